//! Dead-letter what cannot be handled, with the reason attached.
//!
//! [`DeadLetterLayer`] sits above the retry layer. When the service below
//! yields [`Decision::DeadLetter`] with `published: false`, or fails with an
//! error (no retry layer below), it publishes a copy of the delivery — the
//! original body, properties and headers — to the queue's dead-letter queue,
//! `{queue}.dlq`, with a confirm, adding:
//!
//! | header | value |
//! |---|---|
//! | [`REASON_HEADER`] `x-acemq-reason` | `max-attempts`, `rejected`, `panic`, `timeout`, … |
//! | [`ERROR_HEADER`] `x-acemq-error` | the error's display chain, at most [`MAX_ERROR_LEN`] bytes |
//! | [`ATTEMPTS_HEADER`] `x-acemq-attempts` | how many attempts were made (integer) |
//! | [`QUEUE_HEADER`] `x-acemq-queue` | the queue the delivery came from |
//! | [`DEAD_LETTERED_AT_HEADER`] `x-acemq-dead-lettered-at` | unix time in milliseconds (integer) |
//!
//! An error reaching this layer is classified ([`Classify`], by default
//! [`DefaultClassifier`]): a panic gets reason `panic`, a [`Reject`]
//! `rejected`, anything else `max-attempts` (with the delivery's attempt
//! number as the count).
//!
//! Once the broker confirms, the decision is [`Decision::DeadLetter`] with
//! `published: true` and the consumer loop acknowledges the original;
//! `acemq.dead_lettered` {queue, reason} counts it. If the dead-letter queue
//! is missing (the publish comes back unroutable) it is declared again
//! ([`Publish::redeclare`]) and the publish tried once more. If that fails
//! too, or the broker nacks, or the channel is gone, the reason is lost: the
//! layer logs an error saying so and returns `published: false`, and the
//! loop rejects the delivery without requeue so the queue's own dead-letter
//! exchange takes it (without the reason headers).
//!
//! A delivery that is a request — it carries a non-empty `reply_to` and a
//! `correlation_id`, on a queue that serves requests
//! ([`DeadLetterLayer::replies`], [`ErrorReplies`]) and to an address that
//! queue allows — has a caller waiting for its answer. Once the copy is
//! in the dead-letter queue (or could not be put there), and before the
//! decision is returned (so before the request is acknowledged or
//! rejected), the layer sends that caller an error reply through
//! [`Publish::reply_error`] carrying the reason, so the caller does not wait
//! out its deadline for a message that is gone. Sending it is the only
//! extra work, and only for a request that is dead-lettered; a failure to
//! send it is logged and changes nothing else. The reply's wire format is
//! `acemq::rpc`'s. By default a layer serves no requests and sends no
//! reply: a message's `reply_to` is the publisher's to choose, and must not
//! make the service publish wherever it says.
//!
//! Every other decision passes through untouched, without allocation. A
//! disabled layer ([`DeadLetterLayer::enabled`]`(false)`, for a queue with
//! `dead_letter: false`) passes everything through, save that a request
//! decided [`Decision::DeadLetter`] still gets its error reply (the loop
//! then rejects it as usual).
//!
//! # Example
//!
//! ```
//! use std::sync::{Arc, Mutex};
//!
//! use acemq_layers::{BoxError, Decision, DeadLetterLayer, Delivery, Outgoing, Publish, PublishError, Reason, Reject};
//! use acemq_layers::dead_letter::REASON_HEADER;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! /// Stands in for the broker: records where each copy went and its reason.
//! #[derive(Clone, Default)]
//! struct Broker(Arc<Mutex<Vec<(String, String)>>>);
//!
//! impl Publish for Broker {
//!     fn publish(&self, m: Outgoing<'_>) -> impl std::future::Future<Output = Result<(), PublishError>> + Send {
//!         let reason = m.headers.get(REASON_HEADER).and_then(|v| v.as_str()).unwrap_or("").to_owned();
//!         self.0.lock().unwrap().push((m.queue.to_owned(), reason));
//!         std::future::ready(Ok(()))
//!     }
//!     fn redeclare(&self, _: &str) -> impl std::future::Future<Output = Result<(), PublishError>> + Send {
//!         std::future::ready(Ok(()))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let broker = Broker::default();
//! let svc = ServiceBuilder::new()
//!     .layer(DeadLetterLayer::new(broker.clone()))
//!     .service_fn(|_: Delivery| async {
//!         Err::<Decision, BoxError>(Reject::new("not an order").into())
//!     });
//! let delivery = Delivery::builder().queue("orders").body("{}").build();
//! let Decision::DeadLetter(d) = svc.oneshot(delivery).await.unwrap() else { panic!() };
//! assert_eq!((d.reason, d.published), (Reason::Rejected, true));
//! assert_eq!(broker.0.lock().unwrap()[0], ("orders.dlq".to_owned(), "rejected".to_owned()));
//! # }
//! ```
//!
//! # Order
//!
//! Above [`RetryLayer`](crate::RetryLayer) (which decides when attempts are
//! exhausted) and below the in-flight layer, so the drain waits for the
//! confirmed publish.
//!
//! # Cancellation safety
//!
//! Dropping the response future before the confirm leaves the original
//! unsettled: the broker redelivers it, and a copy may already be in the
//! dead-letter queue — a duplicate, never a loss.
//!
//! [`Decision::DeadLetter`]: crate::Decision::DeadLetter
//! [`Classify`]: crate::Classify
//! [`DefaultClassifier`]: crate::DefaultClassifier
//! [`Reject`]: crate::Reject
//! [`Publish::redeclare`]: crate::Publish::redeclare
//! [`Publish::reply_error`]: crate::Publish::reply_error

pub mod future;
mod layer;
mod replies;
mod service;

pub use layer::DeadLetterLayer;
pub use replies::{ErrorReplies, DIRECT_REPLY_TO_PREFIX};
pub use service::DeadLetter;

pub(crate) use future::{act, Act};
pub(crate) use service::Config;

/// Header naming why the delivery was dead-lettered ([`Reason::as_str`](crate::Reason::as_str)).
pub const REASON_HEADER: &str = "x-acemq-reason";
/// Header carrying the last error's display chain, at most [`MAX_ERROR_LEN`] bytes.
pub const ERROR_HEADER: &str = "x-acemq-error";
/// Header carrying how many attempts were made (integer).
pub const ATTEMPTS_HEADER: &str = "x-acemq-attempts";
/// Header naming the queue the delivery came from.
pub const QUEUE_HEADER: &str = "x-acemq-queue";
/// Header carrying when the delivery was dead-lettered, unix milliseconds (integer).
pub const DEAD_LETTERED_AT_HEADER: &str = "x-acemq-dead-lettered-at";
/// The longest error text written to [`ERROR_HEADER`], in bytes (4 KiB).
pub const MAX_ERROR_LEN: usize = 4096;

/// What a dead-letter queue's name adds to its queue's: `.dlq`.
pub const DLQ_SUFFIX: &str = ".dlq";

/// The dead-letter queue of `queue`, where the layer publishes its copies:
/// `{queue}.dlq`.
///
/// ```
/// assert_eq!(acemq_layers::dead_letter::dlq_name("shop.orders"), "shop.orders.dlq");
/// ```
pub fn dlq_name(queue: &str) -> String {
    format!("{queue}{DLQ_SUFFIX}")
}

//! Retry a failed delivery on a schedule: briefly in this process, or for
//! longer on a rung queue in the broker.
//!
//! [`RetryLayer`] sits above the handler (and the cancellation layer) and
//! turns its failures into decisions. Attempt `n` that fails is followed by
//! attempt `n + 1` after `min(initial_delay · 2^(n-1), max_delay)` (see
//! [`RetryPolicy`]):
//!
//! - a delay under `broker_wait_threshold` is waited out **here**: the layer
//!   sleeps, then calls the inner service again with
//!   [`Delivery::attempt`](crate::Delivery::attempt) set to `n + 1`;
//! - a delay at or above it is waited out **in the broker**: a copy with the
//!   original body, properties and headers plus `x-acemq-attempt = n + 1` is
//!   published (with a confirm) to the rung queue
//!   [`rung_name(queue, delay)`](rung_name), e.g. `shop.orders.retry.20s`,
//!   whose TTL dead-letters it back to the queue when the delay is over. The
//!   decision is [`Decision::Retry`] with [`RetryVia::Rung`]; the consumer
//!   loop acknowledges the original. A crash between the two may duplicate
//!   the message, never lose it.
//! - with [`RetryPolicy::in_queue`] every retry waits **in the queue
//!   itself**: the decision is [`Decision::Retry`] with [`RetryVia::Queue`],
//!   the consumer loop rejects the delivery with requeue, and the quorum
//!   queue's delayed retry (RabbitMQ 4.3 and later) holds it back by
//!   `min(initial_delay · n, max_delay)`, `n` its `x-delivery-count`; the
//!   attempt is read from that header, since the message is not copied;
//! - a rung that does not exist (the publish is returned unroutable) is
//!   waited out here instead, counted in `acemq.retry.rung.missing` {queue}
//!   and warned about once per rung: a long wait here holds the delivery and
//!   slows a drain.
//!
//! The handler's failure is classified first (a [`Classify`], by default
//! [`DefaultClassifier`]): a [`Reject`] is dead-lettered at once with reason
//! `rejected`, a [`HandlerPanic`] with reason `panic` (unless
//! [`RetryPolicy::retry_panics`]), and a transient failure of the last
//! attempt with reason `max-attempts`. These are
//! [`Decision::DeadLetter`] with `published: false`; a
//! [`DeadLetterLayer`](crate::DeadLetterLayer) above publishes them.
//!
//! A success, and every decision the inner service returns, passes through
//! untouched and without allocation; only a failure boxes the future that
//! carries out the schedule.
//!
//! # Drain
//!
//! The layer holds the drain's "draining" [`CancellationToken`]
//! (`tokio_util::sync::CancellationToken`). Once it is cancelled no wait in
//! this process starts, and a wait in progress ends at once: the delivery
//! moves to the rung of its full scheduled delay if that rung exists (rung
//! TTLs are fixed), and otherwise is handed back ([`Decision::HandBack`]) —
//! the broker redelivers it at the attempt number its headers carry. Drain
//! time is bounded by handler time, never by backoff. [`RetryWaits`]
//! ([`RetryLayer::waiting`]) counts the waits in progress.
//!
//! Metrics: `acemq.retry.scheduled` {queue, where = `process` | `broker` | `queue`},
//! `acemq.retry.rung.missing` {queue}.
//!
//! # Example
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use acemq_layers::{BoxError, Decision, Delivery, Outgoing, Publish, PublishError, RetryLayer, RetryPolicy};
//! use tokio_util::sync::CancellationToken;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! /// Stands in for the broker: every rung exists.
//! #[derive(Clone)]
//! struct Broker;
//!
//! impl Publish for Broker {
//!     fn publish(&self, m: Outgoing<'_>) -> impl std::future::Future<Output = Result<(), PublishError>> + Send {
//!         println!("published to {}", m.queue);
//!         std::future::ready(Ok(()))
//!     }
//!     fn redeclare(&self, _: &str) -> impl std::future::Future<Output = Result<(), PublishError>> + Send {
//!         std::future::ready(Ok(()))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let mut policy = RetryPolicy::exponential(5, Duration::from_millis(10), Duration::from_secs(60));
//! policy.broker_wait_threshold = Duration::from_secs(1);
//! let draining = CancellationToken::new();
//! let calls = Arc::new(AtomicU32::new(0));
//! let svc = ServiceBuilder::new()
//!     .layer(RetryLayer::new(policy, Broker, draining.clone()))
//!     .service_fn(move |d: Delivery| {
//!         let calls = calls.clone();
//!         async move {
//!             // The first attempt fails; the second, 10 ms later, succeeds.
//!             if calls.fetch_add(1, Ordering::SeqCst) == 0 {
//!                 return Err::<Decision, BoxError>("database unavailable".into());
//!             }
//!             assert_eq!(d.attempt(), 2);
//!             Ok(Decision::Ack)
//!         }
//!     });
//! let delivery = Delivery::builder().queue("orders").body("hello").build();
//! assert_eq!(svc.oneshot(delivery).await.unwrap(), Decision::Ack);
//! # }
//! ```
//!
//! # Differences from `tower::retry`
//!
//! - **Decisions, not re-requests.** `tower::retry` only ever calls the
//!   service again. This layer may instead decide: retry in the broker
//!   ([`Decision::Retry`]), dead-letter ([`Decision::DeadLetter`]) or hand
//!   back ([`Decision::HandBack`]) — the consumer loop carries it out.
//! - **Waits in the broker.** A long delay holds nothing in this process: the
//!   copy waits on a TTL rung queue, so a crash or a deploy during the wait
//!   loses nothing.
//! - **Drain-aware.** In-process waits end when the drain starts; none start
//!   after it.
//! - **The attempt travels with the message**, in the `x-acemq-attempt`
//!   header, so the count survives rungs, redeliveries and restarts; there is
//!   no per-process budget.
//!
//! # Clone
//!
//! [`Retry`] clones its inner service once per call (as `tower::retry`
//! does): the service that was made ready goes into the response future,
//! which calls it again after an in-process wait (after `poll_ready`).
//!
//! # Cancellation safety
//!
//! Dropping the response future drops the running attempt, or ends the wait
//! (the [`RetryWaits`] count follows) and nothing is published; the delivery
//! stays unsettled and the broker redelivers it. Dropped during a rung
//! publish, the copy may or may not be in the rung while the original is
//! also redelivered: a duplicate, never a loss.
//!
//! [`Reject`]: crate::Reject
//! [`HandlerPanic`]: crate::HandlerPanic
//! [`Classify`]: crate::Classify
//! [`DefaultClassifier`]: crate::DefaultClassifier
//! [`Decision::Retry`]: crate::Decision::Retry
//! [`Decision::DeadLetter`]: crate::Decision::DeadLetter
//! [`Decision::HandBack`]: crate::Decision::HandBack
//! [`RetryVia::Rung`]: crate::RetryVia::Rung
//! [`RetryVia::Queue`]: crate::RetryVia::Queue
//! [`CancellationToken`]: tokio_util::sync::CancellationToken

mod failure;
pub mod future;
mod layer;
mod policy;
mod service;

pub use layer::{RetryLayer, RetryWaits};
pub use policy::{delay_label, rung_name, RetryPolicy};
pub(crate) use service::in_queue_attempt;
pub use service::Retry;

pub(crate) use failure::failure_path;
pub(crate) use layer::Config;

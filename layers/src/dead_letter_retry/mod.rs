//! Dead-letter, redelivery limit and retry as one service: what the three
//! layers do stacked, with one future per delivery instead of three.
//!
//! ```text
//! DeadLetterLayer ─┐
//! RedeliveryLimitLayer ─┼─ DeadLetterRetryLayer::new(dead_letter, redelivery_limit, retry)
//! RetryLayer ──────┘
//! ```
//!
//! [`DeadLetterRetryLayer`] is built from the three layers, configured as
//! usual, and behaves exactly as they do stacked in that order (dead-letter
//! outermost, retry innermost; see each for the behaviour): a delivery
//! redelivered past the bound, or struck out, is dead-lettered without
//! calling the service below; a failure is retried on the policy, in
//! process or on a rung; what cannot be handled is published to `Q.dlq`
//! with the reason headers (or, dead-letter disabled, left to the loop to
//! reject, a request's caller still told why). The metrics, the logs and the
//! [`RetryWaits`](crate::RetryWaits) count are theirs too.
//!
//! What it saves is per delivery: the three layers each keep what they may
//! need of a delivery (a clone of it, their configuration) and each wrap
//! the future of the one below; this service keeps one clone and one
//! configuration, and its future is one state machine. Only a failure
//! boxes the future that carries out the schedule or the publish, as with
//! the three. The `acemq` crate's `App` runs it; compose the three layers
//! instead when you want your own layer between them.
//!
//! # Example
//!
//! ```
//! use acemq_layers::{
//!     BoxError, DeadLetterLayer, DeadLetterRetryLayer, Decision, Delivery, Outgoing, Publish,
//!     PublishError, RedeliveryLimitLayer, RetryLayer, RetryPolicy,
//! };
//! use tokio_util::sync::CancellationToken;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! #[derive(Clone)]
//! struct Broker;
//! impl Publish for Broker {
//!     fn publish(&self, _: Outgoing<'_>) -> impl std::future::Future<Output = Result<(), PublishError>> + Send {
//!         std::future::ready(Ok(()))
//!     }
//!     fn redeclare(&self, _: &str) -> impl std::future::Future<Output = Result<(), PublishError>> + Send {
//!         std::future::ready(Ok(()))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let layer = DeadLetterRetryLayer::new(
//!     DeadLetterLayer::new(Broker),
//!     RedeliveryLimitLayer::default(),
//!     RetryLayer::new(RetryPolicy::none(), Broker, CancellationToken::new()),
//! );
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_: Delivery| async { Err::<Decision, BoxError>("no such order".into()) });
//! let delivery = Delivery::builder().queue("orders").build();
//! let Decision::DeadLetter(d) = svc.oneshot(delivery).await.unwrap() else { panic!() };
//! assert!(d.published, "the copy is in orders.dlq");
//! assert_eq!(d.error, "no such order");
//! # }
//! ```

pub mod future;
mod layer;
mod service;

pub use layer::DeadLetterRetryLayer;
pub use service::DeadLetterRetry;

//! A bound on broker redeliveries: the crash-loop breaker.
//!
//! A message whose handling kills the process (an abort, an out-of-memory
//! kill, a stack overflow — not a panic, which is caught) is never settled:
//! the broker redelivers it after every restart, at the same attempt
//! number, and the process dies again. On quorum queues the broker counts
//! these returns in the `x-delivery-count` header
//! ([`DELIVERY_COUNT_HEADER`](crate::headers::DELIVERY_COUNT_HEADER)).
//!
//! RabbitMQ 4.3 (from its release notes and quorum queue guide; only 4.0
//! runs here) splits that count in two: `x-delivery-count` counts only
//! failures (`basic.reject`, a lost channel or connection), no longer a
//! `basic.nack` with requeue nor a consumer timeout, and the new
//! `x-acquired-count`
//! ([`ACQUIRED_COUNT_HEADER`](crate::headers::ACQUIRED_COUNT_HEADER))
//! counts every return. The bound reads both and takes the larger, so it
//! counts on 4.3 what it counts on 3.x and 4.0: every return.
//!
//! [`RedeliveryLimitLayer`] reads it: a delivery whose count exceeds the
//! bound becomes [`Decision::DeadLetter`](crate::Decision::DeadLetter) with
//! reason [`Reason::Redelivered`](crate::Reason::Redelivered) *without
//! calling the service below*; the dead-letter layer above publishes it. A
//! delivery without the header (classic queues, first deliveries) passes
//! through untouched.
//!
//! The count also grows with every drain hand-back, pause hand-back and
//! reconnect requeue, so it is its own bound ([`RedeliveryLimitLayer::DEFAULT_MAX_REDELIVERIES`],
//! 50), not `max_attempts`: deploys must not use up a message's attempts.
//! Rung and dead-letter copies never carry `x-delivery-count` nor
//! `x-acquired-count` (the copy is a new message to the broker), so a
//! retried message starts counting again.
//!
//! # The broker's own limit
//!
//! Quorum queues have a delivery limit of their own (`x-delivery-limit`,
//! 20 by default since RabbitMQ 4.0, none before). The `acemq` crate
//! declares its quorum queues with a limit above this bound, so this layer
//! fires first and the message is dead-lettered with reason `redelivered`;
//! the broker's limit is the backstop.
//!
//! The same layer bounds a second kind of return that no header counts: a
//! message whose acknowledgement the broker timed out (`consumer_timeout`)
//! comes back however long its handler runs, on any queue type. The
//! transport counts those returns and says so with
//! [`ConsumerTimeoutStrikes`] in the delivery's extensions; a delivery that
//! has struck out is dead-lettered with reason
//! [`Reason::ConsumerTimeout`](crate::Reason::ConsumerTimeout), also without
//! calling the service below.
//!
//! A delivery whose headers the transport set aside (nested too deep, too
//! many values, unparsable: [`MalformedHeaders`] in its extensions) is
//! dead-lettered with reason
//! [`Reason::MalformedHeaders`](crate::Reason::MalformedHeaders), without
//! calling the service below either.
//!
//! # Order
//!
//! Directly inside [`DeadLetterLayer`](crate::DeadLetterLayer) (which
//! publishes the decision) and outside [`RetryLayer`](crate::RetryLayer) (so
//! no attempt, wait or rung publish happens for it): pause, in-flight,
//! dead-letter, **redelivery limit**, retry, cancel, handler.
//!
//! # Example
//!
//! ```
//! use acemq_layers::headers::DELIVERY_COUNT_HEADER;
//! use acemq_layers::{Decision, Delivery, Headers, Reason, RedeliveryLimitLayer, Value};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let svc = ServiceBuilder::new()
//!     .layer(RedeliveryLimitLayer::new(3))
//!     .service_fn(|_: Delivery| async { Ok::<_, std::io::Error>(Decision::Ack) });
//! let mut headers = Headers::new();
//! headers.insert(DELIVERY_COUNT_HEADER, Value::I64(4));
//! let delivery = Delivery::builder().queue("orders").headers(headers).build();
//! let Decision::DeadLetter(d) = svc.oneshot(delivery).await.unwrap() else { panic!() };
//! assert_eq!(d.reason, Reason::Redelivered);
//! # }
//! ```

pub mod future;
mod layer;
mod malformed;
mod service;
mod strikes;

pub use layer::RedeliveryLimitLayer;
pub use malformed::MalformedHeaders;
pub use service::RedeliveryLimit;

pub(crate) use service::limited;
pub use strikes::ConsumerTimeoutStrikes;

//! Counts the deliveries inside the handler, in total and per queue.
//!
//! [`InFlightLayer`] wraps a service so that every request counts as in
//! flight from the moment [`call`](tower::Service::call) is entered until its
//! response future completes or is dropped. The count lives in an
//! [`InFlightCounter`] that the drain (or a health endpoint) holds:
//! [`total`](InFlightCounter::total), [`get`](InFlightCounter::get) for one
//! queue, [`snapshot`](InFlightCounter::snapshot) of every queue seen, and
//! [`wait_idle`](InFlightCounter::wait_idle), a future that resolves when
//! nothing is in flight.
//!
//! # Semantics
//!
//! - The count rises before the inner service's `call` runs and falls when
//!   the response future returns `Ready` — on success and on error alike —
//!   or when it is dropped unfinished, or when a panic unwinds through it.
//!   The fall is done by a guard whose `Drop` never panics.
//! - The layer passes everything through: the response and the error are the
//!   inner service's, unchanged.
//! - Per-queue counts are keyed by [`Delivery::queue`]. A queue appears in
//!   the snapshot from its first delivery on and stays there (at 0) after.
//! - The hot path is atomics only: each [`InFlight`] service caches the
//!   count of the last queue it saw; the registry behind the counter
//!   is locked only when a service meets a queue it has not just seen.
//!
//! # Order
//!
//! Put it under the [`PauseLayer`](crate::PauseLayer): a request the gate
//! holds has not started and is not in flight. Everything under it (retries,
//! their waits, dead-letter publishes) is work the drain waits for.
//!
//! # Held until claimed
//!
//! [`ClaimLayer`] is the counting layer a transport puts at the claim
//! point: the innermost part of the stack that every delivery passes once,
//! right before the work on it begins (acemq puts it under your outer
//! layers, above dead-letter and retry). It *claims* each delivery as it
//! enters: from then on the delivery is **in flight** — counted here,
//! holding one of the queue's concurrency permits
//! ([`concurrency`](ClaimLayer::concurrency), taken in `poll_ready` as
//! tower's `ConcurrencyLimit` does) until its outcome exists. Everything
//! before the claim is **held**: waiting at a pause gate, for a key's turn,
//! in an outer `Buffer` for a `RateLimit` permit, in a batch being formed.
//! A held delivery holds no permit (concurrency counts handlers; the
//! broker's prefetch bounds what is held), is not in flight, and can be
//! handed back:
//!
//! - the transport calls [`Lifeline::hand_back_held`](crate::Lifeline::hand_back_held)
//!   on the generation's lifeline and, for each delivery it still waits
//!   for, [`Delivery::hand_back_if_held`]: one atomic on the delivery
//!   decides the race with the claim — the first writer wins;
//! - if the hand-back won, the transport returns the delivery to the broker
//!   at once, and a claim that comes later (tower's `Buffer` worker passing
//!   on a request it had already taken) is refused: the layers below are
//!   not called and the request resolves to
//!   [`Decision::HandBack`](crate::Decision::HandBack);
//! - if the claim won, the delivery is in flight like any other.
//!
//! A delivery is claimed once: a retry's later attempts run under the
//! claim, and clones of a delivery share it.
//!
//! # Confirming
//!
//! Between in flight and settled there is one more state. When a failing
//! delivery's handler has returned and its rung or dead-letter copy has
//! been sent, only the copy's confirm is still awaited: the delivery is
//! **confirming**. It gives up its concurrency permit — the claim keeps
//! the permit in the delivery's shared part, and the transport's
//! [`Publish`](crate::Publish) implementation frees it with
//! [`Outgoing::queued`](crate::Outgoing::queued) between sending the copy
//! and awaiting its confirm — so the next delivery's handler runs while
//! the confirm is outstanding, and a failure storm has more confirms
//! outstanding than there are handlers. A confirming delivery
//!
//! - is still **in flight**: counted here until its outcome exists, so the
//!   drain waits for it before it closes the publishing channel and settles;
//! - still holds its **unacknowledged delivery**, so the broker's prefetch
//!   bounds how many are confirming at once;
//! - is settled only **after** its copy is confirmed (the layers' outcome
//!   exists only then), exactly once;
//! - is an **orphan** if its generation is lost meanwhile: its outcome is
//!   never settled and the broker redelivers it (the
//!   [`Lifeline`](crate::Lifeline)).
//!
//! A rung copy refused after it was sent leaves the delivery to be retried
//! in process: the retry layer takes a permit back (waiting for it like a
//! claim) before its in-process wait and next attempt.
//! [`Delivery::is_confirming`] tells the state. Without a concurrency limit,
//! or with a `Publish` that never calls `queued`, nothing changes: the
//! delivery keeps its permit until its outcome exists.
//!
//! # Example
//!
//! ```
//! use acemq_layers::{Delivery, InFlightCounter, InFlightLayer};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let counter = InFlightCounter::new();
//! let seen = counter.clone();
//! let svc = ServiceBuilder::new()
//!     .layer(InFlightLayer::new(counter.clone()))
//!     .service_fn(move |d: Delivery| {
//!         let seen = seen.clone();
//!         async move {
//!             // Inside the handler, this delivery counts.
//!             assert_eq!(seen.get(d.queue()), 1);
//!             Ok::<_, std::io::Error>(())
//!         }
//!     });
//! let delivery = Delivery::builder().queue("orders").build();
//! svc.oneshot(delivery).await.unwrap();
//! assert_eq!(counter.total(), 0);
//! assert_eq!(counter.snapshot()["orders"], 0);
//! counter.wait_idle().await; // resolves at once: nothing in flight
//! # }
//! ```
//!
//! The claim point, and a delivery handed back before it:
//!
//! ```
//! use std::sync::Arc;
//! use acemq_layers::{ClaimLayer, Decision, Delivery, InFlightCounter, Lifeline};
//! use tokio::sync::Semaphore;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let counter = InFlightCounter::new();
//! let svc = ServiceBuilder::new()
//!     .layer(ClaimLayer::new(counter.clone()).concurrency(Arc::new(Semaphore::new(8))))
//!     .service_fn(|_d: Delivery| async { Ok::<_, std::io::Error>(Decision::Ack) });
//! let lifeline = Lifeline::new(); // a transport's, one per channel
//! let first = Delivery::builder().queue("orders").lifeline(lifeline.clone()).build();
//! assert_eq!(svc.clone().oneshot(first.clone()).await.unwrap(), Decision::Ack);
//! assert!(first.is_claimed());
//!
//! // The drain hands back what is held; a claim after that is refused.
//! let waiting = Delivery::builder().queue("orders").lifeline(lifeline.clone()).build();
//! lifeline.hand_back_held();
//! assert!(waiting.hand_back_if_held());
//! assert_eq!(svc.oneshot(waiting).await.unwrap(), Decision::HandBack);
//! assert_eq!(counter.total(), 0);
//! # }
//! ```

mod claim;
mod counter;
pub mod future;
mod layer;
mod service;

pub use claim::{Claim, ClaimLayer};
pub use counter::InFlightCounter;
pub use layer::InFlightLayer;
pub use service::InFlight;

use crate::Delivery;

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
//!   counter slot of the last queue it saw; the registry behind the counter
//!   is locked only when a service meets a queue it has not just seen.
//!
//! # Order
//!
//! Put it under the [`PauseLayer`](crate::PauseLayer): a request the gate
//! holds has not started and is not in flight. Everything under it (retries,
//! their waits, dead-letter publishes) is work the drain waits for.
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

mod counter;
pub mod future;
mod layer;
mod service;

pub use counter::InFlightCounter;
pub use layer::InFlightLayer;
pub use service::InFlight;

use crate::Delivery;

//! Batches: a handler given many deliveries at once (one statement for
//! many rows), while each delivery keeps its own outcome, retries and
//! dead-letter.
//!
//! Two pieces, one on each side of the claim:
//!
//! - [`BatchLayer`], before the claim (where acemq puts it: under your
//!   outer layers, above the [`ClaimLayer`](crate::ClaimLayer)), gathers
//!   deliveries into a batch of at most [`max_size`](Batcher::max_size),
//!   closed when it is full or when
//!   [`max_wait`](Batcher::max_wait) has passed since its first delivery
//!   — whichever comes first; a closed batch then waits for one of the
//!   [`Batcher`]'s `concurrency` permits (batches running at once), and its
//!   deliveries go on down the stack, each its own request;
//! - [`BatchHandler`], in the handler's place, wraps your service of
//!   [`Batch`]es: it waits until every member of the batch has come down
//!   (or will not come), calls your service once, and gives each member
//!   its own outcome ([`IntoOutcomes`]).
//!
//! Between the two, every delivery is an ordinary request: claimed (in
//! flight, counted per delivery), retried, dead-lettered and settled on
//! its own. An in-process retry calls [`BatchHandler`] again for that one
//! delivery: a batch of one.
//!
//! # Held until claimed
//!
//! A delivery whose batch is being formed, or is waiting for a running
//! batch to finish, is *held* (see the
//! [in-flight module](crate::in_flight#held-until-claimed)): not in flight,
//! and handed back at a drain. A batch whose handler has been called runs
//! to its end, and the drain waits for it as for any handler. A member
//! handed back while its batch is forming leaves it; the rest run.
//!
//! # Cancellation
//!
//! The batch service runs on a task of its own; it ends when every
//! member's request has been dropped (abandoned), and watches the
//! handlers' cancellation through [`Batch::token`]. A panic in it fails
//! each member with [`HandlerPanic`](crate::HandlerPanic) in its error's
//! chain.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use acemq_layers::batch::{Batch, BatchHandler, BatchLayer, Batcher};
//! use acemq_layers::{CancelLayer, ClaimLayer, Decision, Delivery, InFlightCounter, Verdict};
//! use tokio_util::sync::CancellationToken;
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // Batches of up to 3, waiting at most 50 ms; one batch at a time.
//! let batcher = Batcher::new(3, Duration::from_millis(50), 1);
//! let mut svc = ServiceBuilder::new()
//!     .layer(BatchLayer::new(batcher))
//!     .layer(ClaimLayer::new(InFlightCounter::new()))
//!     .layer(CancelLayer::new(CancellationToken::new()))
//!     .service(BatchHandler::new(service_fn(|batch: Batch| async move {
//!         // One outcome per delivery, in the batch's order.
//!         let outcomes: Vec<Result<Verdict, std::io::Error>> = batch
//!             .iter()
//!             .map(|d| match &d.body()[..] {
//!                 b"bad" => Ok(Verdict::dead_letter("bad row")),
//!                 _ => Ok(Verdict::Ack),
//!             })
//!             .collect();
//!         Ok::<_, std::io::Error>(outcomes)
//!     })));
//! let calls: Vec<_> = ["a", "bad", "c"]
//!     .into_iter()
//!     .map(|body| svc.call(Delivery::builder().queue("rows").body(body).build()))
//!     .collect();
//! let decisions = futures::future::join_all(calls).await;
//! assert_eq!(decisions[0].as_ref().unwrap(), &Decision::Ack);
//! assert!(matches!(decisions[1].as_ref().unwrap(), Decision::DeadLetter(_)));
//! assert_eq!(decisions[2].as_ref().unwrap(), &Decision::Ack);
//! # let _ = svc.ready().await;
//! # }
//! ```

mod form;
mod handler;
mod request;
mod state;
#[cfg(all(test, not(acemq_loom)))]
mod tests;

pub use form::{BatchLayer, Batching};
pub use handler::BatchHandler;
pub use request::{Batch, BatchFailed, IntoOutcomes, Outcomes};
pub use state::Batcher;

//! A gate before the handler: pause holds requests, resume lets them on,
//! close hands them back.
//!
//! [`PauseLayer`] puts a gate, controlled by a [`PauseHandle`], in front of
//! a service whose response is a [`Decision`]. The gate is in one of three
//! states:
//!
//! - **open** (the start): a request goes straight to the inner service;
//! - **paused** ([`PauseHandle::pause`]): a request is *held* — it waits in
//!   the gate, in arrival order, without calling the inner service, and is
//!   counted by [`PauseHandle::held`];
//! - **closed** ([`PauseHandle::close`], at drain): every held request and
//!   every later one resolves to [`Decision::HandBack`] without calling the
//!   inner service. Closing is final.
//!
//! [`resume`](PauseHandle::resume) reopens a paused gate and releases every
//! held request, in the order they arrived. A paused gate is not shutting
//! down: pause and close are separate states, and `close()` wins over
//! `pause()` and `resume()`.
//!
//! # Two sources of a pause
//!
//! The gate is held by the **operator** ([`pause`](PauseHandle::pause),
//! [`resume`](PauseHandle::resume)) and by a **circuit breaker**
//! ([`CircuitBreakerLayer`](crate::CircuitBreakerLayer), further down the
//! same stack), each with its own flag in the gate's one atomic word:
//!
//! - an open circuit holds every request, like a pause;
//! - a **half-open** circuit admits exactly one request, the probe, and
//!   holds the others until the breaker decides;
//! - the operator's pause holds whatever the circuit is; the operator's
//!   resume on an open or half-open circuit also closes it (an override,
//!   until the breaker trips again).
//!
//! [`circuit`](PauseHandle::circuit) says where the circuit is
//! ([`Circuit`]); [`is_paused`](PauseHandle::is_paused) is true while the
//! operator or an open circuit holds the gate,
//! [`is_paused_by_operator`](PauseHandle::is_paused_by_operator) only for
//! the former. A gate without a breaker is always [`Circuit::Closed`].

//! # Semantics
//!
//! - `poll_ready` is the inner service's: the gate adds no backpressure of
//!   its own, and never returns `Pending` unless the inner service did (and
//!   so registered the waker).
//! - A held request keeps the inner service it was made ready on (the ready
//!   service is moved into the response future and replaced by a clone, as
//!   `tower::buffer` does), so on resume it is called without waiting again.
//!   Whatever readiness reserves (a concurrency permit, say) stays reserved
//!   while the request is held.
//! - The waiters are woken with [`tokio::sync::Notify`]: `resume()`,
//!   `close()` and every change of the circuit wake every one, none is
//!   lost, none polls (at a half-open circuit one of them takes the probe,
//!   the others wait again).
//! - An open gate costs one atomic load per request.
//!
//! # Order
//!
//! Outermost: a held request has not started, so it is not in flight
//! ([`InFlightLayer`](crate::InFlightLayer) goes under the gate), and a
//! closed gate hands requests back without touching the layers below.
//!
//! # Clone
//!
//! [`Pause`] is `Clone` when the inner service is; clones share the gate.
//! [`PauseHandle`] clones control the same gate.
//!
//! # Example
//!
//! ```
//! use acemq_layers::{Decision, Delivery, PauseHandle, PauseLayer};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let gate = PauseHandle::new();
//! let mut svc = ServiceBuilder::new()
//!     .layer(PauseLayer::new(gate.clone()))
//!     .service_fn(|_d: Delivery| async { Ok::<_, std::io::Error>(Decision::Ack) });
//!
//! gate.pause();
//! let held = svc.ready().await.unwrap().call(Delivery::builder().build());
//! let waiter = tokio::spawn(held);
//! tokio::task::yield_now().await;
//! assert_eq!(gate.held(), 1);
//!
//! gate.resume();
//! assert_eq!(waiter.await.unwrap().unwrap(), Decision::Ack);
//!
//! gate.close();
//! let later = svc.ready().await.unwrap().call(Delivery::builder().build()).await;
//! assert_eq!(later.unwrap(), Decision::HandBack);
//! # }
//! ```

mod circuit;
pub mod future;
mod handle;
mod layer;
mod service;

pub use circuit::Circuit;
pub(crate) use circuit::{record_transition, ProbeMark};
pub use handle::PauseHandle;
pub use layer::PauseLayer;
pub use service::Pause;

use crate::{Decision, Delivery};

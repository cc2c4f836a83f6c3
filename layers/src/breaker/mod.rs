//! Stop taking deliveries when the handler's downstream is down, and try
//! again by itself: a circuit breaker that acts at the pause gate.
//!
//! [`CircuitBreakerLayer`] counts the attempts of the service below it and,
//! when too many fail, opens the circuit of a [`PauseHandle`]'s gate (the
//! [`PauseLayer`](crate::PauseLayer) outermost in the same stack):
//!
//! - **closed** (the start): deliveries pass; each attempt's result goes
//!   into a sliding window (`window`, a ring of 10 buckets). Once at least
//!   `minimum_calls` attempts are in it and the failed share reaches
//!   `failure_ratio`, the circuit **opens**;
//! - **open**: the gate holds every new delivery, as a pause does — held,
//!   not in flight, nothing lost, handed back by the drain — for
//!   `cool_down`;
//! - **half-open**: the gate lets exactly one delivery through as the
//!   *probe* (one of those it holds, or the next to arrive) and holds the
//!   others. The probe's first attempt decides: a success **closes** the
//!   circuit (every held delivery is let through, in arrival order); a
//!   failure **opens** it again, for twice the last cool-down, up to
//!   `max_cool_down` (see [`BreakerPolicy::cool_down_after`]). A probe that
//!   tells nothing (rejected, handed back, never reaching the breaker) lets
//!   the next delivery be the probe.
//!
//! The state is [`PauseHandle::circuit`] ([`Circuit`]: `closed`, `open`,
//! `half_open`): the health snapshot and the admin router's `/queues` show
//! it as `circuit`.
//!
//! # What counts
//!
//! Each **attempt**, so the layer goes *inside* the retry layer: a dead
//! database trips the breaker while in-process retries still run (they
//! carry on for the deliveries already let through; only new ones are
//! held). The result is classified as the retry layer classifies it (give
//! both the same [`Classify`]): a transient failure or a timeout counts as
//! a failure; a success, or any verdict the handler returns (requeue,
//! dead-letter now), counts as a success; a permanent rejection
//! ([`Reject`](crate::Reject)), a panic, a hand-back and an abandoned
//! handler do not count at all — they say nothing about the downstream.
//! Results of deliveries let through before a trip that arrive while the
//! circuit is open or half-open count for nothing either.
//!
//! # The operator and the breaker
//!
//! The gate has two sources of a pause, never one flag:
//!
//! - [`PauseHandle::pause`] is the operator's: it holds whatever the
//!   breaker says (the circuit still opens, half-opens and closes beneath
//!   it, but no probe passes a gate the operator paused);
//! - [`PauseHandle::resume`] lifts the operator's pause, and on an open or
//!   half-open circuit also overrides the breaker: the circuit closes (the
//!   window starts empty) until the breaker trips again.
//!
//! # Held, not handed back
//!
//! An open circuit is a paused gate: [`PauseHandle::is_paused`] is true and
//! [`PauseHandle::paused_for`] runs, so a transport that hands back what
//! was paused too long (acemq's `pause_hand_back_after`, 30 s by default)
//! does so for an open circuit too. Each transition starts that bound over;
//! keep `max_cool_down` below it (the default, 20 s, is) and the held
//! deliveries stay held through every cool-down, the probe is one of them,
//! and no trip costs them a redelivery (`x-delivery-count` on a quorum
//! queue). A cool-down longer than the bound costs each held delivery one
//! redelivery per trip, which counts toward acemq's `max_redeliveries` (50
//! by default): after that many such trips a held message is dead-lettered
//! as `redelivered`. A half-open gate is not paused (a transport that
//! stopped consuming starts again, to find a probe).
//!
//! # Log and metrics
//!
//! Every transition is a log line (`warn` when the circuit opens, `info`
//! when it half-opens or closes) naming the queue (the first delivery's)
//! and why, and counts in `acemq.circuit.transitions` {queue, to =
//! `open` | `half_open` | `closed`}; `acemq.circuit.open` {queue} is 1
//! while the circuit is not closed.
//!
//! # Cost
//!
//! Closed, a successful attempt costs two atomic reads of the gate, one
//! read of the current bucket and one compare-and-swap on it, and no
//! allocation: the window is a fixed ring of packed counters. No clock is
//! read for a success: a ticker task (one per layer, spawned on the tokio
//! runtime of the first success, ending with the layer) stores the current
//! bucket at each bucket's start (a tenth of `window`), and a success
//! counts in the bucket it stored — a tick of the runtime's timer late at
//! most, which moves when a success leaves the window by that much. Until
//! the ticker runs (and without a tokio runtime) a success reads the clock.
//! A failure always reads the clock: the bucket it counts in and the
//! window it is judged on are exact. The cool-down is one spawned tokio
//! task per trip.
//!
//! # Example
//!
//! ```
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use acemq_layers::{
//!     BoxError, BreakerPolicy, Circuit, CircuitBreakerLayer, Decision, Delivery, PauseHandle,
//!     PauseLayer,
//! };
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let gate = PauseHandle::new();
//! let mut policy = BreakerPolicy::default();
//! policy.minimum_calls = 3;
//! policy.cool_down = Duration::from_secs(5);
//! let database_down = Arc::new(AtomicBool::new(true));
//! let down = database_down.clone();
//! let mut svc = ServiceBuilder::new()
//!     .layer(PauseLayer::new(gate.clone()))
//!     // (a retry layer goes here, outside the breaker)
//!     .layer(CircuitBreakerLayer::new(gate.clone(), policy))
//!     .service_fn(move |_d: Delivery| {
//!         let down = down.load(Ordering::SeqCst);
//!         async move {
//!             if down {
//!                 return Err::<Decision, BoxError>("database unavailable".into());
//!             }
//!             Ok(Decision::Ack)
//!         }
//!     });
//! let delivery = || Delivery::builder().queue("orders").build();
//!
//! // Three attempts, three failures: the circuit opens.
//! for _ in 0..3 {
//!     assert!(svc.ready().await.unwrap().call(delivery()).await.is_err());
//! }
//! assert_eq!(gate.circuit(), Circuit::Open);
//!
//! // The next delivery is held, not called.
//! let held = tokio::spawn(svc.ready().await.unwrap().call(delivery()));
//! tokio::task::yield_now().await;
//! assert_eq!(gate.held(), 1);
//!
//! // The database is back; after the cool-down the held delivery is the
//! // probe, it succeeds, and the circuit closes.
//! database_down.store(false, Ordering::SeqCst);
//! assert_eq!(held.await.unwrap().unwrap(), Decision::Ack);
//! assert_eq!(gate.circuit(), Circuit::Closed);
//! # }
//! ```
//!
//! [`PauseHandle`]: crate::PauseHandle
//! [`PauseHandle::circuit`]: crate::PauseHandle::circuit
//! [`PauseHandle::pause`]: crate::PauseHandle::pause
//! [`PauseHandle::resume`]: crate::PauseHandle::resume
//! [`PauseHandle::is_paused`]: crate::PauseHandle::is_paused
//! [`PauseHandle::paused_for`]: crate::PauseHandle::paused_for
//! [`Circuit`]: crate::Circuit
//! [`Classify`]: crate::Classify

pub mod future;
mod layer;
mod policy;
mod service;
mod state;
pub(crate) mod window;

pub use layer::CircuitBreakerLayer;
pub use policy::{BreakerPolicy, BreakerPolicyError};
pub use service::CircuitBreaker;

//! Transport-agnostic tower layers for message handlers.
//!
//! A message taken from a queue is a [`Delivery`]; a handler is any
//! `tower::Service<Delivery>`. The layers here track it, hold it, cancel it,
//! retry it and dead-letter it, and turn the handler's result into one
//! [`Decision`] that the transport (the `acemq` crate, for RabbitMQ) carries
//! out exactly once. Nothing here depends on a broker client: every layer is
//! tested and benchmarked in memory.
//!
//! | layer | what it does | state the drain reads |
//! |---|---|---|
//! | [`pause`] | holds requests before the handler; `close()` hands them back | held count |
//! | [`batch`] | forms batches before the claim (a forming batch is held); runs a service of batches in the handler's place, each delivery keeping its own outcome | — |
//! | [`in_flight`] | counts deliveries inside the handler, per queue; [`ClaimLayer`] is the claim point (in flight from there, with a concurrency permit; held before it, and handed back) | count, `wait_idle()` |
//! | [`partition`] | runs deliveries with equal keys one at a time, in arrival order; a waiting one is held | waiting count |
//! | [`dead_letter`] | publishes what cannot be handled, with the reason | — |
//! | [`redelivery`] | dead-letters a message redelivered past its bound (crash loops) | — |
//! | [`retry`] | backoff in process or on a rung queue in the broker | waits in progress |
//! | [`breaker`] | counts attempts; opens the gate's circuit when too many fail, probes after a cool-down | the circuit's state, on the gate |
//! | [`cancel`] | a read-only view of the root token per request; abandons after a grace period | running handlers |
//! | [`inbox`] | skips a delivery already processed, per (queue, message id); yours to add around the handler | — |
//!
//! # Order
//!
//! Outermost first, the order the `acemq` runner uses:
//!
//! 1. [`PauseLayer`] — a held request has not started, so it must not count
//!    as in flight, and `close()` can hand it back without touching anything
//!    below.
//! 2. Anything that holds a delivery before the work begins: a
//!    [`PartitionLayer`] (a key's turn), your own `Buffer` and `RateLimit`.
//!    What waits here is held: not in flight, handed back at a drain.
//!    A [`BatchLayer`](batch::BatchLayer) goes last among them (a batch
//!    being formed is held), with a [`BatchHandler`](batch::BatchHandler)
//!    in the handler's place (step 9).
//! 3. [`ClaimLayer`] (or [`InFlightLayer`], which counts without claiming) —
//!    everything below is work the drain waits for: handler attempts,
//!    in-process backoffs, and the confirmed publishes of retries and
//!    dead-letters.
//! 4. [`DeadLetterLayer`] — turns a dead-letter decision from below into a
//!    confirmed publish with the reason headers.
//! 5. [`RedeliveryLimitLayer`] — a delivery the broker redelivered more than
//!    `max_redeliveries` times (`x-delivery-count`, quorum queues) becomes a
//!    dead-letter decision for the layer above, without any attempt below.
//! 6. [`RetryLayer`] — calls the inner service again after an in-process
//!    wait, or publishes to a rung; decides when attempts are exhausted.
//! 7. [`CircuitBreakerLayer`] (when you want one) — inside the retry
//!    layer, so every attempt counts, in-process retries included; it acts
//!    on the gate of step 1 (the same [`PauseHandle`]).
//! 8. [`CancelLayer`] — innermost, so each attempt is watched on its own,
//!    a panic is caught where it happens, and abandonment drops exactly the
//!    handler's future.
//! 9. Your handler, with any of your own tower layers around it. It returns
//!    `Ok(())` (acknowledge) or `Ok(`[`Verdict`]`)` (requeue, dead-letter
//!    now); an error is retried, or dead-lettered at once when it carries a
//!    [`Reject`] anywhere (see [`DefaultClassifier`]).
//!
//! ```
//! use acemq_layers::{Delivery, Decision, InFlightLayer, InFlightCounter, PauseLayer, PauseHandle, CancelLayer};
//! use tokio_util::sync::CancellationToken;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let counter = InFlightCounter::new();
//! let gate = PauseHandle::new();
//! let root = CancellationToken::new();
//! let svc = ServiceBuilder::new()
//!     .layer(PauseLayer::new(gate.clone()))
//!     .layer(InFlightLayer::new(counter.clone()))
//!     .layer(CancelLayer::new(root.clone()))
//!     .service_fn(|d: Delivery| async move {
//!         assert_eq!(&d.body()[..], b"hello");
//!         Ok::<_, std::io::Error>(())
//!     });
//! let delivery = Delivery::builder().queue("orders").body("hello").build();
//! let decision = svc.oneshot(delivery).await.unwrap();
//! assert_eq!(decision, Decision::Ack);
//! assert_eq!(counter.total(), 0);
//! # }
//! ```
//!
//! # Verification
//!
//! What coordinates threads here is model checked with
//! [loom](https://docs.rs/loom): [`Slots`](cancel::Slots)' wake bits and
//! owner waker against the loop that pushes and polls; the pause gate's
//! state, held count and `Notify` against `resume`, `close` and
//! `hand_back_held`; the in-flight total, waiter count and `Notify` against
//! [`wait_idle`](InFlightCounter::wait_idle); the cancellation view's
//! watcher (`fired`, the waiters' `Notify`, the signal that every view is
//! gone) against handlers waiting as the [`cancel`] layer does; the
//! [`partition`] table's lock-free slots against the locked table they are
//! handed over to (a key's release racing an arrival of the same key, a key
//! sharing a running key's slot, a waiter and a later arrival); the
//! [`breaker`] window's buckets against a late result (a success counted in
//! the ticker's bucket racing a failure that rotates it). Each model
//! runs two to four threads with one assertion; loom runs every
//! interleaving (at most two preemptions each) and fails on a broken
//! assertion or on a thread left parked (a lost wake-up). The models are in
//! `src/tests/loom_*.rs`.
//!
//! The primitives come from a crate-internal `sync` module: in every normal
//! build std's atomics, tokio's `Notify`, tokio-util's `CancellationToken`
//! and futures' `AtomicWaker`, re-exported as they are; under
//! `--cfg acemq_loom`, loom's atomics and `AtomicWaker`, and models of
//! `Notify` and the token with their documented rules (unit tests check
//! those rules on the real types and on the models alike). Run them with
//!
//! ```text
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg acemq_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test -p acemq-layers --lib
//! ```
//!
//! in a target directory of their own (the flag rebuilds every dependency),
//! as CI does: about two minutes of CPU to build and ten seconds to run, in
//! debug (`--release` takes longer to build than it saves).
//! `LOOM_MAX_PREEMPTIONS=3` runs deeper (a few minutes in `--release`).
//!
//! Not modelled: time (the grace period, `paused_for`, the breaker's
//! ticker: tokio's timer has no loom model; the window's models give the
//! buckets' sequences directly), the watcher as a tokio task (a loom
//! thread stands in for it), and the `SeqCst` accesses of the in-flight counter as such (loom
//! treats them as `AcqRel`; the model puts a `SeqCst` fence where C11's
//! single order of those accesses already holds). One model is ignored: it
//! shows `wait_idle` resolving while a delivery is in flight, when a guard
//! that reached 0 before the wait began reads the new waiter late
//! (`src/tests/loom_in_flight.rs` has the interleaving).

pub mod batch;
pub mod breaker;
pub mod cancel;
pub mod dead_letter;
pub mod dead_letter_retry;
mod decision;
mod delivery;
mod error;
pub mod escape;
pub mod headers;
pub mod in_flight;
pub mod inbox;
mod lifeline;
pub mod partition;
pub mod pause;
mod permit;
pub mod provenance;
mod publish;
pub mod redelivery;
pub mod retry;
mod sync;
#[cfg(all(test, acemq_loom))]
mod tests;
pub mod verdict;

pub use breaker::{BreakerPolicy, BreakerPolicyError, CircuitBreaker, CircuitBreakerLayer};
pub use cancel::{Cancel, CancelLayer};
pub use dead_letter::{DeadLetter, DeadLetterLayer};
pub use dead_letter_retry::{DeadLetterRetry, DeadLetterRetryLayer};
pub use decision::{DeadLetterDecision, Decision, Reason, RetryDecision, RetryVia};
#[doc(hidden)]
pub use delivery::Received;
pub use delivery::{
    parse_attempt, Delivery, DeliveryBuilder, Properties, ATTEMPT_HEADER, MAX_ATTEMPT,
};
pub use error::{
    display_chain, is_timeout, BoxError, Class, Classify, DefaultClassifier, HandlerPanic, Reject,
};
pub use escape::{escape, Escaped};
pub use headers::{Headers, Value};
pub use in_flight::{Claim, ClaimLayer, InFlight, InFlightCounter, InFlightLayer};
pub use inbox::{Inbox, InboxLayer, InboxStore};
pub use lifeline::{Cancellation, Lifeline};
pub use partition::{Partition, PartitionLayer};
pub use pause::{Circuit, Pause, PauseHandle, PauseLayer};
pub use publish::{ErrorReply, Outgoing, Publish, PublishError};
pub use redelivery::{RedeliveryLimit, RedeliveryLimitLayer};
pub use retry::{delay_label, rung_name, Retry, RetryLayer, RetryPolicy, RetryWaits};
pub use verdict::{IntoVerdict, Verdict};

//! The breaker's state machine: what one attempt's result does to the
//! circuit. The circuit's state itself lives in the gate's word (see
//! `pause/circuit.rs`); this keeps the window, the policy and the count of
//! failed probes.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::policy::BreakerPolicy;
use super::window::{Tally, Window};
use crate::decision::Decision;
use crate::error::{BoxError, Class, Classify};
use crate::pause::{record_transition, Circuit, PauseHandle};

/// What one attempt says about the handler's downstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// It answered (a success, or a verdict of its own).
    Success,
    /// A transient failure or a timeout.
    Failure,
    /// Nothing: a permanent rejection, a panic, a hand-back, an abandoned
    /// handler.
    Nothing,
}

pub(crate) struct Shared<C> {
    pub(crate) gate: PauseHandle,
    pub(crate) policy: BreakerPolicy,
    pub(crate) classifier: C,
    window: Arc<Window>,
    /// Failed probes since the circuit last closed (the cool-down grows
    /// with it).
    reopens: AtomicU32,
}

impl<C: Classify> Shared<C> {
    pub(crate) fn new(gate: PauseHandle, policy: BreakerPolicy, classifier: C) -> Self {
        Shared {
            window: Arc::new(Window::new(policy.window)),
            gate,
            policy,
            classifier,
            reopens: AtomicU32::new(0),
        }
    }

    /// What an attempt's result says.
    #[inline]
    pub(crate) fn judge(&self, result: &Result<Decision, BoxError>) -> Seen {
        match result {
            Ok(Decision::HandBack | Decision::Abandoned) => Seen::Nothing,
            Ok(_) => Seen::Success,
            Err(e) => match self.classifier.classify(&**e) {
                Class::Transient | Class::Timeout => Seen::Failure,
                _ => Seen::Nothing,
            },
        }
    }

    /// Acts on one attempt's result; `probe` is the epoch of the half-open
    /// phase that let it through as its probe.
    #[inline]
    pub(crate) fn observe(self: &Arc<Self>, seen: Seen, probe: Option<u64>) {
        let word = self.gate.shared.word();
        if let Some(epoch) = probe {
            if word.circuit() == Circuit::HalfOpen && word.epoch() == epoch {
                self.decide_probe(epoch, seen);
                return;
            }
        }
        // Results of deliveries let through before a trip (or retried in
        // process since) say nothing once the circuit is open.
        if word.circuit() != Circuit::Closed || seen == Seen::Nothing {
            return;
        }
        if seen == Seen::Success {
            self.count_success();
            return;
        }
        // A failure reads the clock: the tally it is judged on is exact.
        let now = Instant::now();
        self.window.record(now, true);
        let tally = self.window.tally(now);
        if self.trips(tally) {
            self.trip(tally);
        }
    }

    /// A success goes into the bucket the window's ticker keeps (no clock
    /// read); before the ticker runs, into the clock's.
    #[inline]
    fn count_success(&self) {
        match self.window.ticked() {
            Some(seq) => self.window.record_in(seq, false),
            None => {
                self.window.record(Instant::now(), false);
                self.window.keep_ticking();
            }
        }
    }

    fn trips(&self, tally: Tally) -> bool {
        tally.calls >= u64::from(self.policy.minimum_calls.max(1))
            && tally.failures as f64 >= self.policy.failure_ratio * tally.calls as f64
    }

    fn queue(&self) -> &str {
        self.gate.shared.queue().map_or("", |q| q)
    }

    fn record(&self, to: Circuit) {
        if let Some(queue) = self.gate.shared.queue() {
            record_transition(queue, to);
        }
    }

    fn trip(self: &Arc<Self>, tally: Tally) {
        let Some(epoch) = self.gate.trip() else {
            return;
        };
        self.window.reset();
        self.reopens.store(0, Ordering::Relaxed);
        let cool_down = self.policy.cool_down;
        tracing::warn!(
            queue = self.queue(),
            failures = tally.failures,
            attempts = tally.calls,
            ?cool_down,
            "circuit open: {} of the last {} attempts failed (within {:?}); the gate holds every delivery for {cool_down:?}, then lets one through as a probe",
            tally.failures,
            tally.calls,
            self.policy.window,
        );
        self.record(Circuit::Open);
        self.after_cool_down(epoch, cool_down);
    }

    fn decide_probe(self: &Arc<Self>, epoch: u64, seen: Seen) {
        match seen {
            Seen::Success => {
                if self.gate.close_circuit(epoch) {
                    self.window.reset();
                    self.reopens.store(0, Ordering::Relaxed);
                    tracing::info!(
                        queue = self.queue(),
                        "circuit closed: the probe succeeded; the gate lets every delivery through again"
                    );
                    self.record(Circuit::Closed);
                }
            }
            Seen::Failure => {
                if let Some(next) = self.gate.reopen(epoch) {
                    let reopens = self.reopens.fetch_add(1, Ordering::Relaxed) + 1;
                    let cool_down = self.policy.cool_down_after(reopens);
                    tracing::warn!(
                        queue = self.queue(),
                        failed_probes = reopens,
                        ?cool_down,
                        "circuit open again: the probe failed; the next probe in {cool_down:?}"
                    );
                    self.record(Circuit::Open);
                    self.after_cool_down(next, cool_down);
                }
            }
            Seen::Nothing => {
                if self.gate.release_probe(epoch) {
                    tracing::debug!(
                        queue = self.queue(),
                        "the circuit's probe told nothing (rejected, handed back or abandoned); the next delivery is the probe"
                    );
                }
            }
        }
    }

    /// Half-opens the circuit of `epoch` once `cool_down` has passed (at
    /// once without a tokio runtime to wait on).
    fn after_cool_down(self: &Arc<Self>, epoch: u64, cool_down: Duration) {
        let shared = self.clone();
        match tokio::runtime::Handle::try_current().ok() {
            Some(rt) => {
                rt.spawn(async move {
                    tokio::time::sleep(cool_down).await;
                    shared.half_open(epoch);
                });
            }
            None => shared.half_open(epoch),
        }
    }

    fn half_open(&self, epoch: u64) {
        if self.gate.half_open(epoch).is_some() {
            tracing::info!(
                queue = self.queue(),
                "circuit half-open: the cool-down has passed; the next delivery goes through as a probe, the others stay held"
            );
            self.record(Circuit::HalfOpen);
        }
    }
}

impl<C> fmt::Debug for Shared<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("circuit", &self.gate.circuit())
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

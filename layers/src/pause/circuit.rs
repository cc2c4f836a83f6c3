//! The gate's one word: who holds it (the operator, the circuit breaker,
//! the drain) and the circuit's state, with the epoch that tells one
//! breaker transition from the next.
//!
//! Layout: the low 8 bits are flags, the high 56 bits the circuit's epoch,
//! bumped by every change of the circuit (so a timer or a probe's result
//! from an earlier phase recognises it is stale and does nothing).

use std::fmt;
use std::sync::Arc;

/// The drain closed the gate: everything is handed back. Final.
pub(crate) const CLOSED: u64 = 1;
/// The operator paused the gate.
pub(crate) const OPERATOR: u64 = 1 << 1;
/// The circuit is open: the breaker holds everything.
pub(crate) const BREAKER_OPEN: u64 = 1 << 2;
/// The circuit is half-open: one probe may pass.
pub(crate) const HALF_OPEN: u64 = 1 << 3;
/// The half-open circuit's probe is out.
pub(crate) const PROBE_TAKEN: u64 = 1 << 4;

const FLAGS: u64 = 0xFF;
pub(crate) const EPOCH_ONE: u64 = 1 << 8;
pub(crate) const CIRCUIT_BITS: u64 = BREAKER_OPEN | HALF_OPEN | PROBE_TAKEN;

/// One reading of the gate's word.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) u64);

impl Word {
    /// Nothing holds the gate: a request goes straight through.
    #[inline]
    pub(crate) fn is_clear(self) -> bool {
        self.0 & FLAGS == 0
    }

    #[inline]
    pub(crate) fn has(self, flag: u64) -> bool {
        self.0 & flag != 0
    }

    #[inline]
    pub(crate) fn epoch(self) -> u64 {
        self.0 >> 8
    }

    pub(crate) fn circuit(self) -> Circuit {
        if self.has(BREAKER_OPEN) {
            Circuit::Open
        } else if self.has(HALF_OPEN) {
            Circuit::HalfOpen
        } else {
            Circuit::Closed
        }
    }

    /// Whether new requests are held, all of them: paused by the operator
    /// or by an open circuit (not closed by the drain).
    pub(crate) fn is_paused(self) -> bool {
        !self.has(CLOSED) && self.has(OPERATOR | BREAKER_OPEN)
    }
}

impl fmt::Debug for Word {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("closed", &self.has(CLOSED))
            .field("operator_paused", &self.has(OPERATOR))
            .field("circuit", &self.circuit())
            .field("probe_out", &self.has(PROBE_TAKEN))
            .finish()
    }
}

/// The state of a queue's circuit breaker, as the gate carries it; see
/// [`breaker`](crate::breaker).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Circuit {
    /// Deliveries pass (unless the operator paused the gate); attempts are
    /// counted. Also the state of a gate without a breaker.
    Closed,
    /// Too many attempts failed: the gate holds every delivery until the
    /// cool-down has passed.
    Open,
    /// The cool-down has passed: one delivery goes through as a probe, the
    /// others are held until its first attempt decides.
    HalfOpen,
}

impl Circuit {
    /// `closed`, `open` or `half_open`: the health snapshot's and the
    /// admin router's `circuit` field, and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Circuit::Closed => "closed",
            Circuit::Open => "open",
            Circuit::HalfOpen => "half_open",
        }
    }
}

impl fmt::Display for Circuit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Marks the delivery a half-open gate let through as its probe, with the
/// epoch it was let through in (read by the breaker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProbeMark(pub(crate) u64);

/// The metrics of a circuit's transition to `to` (the log line is the
/// caller's: it knows why).
pub(crate) fn record_transition(queue: &Arc<str>, to: Circuit) {
    metrics::counter!(
        "acemq.circuit.transitions",
        "queue" => queue.clone(),
        "to" => to.as_str()
    )
    .increment(1);
    let open = if to == Circuit::Closed { 0.0 } else { 1.0 };
    metrics::gauge!("acemq.circuit.open", "queue" => queue.clone()).set(open);
}

//! The gate's state, shared by the handle and every request.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use std::sync::OnceLock;

use super::circuit::{
    record_transition, Circuit, Word, BREAKER_OPEN, CIRCUIT_BITS, CLOSED, EPOCH_ONE, HALF_OPEN,
    OPERATOR, PROBE_TAKEN,
};
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::Notify;

/// What the gate does with a request, read once at the call (and again at
/// every wake of a held one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Call the inner service now.
    Call,
    /// Call it as the half-open circuit's probe of this epoch.
    Probe(u64),
    /// Hold the request.
    Hold,
    /// Hand it back (the gate is closed).
    HandBack,
}

pub(crate) struct Shared {
    /// Flags and the circuit's epoch: see `circuit.rs`.
    state: AtomicU64,
    held: AtomicUsize,
    /// Bumped by `hand_back_held`: a request held before it is handed back.
    evictions: AtomicU64,
    pub(crate) notify: Arc<Notify>,
    /// The queue the breaker on this gate serves (set by the breaker at
    /// its first request), for the log and metrics of an operator's
    /// override.
    queue: OnceLock<Arc<str>>,
}

impl Shared {
    #[inline]
    pub(crate) fn word(&self) -> Word {
        Word(self.state.load(Ordering::Acquire))
    }

    /// What to do with a request now; takes the probe of a half-open
    /// circuit when it is free.
    #[inline]
    pub(crate) fn admit(&self) -> Admit {
        let mut w = self.word();
        loop {
            if w.is_clear() {
                return Admit::Call;
            }
            if w.has(CLOSED) {
                return Admit::HandBack;
            }
            if w.has(OPERATOR | BREAKER_OPEN) || !w.has(HALF_OPEN) || w.has(PROBE_TAKEN) {
                return Admit::Hold;
            }
            match self.state.compare_exchange(
                w.0,
                w.0 | PROBE_TAKEN,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Admit::Probe(w.epoch()),
                Err(now) => w = Word(now),
            }
        }
    }

    /// Applies `f` to the word until it sticks; `(old, new)` when `f`
    /// changed it, and then wakes every waiter.
    pub(crate) fn update(&self, mut f: impl FnMut(Word) -> Option<u64>) -> Option<(Word, Word)> {
        let mut cur = self.word();
        loop {
            let new = f(cur)?;
            match self
                .state
                .compare_exchange(cur.0, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.notify.notify_waiters();
                    return Some((cur, Word(new)));
                }
                Err(now) => cur = Word(now),
            }
        }
    }

    /// Names the queue of the breaker on this gate (first name wins).
    #[inline]
    pub(crate) fn name_queue(&self, queue: &Arc<str>) {
        if self.queue.get().is_none() {
            let _ = self.queue.set(queue.clone());
        }
    }

    pub(crate) fn queue(&self) -> Option<&Arc<str>> {
        self.queue.get()
    }
}

/// Controls a pause gate: [`pause`](Self::pause), [`resume`](Self::resume),
/// [`close`](Self::close), and carries the state of a circuit breaker on
/// it ([`circuit`](Self::circuit)); see the [module docs](super).
///
/// Clones control the same gate.
#[derive(Clone)]
pub struct PauseHandle {
    pub(crate) shared: Arc<Shared>,
}

impl PauseHandle {
    /// An open gate.
    pub fn new() -> Self {
        PauseHandle {
            shared: Arc::new(Shared {
                state: AtomicU64::new(0),
                held: AtomicUsize::new(0),
                evictions: AtomicU64::new(0),
                notify: Arc::new(Notify::new()),
                queue: OnceLock::new(),
            }),
        }
    }

    /// The operator's pause: holds new requests until
    /// [`resume`](Self::resume) (or hands them back at
    /// [`close`](Self::close)), whatever a circuit breaker on the gate
    /// says. Does nothing on a closed gate; returns whether this call paused
    /// it (`false` when the operator had already, or it is closed).
    pub fn pause(&self) -> bool {
        self.shared
            .update(|w| (!w.has(CLOSED | OPERATOR)).then_some(w.0 | OPERATOR))
            .is_some()
    }

    /// Hands back every request held now (each resolves to
    /// [`Decision::HandBack`](crate::Decision::HandBack)); the gate stays
    /// paused, and requests that arrive later are held again. For a
    /// transport that gives a long-paused queue's work back to the broker,
    /// so other consumers can take it.
    pub fn hand_back_held(&self) {
        self.shared.evictions.fetch_add(1, Ordering::AcqRel);
        self.shared.notify.notify_waiters();
    }

    /// Resolves once the gate has been paused (by the operator or an open
    /// circuit: [`is_paused`](Self::is_paused)) for `bound` without a change
    /// in between (never while it is closed).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn paused_for(&self, bound: Duration) {
        loop {
            let notified = self.shared.notify.clone().notified_owned();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let w = self.shared.word();
            if w.has(CLOSED) {
                std::future::pending::<()>().await;
            } else if w.is_paused() {
                let sleep = tokio::time::sleep(bound);
                tokio::pin!(sleep);
                // Any change (a resume, even one followed at once by
                // another pause; a circuit's transition) starts the bound
                // over.
                if let futures::future::Either::Left(((), _)) =
                    futures::future::select(sleep.as_mut(), notified.as_mut()).await
                {
                    if self.is_paused() {
                        return;
                    }
                }
            } else {
                notified.await;
            }
        }
    }

    /// Resolves once the gate is not paused (open, half-open or closed).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn resumed(&self) {
        loop {
            let notified = self.shared.notify.clone().notified_owned();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.is_paused() {
                return;
            }
            notified.await;
        }
    }

    /// The operator's resume: lifts the operator's pause and releases every
    /// held request, in arrival order. On an open or half-open circuit it
    /// also overrides the breaker: the circuit closes (logged, counted in
    /// `acemq.circuit.transitions`) until the breaker trips again. Does
    /// nothing on a closed gate; returns whether the gate was paused or its
    /// circuit open or half-open.
    pub fn resume(&self) -> bool {
        let changed = self.shared.update(|w| {
            if w.has(CLOSED) || !w.has(OPERATOR | CIRCUIT_BITS) {
                return None;
            }
            let cleared = w.0 & !(OPERATOR | CIRCUIT_BITS);
            Some(if w.has(CIRCUIT_BITS) {
                cleared + EPOCH_ONE
            } else {
                cleared
            })
        });
        let Some((old, _)) = changed else {
            return false;
        };
        if old.circuit() != Circuit::Closed {
            if let Some(queue) = self.shared.queue() {
                tracing::warn!(
                    queue = %queue,
                    from = %old.circuit(),
                    "circuit closed by the operator's resume: deliveries pass again until the breaker trips anew"
                );
                record_transition(queue, Circuit::Closed);
            }
        }
        true
    }

    /// Closes the gate for good: every held request and every later one
    /// resolves to [`Decision::HandBack`](crate::Decision::HandBack) without
    /// reaching the inner service. Returns whether this call closed it.
    pub fn close(&self) -> bool {
        let was = self.shared.state.fetch_or(CLOSED, Ordering::AcqRel);
        self.shared.notify.notify_waiters();
        !Word(was).has(CLOSED)
    }

    /// Whether the gate holds every new request: paused by the operator or
    /// by an open circuit (not half-open, not closed: see
    /// [`is_closed`](Self::is_closed)).
    pub fn is_paused(&self) -> bool {
        self.shared.word().is_paused()
    }

    /// Whether the operator paused the gate (and has not resumed it), on a
    /// gate that is not closed.
    pub fn is_paused_by_operator(&self) -> bool {
        let w = self.shared.word();
        w.has(OPERATOR) && !w.has(CLOSED)
    }

    /// The state of the circuit breaker on this gate;
    /// [`Circuit::Closed`] without one.
    pub fn circuit(&self) -> Circuit {
        self.shared.word().circuit()
    }

    /// Whether the gate is closed.
    pub fn is_closed(&self) -> bool {
        self.shared.word().has(CLOSED)
    }

    /// How many requests are held in the gate now.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::Acquire)
    }

    /// The breaker trips a closed circuit: open, every new request held.
    /// The new epoch, or `None` when the circuit was not closed or the gate
    /// is.
    pub(crate) fn trip(&self) -> Option<u64> {
        self.shared
            .update(|w| (!w.has(CLOSED | CIRCUIT_BITS)).then_some((w.0 | BREAKER_OPEN) + EPOCH_ONE))
            .map(|(_, new)| new.epoch())
    }

    /// The probe of `epoch` failed: open again. The new epoch, or `None`
    /// when that half-open phase is over.
    pub(crate) fn reopen(&self, epoch: u64) -> Option<u64> {
        self.shared
            .update(|w| {
                let current = !w.has(CLOSED) && w.has(HALF_OPEN) && w.epoch() == epoch;
                current.then_some(((w.0 & !CIRCUIT_BITS) | BREAKER_OPEN) + EPOCH_ONE)
            })
            .map(|(_, new)| new.epoch())
    }

    /// The cool-down of `epoch` has passed: half-open, one probe may pass.
    /// The new epoch, or `None` when that open phase is over.
    pub(crate) fn half_open(&self, epoch: u64) -> Option<u64> {
        self.shared
            .update(|w| {
                let current = !w.has(CLOSED) && w.has(BREAKER_OPEN) && w.epoch() == epoch;
                current.then_some(((w.0 & !CIRCUIT_BITS) | HALF_OPEN) + EPOCH_ONE)
            })
            .map(|(_, new)| new.epoch())
    }

    /// The probe of `epoch` succeeded: closed, every held request released.
    pub(crate) fn close_circuit(&self, epoch: u64) -> bool {
        self.shared
            .update(|w| {
                let current = !w.has(CLOSED) && w.has(HALF_OPEN) && w.epoch() == epoch;
                current.then_some((w.0 & !CIRCUIT_BITS) + EPOCH_ONE)
            })
            .is_some()
    }

    /// The probe of `epoch` told nothing (a permanent rejection, a hand
    /// back, never reached the breaker): another request may be the probe.
    pub(crate) fn release_probe(&self, epoch: u64) -> bool {
        release_probe(&self.shared, epoch)
    }
}

pub(crate) fn release_probe(shared: &Shared, epoch: u64) -> bool {
    shared
        .update(|w| {
            let current =
                w.has(HALF_OPEN) && w.has(PROBE_TAKEN) && !w.has(CLOSED) && w.epoch() == epoch;
            current.then_some((w.0 & !PROBE_TAKEN) + EPOCH_ONE)
        })
        .is_some()
}

impl Default for PauseHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for PauseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PauseHandle")
            .field("state", &self.shared.word())
            .field("held", &self.held())
            .finish()
    }
}

/// One held request: counted on creation, uncounted on drop.
pub(crate) struct HeldGuard {
    shared: Arc<Shared>,
    epoch: u64,
}

impl HeldGuard {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        shared.held.fetch_add(1, Ordering::AcqRel);
        let epoch = shared.evictions.load(Ordering::Acquire);
        HeldGuard { shared, epoch }
    }

    /// Whether `hand_back_held` was called since this request was held.
    pub(crate) fn evicted(&self) -> bool {
        self.shared.evictions.load(Ordering::Acquire) != self.epoch
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    pub(crate) fn shared_arc(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        self.shared.held.fetch_sub(1, Ordering::AcqRel);
    }
}

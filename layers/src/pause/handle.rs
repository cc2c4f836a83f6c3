//! The gate's state, shared by the handle and every request.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use crate::sync::Notify;

const OPEN: u8 = 0;
const PAUSED: u8 = 1;
const CLOSED: u8 = 2;

/// The state of the gate, as read by a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Open,
    Paused,
    Closed,
}

pub(crate) struct Shared {
    state: AtomicU8,
    held: AtomicUsize,
    /// Bumped by `hand_back_held`: a request held before it is handed back.
    evictions: AtomicU64,
    pub(crate) notify: Arc<Notify>,
}

impl Shared {
    pub(crate) fn state(&self) -> State {
        match self.state.load(Ordering::Acquire) {
            OPEN => State::Open,
            PAUSED => State::Paused,
            _ => State::Closed,
        }
    }
}

/// Controls a pause gate: [`pause`](Self::pause), [`resume`](Self::resume),
/// [`close`](Self::close); see the [module docs](super).
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
                state: AtomicU8::new(OPEN),
                held: AtomicUsize::new(0),
                evictions: AtomicU64::new(0),
                notify: Arc::new(Notify::new()),
            }),
        }
    }

    /// Holds new requests until [`resume`](Self::resume) (or hands them back
    /// at [`close`](Self::close)). Does nothing on a closed gate; returns
    /// whether the gate was open.
    pub fn pause(&self) -> bool {
        let paused = self
            .shared
            .state
            .compare_exchange(OPEN, PAUSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if paused {
            self.shared.notify.notify_waiters();
        }
        paused
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

    /// Resolves once the gate has been paused for `bound` without a resume
    /// in between (at once if it is closed: never).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn paused_for(&self, bound: Duration) {
        loop {
            let notified = self.shared.notify.clone().notified_owned();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.shared.state() {
                State::Closed => std::future::pending::<()>().await,
                State::Paused => {
                    let sleep = tokio::time::sleep(bound);
                    tokio::pin!(sleep);
                    // Any change (a resume, even one followed at once by
                    // another pause) starts the bound over.
                    if let futures::future::Either::Left(((), _)) =
                        futures::future::select(sleep.as_mut(), notified.as_mut()).await
                    {
                        if self.is_paused() {
                            return;
                        }
                    }
                }
                State::Open => notified.await,
            }
        }
    }

    /// Resolves once the gate is not paused (open or closed).
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

    /// Reopens a paused gate and releases every held request, in arrival
    /// order. Does nothing on a closed gate; returns whether the gate was
    /// paused.
    pub fn resume(&self) -> bool {
        let resumed = self
            .shared
            .state
            .compare_exchange(PAUSED, OPEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if resumed {
            self.shared.notify.notify_waiters();
        }
        resumed
    }

    /// Closes the gate for good: every held request and every later one
    /// resolves to [`Decision::HandBack`](crate::Decision::HandBack) without
    /// reaching the inner service. Returns whether this call closed it.
    pub fn close(&self) -> bool {
        let was = self.shared.state.swap(CLOSED, Ordering::AcqRel);
        self.shared.notify.notify_waiters();
        was != CLOSED
    }

    /// Whether the gate is paused (not closed: see [`is_closed`](Self::is_closed)).
    pub fn is_paused(&self) -> bool {
        self.shared.state() == State::Paused
    }

    /// Whether the gate is closed.
    pub fn is_closed(&self) -> bool {
        self.shared.state() == State::Closed
    }

    /// How many requests are held in the gate now.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::Acquire)
    }
}

impl Default for PauseHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for PauseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PauseHandle")
            .field("state", &self.shared.state())
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
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        self.shared.held.fetch_sub(1, Ordering::AcqRel);
    }
}

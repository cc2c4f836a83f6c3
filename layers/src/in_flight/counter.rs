//! The shared counter: a total, per-queue counts and the idle signal.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use super::future::WaitIdle;
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::{self, Notify};

/// Counts the deliveries in flight, in total and per queue.
///
/// Cloning is cheap and every clone shares the same counts: give one to the
/// [`InFlightLayer`](super::InFlightLayer) and keep one for the drain.
#[derive(Clone)]
pub struct InFlightCounter {
    pub(crate) shared: Arc<Shared>,
    // The per-queue counts (apart from `Shared`, which every count points
    // to: a guard holds its count alone, one reference count per delivery).
    queues: Arc<Mutex<Vec<Arc<QueueCount>>>>,
}

pub(crate) struct Shared {
    pub(crate) total: AtomicUsize,
    pub(crate) idle: Arc<Notify>,
    /// Live `WaitIdle` futures: the last guard only touches the `Notify`
    /// (which takes a lock) when someone waits.
    pub(crate) waiters: AtomicUsize,
}

/// The count of one queue.
pub(crate) struct QueueCount {
    pub(crate) queue: Arc<str>,
    count: AtomicUsize,
    shared: Arc<Shared>,
}

impl QueueCount {
    /// Whether this counts `queue` (pointer first, then the text).
    pub(crate) fn is_for(&self, queue: &Arc<str>) -> bool {
        Arc::ptr_eq(&self.queue, queue) || *self.queue == **queue
    }
}

impl InFlightCounter {
    /// A counter at zero, with no queue seen yet.
    pub fn new() -> Self {
        InFlightCounter {
            shared: Arc::new(Shared {
                total: AtomicUsize::new(0),
                idle: Arc::new(Notify::new()),
                waiters: AtomicUsize::new(0),
            }),
            queues: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// How many deliveries are in flight, all queues together.
    pub fn total(&self) -> usize {
        self.shared.total.load(Ordering::Acquire)
    }

    /// How many deliveries from `queue` are in flight (0 for a queue never seen).
    pub fn get(&self, queue: &str) -> usize {
        self.lock()
            .iter()
            .find(|c| &*c.queue == queue)
            .map_or(0, |c| c.count.load(Ordering::Acquire))
    }

    /// The count of every queue seen so far, including those at 0.
    ///
    /// Each count is read on its own: while deliveries start and finish, the
    /// sum may differ from [`total`](Self::total) read a moment apart.
    pub fn snapshot(&self) -> BTreeMap<String, usize> {
        self.lock()
            .iter()
            .map(|c| (c.queue.to_string(), c.count.load(Ordering::Acquire)))
            .collect()
    }

    /// The names of every queue seen so far, in name order.
    pub fn queues(&self) -> Vec<String> {
        self.snapshot().into_keys().collect()
    }

    /// A future that resolves when nothing is in flight.
    ///
    /// It resolves at once if the total is 0 when first polled; otherwise it
    /// resolves when the delivery that brings the total to 0 ends. Nothing
    /// polls: the last guard to drop wakes every waiter.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: dropping the future unregisters it and loses nothing;
    /// call `wait_idle` again to wait again.
    pub fn wait_idle(&self) -> WaitIdle {
        WaitIdle::new(self.shared.clone())
    }

    /// The count of `queue`: `last` (the last queue a service saw) if it
    /// is that queue's, so the hot path needs no lock; else from the
    /// registry (created on first sight), and kept in `last`.
    pub(crate) fn queue_count(
        &self,
        last: &mut Option<Arc<QueueCount>>,
        queue: &Arc<str>,
    ) -> Arc<QueueCount> {
        match last {
            Some(count) if count.is_for(queue) => count.clone(),
            _ => {
                let count = self.registered(queue);
                *last = Some(count.clone());
                count
            }
        }
    }

    /// The count of `queue` in the registry, created on first sight.
    fn registered(&self, queue: &Arc<str>) -> Arc<QueueCount> {
        let mut queues = self.lock();
        if let Some(count) = queues.iter().find(|c| c.is_for(queue)) {
            return count.clone();
        }
        let count = Arc::new(QueueCount {
            queue: queue.clone(),
            count: AtomicUsize::new(0),
            shared: self.shared.clone(),
        });
        queues.push(count.clone());
        count
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<QueueCount>>> {
        // The registry is only pushed to; a panic elsewhere cannot leave it
        // inconsistent, so a poisoned lock is still good.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for InFlightCounter {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for InFlightCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightCounter")
            .field("total", &self.total())
            .field("queues", &self.snapshot())
            .finish()
    }
}

impl fmt::Debug for QueueCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueCount")
            .field("queue", &self.queue)
            .field("count", &self.count.load(Ordering::Relaxed))
            .finish()
    }
}

/// One delivery in flight: counted on creation, uncounted on drop.
pub(crate) struct Guard {
    of: Arc<QueueCount>,
}

impl Guard {
    pub(crate) fn new(of: Arc<QueueCount>) -> Self {
        of.count.fetch_add(1, Ordering::AcqRel);
        of.shared.total.fetch_add(1, Ordering::AcqRel);
        Guard { of }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let shared = &self.of.shared;
        self.of.count.fetch_sub(1, Ordering::AcqRel);
        // `total` written, then `waiters` read; `WaitIdle` does the
        // opposite: in the single order of `SeqCst` accesses one of the
        // two sees the other's write, so the last guard either sees the
        // waiter or the waiter sees 0.
        if shared.total.fetch_sub(1, Ordering::SeqCst) == 1 {
            sync::seq_cst_order();
            if shared.waiters.load(Ordering::SeqCst) > 0 {
                shared.idle.notify_waiters();
            }
        }
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("queue", &self.of.queue)
            .finish()
    }
}

//! The state every clone of one partition layer shares: which keys run,
//! who waits for each, and the bounds.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;

use futures::task::AtomicWaker;

/// The keys are hashes already: hashing them again would only cost.
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// One waiter's place in its key's line: granted when the key passes to it.
pub(super) struct Turn {
    granted: AtomicBool,
    waker: AtomicWaker,
}

impl Turn {
    pub(super) fn is_granted(&self) -> bool {
        self.granted.load(Ordering::Acquire)
    }

    pub(super) fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }
}

/// A running key: whoever holds it, and who waits, in arrival order.
#[derive(Default)]
struct Line {
    waiters: VecDeque<Arc<Turn>>,
}

/// The bounds on waiting deliveries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Bounds {
    pub(super) per_key: usize,
    pub(super) total: usize,
}

pub(super) struct Table {
    lines: HashMap<u64, Line, BuildHasherDefault<IdHasher>>,
    /// Deliveries waiting for their key, all keys.
    waiting: usize,
    /// Keys whose line is at `per_key`.
    full_keys: usize,
    /// Callers of `poll_ready` waiting for room.
    ready: Vec<Waker>,
}

/// What the clones of one layer share.
pub(super) struct Shared {
    table: Mutex<Table>,
    pub(super) bounds: Bounds,
    /// Whether another delivery may come in (what `has_room` said at the
    /// last change): `poll_ready` reads it without the lock.
    room: AtomicBool,
}

/// What [`Shared::enter`] decided.
pub(super) enum Entry {
    /// The key was free: it is the caller's now.
    Run,
    /// The key runs: wait for this turn.
    Wait(Arc<Turn>),
}

impl Shared {
    pub(super) fn new(bounds: Bounds, keys: usize) -> Self {
        Shared {
            table: Mutex::new(Table {
                lines: HashMap::with_capacity_and_hasher(keys, BuildHasherDefault::default()),
                waiting: 0,
                full_keys: 0,
                ready: Vec::new(),
            }),
            bounds,
            room: AtomicBool::new(bounds.total > 0 && bounds.per_key > 0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Every update is complete before anything that could panic.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn has_room(&self, t: &Table) -> bool {
        t.full_keys == 0 && t.waiting < self.bounds.total
    }

    /// Whether another delivery may come in; registers `waker` if not.
    pub(super) fn poll_room(&self, waker: &Waker) -> bool {
        if self.room.load(Ordering::Acquire) {
            return true;
        }
        let mut t = self.lock();
        if self.has_room(&t) {
            return true;
        }
        if !t.ready.iter().any(|w| w.will_wake(waker)) {
            t.ready.push(waker.clone());
        }
        false
    }

    /// A delivery of `key` arrives: it runs if the key is free, else waits.
    pub(super) fn enter(&self, key: u64) -> Entry {
        let mut t = self.lock();
        let t = &mut *t;
        match t.lines.entry(key) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Line::default());
                Entry::Run
            }
            std::collections::hash_map::Entry::Occupied(mut o) => {
                let turn = Arc::new(Turn {
                    granted: AtomicBool::new(false),
                    waker: AtomicWaker::new(),
                });
                let line = o.get_mut();
                line.waiters.push_back(turn.clone());
                t.waiting += 1;
                if line.waiters.len() == self.bounds.per_key {
                    t.full_keys += 1;
                }
                self.room.store(self.has_room(t), Ordering::Release);
                Entry::Wait(turn)
            }
        }
    }

    /// The holder of `key` is done: the key passes to its first waiter, or
    /// is free.
    pub(super) fn release(&self, key: u64) {
        let woken = {
            let mut t = self.lock();
            let t = &mut *t;
            let Some(line) = t.lines.get_mut(&key) else {
                return;
            };
            match line.waiters.pop_front() {
                Some(next) => {
                    if line.waiters.len() + 1 == self.bounds.per_key {
                        t.full_keys -= 1;
                    }
                    t.waiting -= 1;
                    next.granted.store(true, Ordering::Release);
                    next.waker.wake();
                }
                None => {
                    t.lines.remove(&key);
                }
            }
            self.take_ready(t)
        };
        for w in woken {
            w.wake();
        }
    }

    /// A waiter of `key` gives up its place (its future was dropped): out
    /// of the line, or, if the key had passed to it already, passed on.
    pub(super) fn leave(&self, key: u64, turn: &Arc<Turn>) {
        let woken = {
            let mut t = self.lock();
            if turn.is_granted() {
                drop(t);
                self.release(key);
                return;
            }
            let t = &mut *t;
            if let Some(line) = t.lines.get_mut(&key) {
                if let Some(i) = line.waiters.iter().position(|w| Arc::ptr_eq(w, turn)) {
                    if line.waiters.len() == self.bounds.per_key {
                        t.full_keys -= 1;
                    }
                    line.waiters.remove(i);
                    t.waiting -= 1;
                }
            }
            self.take_ready(t)
        };
        for w in woken {
            w.wake();
        }
    }

    /// The `poll_ready` callers to wake, if there is room now.
    fn take_ready(&self, t: &mut Table) -> Vec<Waker> {
        self.room.store(self.has_room(t), Ordering::Release);
        if !t.ready.is_empty() && self.has_room(t) {
            std::mem::take(&mut t.ready)
        } else {
            Vec::new()
        }
    }

    /// Deliveries waiting for their key's turn now.
    pub(super) fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Keys running now.
    pub(super) fn running_keys(&self) -> usize {
        self.lock().lines.len()
    }
}

/// The key held by a running delivery: released when dropped.
pub(super) struct Held {
    pub(super) shared: Arc<Shared>,
    pub(super) key: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shared.release(self.key);
    }
}

/// A waiting delivery's place: left when dropped before it was turned
/// into a [`Held`].
pub(super) struct Place {
    pub(super) shared: Arc<Shared>,
    pub(super) key: u64,
    pub(super) turn: Option<Arc<Turn>>,
}

impl Place {
    /// The key is ours: from now on it is held.
    pub(super) fn into_held(mut self) -> Held {
        self.turn = None;
        Held {
            shared: self.shared.clone(),
            key: self.key,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(turn) = self.turn.take() {
            self.shared.leave(self.key, &turn);
        }
    }
}

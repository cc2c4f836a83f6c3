//! The state every clone of one partition layer shares: which keys run,
//! who waits for each, and the bounds.
//!
//! A key that runs with no one waiting for it lives in a fixed array of
//! slots, one word each, taken and freed with one compare-and-swap: the
//! pass-through path takes no lock. A slot goes over to the locked table
//! (its word becomes [`LOCKED`]) as soon as a key needs more than the word
//! can say — a second delivery of a running key, or a different key with
//! the same slot — and comes back when the table holds no key of that slot
//! any more. While a slot is locked every change to its keys is made under
//! the lock, so the table is the one place a waiter is queued and granted.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, PoisonError};
use std::task::Waker;

use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{AtomicWaker, Mutex, MutexGuard};

/// Slots of the lock-free path (a power of two). A key's slot is its low
/// bits; its word keeps the rest of the key, so two keys share a word only
/// if they are equal. Few under loom, so that keys collide in the models.
#[cfg(not(acemq_loom))]
const SLOTS: usize = 256;
#[cfg(acemq_loom)]
const SLOTS: usize = 4;
const SLOT_BITS: u64 = SLOTS as u64 - 1;

/// A free slot's word.
const FREE: u64 = 0;
/// The word of a slot whose keys are in the locked table.
const LOCKED: u64 = 1;
/// Set in the word of a slot whose key runs with no one waiting: the
/// word is the key's high bits with this flag in the slot's bits.
const HELD: u64 = 2;

fn slot_of(key: u64) -> usize {
    (key & SLOT_BITS) as usize
}

/// The word of a slot whose `key` runs with no one waiting.
fn held_word(key: u64) -> u64 {
    (key & !SLOT_BITS) | HELD
}

/// The key a [`held_word`] of slot `slot` stands for.
fn key_of(word: u64, slot: usize) -> u64 {
    (word & !SLOT_BITS) | slot as u64
}

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
    /// The running keys of the locked slots, with their waiters.
    lines: HashMap<u64, Line, BuildHasherDefault<IdHasher>>,
    /// Per slot, its keys in `lines`: the slot is free again at 0.
    in_lines: [u32; SLOTS],
    /// Deliveries waiting for their key, all keys.
    waiting: usize,
    /// Keys whose line is at `per_key`.
    full_keys: usize,
    /// Callers of `poll_ready` waiting for room.
    ready: Vec<Waker>,
}

/// What the clones of one layer share.
pub(super) struct Shared {
    /// The lock-free path: per slot, [`FREE`], [`LOCKED`] or a
    /// [`held_word`].
    slots: [AtomicU64; SLOTS],
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
            slots: std::array::from_fn(|_| AtomicU64::new(FREE)),
            table: Mutex::new(Table {
                lines: HashMap::with_capacity_and_hasher(keys, BuildHasherDefault::default()),
                in_lines: [0; SLOTS],
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
    #[inline]
    pub(super) fn poll_room(&self, waker: &Waker) -> bool {
        if self.room.load(Ordering::Acquire) {
            return true;
        }
        self.poll_room_locked(waker)
    }

    #[cold]
    fn poll_room_locked(&self, waker: &Waker) -> bool {
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
    #[inline]
    pub(super) fn enter(&self, key: u64) -> Entry {
        // A free slot: the key is free, and now the caller's (acquiring
        // what its last holder did).
        let slot = &self.slots[slot_of(key)];
        if slot
            .compare_exchange(FREE, held_word(key), Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return Entry::Run;
        }
        self.enter_locked(key)
    }

    /// The holder of `key` is done: the key passes to its first waiter, or
    /// is free.
    #[inline]
    pub(super) fn release(&self, key: u64) {
        // Still the slot's word that `enter` wrote: no one waits.
        let slot = &self.slots[slot_of(key)];
        if slot
            .compare_exchange(held_word(key), FREE, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            self.release_locked(key);
        }
    }

    /// Locks `key`'s slot: from now on its keys change under the lock. A
    /// key that held the slot without the lock goes into the table.
    fn lock_slot(&self, t: &mut Table, key: u64) {
        let i = slot_of(key);
        let word = self.slots[i].swap(LOCKED, Ordering::AcqRel);
        if word != FREE && word != LOCKED {
            t.lines.insert(key_of(word, i), Line::default());
            t.in_lines[i] += 1;
        }
    }

    /// `enter` of a key whose slot is taken (by this key or another).
    #[cold]
    fn enter_locked(&self, key: u64) -> Entry {
        let mut t = self.lock();
        let t = &mut *t;
        self.lock_slot(t, key);
        match t.lines.entry(key) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Line::default());
                t.in_lines[slot_of(key)] += 1;
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

    /// `release` of a key in the locked table (its slot is locked).
    #[cold]
    fn release_locked(&self, key: u64) {
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
                    let i = slot_of(key);
                    t.in_lines[i] -= 1;
                    if t.in_lines[i] == 0 {
                        // No key of the slot is left in the table: the
                        // lock-free path may take it again.
                        self.slots[i].store(FREE, Ordering::Release);
                    }
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
                self.release_locked(key);
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

    /// Slots handed over to the locked table now (each frees once its
    /// keys are done).
    #[cfg(test)]
    pub(super) fn locked_slots(&self) -> usize {
        let _t = self.lock();
        self.slots
            .iter()
            .filter(|s| s.load(Ordering::Acquire) == LOCKED)
            .count()
    }

    /// Keys running now.
    pub(super) fn running_keys(&self) -> usize {
        let t = self.lock();
        let lock_free = self
            .slots
            .iter()
            .filter(|s| s.load(Ordering::Acquire) & HELD != 0)
            .count();
        t.lines.len() + lock_free
    }
}

/// The key held by a running delivery: released when dropped.
pub(super) struct Held {
    pub(super) shared: Arc<Shared>,
    pub(super) key: u64,
}

impl Drop for Held {
    #[inline]
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

//! What wakes a [`Slots`](super::Slots)' requests: one waker per slot,
//! made once, which sets the slot's bit and wakes the owner; and the marks
//! the owner reads back, which slots to poll and which to poll once more
//! after their first `Pending`.

use std::sync::Arc;
use std::task::{Wake, Waker};

use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::AtomicWaker;

/// Slots per chunk: one bit each in a word.
const BITS: usize = u64::BITS as usize;

/// The word of slot `i` in a bit set, and its bit there.
#[inline]
fn word_and_bit(i: usize) -> (usize, u64) {
    (i / BITS, 1u64 << (i % BITS))
}

/// Sixty-four slots' wake bits and the owner's waker.
struct Chunk {
    woken: AtomicU64,
    owner: Arc<AtomicWaker>,
}

/// The waker of one slot: made once, when the slot is, and reused by every
/// request the slot runs.
struct SlotWaker {
    chunk: Arc<Chunk>,
    bit: u64,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.chunk.woken.fetch_or(self.bit, Ordering::AcqRel);
        self.chunk.owner.wake();
    }
}

/// Every slot's waker, the bits they set, and the owner's marks.
pub(super) struct Wakers {
    wakers: Vec<Waker>,
    chunks: Vec<Arc<Chunk>>,
    // Slots to poll, taken from the chunks' bits (and set by `mark`).
    scan: Vec<u64>,
    // Slots to poll once more after their first `Pending`.
    nudge: Vec<u64>,
    owner: Arc<AtomicWaker>,
}

impl Wakers {
    /// Room for `n` slots' wakers; none made yet.
    pub(super) fn with_capacity(n: usize) -> Self {
        Wakers {
            wakers: Vec::with_capacity(n),
            chunks: Vec::new(),
            scan: Vec::new(),
            nudge: Vec::new(),
            owner: Arc::new(AtomicWaker::new()),
        }
    }

    /// Makes the waker of the next slot (the one at index
    /// [`len`](Self::len)).
    pub(super) fn add(&mut self) {
        let i = self.wakers.len();
        if i.is_multiple_of(BITS) {
            self.chunks.push(Arc::new(Chunk {
                woken: AtomicU64::new(0),
                owner: self.owner.clone(),
            }));
            self.scan.push(0);
            self.nudge.push(0);
        }
        let chunk = self.chunks[i / BITS].clone();
        self.wakers.push(Waker::from(Arc::new(SlotWaker {
            chunk,
            bit: word_and_bit(i).1,
        })));
    }

    /// How many slots have a waker.
    pub(super) fn len(&self) -> usize {
        self.wakers.len()
    }

    /// Slot `i`'s waker.
    #[inline]
    pub(super) fn get(&self, i: usize) -> &Waker {
        &self.wakers[i]
    }

    /// Marks slot `i` for a poll.
    #[inline]
    pub(super) fn mark(&mut self, i: usize) {
        let (w, bit) = word_and_bit(i);
        self.scan[w] |= bit;
    }

    /// Marks slot `i` to be polled once more after its next `Pending`.
    #[inline]
    pub(super) fn nudge(&mut self, i: usize) {
        let (w, bit) = word_and_bit(i);
        self.nudge[w] |= bit;
    }

    /// Unmarks slot `i`'s nudge; whether it was marked.
    #[inline]
    pub(super) fn take_nudge(&mut self, i: usize) -> bool {
        let (w, bit) = word_and_bit(i);
        let marked = self.nudge[w] & bit != 0;
        self.nudge[w] &= !bit;
        marked
    }

    /// Registers the owner's waker, then takes every slot woken since the
    /// last call as marked: registered before the bits are read, so a
    /// wake after this wakes the owner.
    #[inline]
    pub(super) fn register_and_take_woken(&mut self, owner: &Waker) {
        self.owner.register(owner);
        for (w, chunk) in self.chunks.iter().enumerate() {
            self.scan[w] |= chunk.woken.swap(0, Ordering::AcqRel);
        }
    }

    /// The lowest slot marked for a poll, unmarked.
    #[inline]
    pub(super) fn next_marked(&mut self) -> Option<usize> {
        let w = self.scan.iter().position(|&bits| bits != 0)?;
        let b = self.scan[w].trailing_zeros() as usize;
        self.scan[w] &= !(1u64 << b);
        Some(w * BITS + b)
    }
}

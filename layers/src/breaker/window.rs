//! The sliding window: a ring of counters, one per time bucket, updated
//! without a lock or an allocation; and the ticker that keeps the current
//! bucket, so that counting a success reads no clock.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::atomic::{AtomicU64, Ordering};

/// Buckets in the ring: the window slides a tenth at a time.
pub(crate) const BUCKETS: usize = 10;

// One bucket's word: its stamp (the bucket's sequence number, 24 bits),
// then its calls and failures (20 bits each, saturating).
const COUNT_BITS: u32 = 20;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const STAMP_MASK: u64 = (1 << 24) - 1;

// The ticker's word (`Window::current`): no ticker, one being started, one
// that gave up (a runtime without a timer), or `TICKING` with the current
// bucket's sequence.
const IDLE: u64 = 0;
const STARTING: u64 = 1 << 61;
const GAVE_UP: u64 = 1 << 62;
const TICKING: u64 = 1 << 63;

fn pack(stamp: u64, calls: u64, failures: u64) -> u64 {
    (stamp << (2 * COUNT_BITS)) | (calls << COUNT_BITS) | failures
}

fn stamp(word: u64) -> u64 {
    word >> (2 * COUNT_BITS)
}

fn calls(word: u64) -> u64 {
    (word >> COUNT_BITS) & COUNT_MAX
}

fn failures(word: u64) -> u64 {
    word & COUNT_MAX
}

/// Attempts and failures within the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) calls: u64,
    pub(crate) failures: u64,
}

pub(crate) struct Window {
    origin: Instant,
    width_nanos: u64,
    buckets: [AtomicU64; BUCKETS],
    /// The current bucket's sequence as the ticker last set it (with
    /// `TICKING`), or the ticker's state.
    current: AtomicU64,
}

impl Window {
    pub(crate) fn new(window: Duration) -> Self {
        let width = (window.as_nanos() / BUCKETS as u128).clamp(1, u128::from(u64::MAX));
        Window {
            origin: Instant::now(),
            width_nanos: width as u64,
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            current: AtomicU64::new(IDLE),
        }
    }

    /// The number of the bucket `now` falls in, counted from the origin.
    fn number(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(since).unwrap_or(u64::MAX) / self.width_nanos
    }

    fn sequence(&self, now: Instant) -> u64 {
        self.number(now) & STAMP_MASK
    }

    /// The current bucket's sequence without reading the clock, while the
    /// ticker keeps it (a tick late at most: see `tick`).
    #[inline]
    pub(crate) fn ticked(&self) -> Option<u64> {
        let word = self.current.load(Ordering::Acquire);
        (word & TICKING != 0).then_some(word & STAMP_MASK)
    }

    /// Counts one attempt at `now`.
    pub(crate) fn record(&self, now: Instant, failed: bool) {
        self.record_in(self.sequence(now), failed);
    }

    /// Counts one attempt in the bucket of sequence `seq`. A bucket that
    /// has moved on since (a later attempt rotated it: `seq` is a window or
    /// two behind) keeps its count: the attempt is out of the window.
    #[inline]
    pub(crate) fn record_in(&self, seq: u64, failed: bool) {
        let bucket = &self.buckets[(seq % BUCKETS as u64) as usize];
        let mut cur = bucket.load(Ordering::Relaxed);
        loop {
            let ahead = stamp(cur).wrapping_sub(seq) & STAMP_MASK;
            let (c, f) = if ahead == 0 {
                (calls(cur), failures(cur))
            } else if ahead <= 2 * BUCKETS as u64 {
                return;
            } else {
                (0, 0)
            };
            let new = pack(
                seq,
                (c + 1).min(COUNT_MAX),
                (f + u64::from(failed)).min(COUNT_MAX),
            );
            match bucket.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// The attempts of the buckets within the window at `now`.
    pub(crate) fn tally(&self, now: Instant) -> Tally {
        self.tally_at(self.sequence(now))
    }

    /// The attempts of the buckets within the window that ends with the
    /// bucket of sequence `seq`.
    pub(crate) fn tally_at(&self, seq: u64) -> Tally {
        let mut tally = Tally::default();
        for bucket in &self.buckets {
            let word = bucket.load(Ordering::Relaxed);
            let age = seq.wrapping_sub(stamp(word)) & STAMP_MASK;
            if age < BUCKETS as u64 {
                tally.calls += calls(word);
                tally.failures += failures(word);
            }
        }
        tally
    }

    /// Forgets every attempt (at a trip and when the circuit closes).
    pub(crate) fn reset(&self) {
        for bucket in &self.buckets {
            bucket.store(0, Ordering::Relaxed);
        }
    }

    /// Starts the ticker on the current tokio runtime, if there is one and
    /// no ticker runs (or gave up).
    pub(crate) fn keep_ticking(self: &Arc<Self>) {
        if self.current.load(Ordering::Relaxed) != IDLE {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self
            .current
            .compare_exchange(IDLE, STARTING, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        // Made out here: dropped with the task even if it never runs.
        let ticker = Ticker {
            window: Arc::downgrade(self),
            ticked: false,
        };
        rt.spawn(ticker.run());
    }
}

/// The task that keeps `Window::current`: at each bucket's start it
/// stores the bucket's sequence. It ends when the window is gone, and
/// when it ends (the runtime shut down) the window reads the clock again
/// until a ticker runs.
struct Ticker {
    window: Weak<Window>,
    /// Whether a tick's sleep ever ended: a ticker that ends before one did
    /// (a runtime without a timer panics at the first) is not started
    /// again.
    ticked: bool,
}

impl Ticker {
    async fn run(mut self) {
        loop {
            let Some(window) = self.window.upgrade() else {
                return;
            };
            let number = window.number(Instant::now());
            let next = number
                .checked_add(1)
                .and_then(|n| n.checked_mul(window.width_nanos))
                .and_then(|nanos| window.origin.checked_add(Duration::from_nanos(nanos)));
            let Some(next) = next else {
                return;
            };
            let sleep = tokio::time::sleep_until(next);
            window
                .current
                .store(TICKING | (number & STAMP_MASK), Ordering::Release);
            drop(window);
            sleep.await;
            self.ticked = true;
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        if let Some(window) = self.window.upgrade() {
            let state = if self.ticked { IDLE } else { GAVE_UP };
            window.current.store(state, Ordering::Release);
        }
    }
}

#[cfg(all(test, not(acemq_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_counts_and_the_window_slides_past_it() {
        let w = Window::new(Duration::from_secs(10));
        let t0 = w.origin;
        w.record(t0, true);
        w.record(t0 + Duration::from_millis(500), false);
        w.record(t0 + Duration::from_secs(5), true);
        let at = |s: u64| w.tally(t0 + Duration::from_millis(s));
        assert_eq!(
            at(5_000),
            Tally {
                calls: 3,
                failures: 2
            }
        );
        // The first bucket ([0 s, 1 s)) leaves the window at 10 s.
        assert_eq!(
            at(9_999),
            Tally {
                calls: 3,
                failures: 2
            }
        );
        assert_eq!(
            at(10_000),
            Tally {
                calls: 1,
                failures: 1
            }
        );
        assert_eq!(at(15_000), Tally::default());
    }

    #[test]
    fn a_reused_bucket_starts_from_zero() {
        let w = Window::new(Duration::from_secs(10));
        let t0 = w.origin;
        w.record(t0, true);
        w.record(t0 + Duration::from_secs(10), false);
        assert_eq!(
            w.tally(t0 + Duration::from_secs(10)),
            Tally {
                calls: 1,
                failures: 0
            }
        );
        w.reset();
        assert_eq!(w.tally(t0 + Duration::from_secs(10)), Tally::default());
    }

    #[test]
    fn a_late_result_leaves_a_bucket_that_moved_on_alone() {
        let w = Window::new(Duration::from_secs(10));
        w.record_in(13, true);
        // Bucket 3's result, a window late: it is out of the window.
        w.record_in(3, false);
        assert_eq!(
            w.tally_at(13),
            Tally {
                calls: 1,
                failures: 1
            }
        );
        // A bucket 10 windows old is reused as before.
        w.record_in(113, false);
        assert_eq!(
            w.tally_at(113),
            Tally {
                calls: 1,
                failures: 0
            }
        );
    }
}

//! The sliding window: a ring of counters, one per time bucket, updated
//! without a lock or an allocation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Buckets in the ring: the window slides a tenth at a time.
pub(crate) const BUCKETS: usize = 10;

// One bucket's word: its stamp (the bucket's sequence number, 24 bits),
// then its calls and failures (20 bits each, saturating).
const COUNT_BITS: u32 = 20;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const STAMP_MASK: u64 = (1 << 24) - 1;

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
}

impl Window {
    pub(crate) fn new(window: Duration) -> Self {
        let width = (window.as_nanos() / BUCKETS as u128).clamp(1, u128::from(u64::MAX));
        Window {
            origin: Instant::now(),
            width_nanos: width as u64,
            buckets: Default::default(),
        }
    }

    fn sequence(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin).as_nanos();
        let seq = since / u128::from(self.width_nanos);
        (seq as u64) & STAMP_MASK
    }

    /// Counts one attempt at `now`.
    #[inline]
    pub(crate) fn record(&self, now: Instant, failed: bool) {
        let seq = self.sequence(now);
        let bucket = &self.buckets[(seq % BUCKETS as u64) as usize];
        let mut cur = bucket.load(Ordering::Relaxed);
        loop {
            let (c, f) = if stamp(cur) == seq {
                (calls(cur), failures(cur))
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
        let seq = self.sequence(now);
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
}

#[cfg(test)]
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
}

//! Capped exponential backoff with full jitter: the one schedule for
//! reconnects, consumer recoveries and the outbox relay's retries. (The
//! retry layer keeps its own deterministic schedule: rung names and TTLs
//! depend on it.)

use std::time::Duration;

/// The first reconnect or recovery delay; it doubles up to [`BACKOFF_MAX`].
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(200);
/// The cap on the reconnect and recovery delay.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Capped exponential backoff with full jitter: the n-th delay is drawn
/// uniformly from `[0, min(min·2^(n-1), max)]`, so instances restarted
/// together (a broker restart) spread out instead of reconnecting in
/// lockstep — also at the cap, where tower's `ExponentialBackoff` stops
/// jittering.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    base: Duration,
    rng: fastrand::Rng,
}

impl Backoff {
    /// Reconnects and recoveries: from 200 ms up to 10 s.
    pub(crate) fn new() -> Self {
        Backoff::between(BACKOFF_MIN, BACKOFF_MAX)
    }

    /// From `min`, doubling up to `max`.
    pub(crate) fn between(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            base: min,
            rng: fastrand::Rng::new(),
        }
    }

    /// The next delay.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.base.mul_f64(self.rng.f64());
        self.base = (self.base * 2).min(self.max);
        d
    }

    /// Back to the first delay (after a success).
    pub(crate) fn reset(&mut self) {
        self.base = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_under_a_doubling_cap_and_are_spread() {
        let mut b = Backoff::between(Duration::from_millis(100), Duration::from_millis(800));
        let caps = [100u64, 200, 400, 800, 800, 800];
        for cap in caps {
            let d = b.next_delay();
            assert!(d <= Duration::from_millis(cap), "{d:?} above {cap} ms");
        }
        // At the cap, 200 draws are not all alike (full jitter).
        let draws: std::collections::BTreeSet<_> = (0..200).map(|_| b.next_delay()).collect();
        assert!(draws.len() > 100, "{} distinct delays", draws.len());
        assert!(draws.iter().any(|d| *d < Duration::from_millis(400)));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn two_backoffs_do_not_draw_in_lockstep() {
        let mut a = Backoff::new();
        let mut b = Backoff::new();
        let same = (0..20).filter(|_| a.next_delay() == b.next_delay()).count();
        assert!(same < 20);
    }
}

//! Capped exponential backoff with full jitter, for reconnects and
//! recoveries.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::Duration;

/// The first reconnect or recovery delay; it doubles up to [`BACKOFF_MAX`].
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(200);
/// The cap on the reconnect and recovery delay.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Capped exponential backoff with full jitter: each delay is drawn from
/// `[base/2, base]`, so instances restarted together (a broker restart)
/// spread out instead of reconnecting in lockstep — also at the cap, where
/// tower's `ExponentialBackoff` stops jittering.
#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    seed: RandomState,
    n: u64,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff {
            base: BACKOFF_MIN,
            seed: RandomState::new(),
            n: 0,
        }
    }

    /// The next delay.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let r = self.seed.hash_one(self.n);
        self.n += 1;
        let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
        let d = self.base.mul_f64(0.5 + 0.5 * unit);
        self.base = (self.base * 2).min(BACKOFF_MAX);
        d
    }

    pub(crate) fn reset(&mut self) {
        self.base = BACKOFF_MIN;
    }
}

//! The retry schedule and the names of its rung queues.

use std::time::Duration;

/// A retry schedule: attempt `n` that fails is followed by attempt `n + 1`
/// after `min(initial_delay · 2^(n-1), max_delay)`. A delay at or above
/// `broker_wait_threshold` is spent on a rung queue in the broker; a shorter
/// one in this process.
///
/// The struct is `#[non_exhaustive]`: start from [`RetryPolicy::exponential`]
/// (or [`RetryPolicy::none`]) and set the other fields.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts in all, the first included (≥ 1). 1 means no retry.
    pub max_attempts: u32,
    /// The delay after the first failure.
    pub initial_delay: Duration,
    /// The cap on any delay.
    pub max_delay: Duration,
    /// Delays at or above this wait on a rung queue in the broker.
    pub broker_wait_threshold: Duration,
    /// Randomise in-process delays by ±20 % (off by default; rung delays are
    /// fixed by the rung queue's TTL).
    pub jitter: bool,
    /// Retry a handler that panicked like any transient failure (off by
    /// default: a bug is not retried, it is dead-lettered with reason `panic`).
    pub retry_panics: bool,
    /// Every retry waits in the queue itself ([`RetryVia::Queue`](crate::RetryVia::Queue)):
    /// the delivery is rejected with requeue and the quorum queue's own
    /// delayed retry holds it back (RabbitMQ 4.3 and later); no rung, no
    /// wait in this process, and the attempt number is read from
    /// `x-delivery-count` (off by default). The schedule must be one the
    /// queue can keep: see [`in_queue_delays`](Self::in_queue_delays).
    pub in_queue: bool,
}

impl Default for RetryPolicy {
    /// No retries: one attempt.
    fn default() -> Self {
        RetryPolicy::none()
    }
}

impl RetryPolicy {
    /// The default `broker_wait_threshold`: delays of 30 s and more wait on
    /// a rung.
    pub const DEFAULT_BROKER_WAIT_THRESHOLD: Duration = Duration::from_secs(30);

    /// One attempt, no retry.
    pub const fn none() -> Self {
        RetryPolicy {
            max_attempts: 1,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(1),
            broker_wait_threshold: Self::DEFAULT_BROKER_WAIT_THRESHOLD,
            jitter: false,
            retry_panics: false,
            in_queue: false,
        }
    }

    /// `max_attempts` in all, `initial_delay` doubling up to `max_delay`;
    /// waits of [`DEFAULT_BROKER_WAIT_THRESHOLD`](Self::DEFAULT_BROKER_WAIT_THRESHOLD)
    /// (30 s) and more on a rung, no jitter, panics not retried.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq_layers::RetryPolicy;
    ///
    /// let mut policy = RetryPolicy::exponential(5, Duration::from_secs(1), Duration::from_secs(60));
    /// policy.broker_wait_threshold = Duration::from_secs(10);
    /// assert_eq!(policy.delay_after(4), Duration::from_secs(8));
    /// ```
    pub const fn exponential(
        max_attempts: u32,
        initial_delay: Duration,
        max_delay: Duration,
    ) -> Self {
        RetryPolicy {
            max_attempts,
            initial_delay,
            max_delay,
            broker_wait_threshold: Self::DEFAULT_BROKER_WAIT_THRESHOLD,
            jitter: false,
            retry_panics: false,
            in_queue: false,
        }
    }

    /// The delay before attempt `failed_attempt + 1`:
    /// `min(initial_delay · 2^(failed_attempt-1), max_delay)`.
    pub fn delay_after(&self, failed_attempt: u32) -> Duration {
        let exp = failed_attempt.saturating_sub(1).min(32);
        let factor = 1u64 << exp;
        let nanos = self
            .initial_delay
            .as_nanos()
            .saturating_mul(u128::from(factor));
        let capped = nanos.min(self.max_delay.as_nanos());
        Duration::from_nanos(u64::try_from(capped).unwrap_or(u64::MAX))
    }

    /// Whether a delay waits on a rung in the broker.
    pub fn is_broker_wait(&self, delay: Duration) -> bool {
        delay >= self.broker_wait_threshold
    }

    /// The distinct delays of the schedule that wait in the broker, in
    /// increasing order: one rung queue each. Computed from the first 33
    /// attempts at most: [`delay_after`](Self::delay_after) stops growing
    /// there, so a schedule of any length is read at once.
    pub fn rung_delays(&self) -> Vec<Duration> {
        if self.in_queue {
            return Vec::new();
        }
        let mut out: Vec<Duration> = (1..self.max_attempts.min(34))
            .map(|n| self.delay_after(n))
            .filter(|d| self.is_broker_wait(*d))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

impl RetryPolicy {
    /// The quorum queue's delayed retry that keeps this schedule, as
    /// `(min, max)`: the queue delays the `n`th failed return by
    /// `min(min · n, max)`, so `min` is `initial_delay` and `max` is
    /// `max_delay`. `None` when the doubling schedule differs from that
    /// straight line before its last attempt (it fits with `max_attempts` ≤
    /// 3, or `max_delay` ≤ 3 × `initial_delay`), or a delay is not whole
    /// milliseconds or is zero.
    pub fn in_queue_delays(&self) -> Option<(Duration, Duration)> {
        let (min, max) = (self.initial_delay, self.max_delay);
        let whole_ms = |d: Duration| d.subsec_nanos().is_multiple_of(1_000_000) && !d.is_zero();
        if !whole_ms(min) || !whole_ms(max) || max < min {
            return None;
        }
        // Past the third attempt both lines are at the cap, or they differ.
        let fits = (1..self.max_attempts.min(40)).all(|n| {
            let linear = min.saturating_mul(n).min(max);
            self.delay_after(n) == linear
        });
        fits.then_some((min, max))
    }
}

/// The rung queue of `queue` for `delay`: `Q.retry.20s` for whole seconds,
/// `Q.retry.400ms` otherwise (never `5m`).
pub fn rung_name(queue: &str, delay: Duration) -> String {
    format!("{queue}.retry.{}", delay_label(delay))
}

/// `20s` for whole seconds, `400ms` otherwise.
pub fn delay_label(delay: Duration) -> String {
    if delay.subsec_nanos() == 0 {
        format!("{}s", delay.as_secs())
    } else {
        format!("{}ms", delay.as_millis())
    }
}

// Not in the model-checking build: these run on tokio and std, outside loom.
#[cfg(all(test, not(acemq_loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_doubles_and_caps() {
        let p = RetryPolicy {
            max_attempts: 6,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(8),
            broker_wait_threshold: Duration::from_secs(2),
            ..RetryPolicy::none()
        };
        let d: Vec<u64> = (1..6).map(|n| p.delay_after(n).as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 8, 8]);
        assert_eq!(p.rung_delays(), [2, 4, 8].map(Duration::from_secs).to_vec());
    }

    #[test]
    fn shop_schedule_has_two_rungs() {
        let p = RetryPolicy {
            max_attempts: 4,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(8),
            broker_wait_threshold: Duration::from_secs(2),
            ..RetryPolicy::none()
        };
        let names: Vec<String> = p
            .rung_delays()
            .into_iter()
            .map(|d| rung_name("shop.orders", d))
            .collect();
        assert_eq!(names, ["shop.orders.retry.2s", "shop.orders.retry.4s"]);
    }

    #[test]
    fn the_queues_straight_line_keeps_short_or_flat_schedules_only() {
        let s = Duration::from_secs;
        let fits = |n, i, m| RetryPolicy::exponential(n, s(i), s(m)).in_queue_delays();
        assert_eq!(fits(3, 1, 60), Some((s(1), s(60))), "1 s, 2 s");
        assert_eq!(fits(10, 5, 10), Some((s(5), s(10))), "5 s, 10 s, 10 s, ...");
        assert_eq!(fits(10, 5, 5), Some((s(5), s(5))), "flat");
        assert_eq!(fits(4, 1, 60), None, "1 s, 2 s, 4 s against 1 s, 2 s, 3 s");
        assert_eq!(
            fits(10, 5, 15),
            Some((s(5), s(15))),
            "5 s, 10 s, then 15 s on both lines"
        );
        assert_eq!(
            fits(10, 5, 16),
            None,
            "5 s, 10 s, 16 s against 5 s, 10 s, 15 s"
        );
        let odd = RetryPolicy::exponential(2, Duration::from_micros(1500), s(1));
        assert_eq!(odd.in_queue_delays(), None, "not whole milliseconds");
    }

    #[test]
    fn rung_names_use_seconds_or_milliseconds() {
        assert_eq!(rung_name("q", Duration::from_secs(300)), "q.retry.300s");
        assert_eq!(rung_name("q", Duration::from_millis(400)), "q.retry.400ms");
        assert_eq!(
            rung_name("q", Duration::from_millis(1500)),
            "q.retry.1500ms"
        );
    }
}

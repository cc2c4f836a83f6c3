//! When the circuit opens, and for how long.

use std::fmt;
use std::time::Duration;

/// When a [`CircuitBreaker`](super::CircuitBreaker) opens and how long it
/// stays open: above `failure_ratio` of at least `minimum_calls` attempts
/// within `window`, it opens for `cool_down`, doubled after each failed
/// probe up to `max_cool_down`.
///
/// The struct is `#[non_exhaustive]`: start from
/// [`BreakerPolicy::default`] and set the fields.
///
/// ```
/// use std::time::Duration;
/// use acemq_layers::BreakerPolicy;
///
/// let mut policy = BreakerPolicy::default();
/// policy.minimum_calls = 10;
/// policy.cool_down = Duration::from_secs(2);
/// assert!(policy.check().is_ok());
/// assert_eq!(policy.cool_down_after(2), Duration::from_secs(8));
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct BreakerPolicy {
    /// The share of counted attempts that failed at or above which the
    /// circuit opens: above 0, at most 1. Default 0.5.
    pub failure_ratio: f64,
    /// The fewest attempts within the window before the ratio is judged at
    /// all (≥ 1). Default 20.
    pub minimum_calls: u32,
    /// How far back attempts count (a ring of 10 buckets of a tenth each).
    /// Default 30 s.
    pub window: Duration,
    /// How long the circuit stays open after a trip before a probe. Default
    /// 5 s.
    pub cool_down: Duration,
    /// The cap on the cool-down, which doubles after each failed probe.
    /// Default 20 s: below `pause_hand_back_after`'s default (30 s), so the
    /// deliveries the gate holds stay held (not redelivered) through every
    /// cool-down.
    pub max_cool_down: Duration,
}

impl BreakerPolicy {
    /// The default `failure_ratio`: 0.5.
    pub const DEFAULT_FAILURE_RATIO: f64 = 0.5;
    /// The default `minimum_calls`: 20.
    pub const DEFAULT_MINIMUM_CALLS: u32 = 20;
    /// The default `window`: 30 s.
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30);
    /// The default `cool_down`: 5 s.
    pub const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(5);
    /// The default `max_cool_down`: 20 s.
    pub const DEFAULT_MAX_COOL_DOWN: Duration = Duration::from_secs(20);

    /// The cool-down after `reopens` failed probes in a row:
    /// `min(cool_down · 2^reopens, max_cool_down)` (never below
    /// `cool_down`).
    pub fn cool_down_after(&self, reopens: u32) -> Duration {
        let grown = self
            .cool_down
            .checked_mul(1u32 << reopens.min(31))
            .unwrap_or(Duration::MAX);
        grown.min(self.max_cool_down).max(self.cool_down)
    }

    /// Whether the policy makes sense; the error names the field and what
    /// it must be. A layer given a policy that fails this still works (a
    /// ratio above 1 never trips, 0 calls count as 1), but a config should
    /// be refused.
    pub fn check(&self) -> Result<(), BreakerPolicyError> {
        let fail = |field, message: String| Err(BreakerPolicyError { field, message });
        if !(self.failure_ratio > 0.0 && self.failure_ratio <= 1.0) {
            return fail(
                "failure_ratio",
                format!(
                    "must be above 0 and at most 1, a share of attempts (got {})",
                    self.failure_ratio
                ),
            );
        }
        if self.minimum_calls == 0 {
            return fail(
                "minimum_calls",
                "must be at least 1 (the attempts within the window before the ratio counts)"
                    .to_owned(),
            );
        }
        if self.window < Duration::from_millis(10) {
            return fail(
                "window",
                format!("must be at least 10ms (got {:?})", self.window),
            );
        }
        if self.cool_down.is_zero() {
            return fail(
                "cool_down",
                "must be above 0 (how long the circuit stays open before a probe)".to_owned(),
            );
        }
        if self.max_cool_down < self.cool_down {
            return fail(
                "max_cool_down",
                format!(
                    "must be at least cool_down ({:?}; got {:?})",
                    self.cool_down, self.max_cool_down
                ),
            );
        }
        Ok(())
    }
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        BreakerPolicy {
            failure_ratio: Self::DEFAULT_FAILURE_RATIO,
            minimum_calls: Self::DEFAULT_MINIMUM_CALLS,
            window: Self::DEFAULT_WINDOW,
            cool_down: Self::DEFAULT_COOL_DOWN,
            max_cool_down: Self::DEFAULT_MAX_COOL_DOWN,
        }
    }
}

/// A [`BreakerPolicy`] field out of range: [`field`](Self::field) names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerPolicyError {
    field: &'static str,
    message: String,
}

impl BreakerPolicyError {
    /// The field: `failure_ratio`, `minimum_calls`, `window`, `cool_down`
    /// or `max_cool_down`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// What it must be, and what it was.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for BreakerPolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for BreakerPolicyError {}

//! A queue's circuit breaker, as config: `circuit_breaker: { failure_ratio,
//! minimum_calls, window, cool_down, max_cool_down }`, every field
//! optional.

use std::time::Duration;

use acemq_layers::BreakerPolicy;
use serde::Deserialize;

use super::duration;
use super::error::ConfigError;

/// A queue's circuit breaker (see
/// [`acemq_layers::breaker`]): above `failure_ratio` of at least
/// `minimum_calls` attempts within `window`, the queue's gate holds every
/// delivery for `cool_down`, then lets one through as a probe; a failed
/// probe doubles the cool-down, up to `max_cool_down`.
///
/// ```yaml
/// queues:
///   - name: shop.orders
///     circuit_breaker: { failure_ratio: 0.5, minimum_calls: 20, window: 30s, cool_down: 5s, max_cool_down: 20s }
/// ```
///
/// `circuit_breaker: {}` takes every default.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CircuitBreakerConfig {
    /// The share of failed attempts at or above which the circuit opens
    /// (default 0.5; above 0, at most 1).
    #[serde(default = "CircuitBreakerConfig::default_failure_ratio")]
    pub failure_ratio: f64,
    /// The fewest attempts within the window before the ratio is judged
    /// (default 20; at least 1).
    #[serde(default = "CircuitBreakerConfig::default_minimum_calls")]
    pub minimum_calls: u32,
    /// How far back attempts count (default 30 s; at least 10 ms).
    #[serde(
        default = "CircuitBreakerConfig::default_window",
        deserialize_with = "duration::deserialize"
    )]
    pub window: Duration,
    /// How long the circuit stays open before a probe (default 5 s; not
    /// zero).
    #[serde(
        default = "CircuitBreakerConfig::default_cool_down",
        deserialize_with = "duration::deserialize"
    )]
    pub cool_down: Duration,
    /// The cap on the cool-down, which doubles after each failed probe
    /// (default 20 s; at least `cool_down`). Keep it below
    /// `pause_hand_back_after` (30 s by default) and the held deliveries
    /// stay held through every cool-down instead of being redelivered.
    #[serde(
        default = "CircuitBreakerConfig::default_max_cool_down",
        deserialize_with = "duration::deserialize"
    )]
    pub max_cool_down: Duration,
}

impl Default for CircuitBreakerConfig {
    fn default() -> Self {
        CircuitBreakerConfig::from_policy(&BreakerPolicy::default())
    }
}

impl CircuitBreakerConfig {
    fn default_failure_ratio() -> f64 {
        BreakerPolicy::DEFAULT_FAILURE_RATIO
    }
    fn default_minimum_calls() -> u32 {
        BreakerPolicy::DEFAULT_MINIMUM_CALLS
    }
    fn default_window() -> Duration {
        BreakerPolicy::DEFAULT_WINDOW
    }
    fn default_cool_down() -> Duration {
        BreakerPolicy::DEFAULT_COOL_DOWN
    }
    fn default_max_cool_down() -> Duration {
        BreakerPolicy::DEFAULT_MAX_COOL_DOWN
    }

    /// The breaker's policy this describes.
    pub fn policy(&self) -> BreakerPolicy {
        let mut p = BreakerPolicy::default();
        p.failure_ratio = self.failure_ratio;
        p.minimum_calls = self.minimum_calls;
        p.window = self.window;
        p.cool_down = self.cool_down;
        p.max_cool_down = self.max_cool_down;
        p
    }

    /// The config form of a policy given in code.
    pub(crate) fn from_policy(p: &BreakerPolicy) -> Self {
        CircuitBreakerConfig {
            failure_ratio: p.failure_ratio,
            minimum_calls: p.minimum_calls,
            window: p.window,
            cool_down: p.cool_down,
            max_cool_down: p.max_cool_down,
        }
    }

    /// Checks the values of the breaker of `queues[i]`.
    pub(crate) fn validate_at(&self, i: usize) -> Result<(), ConfigError> {
        let Err(e) = self.policy().check() else {
            return Ok(());
        };
        let field = format!("queues[{i}].circuit_breaker.{}", e.field());
        let fix = match e.field() {
            "failure_ratio" => "set it to a share of attempts, e.g. 0.5 (the circuit opens when half of them fail; 1 only when all do)",
            "minimum_calls" => "set it to at least 1, e.g. 20 (fewer attempts than this within the window never open the circuit)",
            "window" => "set it to at least 10ms, e.g. 30s (how far back attempts count)",
            "cool_down" => "set it to how long to wait before a probe, e.g. 5s",
            _ => "raise max_cool_down to at least cool_down, or lower cool_down",
        };
        Err(ConfigError::invalid(field, e.message().to_owned(), fix))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::test_support::{assert_invalid, one_queue};
    use crate::Config;

    use super::CircuitBreakerConfig;

    #[test]
    fn an_empty_circuit_breaker_takes_every_default() {
        let config = Config::from_yaml_str(&one_queue("{ name: q, circuit_breaker: {} }")).unwrap();
        let breaker = config.queues[0].circuit_breaker.clone().unwrap();
        assert_eq!(breaker, CircuitBreakerConfig::default());
        assert_eq!(breaker.failure_ratio, 0.5);
        assert_eq!(breaker.minimum_calls, 20);
        assert_eq!(breaker.window, Duration::from_secs(30));
        assert_eq!(breaker.cool_down, Duration::from_secs(5));
        assert_eq!(breaker.max_cool_down, Duration::from_secs(20));
        assert_eq!(
            Config::from_yaml_str(&one_queue("{ name: q }"))
                .unwrap()
                .queues[0]
                .circuit_breaker,
            None,
            "no breaker unless asked for"
        );
    }

    #[test]
    fn every_field_is_read_with_durations_as_elsewhere() {
        let yaml = one_queue(
            "{ name: q, circuit_breaker: { failure_ratio: 0.25, minimum_calls: 4, window: 10s, cool_down: 500ms, max_cool_down: 2 } }",
        );
        let b = Config::from_yaml_str(&yaml).unwrap().queues[0]
            .circuit_breaker
            .clone()
            .unwrap();
        let p = b.policy();
        assert_eq!(p.failure_ratio, 0.25);
        assert_eq!(p.minimum_calls, 4);
        assert_eq!(p.window, Duration::from_secs(10));
        assert_eq!(p.cool_down, Duration::from_millis(500));
        assert_eq!(p.max_cool_down, Duration::from_secs(2));
    }

    #[test]
    fn bad_values_are_rejected_naming_the_field() {
        for (breaker, field) in [
            ("{ failure_ratio: 0 }", "failure_ratio"),
            ("{ failure_ratio: 1.5 }", "failure_ratio"),
            ("{ minimum_calls: 0 }", "minimum_calls"),
            ("{ window: 0 }", "window"),
            ("{ cool_down: 0 }", "cool_down"),
            ("{ cool_down: 30s, max_cool_down: 10s }", "max_cool_down"),
        ] {
            let yaml = one_queue(&format!("{{ name: q, circuit_breaker: {breaker} }}"));
            let message = assert_invalid(&yaml, &format!("queues[0].circuit_breaker.{field}"));
            assert!(
                message.contains("e.g.") || message.contains("raise"),
                "{message}"
            );
        }
        let unknown = crate::config::test_support::rejected(&one_queue(
            "{ name: q, circuit_breaker: { ratio: 0.5 } }",
        ))
        .to_string();
        assert!(unknown.contains("ratio"), "{unknown}");
    }
}

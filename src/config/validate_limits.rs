//! The upper bounds of a config (run by [`Config::validate`]): the longest
//! each duration may be, `concurrency` against `prefetch`, the names AMQP
//! carries as short strings, and queue names that another queue's
//! dead-letter queue or rung already takes.

use std::time::Duration;

use super::error::ConfigError;
use super::queue::{AckBatch, QueueConfig, RetriesConfig};
use super::routing::Arguments;
use super::schema::Config;

/// `d` as a human reads it in an error: `24h`, `1h 30m`, `49d 17h 2m 47.295s`.
fn shown(d: Duration) -> String {
    let secs = d.as_secs();
    // Days from two on: `24h` reads better than `1d`.
    let days = if secs >= 2 * 86_400 { secs / 86_400 } else { 0 };
    let (hours, mins) = ((secs - days * 86_400) / 3_600, secs / 60 % 60);
    let rest = Duration::new(secs % 60, d.subsec_nanos());
    let mut out = Vec::new();
    if days > 0 {
        out.push(format!("{days}d"));
    }
    if hours > 0 {
        out.push(format!("{hours}h"));
    }
    if mins > 0 {
        out.push(format!("{mins}m"));
    }
    if !rest.is_zero() || out.is_empty() {
        out.push(format!("{rest:?}"));
    }
    out.join(" ")
}

/// An error for `field` holding `value`, above `max`.
fn too_long(field: String, value: Duration, max: Duration, what: &str) -> ConfigError {
    ConfigError::invalid(
        field,
        format!("({}) is above its maximum of {}", shown(value), shown(max)),
        format!("give at most {} ({what})", shown(max)),
    )
}

impl Config {
    /// The longest name AMQP carries (a short string), in bytes: queue and
    /// exchange names, routing keys, argument and header names, string
    /// properties.
    pub(crate) const MAX_SHORT_STRING_BYTES: usize = 255;

    /// The longest `shutdown_timeout`, `abandon_after` and `host_timeout`:
    /// 24 hours.
    pub const MAX_DRAIN_DURATION: Duration = Duration::from_secs(24 * 3600);
    /// The longest `connect_timeout`: 1 hour.
    pub const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(3600);
    /// The longest `pause_hand_back_after`: 24 hours.
    pub const MAX_PAUSE_HAND_BACK_AFTER: Duration = Duration::from_secs(24 * 3600);

    /// Every duration of the config (`heartbeat` has its own check) within
    /// its stated maximum.
    pub(super) fn validate_durations(&self) -> Result<(), ConfigError> {
        let drain = "the drain's deadlines must end while the orchestrator still waits";
        let top = [
            (
                "shutdown_timeout",
                self.shutdown_timeout,
                Self::MAX_DRAIN_DURATION,
                drain,
            ),
            (
                "abandon_after",
                self.abandon_after,
                Self::MAX_DRAIN_DURATION,
                drain,
            ),
            (
                "host_timeout",
                self.host_timeout,
                Self::MAX_DRAIN_DURATION,
                drain,
            ),
            (
                "connect_timeout",
                self.connect_timeout,
                Self::MAX_CONNECT_TIMEOUT,
                "a broker that has not answered by then is not coming; the default is 10s",
            ),
            (
                "pause_hand_back_after",
                self.pause_hand_back_after,
                Self::MAX_PAUSE_HAND_BACK_AFTER,
                "a pause longer than that should hand its deliveries back to other instances",
            ),
        ];
        for (field, value, max, what) in top {
            if value > max {
                return Err(too_long(field.to_owned(), value, max, what));
            }
        }
        for (i, q) in self.queues.iter().enumerate() {
            let field = |name: &str| format!("queues[{i}].{name}");
            if let Some(delay) = q.ack_batch.delay.filter(|d| *d > AckBatch::MAX_DELAY) {
                return Err(too_long(
                    field("ack_batch.delay"),
                    delay,
                    AckBatch::MAX_DELAY,
                    "an acknowledgement held longer only costs duplicates after a crash; the \
                     default is 2ms",
                ));
            }
            let Some(r) = &q.retries else { continue };
            let max = RetriesConfig::MAX_DELAY;
            let ttl = "RabbitMQ's longest message TTL, which a rung's delay is";
            for (name, value) in [
                ("retries.initial_delay", r.initial_delay),
                ("retries.max_delay", r.max_delay),
                ("retries.broker_wait_threshold", r.broker_wait_threshold),
            ] {
                if value > max {
                    return Err(too_long(field(name), value, max, ttl));
                }
            }
        }
        Ok(())
    }

    /// Per queue: `concurrency` at most `prefetch`, and every name AMQP
    /// carries as a short string within 255 bytes; then no queue named as
    /// another's dead-letter queue or rung.
    pub(super) fn validate_limits(&self) -> Result<(), ConfigError> {
        for (i, q) in self.queues.iter().enumerate() {
            q.validate_concurrency_at(i)?;
            q.validate_short_strings_at(i)?;
        }
        for (i, x) in self.exchanges.iter().enumerate() {
            short(format!("exchanges[{i}].name"), "exchange name", &x.name)?;
        }
        self.validate_derived_names()
    }

    /// No queue is named like the dead-letter queue or a rung acemq
    /// declares for another queue (it would be declared twice, two ways).
    fn validate_derived_names(&self) -> Result<(), ConfigError> {
        for (j, owner) in self.queues.iter().enumerate() {
            let mut derived: Vec<(String, &str)> = owner
                .rungs()
                .into_iter()
                .map(|(name, _)| (name, "a retry queue (rung)"))
                .collect();
            if owner.dead_letter {
                derived.push((owner.dlq_name(), "the dead-letter queue"));
            }
            for (name, what) in derived {
                if let Some(i) = self.queues.iter().position(|q| q.name == name) {
                    return Err(ConfigError::invalid(
                        format!("queues[{i}].name"),
                        format!(
                            "{name:?} is {what} acemq declares for queues[{j}] ({:?})",
                            owner.name
                        ),
                        format!(
                            "rename queues[{i}]: acemq declares {name:?} itself, with the \
                             arguments queues[{j}] needs, and the broker refuses a second \
                             declaration that differs"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `text` within [`Config::MAX_SHORT_STRING_BYTES`], or an error naming
/// `field`.
fn short(field: String, what: &str, text: &str) -> Result<(), ConfigError> {
    const MAX_SHORT_STRING_BYTES: usize = Config::MAX_SHORT_STRING_BYTES;
    if text.len() <= MAX_SHORT_STRING_BYTES {
        return Ok(());
    }
    let start: String = text.chars().take(40).collect();
    Err(ConfigError::invalid(
        field,
        format!(
            "(the {what} starting {start:?}) is {} bytes long, above AMQP's limit of \
             {MAX_SHORT_STRING_BYTES}",
            text.len()
        ),
        format!(
            "shorten it by at least {} bytes",
            text.len() - MAX_SHORT_STRING_BYTES
        ),
    ))
}

/// Every argument name of `args` within [`Config::MAX_SHORT_STRING_BYTES`].
fn short_names(field: &str, what: &str, args: &Arguments) -> Result<(), ConfigError> {
    for name in args.keys() {
        short(format!("{field}.arguments"), what, name)?;
    }
    Ok(())
}

impl QueueConfig {
    fn validate_concurrency_at(&self, i: usize) -> Result<(), ConfigError> {
        // The default (8) beside a smaller prefetch is not a mistake the
        // user made: it runs at most `prefetch` handlers, as it always did.
        let default = self.concurrency == QueueConfig::DEFAULT_CONCURRENCY;
        if self.concurrency > usize::from(self.prefetch) && !default {
            return Err(ConfigError::invalid(
                format!("queues[{i}].concurrency"),
                format!(
                    "({}) is above prefetch ({})",
                    self.concurrency, self.prefetch
                ),
                format!(
                    "lower concurrency to at most {} or raise prefetch to at least {}: a \
                     handler runs on a delivery the broker sent, and the broker sends at most \
                     prefetch unacknowledged deliveries, so the handlers beyond it could never \
                     run",
                    self.prefetch,
                    self.concurrency.min(usize::from(u16::MAX))
                ),
            ));
        }
        Ok(())
    }

    fn validate_short_strings_at(&self, i: usize) -> Result<(), ConfigError> {
        let field = format!("queues[{i}]");
        short_names(&field, "argument name", &self.arguments)?;
        for (j, b) in self.bindings.iter().enumerate() {
            let field = format!("queues[{i}].bindings[{j}]");
            short(format!("{field}.exchange"), "exchange name", &b.exchange)?;
            for (k, key) in b.routing_keys.iter().enumerate() {
                short(format!("{field}.routing_keys[{k}]"), "routing key", key)?;
            }
            short_names(&field, "argument (header) name", &b.arguments)?;
        }
        Ok(())
    }
}

impl RetriesConfig {
    /// The most attempts a schedule may have: 1,000,000, the highest
    /// attempt number the attempt header carries.
    pub const MAX_ATTEMPTS: u32 = acemq_layers::MAX_ATTEMPT;
    /// The longest `initial_delay`, `max_delay` and
    /// `broker_wait_threshold`: RabbitMQ's longest message TTL, 2^32 − 1 ms
    /// (49 days 17 hours).
    pub const MAX_DELAY: Duration = Duration::from_millis(u32::MAX as u64);
}

impl AckBatch {
    /// The longest time bound: 1 s.
    pub const MAX_DELAY: Duration = Duration::from_secs(1);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::test_support::{assert_invalid, one_queue};
    use crate::config::*;

    #[test]
    fn a_concurrency_above_prefetch_is_rejected_naming_both_values() {
        let message = assert_invalid(
            &one_queue("{ name: q, prefetch: 4, concurrency: 5 }"),
            "queues[0].concurrency",
        );
        assert!(message.contains("(5) is above prefetch (4)"), "{message}");
        assert!(
            message.contains("lower concurrency to at most 4"),
            "{message}"
        );
        // The value that made the start allocate 34 GB and abort.
        let message = assert_invalid(
            &one_queue("{ name: q, concurrency: 4294967296 }"),
            "queues[0].concurrency",
        );
        assert!(
            message.contains("(4294967296) is above prefetch (32)"),
            "{message}"
        );
        assert!(!message.contains('\n'), "{message}");
        Config::from_yaml_str(&one_queue("{ name: q, prefetch: 4, concurrency: 4 }")).unwrap();
        // A small prefetch with the default concurrency still loads: it
        // runs at most `prefetch` handlers.
        Config::from_yaml_str(&one_queue("{ name: q, prefetch: 2 }")).unwrap();
    }

    #[test]
    fn every_duration_above_its_maximum_is_rejected_naming_the_field_and_the_maximum() {
        let top = |key: &str, value: &str, max: &str| {
            let message = assert_invalid(
                &format!("{key}: \"{value}\"\n{}", one_queue("name: q")),
                key,
            );
            assert!(
                message.contains(&format!("is above its maximum of {max}")),
                "{message}"
            );
            assert!(
                message.contains(&format!("give at most {max}")),
                "{message}"
            );
        };
        top("shutdown_timeout", "99999999999999h", "24h");
        top("abandon_after", "25h", "24h");
        top("host_timeout", "1441m", "24h");
        top("connect_timeout", "3601s", "1h");
        top("pause_hand_back_after", "86401", "24h");
        let ttl = "49d 17h 2m 47.295s";
        for key in ["initial_delay", "max_delay", "broker_wait_threshold"] {
            let others = match key {
                "initial_delay" => "max_delay: 1500h",
                "max_delay" => "initial_delay: 1",
                _ => "initial_delay: 1, max_delay: 2",
            };
            let message = assert_invalid(
                &one_queue(&format!(
                    "{{ name: q, retries: {{ max_attempts: 3, {others}, {key}: 1200h }} }}"
                )),
                &format!("queues[0].retries.{key}"),
            );
            assert!(
                message.contains(&format!("is above its maximum of {ttl}")),
                "{message}"
            );
        }
        let message = assert_invalid(
            &one_queue("{ name: q, ack_batch: { count: 4, delay: 2s } }"),
            "queues[0].ack_batch.delay",
        );
        assert!(message.contains("maximum of 1s"), "{message}");
        // At the maximum is accepted.
        let config = Config::from_yaml_str(&format!(
            "shutdown_timeout: 24h\nabandon_after: 24h\nhost_timeout: 24h\nconnect_timeout: 1h\n\
             pause_hand_back_after: 24h\n{}",
            one_queue("{ name: q, ack_batch: { count: 4, delay: 1s } }")
        ))
        .unwrap();
        assert_eq!(config.shutdown_timeout, Config::MAX_DRAIN_DURATION);
    }

    #[test]
    fn the_heartbeat_keeps_its_own_maximum() {
        assert_invalid(
            &format!("heartbeat: 65536\n{}", one_queue("name: q")),
            "heartbeat",
        );
    }

    #[test]
    fn max_attempts_above_its_maximum_is_rejected_at_once() {
        let message = assert_invalid(
            &one_queue(
                "{ name: q, retries: { max_attempts: 4294967295, initial_delay: 1, max_delay: 30 } }",
            ),
            "queues[0].retries.max_attempts",
        );
        assert!(
            message.contains("(4294967295) is above its maximum of 1000000"),
            "{message}"
        );
        // The maximum itself validates at once: the rungs are read from the
        // first attempts only.
        let config = Config::from_yaml_str(&one_queue(
            "{ name: q, retries: { max_attempts: 1000000, initial_delay: 1, max_delay: 60, \
             broker_wait_threshold: 1 } }",
        ))
        .unwrap();
        let rungs: Vec<String> = config.queues[0]
            .rungs()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            rungs,
            [
                "q.retry.1s",
                "q.retry.2s",
                "q.retry.4s",
                "q.retry.8s",
                "q.retry.16s",
                "q.retry.32s",
                "q.retry.60s"
            ]
        );
    }

    #[test]
    fn a_queue_named_like_another_queues_dead_letter_queue_or_rung_is_rejected_naming_both() {
        let message = assert_invalid(
            "queues:\n  - { name: a, dead_letter: true }\n  - { name: a.dlq }\n",
            "queues[1].name",
        );
        assert!(
            message.contains(
                "\"a.dlq\" is the dead-letter queue acemq declares for queues[0] (\"a\")"
            ),
            "{message}"
        );
        let message = assert_invalid(
            "queues:\n  - name: a.retry.40s\n  - { name: a, retries: { max_attempts: 4, \
             initial_delay: 10, max_delay: 60, broker_wait_threshold: 10 } }\n",
            "queues[0].name",
        );
        assert!(
            message.contains("is a retry queue (rung) acemq declares for queues[1] (\"a\")"),
            "{message}"
        );
        // Without dead_letter on `a`, `a.dlq` is a queue like any other.
        Config::from_yaml_str("queues:\n  - name: a\n  - name: a.dlq\n").unwrap();
    }

    #[test]
    fn names_amqp_carries_as_short_strings_are_at_most_255_bytes() {
        let long = "x".repeat(256);
        let cases = [
            (
                format!("queues:\n  - name: q\n    arguments: {{ {long}: 1 }}\n"),
                "queues[0].arguments",
            ),
            (
                format!("exchanges: [{{ name: {long}, type: fanout }}]\nqueues:\n  - name: q\n"),
                "exchanges[0].name",
            ),
            (
                format!(
                    "exchanges: [{{ name: shop, type: topic }}]\nqueues:\n  - name: q\n    \
                     bindings: [{{ exchange: shop, routing_keys: [a, {long}] }}]\n"
                ),
                "queues[0].bindings[0].routing_keys[1]",
            ),
            (
                format!(
                    "exchanges: [{{ name: h, type: headers }}]\nqueues:\n  - name: q\n    \
                     bindings: [{{ exchange: h, arguments: {{ x-match: all, {long}: eu }} }}]\n"
                ),
                "queues[0].bindings[0].arguments",
            ),
            (
                format!("queues:\n  - name: q\n    bindings: [{{ exchange: amq.{long} }}]\n"),
                "queues[0].bindings[0].exchange",
            ),
        ];
        for (yaml, field) in cases {
            let message = assert_invalid(&yaml, field);
            assert!(
                message.contains("bytes long, above AMQP's limit of 255"),
                "{message}"
            );
        }
        let fits = "x".repeat(255);
        Config::from_yaml_str(&format!(
            "queues:\n  - name: q\n    arguments: {{ {fits}: 1 }}\n"
        ))
        .unwrap();
    }

    #[test]
    fn a_duration_is_shown_in_days_hours_minutes_and_seconds() {
        assert_eq!(super::shown(Duration::from_secs(24 * 3600)), "24h");
        assert_eq!(super::shown(Duration::from_millis(1500)), "1.5s");
        assert_eq!(super::shown(Duration::ZERO), "0ns");
        assert_eq!(super::shown(RetriesConfig::MAX_DELAY), "49d 17h 2m 47.295s");
    }
}

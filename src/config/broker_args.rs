//! Queue arguments that work on one RabbitMQ version and not on another:
//! warnings, not errors (the config may be meant for an older broker).
//!
//! - `x-queue-mode` (any value) and `x-queue-version: 1`: RabbitMQ 4.3
//!   refuses a declaration that carries them (classic queue storage v1 is
//!   removed; from its release notes — only 4.0 runs here). Earlier
//!   versions accept them.
//! - `x-delivery-limit` at or below `max_redeliveries` on a quorum queue:
//!   the broker dead-letters (or drops) a message that keeps coming back
//!   before acemq's own bound does, without acemq's reason headers.
//! - A queue's effective consumer timeout (`consumer_timeout`, else its
//!   `x-consumer-timeout` argument) not above the drain's longest wait for
//!   a handler (`shutdown_timeout + abandon_after`).
//!
//! And, at start, what becomes of `consumer_timeout` on each broker.

use std::time::Duration;

use super::error::ConfigError;
use super::queue::{QueueConfig, QueueType};
use super::routing::ArgValue;
use super::schema::Config;

impl Config {
    /// One line per queue argument that a RabbitMQ version refuses or that
    /// defeats acemq's own redelivery bound, naming the queue, the argument,
    /// the version and the fix. Empty when there is none. Validation logs
    /// them as warnings.
    pub(crate) fn argument_warnings(&self) -> Vec<String> {
        let drain = self.longest_handler_wait();
        self.queues
            .iter()
            .enumerate()
            .flat_map(|(i, q)| {
                let mut out = q.argument_warnings(i);
                out.extend(q.drain_outlasts_timeout(i, drain));
                out
            })
            .collect()
    }

    /// One line per queue with `consumer_timeout`: what the broker does
    /// with it, and what to set on a broker that ignores it. Logged at
    /// start.
    pub(crate) fn consumer_timeout_notes(&self) -> Vec<String> {
        self.queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.consume)
            .filter_map(|(i, q)| {
                let t = q.consumer_timeout?;
                Some(if q.sent_consumer_timeout().is_some() {
                    format!(
                        "queues[{i}].consumer_timeout is {t:?} on quorum queue {:?}: acemq \
                         consumes it with the consumer argument x-consumer-timeout = {} ms, which \
                         RabbitMQ 4.3 and later honour above the queue's own timeout; earlier \
                         brokers ignore it (RabbitMQ 3.10.8 accepts the consume and applies its \
                         own timeout), so there set consumer_timeout in rabbitmq.conf (or, from \
                         3.12, the queue's x-consumer-timeout argument or a policy's \
                         consumer-timeout) above the handler's longest run",
                        q.name,
                        t.as_millis()
                    )
                } else {
                    format!(
                        "queues[{i}].consumer_timeout is {t:?} on classic queue {:?}: not sent \
                         (RabbitMQ 4.3 refuses the consumer argument x-consumer-timeout on a \
                         classic queue, and never times out a classic queue's consumer); before \
                         4.3 the broker's timeout applies, so there set consumer_timeout in \
                         rabbitmq.conf above the handler's longest run",
                        q.name
                    )
                })
            })
            .collect()
    }
}

impl QueueConfig {
    /// `consumer_timeout` where acemq sends it as the consumer argument
    /// `x-consumer-timeout`: on a quorum queue (RabbitMQ 4.3 refuses the
    /// argument on a classic queue, whose consumers it never times out).
    pub(crate) fn sent_consumer_timeout(&self) -> Option<Duration> {
        self.consumer_timeout
            .filter(|_| self.kind == QueueType::Quorum)
    }

    /// The consumer timeout this config gives the queue's deliveries, and
    /// where it comes from: `consumer_timeout`, else the queue's
    /// `x-consumer-timeout` argument; `None` when the broker's own applies
    /// (unknown here).
    pub(crate) fn effective_consumer_timeout(&self) -> Option<(Duration, &'static str)> {
        if let Some(t) = self.sent_consumer_timeout() {
            return Some((t, "consumer_timeout"));
        }
        let ms = self.arguments.get("x-consumer-timeout").and_then(int)?;
        let ms = u64::try_from(ms).ok()?;
        Some((Duration::from_millis(ms), "arguments.x-consumer-timeout"))
    }

    /// A warning when the drain may hold a delivery longer than the
    /// queue's effective consumer timeout: the broker then takes it back
    /// mid-drain, and the handler's work is done again.
    fn drain_outlasts_timeout(&self, i: usize, drain: Duration) -> Option<String> {
        if !self.consume {
            return None;
        }
        let (timeout, from) = self.effective_consumer_timeout()?;
        (drain >= timeout).then(|| {
            format!(
                "queues[{i}].{from} is {timeout:?} on queue {:?}, not above the drain's \
                 longest wait for a handler, shutdown_timeout + abandon_after = {drain:?}: a \
                 handler still running at a stop can be timed out by the broker mid-drain, its \
                 delivery taken back and its work done again; set consumer_timeout above \
                 {drain:?} and the handler's longest run, or lower shutdown_timeout and \
                 abandon_after",
                self.name
            )
        })
    }

    fn argument_warnings(&self, i: usize) -> Vec<String> {
        let mut out = Vec::new();
        let field = |name: &str| format!("queues[{i}].arguments.{name}");
        if let Some(v) = self.arguments.get("x-queue-mode") {
            out.push(format!(
                "{} is {} on queue {:?}: RabbitMQ 4.3 refuses to declare a queue with \
                 x-queue-mode (any value; classic queues are always lazy since 3.12), so the \
                 queue could not be declared there; remove it",
                field("x-queue-mode"),
                shown(v),
                self.name
            ));
        }
        if let Some(v) = self.arguments.get("x-queue-version") {
            if is_one(v) {
                out.push(format!(
                    "{} is 1 on queue {:?}: RabbitMQ 4.3 refuses to declare a queue with \
                     x-queue-version 1 (classic queue storage v1 is removed), so the queue \
                     could not be declared there; remove it (version 2 is the default since \
                     4.2)",
                    field("x-queue-version"),
                    self.name
                ));
            }
        }
        if self.kind == QueueType::Quorum {
            if let Some(limit) = self.arguments.get("x-delivery-limit").and_then(int) {
                if limit >= 0 && limit <= i64::from(self.max_redeliveries) {
                    out.push(format!(
                        "{} is {limit}, not above max_redeliveries ({}) on quorum queue {:?}: \
                         the broker dead-letters a message returned more than {limit} times \
                         itself, without acemq's reason headers (or drops it without a \
                         dead-letter exchange), before acemq's bound does; remove it (acemq \
                         then declares max_redeliveries + 10) or lower max_redeliveries below it",
                        field("x-delivery-limit"),
                        self.max_redeliveries,
                        self.name
                    ));
                }
            }
        }
        out
    }
}

impl Config {
    /// On a broker of RabbitMQ 4.3 or later (`broker`, e.g. `RabbitMQ
    /// 4.3.6`): the first queue argument it refuses to declare, as the
    /// config error a start ends with (exit 78) before anything is
    /// declared. Before 4.3 the same arguments are only warnings
    /// ([`argument_warnings`](Self::argument_warnings)).
    pub(crate) fn refused_on_4_3(&self, broker: &str) -> Option<ConfigError> {
        self.queues.iter().enumerate().find_map(|(i, q)| {
            let (arg, value, why) = q.refused_by_4_3()?;
            Some(ConfigError::invalid(
                format!("queues[{i}].arguments.{arg}"),
                format!(
                    "is {value} on queue {:?}, and the broker, {broker}, refuses to declare a \
                     queue with it ({why})",
                    q.name
                ),
                format!("remove {arg} from the queue's arguments"),
            ))
        })
    }

    /// On a broker of RabbitMQ 4.3 or later: one line per consumed classic
    /// queue without `consumer_timeout`, saying that no broker bound
    /// applies to its handlers any more (4.3 never times out a classic
    /// queue's consumer). Logged at start as warnings.
    pub(crate) fn unbounded_on_4_3(&self, broker: &str) -> Vec<String> {
        self.queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.consume && q.kind == QueueType::Classic)
            .filter(|(_, q)| q.consumer_timeout.is_none())
            .map(|(i, q)| {
                format!(
                    "queues[{i}] {:?} is a classic queue, and the broker, {broker}, never times \
                     out a classic queue's consumer: no broker bound applies to its handlers \
                     any more, so a handler that never returns holds its delivery until the \
                     process stops; bound the handler's work inside the handler, or make the \
                     queue type: quorum with consumer_timeout (consumer_timeout on this queue \
                     silences this warning; 4.3 does not apply it to a classic queue either)",
                    q.name
                )
            })
            .collect()
    }
}

impl QueueConfig {
    /// The argument RabbitMQ 4.3 refuses to declare, its value as shown,
    /// and why: `x-queue-mode` (any value), `x-queue-version: 1`.
    fn refused_by_4_3(&self) -> Option<(&'static str, String, &'static str)> {
        if let Some(v) = self.arguments.get("x-queue-mode") {
            return Some((
                "x-queue-mode",
                shown(v),
                "classic queues are always lazy since 3.12",
            ));
        }
        self.arguments
            .get("x-queue-version")
            .filter(|v| is_one(v))
            .map(|_| {
                (
                    "x-queue-version",
                    "1".to_owned(),
                    "classic queue storage v1 is removed; version 2 is the default",
                )
            })
    }
}

fn int(v: &ArgValue) -> Option<i64> {
    match v {
        ArgValue::Int(n) => Some(*n),
        ArgValue::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn is_one(v: &ArgValue) -> bool {
    match v {
        ArgValue::Float(f) => *f == 1.0,
        other => int(other) == Some(1),
    }
}

fn shown(v: &ArgValue) -> String {
    match v {
        ArgValue::Bool(b) => b.to_string(),
        ArgValue::Int(n) => n.to_string(),
        ArgValue::Float(f) => f.to_string(),
        ArgValue::String(s) => format!("{s:?}"),
    }
}

#[cfg(test)]
mod tests {
    //! The refusals are RabbitMQ 4.3's, taken from its release notes
    //! (`x-queue-mode` set to any value, `x-queue-version` set to 1); only
    //! 4.0 runs on this machine.

    use super::*;

    fn warnings(yaml: &str) -> Vec<String> {
        Config::from_yaml_str(yaml)
            .expect("a valid config")
            .argument_warnings()
    }

    #[test]
    fn x_queue_mode_is_a_warning_naming_rabbitmq_4_3() {
        let w = warnings("queues:\n  - name: q\n    arguments: { x-queue-mode: lazy }\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with(
                "queues[0].arguments.x-queue-mode is \"lazy\" on queue \"q\": RabbitMQ 4.3 refuses"
            ),
            "{}",
            w[0]
        );
        assert!(w[0].ends_with("remove it"), "{}", w[0]);
        assert!(!w[0].contains('\n'));
    }

    #[test]
    fn x_queue_version_1_is_a_warning_and_2_is_not() {
        let w = warnings("queues:\n  - name: q\n    arguments: { x-queue-version: 1 }\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("RabbitMQ 4.3 refuses"), "{}", w[0]);
        assert!(w[0].starts_with("queues[0].arguments.x-queue-version is 1"));
        let w = warnings("queues:\n  - name: q\n    arguments: { x-queue-version: \"1\" }\n");
        assert_eq!(w.len(), 1, "a string 1 too: {w:?}");
        assert!(
            warnings("queues:\n  - name: q\n    arguments: { x-queue-version: 2 }\n").is_empty()
        );
        assert!(warnings("queues:\n  - name: q\n").is_empty());
    }

    #[test]
    fn a_quorum_delivery_limit_at_or_below_max_redeliveries_is_a_warning() {
        let yaml = |limit: i64| {
            format!(
                "queues:\n  - name: q\n    type: quorum\n    max_redeliveries: 30\n    \
                 arguments: {{ x-delivery-limit: {limit} }}\n"
            )
        };
        let w = warnings(&yaml(30));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("not above max_redeliveries (30)"), "{}", w[0]);
        assert!(warnings(&yaml(31)).is_empty());
        assert!(warnings(&yaml(-1)).is_empty(), "no limit");
    }

    #[test]
    fn the_drain_is_compared_with_the_effective_consumer_timeout() {
        // shutdown_timeout 20 + abandon_after 5 = 25 s.
        let yaml = |extra: &str| {
            format!(
                "shutdown_timeout: 20\nqueues:\n  - name: q\n    type: quorum\n    \
                 arguments: {{ x-consumer-timeout: 3000 }}\n{extra}"
            )
        };
        let w = warnings(&yaml(""));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with(
                "queues[0].arguments.x-consumer-timeout is 3s on queue \"q\", not above the \
                 drain's longest wait for a handler, shutdown_timeout + abandon_after = 25s"
            ),
            "{}",
            w[0]
        );
        // consumer_timeout is what the broker applies to this consumer.
        assert!(warnings(&yaml("    consumer_timeout: 60s\n")).is_empty());
        let w = warnings(&yaml("    consumer_timeout: 20s\n"));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("queues[0].consumer_timeout is 20s"),
            "{}",
            w[0]
        );
        // Neither: the broker's own, unknown here.
        assert!(warnings("queues:\n  - name: q\n").is_empty());
    }

    #[test]
    fn consumer_timeout_loads_in_any_unit_says_what_each_broker_does_and_zero_is_refused() {
        let config = Config::from_yaml_str(
            "queues:\n  - name: q\n    type: quorum\n    consumer_timeout: 20s\n  \
             - name: c\n    consumer_timeout: 1m\n",
        )
        .unwrap();
        assert_eq!(
            config.queues[0].consumer_timeout,
            Some(Duration::from_secs(20))
        );
        let notes = config.consumer_timeout_notes();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(config.queues[1].sent_consumer_timeout(), None);
        assert!(
            notes[1]
                .starts_with("queues[1].consumer_timeout is 60s on classic queue \"c\": not sent"),
            "{}",
            notes[1]
        );
        assert!(
            notes[0].contains("x-consumer-timeout = 20000 ms")
                && notes[0].contains("RabbitMQ 4.3 and later honour")
                && notes[0].contains("set consumer_timeout in rabbitmq.conf"),
            "{}",
            notes[0]
        );
        assert!(Config::from_yaml_str("queues: [{ name: q }]")
            .unwrap()
            .consumer_timeout_notes()
            .is_empty());
        let err = Config::from_yaml_str("queues:\n  - name: q\n    consumer_timeout: 0\n")
            .and_then(|c| c.validate().map(|()| c))
            .expect_err("zero is refused");
        let message = err.to_string();
        assert!(
            message.contains("queues[0].consumer_timeout") && message.contains("at least 1ms"),
            "{message}"
        );
    }
    #[test]
    fn on_4_3_a_refused_argument_is_a_one_line_config_error_naming_it_and_the_fix() {
        let config = |args: &str| {
            Config::from_yaml_str(&format!(
                "queues:\n  - name: a\n  - name: b\n    consume: false\n    arguments: {args}\n"
            ))
            .unwrap()
        };
        let e = config("{ x-queue-mode: lazy }")
            .refused_on_4_3("RabbitMQ 4.3.6")
            .expect("x-queue-mode is refused");
        assert_eq!(e.field(), Some("queues[1].arguments.x-queue-mode"));
        let text = e.to_string();
        assert_eq!(
            text,
            "invalid config: queues[1].arguments.x-queue-mode is \"lazy\" on queue \"b\", and \
             the broker, RabbitMQ 4.3.6, refuses to declare a queue with it (classic queues are \
             always lazy since 3.12): remove x-queue-mode from the queue's arguments"
        );
        let e = config("{ x-queue-version: 1 }")
            .refused_on_4_3("RabbitMQ 4.4.1")
            .expect("x-queue-version 1 is refused");
        assert_eq!(e.field(), Some("queues[1].arguments.x-queue-version"));
        assert!(e.to_string().contains("RabbitMQ 4.4.1"), "{e}");
        assert!(config("{ x-queue-version: 2 }")
            .refused_on_4_3("RabbitMQ 4.3.6")
            .is_none());
    }

    #[test]
    fn on_4_3_each_consumed_classic_queue_without_consumer_timeout_is_warned_about() {
        let config = Config::from_yaml_str(
            "queues:\n  - name: plain\n  - name: bounded\n    consumer_timeout: 1m\n  \
             - name: q\n    type: quorum\n  - name: idle\n    consume: false\n",
        )
        .unwrap();
        let w = config.unbounded_on_4_3("RabbitMQ 4.3.6");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with(
                "queues[0] \"plain\" is a classic queue, and the broker, RabbitMQ 4.3.6, never \
                 times out a classic queue's consumer: no broker bound applies to its handlers"
            ),
            "{}",
            w[0]
        );
        assert!(!w[0].contains('\n'));
    }
}

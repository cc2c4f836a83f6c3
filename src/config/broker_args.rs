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

use super::queue::{QueueConfig, QueueType};
use super::routing::ArgValue;
use super::schema::Config;

impl Config {
    /// One line per queue argument that a RabbitMQ version refuses or that
    /// defeats acemq's own redelivery bound, naming the queue, the argument,
    /// the version and the fix. Empty when there is none. Validation logs
    /// them as warnings.
    pub(crate) fn argument_warnings(&self) -> Vec<String> {
        self.queues
            .iter()
            .enumerate()
            .flat_map(|(i, q)| q.argument_warnings(i))
            .collect()
    }
}

impl QueueConfig {
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
}

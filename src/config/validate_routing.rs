//! Checking the routing part of a config: exchanges, each queue's
//! bindings, arguments, `passive`, `max_redeliveries` and
//! `consumer_timeout_strikes` (run by
//! [`Config::validate`]), and the handlers given against the queues
//! consumed ([`Config::check_handlers`]).

use super::error::ConfigError;
use super::queue::QueueConfig;
use super::routing::{BindingConfig, ExchangeKind};
use super::schema::Config;

/// Arguments acemq sets itself from other keys; a queue's `arguments` may not
/// set them (with the key that does).
fn owned_argument(q: &QueueConfig, name: &str) -> Option<&'static str> {
    match name {
        "x-queue-type" => Some("type (classic or quorum)"),
        "x-dead-letter-exchange" | "x-dead-letter-routing-key" if q.dead_letter => {
            Some("dead_letter (acemq routes what the queue dead-letters to its .dlq)")
        }
        _ => None,
    }
}

impl Config {
    /// Checks `exchanges`, and each queue's `bindings`, `arguments`,
    /// `passive` and `max_redeliveries` ([`Config::validate`] calls it).
    pub(super) fn validate_routing(&self) -> Result<(), ConfigError> {
        for (i, x) in self.exchanges.iter().enumerate() {
            let field = format!("exchanges[{i}].name");
            if x.name.is_empty() {
                return Err(ConfigError::invalid(
                    field,
                    "is empty",
                    "name the exchange (the default exchange needs no declaring and takes no bindings)",
                ));
            }
            if x.name.starts_with("amq.") {
                return Err(ConfigError::invalid(
                    field,
                    format!("{:?} starts with amq.", x.name),
                    "remove it from exchanges: RabbitMQ's amq.* exchanges exist already; bind to them directly",
                ));
            }
            if let Some(first) = self.exchanges[..i].iter().position(|e| e.name == x.name) {
                return Err(ConfigError::invalid(
                    field,
                    format!("{:?} is the same as exchanges[{first}].name", x.name),
                    "declare each exchange once",
                ));
            }
        }
        for (i, q) in self.queues.iter().enumerate() {
            self.validate_queue_routing(i, q)?;
        }
        Ok(())
    }

    fn validate_queue_routing(&self, i: usize, q: &QueueConfig) -> Result<(), ConfigError> {
        if q.max_redeliveries == 0 {
            return Err(ConfigError::invalid(
                format!("queues[{i}].max_redeliveries"),
                "is 0",
                "set it to at least 1 (the default, 50, is well above what deploys and \
                 reconnects cause; it bounds the broker's x-delivery-count on quorum queues)",
            ));
        }
        if !(1..=QueueConfig::MAX_CONSUMER_TIMEOUT_STRIKES).contains(&q.consumer_timeout_strikes) {
            return Err(ConfigError::invalid(
                format!("queues[{i}].consumer_timeout_strikes"),
                format!("is {}", q.consumer_timeout_strikes),
                format!(
                    "set it between 1 and {} (default {}): how many times the broker may time \
                     out a message's acknowledgement (consumer_timeout) before it is \
                     dead-lettered as consumer-timeout",
                    QueueConfig::MAX_CONSUMER_TIMEOUT_STRIKES,
                    QueueConfig::DEFAULT_CONSUMER_TIMEOUT_STRIKES
                ),
            ));
        }
        if q.consumer_timeout.is_some_and(|t| t.as_millis() == 0) {
            return Err(ConfigError::invalid(
                format!("queues[{i}].consumer_timeout"),
                format!("is {:?}", q.consumer_timeout.unwrap_or_default()),
                "give it at least 1ms (the broker takes milliseconds), above the handler's \
                 longest run, or leave it out (the queue's or the broker's timeout applies)",
            ));
        }
        if q.passive {
            if let Some(what) = [
                (!q.bindings.is_empty()).then_some("bindings"),
                (!q.arguments.is_empty()).then_some("arguments"),
            ]
            .into_iter()
            .flatten()
            .next()
            {
                return Err(ConfigError::invalid(
                    format!("queues[{i}].{what}"),
                    "is set on a passive queue",
                    "a passive queue is declared elsewhere and acemq only checks that it \
                     exists: remove passive: true, or set its bindings and arguments where it \
                     is declared",
                ));
            }
        }
        for name in q.arguments.keys() {
            if let Some(key) = owned_argument(q, name) {
                return Err(ConfigError::invalid(
                    format!("queues[{i}].arguments.{name}"),
                    "is set by acemq",
                    format!("remove it; acemq sets it from {key}"),
                ));
            }
        }
        for (j, b) in q.bindings.iter().enumerate() {
            self.validate_binding(i, j, b)?;
        }
        Ok(())
    }

    /// Checks binding `j` of queue `i`: it names an exchange, one the config
    /// declares (or an `amq.*` one), with what its type needs.
    fn validate_binding(&self, i: usize, j: usize, b: &BindingConfig) -> Result<(), ConfigError> {
        let field = |f: &str| format!("queues[{i}].bindings[{j}].{f}");
        if b.exchange.is_empty() {
            return Err(ConfigError::invalid(
                field("exchange"),
                "is empty",
                "name an exchange: every queue is already reachable through the default \
                 exchange by its name, which takes no bindings",
            ));
        }
        let kind = self
            .exchanges
            .iter()
            .find(|x| x.name == b.exchange)
            .map(|x| x.kind);
        match kind {
            Some(ExchangeKind::Direct | ExchangeKind::Topic) if b.routing_keys.is_empty() => {
                return Err(ConfigError::invalid(
                    field("routing_keys"),
                    format!(
                        "is empty for the {} exchange {:?}",
                        kind.map_or("", ExchangeKind::as_str),
                        b.exchange
                    ),
                    "give at least one routing key (a topic pattern such as orders.*), or \
                     use a fanout exchange",
                ));
            }
            Some(ExchangeKind::Headers) if b.arguments.is_empty() => {
                return Err(ConfigError::invalid(
                    field("arguments"),
                    format!("is empty for the headers exchange {:?}", b.exchange),
                    "give the headers to match, e.g. { x-match: all, region: eu }",
                ));
            }
            None if !b.exchange.starts_with("amq.") => {
                return Err(ConfigError::invalid(
                    field("exchange"),
                    format!("{:?} is not in exchanges", b.exchange),
                    format!(
                        "declare it under exchanges: (e.g. {{ name: {}, type: topic }}) or \
                         bind to one of RabbitMQ's amq.* exchanges",
                        b.exchange
                    ),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// Checks that the handlers given match the config: every handler's
    /// queue is in the config, and every queue with `consume: true` (the
    /// default) has a handler. A queue with `consume: false` may have none
    /// (it is only declared); a handler for it is an error.
    pub(crate) fn check_handlers<'a>(
        &self,
        handled: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ConfigError> {
        let handled: Vec<&str> = handled.into_iter().collect();
        for h in &handled {
            match self.queues.iter().position(|q| q.name == *h) {
                None => {
                    return Err(ConfigError::invalid(
                        "queues",
                        format!("do not name {h:?}, which a handler was given for"),
                        "add it under `queues:` or fix the name given to App::consume",
                    ))
                }
                Some(i) if !self.queues[i].consume => {
                    return Err(ConfigError::invalid(
                        format!("queues[{i}].consume"),
                        format!("is false for {h:?}, which a handler was given for"),
                        "remove consume: false to consume it, or do not give it a handler",
                    ))
                }
                Some(_) => {}
            }
        }
        for (i, q) in self.queues.iter().enumerate() {
            if q.consume && !handled.contains(&q.name.as_str()) {
                return Err(ConfigError::invalid(
                    format!("queues[{i}].name"),
                    format!("{:?} has no handler", q.name),
                    format!(
                        "call App::consume({:?}, handler), set consume: false on it to only \
                         declare it, or remove it from the config",
                        q.name
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn invalid(yaml: &str) -> (String, String) {
        let err = Config::from_yaml_str(yaml).expect_err("rejected");
        (err.field().unwrap_or("").to_owned(), err.to_string())
    }

    #[test]
    fn a_binding_to_an_exchange_the_config_does_not_declare_is_rejected_unless_it_is_amq() {
        let (field, message) =
            invalid("queues: [{ name: q, bindings: [{ exchange: shop, routing_keys: [a] }] }]");
        assert_eq!(field, "queues[0].bindings[0].exchange");
        assert!(message.contains("declare it under exchanges:"), "{message}");
        Config::from_yaml_str(
            "queues: [{ name: q, bindings: [{ exchange: amq.topic, routing_keys: [a] }] }]",
        )
        .unwrap();
    }

    #[test]
    fn a_topic_binding_without_keys_and_a_headers_binding_without_arguments_are_rejected() {
        let (field, _) = invalid(
            "exchanges: [{ name: x, type: topic }]\nqueues: [{ name: q, bindings: [{ exchange: x }] }]",
        );
        assert_eq!(field, "queues[0].bindings[0].routing_keys");
        let (field, message) = invalid(
            "exchanges: [{ name: x, type: headers }]\nqueues: [{ name: q, bindings: [{ exchange: x }] }]",
        );
        assert_eq!(field, "queues[0].bindings[0].arguments");
        assert!(message.contains("x-match"), "{message}");
        Config::from_yaml_str(
            "exchanges: [{ name: x, type: fanout }]\nqueues: [{ name: q, bindings: [{ exchange: x }] }]",
        )
        .unwrap();
    }

    #[test]
    fn arguments_acemq_sets_itself_are_rejected_naming_the_key_that_sets_them() {
        let (field, message) =
            invalid("queues: [{ name: q, arguments: { x-queue-type: quorum } }]");
        assert_eq!(field, "queues[0].arguments.x-queue-type");
        assert!(message.contains("type"), "{message}");
        let (field, _) = invalid(
            "queues: [{ name: q, dead_letter: true, arguments: { x-dead-letter-exchange: other } }]",
        );
        assert_eq!(field, "queues[0].arguments.x-dead-letter-exchange");
        // Without dead_letter the queue's own dead-lettering is the user's.
        Config::from_yaml_str(
            "queues: [{ name: q, arguments: { x-dead-letter-exchange: other } }]",
        )
        .unwrap();
    }

    #[test]
    fn a_passive_queue_with_bindings_or_arguments_and_a_zero_redelivery_bound_are_rejected() {
        let (field, _) =
            invalid("queues: [{ name: q, passive: true, arguments: { x-max-length: 1 } }]");
        assert_eq!(field, "queues[0].arguments");
        let (field, _) = invalid("queues: [{ name: q, max_redeliveries: 0 }]");
        assert_eq!(field, "queues[0].max_redeliveries");
    }

    #[test]
    fn consumer_timeout_strikes_outside_1_to_100_is_rejected_naming_the_range_and_the_default() {
        for bad in ["0", "101", "4294967295"] {
            let (field, message) = invalid(&format!(
                "queues: [{{ name: q, consumer_timeout_strikes: {bad} }}]"
            ));
            assert_eq!(field, "queues[0].consumer_timeout_strikes", "{bad}");
            assert!(
                message.contains(&format!("is {bad}")) && message.contains("between 1 and 100"),
                "{message}"
            );
        }
        let ok =
            Config::from_yaml_str("queues: [{ name: q, consumer_timeout_strikes: 5 }]").unwrap();
        assert_eq!(ok.queues[0].consumer_timeout_strikes, 5);
        let default = Config::from_yaml_str("queues: [{ name: q }]").unwrap();
        assert_eq!(default.queues[0].consumer_timeout_strikes, 2);
    }

    #[test]
    fn exchanges_named_amq_empty_or_twice_are_rejected() {
        assert_eq!(
            invalid("exchanges: [{ name: amq.topic, type: topic }]\nqueues: [{ name: q }]").0,
            "exchanges[0].name"
        );
        assert_eq!(
            invalid("exchanges: [{ name: \"\", type: topic }]\nqueues: [{ name: q }]").0,
            "exchanges[0].name"
        );
        assert_eq!(
            invalid(
                "exchanges: [{ name: x, type: topic }, { name: x, type: fanout }]\nqueues: [{ name: q }]"
            )
            .0,
            "exchanges[1].name"
        );
        let unknown_type = Config::from_yaml_str(
            "exchanges: [{ name: x, type: x-delayed-message }]\nqueues: [{ name: q }]",
        )
        .unwrap_err()
        .to_string();
        assert!(unknown_type.contains("direct"), "{unknown_type}");
    }

    #[test]
    fn handlers_must_match_the_queues_that_are_consumed() {
        let config =
            Config::from_yaml_str("queues: [{ name: a }, { name: b, consume: false }]").unwrap();
        config.check_handlers(["a"]).unwrap();
        let none = config.check_handlers([]).unwrap_err();
        assert_eq!(none.field(), Some("queues[0].name"));
        let extra = config.check_handlers(["a", "b"]).unwrap_err();
        assert_eq!(extra.field(), Some("queues[1].consume"));
        let stranger = config.check_handlers(["a", "c"]).unwrap_err();
        assert!(stranger.to_string().contains("\"c\""), "{stranger}");
    }
}

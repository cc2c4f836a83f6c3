//! The routing part of the config: exchanges, bindings, a queue's own
//! arguments, and which queues are consumed, declared only, or only checked.
//!
//! ```
//! use acemq::config::{Config, ExchangeKind};
//!
//! let config = Config::from_yaml_str(
//!     r##"
//! exchanges:
//!   - { name: shop, type: topic }
//! queues:
//!   - name: shop.orders.eu
//!     bindings:
//!       - { exchange: shop, routing_keys: ["orders.eu.*"] }
//!     arguments: { x-max-length: 10000, x-single-active-consumer: true }
//!   - name: shop.audit
//!     consume: false
//!     bindings:
//!       - { exchange: shop, routing_keys: ["#"] }
//! "##,
//! )
//! .unwrap();
//! assert_eq!(config.exchanges[0].kind, ExchangeKind::Topic);
//! assert!(config.exchanges[0].durable); // the default
//! assert!(!config.queue("shop.audit").unwrap().consume);
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

/// An exchange to declare before any queue is bound to it.
///
/// ```
/// use acemq::config::{BindingConfig, Config, ExchangeConfig, ExchangeKind, QueueConfig};
///
/// let mut q = QueueConfig::new("billing.invoices");
/// q.bindings.push(BindingConfig::new("billing", ["invoice.created", "invoice.paid"]));
/// let mut config = Config::new([q]);
/// config.exchanges.push(ExchangeConfig::new("billing", ExchangeKind::Topic));
/// config.validate().unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ExchangeConfig {
    /// The exchange's name (required; not empty, at most 255 bytes, not
    /// starting with `amq.`, RabbitMQ's own, which exist already and can be
    /// bound to without declaring them).
    pub name: String,
    /// The exchange type, key `type` (required): `direct`, `topic`, `fanout`
    /// or `headers`.
    #[serde(rename = "type")]
    pub kind: ExchangeKind,
    /// Survives a broker restart (default true).
    #[serde(default = "yes")]
    pub durable: bool,
}

impl ExchangeConfig {
    /// A durable exchange `name` of type `kind`.
    pub fn new(name: impl Into<String>, kind: ExchangeKind) -> Self {
        ExchangeConfig {
            name: name.into(),
            kind,
            durable: true,
        }
    }
}

/// An exchange type. Serialised as `direct`, `topic`, `fanout` or `headers`.
///
/// ```
/// use acemq::config::{ExchangeConfig, ExchangeKind};
///
/// let x = ExchangeConfig::new("billing", ExchangeKind::Topic);
/// assert_eq!(x.kind.as_str(), "topic");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ExchangeKind {
    /// Routes on the exact routing key.
    Direct,
    /// Routes on routing-key patterns (`*` one word, `#` any).
    Topic,
    /// Routes to every bound queue; routing keys are ignored.
    Fanout,
    /// Routes on message headers, matched against the binding's arguments
    /// (`x-match: all | any`).
    Headers,
}

impl ExchangeKind {
    /// The AMQP name: `direct`, `topic`, `fanout`, `headers`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Headers => "headers",
        }
    }
}

/// A binding of a queue to an exchange.
///
/// ```
/// use acemq::config::{ArgValue, BindingConfig};
///
/// // A headers exchange matches on arguments, not routing keys.
/// let mut b = BindingConfig::new("events", Vec::<String>::new());
/// b.arguments.insert("x-match".into(), ArgValue::String("any".into()));
/// b.arguments.insert("region".into(), ArgValue::String("eu".into()));
/// ```
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BindingConfig {
    /// The exchange (required; one of `exchanges`, or one that exists
    /// already, such as `amq.topic`).
    pub exchange: String,
    /// One binding per routing key (default none: one binding with the empty
    /// key, what fanout and headers exchanges take). A direct or topic
    /// exchange of the config needs at least one.
    #[serde(default)]
    pub routing_keys: Vec<String>,
    /// The binding's arguments: for a headers exchange the headers to match
    /// and `x-match` (`all`, the default, or `any`).
    #[serde(default)]
    pub arguments: Arguments,
}

impl BindingConfig {
    /// A binding to `exchange` with these routing keys and no arguments.
    pub fn new<K: Into<String>>(
        exchange: impl Into<String>,
        routing_keys: impl IntoIterator<Item = K>,
    ) -> Self {
        BindingConfig {
            exchange: exchange.into(),
            routing_keys: routing_keys.into_iter().map(Into::into).collect(),
            arguments: Arguments::new(),
        }
    }
}

/// Queue or binding arguments, by name: `x-max-length: 1000`,
/// `x-single-active-consumer: true`, `x-match: any`. A name is at most 255
/// bytes (an AMQP short string), as is a binding's exchange name and each
/// routing key.
///
/// ```
/// use acemq::config::{ArgValue, Arguments, QueueConfig};
///
/// let mut q = QueueConfig::new("shop.orders");
/// q.arguments = Arguments::from([("x-max-length".to_owned(), ArgValue::Int(10_000))]);
/// ```
pub type Arguments = BTreeMap<String, ArgValue>;

/// One argument's value: what YAML, TOML and JSON can write plainly.
/// Integers go to the broker as signed 64-bit (`l`), which RabbitMQ treats as
/// equivalent to any other integer type when it compares a declaration.
///
/// ```
/// use acemq::config::{ArgValue, Config};
///
/// let config = Config::from_yaml_str(
///     "queues: [{ name: q, arguments: { x-max-length: 1000, x-single-active-consumer: true } }]",
/// ).unwrap();
/// assert_eq!(config.queues[0].arguments["x-max-length"], ArgValue::Int(1000));
/// assert_eq!(config.queues[0].arguments["x-single-active-consumer"], ArgValue::Bool(true));
/// ```
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum ArgValue {
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A number with a fraction.
    Float(f64),
    /// A string.
    String(String),
}

fn yes() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn exchanges_bindings_and_arguments_load_from_yaml_toml_and_json_alike() {
        let yaml = Config::from_yaml_str(
            "exchanges: [{ name: shop, type: topic, durable: false }]\n\
             queues:\n  - name: q\n    bindings: [{ exchange: shop, routing_keys: [a.*, b.#] }]\n\
             \x20   arguments: { x-max-length: 10, x-single-active-consumer: true, x-overflow: reject-publish }\n",
        )
        .unwrap();
        let toml = Config::from_toml_str(
            "[[exchanges]]\nname = \"shop\"\ntype = \"topic\"\ndurable = false\n\
             [[queues]]\nname = \"q\"\nbindings = [{ exchange = \"shop\", routing_keys = [\"a.*\", \"b.#\"] }]\n\
             arguments = { x-max-length = 10, x-single-active-consumer = true, x-overflow = \"reject-publish\" }\n",
        )
        .unwrap();
        let json = Config::from_json_str(
            r#"{"exchanges":[{"name":"shop","type":"topic","durable":false}],
                "queues":[{"name":"q","bindings":[{"exchange":"shop","routing_keys":["a.*","b.#"]}],
                "arguments":{"x-max-length":10,"x-single-active-consumer":true,"x-overflow":"reject-publish"}}]}"#,
        )
        .unwrap();
        assert_eq!(yaml, toml);
        assert_eq!(yaml, json);
        let q = &yaml.queues[0];
        assert_eq!(q.arguments["x-max-length"], ArgValue::Int(10));
        assert_eq!(
            q.arguments["x-single-active-consumer"],
            ArgValue::Bool(true)
        );
        assert_eq!(q.bindings[0].routing_keys, ["a.*", "b.#"]);
        assert!(!yaml.exchanges[0].durable);
        assert!(q.consume && !q.passive);
        assert_eq!(q.max_redeliveries, 50);
    }
}

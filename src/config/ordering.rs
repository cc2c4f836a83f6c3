//! Per-key ordering from config: a queue's `ordered_by`.
//!
//! ```yaml
//! queues:
//!   - name: shop.orders
//!     concurrency: 8
//!     ordered_by: { header: x-customer }   # or: routing_key, message_id
//! ```
//!
//! Deliveries with equal keys run one at a time, in the order they arrived;
//! different keys run up to `concurrency`. A delivery without the key runs
//! unordered. A delivery waiting for its key's turn is held: it takes no
//! concurrency permit and the drain hands it back. An in-process retry
//! keeps the key; a retry through a rung gives up the order for that
//! message (it comes back at the end of the queue). See
//! [`acemq_layers::partition`].
//!
//! The config reads it into the partition layer's own
//! [`OrderedBy`](acemq_layers::partition::OrderedBy) (re-exported as
//! [`acemq::config::OrderedBy`](crate::config::OrderedBy)): one type for the
//! key, whether it comes from a file or from code.
//!
//! ```
//! use acemq::config::{Config, OrderedBy};
//!
//! let config = Config::from_yaml_str(
//!     "queues: [{ name: shop.orders, ordered_by: { header: x-customer } }]",
//! ).unwrap();
//! assert_eq!(config.queues[0].ordered_by, Some(OrderedBy::Header("x-customer".into())));
//! ```

use acemq_layers::partition::OrderedBy;
use serde::{Deserialize, Deserializer};

use super::error::ConfigError;

/// The written forms: `routing_key`, `message_id`, `{ header: NAME }`
/// (the same in YAML, TOML and JSON).
#[derive(Deserialize)]
#[serde(untagged)]
enum Raw {
    Name(String),
    Header { header: String },
}

impl TryFrom<Raw> for OrderedBy {
    type Error = String;

    fn try_from(raw: Raw) -> Result<Self, String> {
        match raw {
            Raw::Header { header } => Ok(OrderedBy::Header(header.into())),
            Raw::Name(name) => match name.as_str() {
                "routing_key" => Ok(OrderedBy::RoutingKey),
                "message_id" => Ok(OrderedBy::MessageId),
                other => Err(format!(
                    "ordered_by: {other:?} is not a key: write `routing_key`, `message_id` or `{{ header: NAME }}`"
                )),
            },
        }
    }
}

/// Reads a queue's `ordered_by` (absent or `null`: none).
pub(super) fn deserialize<'de, D>(deserializer: D) -> Result<Option<OrderedBy>, D::Error>
where
    D: Deserializer<'de>,
{
    Option::<Raw>::deserialize(deserializer)?
        .map(|raw| OrderedBy::try_from(raw).map_err(serde::de::Error::custom))
        .transpose()
}

/// Checks the `ordered_by` of `queues[index]`.
pub(crate) fn validate_at(by: &OrderedBy, index: usize) -> Result<(), ConfigError> {
    if let OrderedBy::Header(name) = by {
        if name.trim().is_empty() {
            return Err(ConfigError::invalid(
                format!("queues[{index}].ordered_by.header"),
                "is empty",
                "name the header that carries the key, e.g. `ordered_by: { header: x-customer }`, or use `routing_key` or `message_id`",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{validate_at, OrderedBy};
    use crate::config::QueueConfig;

    fn queue(yaml: &str) -> Result<QueueConfig, serde_yaml_ng::Error> {
        serde_yaml_ng::from_str(yaml)
    }

    #[test]
    fn each_form_reads_from_yaml() {
        let q = queue("name: q\nordered_by: { header: x-customer }\n").unwrap();
        assert_eq!(q.ordered_by, Some(OrderedBy::Header("x-customer".into())));
        let q = queue("name: q\nordered_by: routing_key\n").unwrap();
        assert_eq!(q.ordered_by, Some(OrderedBy::RoutingKey));
        let q = queue("name: q\nordered_by: message_id\n").unwrap();
        assert_eq!(q.ordered_by, Some(OrderedBy::MessageId));
        assert_eq!(queue("name: q\n").unwrap().ordered_by, None);
        let e = queue("name: q\nordered_by: customer\n").unwrap_err();
        assert!(e.to_string().contains("routing_key"), "{e}");
        let json: QueueConfig =
            serde_json::from_str(r#"{"name": "q", "ordered_by": {"header": "x-customer"}}"#)
                .unwrap();
        assert_eq!(
            json.ordered_by,
            Some(OrderedBy::Header("x-customer".into()))
        );
    }

    #[test]
    fn an_empty_header_name_is_rejected_naming_the_field() {
        let e = validate_at(&OrderedBy::Header(" ".into()), 2).unwrap_err();
        assert!(e.to_string().contains("queues[2].ordered_by.header"), "{e}");
    }
}

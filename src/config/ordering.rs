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

use serde::{Deserialize, Serialize};

use super::error::ConfigError;

/// What a queue's deliveries are ordered by (`ordered_by`).
///
/// ```
/// use acemq::config::{Config, OrderedBy};
///
/// let config = Config::from_yaml_str(
///     "queues: [{ name: shop.orders, ordered_by: { header: x-customer } }]",
/// ).unwrap();
/// assert_eq!(config.queues[0].ordered_by, Some(OrderedBy::Header("x-customer".into())));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Raw", into = "Raw")]
pub enum OrderedBy {
    /// `{ header: NAME }`: the value of this header (a string, byte array
    /// or integer; a delivery without it runs unordered).
    Header(String),
    /// `routing_key`: the routing key the message was first published with.
    RoutingKey,
    /// `message_id`: the message id property (a delivery without one runs
    /// unordered).
    MessageId,
}

/// The written forms: `routing_key`, `message_id`, `{ header: NAME }`
/// (the same in YAML, TOML and JSON).
#[derive(Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum Raw {
    Name(String),
    Header { header: String },
}

impl TryFrom<Raw> for OrderedBy {
    type Error = String;

    fn try_from(raw: Raw) -> Result<Self, String> {
        match raw {
            Raw::Header { header } => Ok(OrderedBy::Header(header)),
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

impl From<OrderedBy> for Raw {
    fn from(by: OrderedBy) -> Raw {
        match by {
            OrderedBy::Header(header) => Raw::Header { header },
            OrderedBy::RoutingKey => Raw::Name("routing_key".into()),
            OrderedBy::MessageId => Raw::Name("message_id".into()),
        }
    }
}

impl OrderedBy {
    /// The partition layer's key for this choice.
    pub fn key(&self) -> acemq_layers::partition::OrderedBy {
        match self {
            OrderedBy::Header(name) => acemq_layers::partition::OrderedBy::header(name.as_str()),
            OrderedBy::RoutingKey => acemq_layers::partition::OrderedBy::RoutingKey,
            OrderedBy::MessageId => acemq_layers::partition::OrderedBy::MessageId,
        }
    }

    /// Checks the choice of `queues[index]`.
    pub(crate) fn validate_at(&self, index: usize) -> Result<(), ConfigError> {
        if let OrderedBy::Header(name) = self {
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
}

#[cfg(test)]
mod tests {
    use super::OrderedBy;
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
        let e = OrderedBy::Header(" ".into()).validate_at(2).unwrap_err();
        assert!(e.to_string().contains("queues[2].ordered_by.header"), "{e}");
    }
}

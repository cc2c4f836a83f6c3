//! Per-key ordering from config: a queue's `ordered_by`.
//!
//! ```yaml
//! queues:
//!   - name: shop.orders
//!     concurrency: 8
//!     ordered_by: { header: x-customer }   # or: routing_key, message_id,
//!                                          # { json: /customer/id }
//! ```
//!
//! Deliveries with equal keys run one at a time, in the order they arrived;
//! different keys run up to `concurrency`. A delivery without the key runs
//! unordered.
//!
//! `{ json: POINTER }` keys on a field of a JSON body, where no header
//! carries the key: a [JSON pointer](https://www.rfc-editor.org/rfc/rfc6901)
//! (`/customer_id`, `/customer/id`, `/lines/0/sku`). A string, a number or a
//! boolean there is the key (the string `"7"` and the number `7` are
//! different keys); a body that is not JSON, or has `null`, an object, an
//! array or nothing there, has no key and runs unordered. The body is
//! parsed once: the parsed document goes into the delivery's extensions as
//! a [`JsonBody`], which the handler reads instead of parsing again
//! (`Order::deserialize(body.value())`). From code, a key of any function
//! of the delivery: [`QueueStack::ordered_by_fn`](crate::QueueStack::ordered_by_fn). A delivery waiting for its key's turn is held: it takes no
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

use std::sync::Arc;

use acemq_layers::partition::{key_hash, KeyFn, OrderedBy};
use acemq_layers::Delivery;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::error::ConfigError;

/// A delivery's body as parsed by `ordered_by: { json: POINTER }`, in its
/// extensions: the handler deserializes from it instead of parsing the body
/// again. Only a delivery whose body is JSON with a key at the pointer
/// carries one.
///
/// ```
/// use acemq::config::JsonBody;
/// use acemq::Delivery;
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Order { id: String }
///
/// fn order(d: &Delivery) -> serde_json::Result<Order> {
///     match d.extensions().get::<JsonBody>() {
///         Some(body) => Order::deserialize(body.value()),
///         None => serde_json::from_slice(d.body()),
///     }
/// }
/// # let _ = order;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct JsonBody(Arc<Value>);

impl JsonBody {
    /// The parsed body.
    pub fn value(&self) -> &Value {
        &self.0
    }
}

/// The key at `pointer` in a JSON body, the document left in the
/// delivery's extensions as a [`JsonBody`].
pub fn json_key(pointer: &str) -> OrderedBy {
    let at = pointer.to_owned();
    OrderedBy::Fn(KeyFn::new(
        format!("json {pointer}"),
        move |d: &Delivery, found| {
            let doc: Value = serde_json::from_slice(d.body()).ok()?;
            let key = match doc.pointer(&at)? {
                Value::String(s) => key_hash(s.as_bytes()),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => key_hash(&i),
                    None => key_hash(&n.to_string()),
                },
                Value::Bool(b) => key_hash(b),
                Value::Null | Value::Array(_) | Value::Object(_) => return None,
            };
            found.insert(JsonBody(Arc::new(doc)));
            Some(key)
        },
    ))
}

/// The written forms: `routing_key`, `message_id`, `{ header: NAME }`,
/// `{ json: POINTER }` (the same in YAML, TOML and JSON).
#[derive(Deserialize)]
#[serde(untagged)]
enum Raw {
    Name(String),
    Header { header: String },
    Json { json: String },
}

impl TryFrom<Raw> for OrderedBy {
    type Error = String;

    fn try_from(raw: Raw) -> Result<Self, String> {
        match raw {
            Raw::Header { header } => Ok(OrderedBy::Header(header.into())),
            Raw::Json { json } if json.starts_with('/') => Ok(json_key(&json)),
            Raw::Json { json } => Err(format!(
                "ordered_by.json: {json:?} is not a JSON pointer: write one that starts with `/`, e.g. `{{ json: /customer_id }}`"
            )),
            Raw::Name(name) => match name.as_str() {
                "routing_key" => Ok(OrderedBy::RoutingKey),
                "message_id" => Ok(OrderedBy::MessageId),
                other => Err(format!(
                    "ordered_by: {other:?} is not a key: write `routing_key`, `message_id`, `{{ header: NAME }}` or `{{ json: /POINTER }}`"
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
    fn the_json_form_keys_on_a_field_of_the_body_and_leaves_the_parsed_body() {
        use acemq_layers::partition::{key_hash, Key};
        use acemq_layers::Delivery;

        let q = queue("name: q\nordered_by: { json: /customer/id }\n").unwrap();
        let by = q.ordered_by.expect("a key");
        assert_eq!(by, super::json_key("/customer/id"));
        assert_ne!(by, super::json_key("/customer"));
        let mut d = Delivery::builder()
            .body(r#"{"customer": {"id": "ada"}, "total": 3}"#)
            .build();
        assert_eq!(by.key_mut(&mut d), Some(key_hash(&b"ada"[..])));
        let body = d
            .extensions()
            .get::<super::JsonBody>()
            .expect("the parsed body");
        assert_eq!(body.value()["total"], 3);
        let number = Delivery::builder()
            .body(r#"{"customer": {"id": 7}}"#)
            .build();
        assert_eq!(by.key(&number), Some(key_hash(&7i64)));
        for keyless in [
            "not json",
            r#"{"customer": {}}"#,
            r#"{"customer": {"id": null}}"#,
        ] {
            let mut d = Delivery::builder().body(keyless).build();
            assert_eq!(by.key_mut(&mut d), None, "{keyless}");
            assert!(d.extensions().get::<super::JsonBody>().is_none());
        }
        let e = queue("name: q\nordered_by: { json: customer_id }\n").unwrap_err();
        assert!(e.to_string().contains("starts with `/`"), "{e}");
    }

    #[test]
    fn an_empty_header_name_is_rejected_naming_the_field() {
        let e = validate_at(&OrderedBy::Header(" ".into()), 2).unwrap_err();
        assert!(e.to_string().contains("queues[2].ordered_by.header"), "{e}");
    }
}

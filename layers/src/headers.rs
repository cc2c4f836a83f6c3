//! An owned, transport-agnostic header map.
//!
//! AMQP headers are a table of typed values. [`Headers`] keeps every type the
//! AMQP 0-9-1 field table can carry, so a message republished to a retry rung
//! or to the dead-letter queue keeps its original headers exactly. The
//! `acemq` crate converts to and from lapin's `FieldTable`.

use std::collections::BTreeMap;

/// Header carried by rung copies and dead-letter copies: the exchange the
/// message was first published to (empty for the default exchange). Set on
/// the first hop, kept after; read back by
/// [`Delivery::original_exchange`](crate::Delivery::original_exchange).
pub const ORIGINAL_EXCHANGE_HEADER: &str = "x-acemq-original-exchange";

/// Header carried by rung copies and dead-letter copies: the routing key the
/// message was first published with. Set on the first hop, kept after; read
/// back by [`Delivery::original_routing_key`](crate::Delivery::original_routing_key).
pub const ORIGINAL_ROUTING_KEY_HEADER: &str = "x-acemq-original-routing-key";

/// The header a quorum queue adds to a message it redelivers: how many times
/// it was returned to the queue (a requeue, a closed channel, a hand-back).
/// Never copied onto a rung or dead-letter copy (the copy is a new message
/// to the broker, and a stale count would spend its bound).
pub const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// The header RabbitMQ 4.3's quorum queues add to a message they redeliver
/// beside [`DELIVERY_COUNT_HEADER`]: how many times it was acquired by a
/// consumer and came back, whatever brought it back (from RabbitMQ's
/// release notes and quorum queue guide: 4.3 counts a `basic.nack`, a
/// consumer timeout and a consumer's node lost in a partition here, and no
/// longer in `x-delivery-count`). Read like `x-delivery-count`; never copied
/// onto a rung or dead-letter copy, for the same reason.
pub const ACQUIRED_COUNT_HEADER: &str = "x-acquired-count";

/// The headers the broker counts redeliveries in, stripped from every copy.
pub const REDELIVERY_COUNT_HEADERS: [&str; 2] = [DELIVERY_COUNT_HEADER, ACQUIRED_COUNT_HEADER];

/// One header value. Mirrors the AMQP 0-9-1 field-value types.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// A boolean.
    Bool(bool),
    /// A signed 8-bit integer.
    I8(i8),
    /// An unsigned 8-bit integer.
    U8(u8),
    /// A signed 16-bit integer.
    I16(i16),
    /// An unsigned 16-bit integer.
    U16(u16),
    /// A signed 32-bit integer.
    I32(i32),
    /// An unsigned 32-bit integer.
    U32(u32),
    /// A signed 64-bit integer.
    I64(i64),
    /// A 32-bit float.
    F32(f32),
    /// A 64-bit float.
    F64(f64),
    /// A decimal: `value / 10^scale`.
    Decimal {
        /// Number of decimal places.
        scale: u8,
        /// The unscaled value.
        value: u32,
    },
    /// A string (AMQP long string; may hold any bytes, usually UTF-8).
    String(Vec<u8>),
    /// A byte array (RabbitMQ extension).
    Bytes(Vec<u8>),
    /// An array of values.
    Array(Vec<Value>),
    /// A timestamp in seconds since the Unix epoch.
    Timestamp(u64),
    /// A nested table.
    Table(Headers),
    /// No value.
    Void,
}

impl Value {
    /// The value as a signed integer, when it is one of the integer types.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::I8(v) => v.into(),
            Value::U8(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I64(v) => v,
            Value::Timestamp(v) => i64::try_from(v).ok()?,
            _ => return None,
        })
    }

    /// The value as text, when it is a string holding valid UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => std::str::from_utf8(s).ok(),
            _ => None,
        }
    }

    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Bool(_) => "bool",
            Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_) => "signed integer",
            Value::U8(_) | Value::U16(_) | Value::U32(_) => "unsigned integer",
            Value::F32(_) | Value::F64(_) => "float",
            Value::Decimal { .. } => "decimal",
            Value::String(_) => "string",
            Value::Bytes(_) => "byte array",
            Value::Array(_) => "array",
            Value::Timestamp(_) => "timestamp",
            Value::Table(_) => "table",
            Value::Void => "void",
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.as_bytes().to_vec())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(s.into_bytes())
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::I64(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::I64(v.into())
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

/// An owned map of header names to [`Value`]s, ordered by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Headers(BTreeMap<String, Value>);

impl Headers {
    /// An empty map (does not allocate).
    pub const fn new() -> Self {
        Headers(BTreeMap::new())
    }

    /// The value of `name`, if present.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name)
    }

    /// Sets `name` to `value`, returning the previous value.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<Value>) -> Option<Value> {
        self.0.insert(name.into(), value.into())
    }

    /// Removes `name`, returning its value.
    pub fn remove(&mut self, name: &str) -> Option<Value> {
        self.0.remove(name)
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether any header's name starts with `prefix`.
    pub(crate) fn has_prefixed(&self, prefix: &str) -> bool {
        self.0
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .next()
            .is_some_and(|(name, _)| name.starts_with(prefix))
    }

    /// Removes every header whose name starts with `prefix`; how many.
    pub(crate) fn remove_prefixed(&mut self, prefix: &str) -> usize {
        let before = self.0.len();
        self.0.retain(|name, _| !name.starts_with(prefix));
        before - self.0.len()
    }

    /// Iterates over the headers in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }
}

impl FromIterator<(String, Value)> for Headers {
    fn from_iter<T: IntoIterator<Item = (String, Value)>>(iter: T) -> Self {
        Headers(iter.into_iter().collect())
    }
}

impl IntoIterator for Headers {
    type Item = (String, Value);
    type IntoIter = std::collections::btree_map::IntoIter<String, Value>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

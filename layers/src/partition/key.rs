//! What a delivery's key is: [`Key`], the ready-made [`OrderedBy`], and
//! [`key_hash`].

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::Delivery;

/// How the partition layer finds a delivery's key: a 64-bit hash, or
/// `None` for a delivery without one (it runs unordered, as soon as the
/// concurrency allows).
///
/// Implemented for [`OrderedBy`] and for every `Fn(&Delivery) -> Option<u64>`
/// that is `Clone` (hash your own key with [`key_hash`]).
pub trait Key {
    /// The key of `delivery`.
    fn key(&self, delivery: &Delivery) -> Option<u64>;
}

impl<F> Key for F
where
    F: Fn(&Delivery) -> Option<u64>,
{
    fn key(&self, delivery: &Delivery) -> Option<u64> {
        self(delivery)
    }
}

/// The 64-bit hash the layer keeps for a key: equal values give equal
/// hashes within a process (std's `DefaultHasher` with fixed keys); no
/// allocation. Two different keys with one hash are only serialised, never
/// run together.
pub fn key_hash<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// Ready-made keys: a header's value, the routing key, the message id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrderedBy {
    /// The value of this header. A string, byte array or integer value is
    /// a key (an integer and the same digits as a string are different
    /// keys); a delivery without the header, or with a value of another
    /// type, has none.
    Header(Arc<str>),
    /// The routing key the message was published with (on a rung's copy,
    /// the original routing key: the key does not change with a retry).
    RoutingKey,
    /// The message id property; a delivery without one has no key.
    MessageId,
}

impl OrderedBy {
    /// The value of header `name`.
    pub fn header(name: impl Into<Arc<str>>) -> Self {
        OrderedBy::Header(name.into())
    }
}

impl Key for OrderedBy {
    fn key(&self, d: &Delivery) -> Option<u64> {
        match self {
            OrderedBy::Header(name) => {
                let value = d.headers().get(name)?;
                match value {
                    crate::Value::String(b) | crate::Value::Bytes(b) => {
                        Some(key_hash(b.as_slice()))
                    }
                    other => other.as_i64().map(|n| key_hash(&n)),
                }
            }
            OrderedBy::RoutingKey => Some(key_hash(d.original_routing_key())),
            OrderedBy::MessageId => d.properties().message_id.as_deref().map(key_hash),
        }
    }
}

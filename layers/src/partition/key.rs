//! What a delivery's key is: [`Key`], the ready-made [`OrderedBy`], a
//! function of the delivery ([`KeyFn`]), and [`key_hash`].

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use http::Extensions;

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

    /// The key of `delivery`, which the key may also leave in the
    /// delivery's extensions for the handler (what it parsed the body
    /// into, say, so the handler does not parse it again). The layer calls
    /// this one; by default it is [`key`](Self::key).
    fn key_mut(&self, delivery: &mut Delivery) -> Option<u64> {
        self.key(delivery)
    }
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

/// Ready-made keys: a header's value, the routing key, the message id, or
/// a function of the delivery.
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
    /// A function of the delivery, its body included: see [`KeyFn`].
    Fn(KeyFn),
}

/// The type-erased function behind [`KeyFn`].
type KeyFnInner = dyn Fn(&Delivery, &mut Extensions) -> Option<u64> + Send + Sync;

/// A key computed by a function of the delivery, body included
/// ([`OrderedBy::Fn`]): what acemq's `QueueStack::ordered_by_fn` and a
/// queue's `ordered_by: { json: POINTER }` make.
///
/// The function may leave what it found in the delivery's extensions (the
/// `&mut Extensions` it is given is added to them), so the handler reuses
/// it instead of parsing the body again; [`KeyFn::hashed`] leaves the key
/// there as an [`OrderingKey`].
///
/// Two `KeyFn`s are equal when their names are: name each distinctly.
#[derive(Clone)]
pub struct KeyFn {
    name: Arc<str>,
    f: Arc<KeyFnInner>,
}

impl KeyFn {
    /// A key named `name` (shown by `Debug`, compared by `==`) computed by
    /// `f`, which may insert values into the extensions it is given: they
    /// go into the delivery's.
    pub fn new(
        name: impl Into<Arc<str>>,
        f: impl Fn(&Delivery, &mut Extensions) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        KeyFn {
            name: name.into(),
            f: Arc::new(f),
        }
    }

    /// A key from `f`'s value, hashed with [`key_hash`] and left in the
    /// delivery's extensions as an [`OrderingKey<T>`] for the handler.
    pub fn hashed<T, F>(name: impl Into<Arc<str>>, f: F) -> Self
    where
        T: Hash + Clone + Send + Sync + 'static,
        F: Fn(&Delivery) -> Option<T> + Send + Sync + 'static,
    {
        KeyFn::new(name, move |d: &Delivery, ext: &mut Extensions| {
            let key = f(d)?;
            let hash = key_hash(&key);
            ext.insert(OrderingKey(key));
            Some(hash)
        })
    }

    /// The name it was given.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl PartialEq for KeyFn {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for KeyFn {}

// A `KeyFn` holds no state of its own that a panic could leave half
// changed (the function is only called): a config holding one is usable
// across `catch_unwind`.
impl std::panic::UnwindSafe for KeyFn {}
impl std::panic::RefUnwindSafe for KeyFn {}

impl fmt::Debug for KeyFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("KeyFn").field(&self.name).finish()
    }
}

/// The key [`KeyFn::hashed`] found, in the delivery's extensions:
/// `delivery.extensions().get::<OrderingKey<T>>()` in the handler.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OrderingKey<T>(pub T);

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
            OrderedBy::Fn(k) => (k.f)(d, &mut Extensions::new()),
        }
    }

    fn key_mut(&self, d: &mut Delivery) -> Option<u64> {
        let OrderedBy::Fn(k) = self else {
            return self.key(d);
        };
        let mut found = Extensions::new();
        let key = (k.f)(d, &mut found);
        d.extensions_mut().extend(found);
        key
    }
}

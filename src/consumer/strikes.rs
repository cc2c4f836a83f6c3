//! Consumer-timeout strikes: which delivery a broker's acknowledgement
//! timeout was about, and a queue's bounded memory of how often each
//! message was struck.
//!
//! When the broker times out an acknowledgement (`consumer_timeout`) it
//! closes the channel (RabbitMQ 3.x, 4.0: `PRECONDITION_FAILED - delivery
//! acknowledgement on channel N timed out`) or cancels the consumer with
//! the channel left open (RabbitMQ 4.3). Either way every unacknowledged
//! delivery on it comes back, short innocent ones included. So only the
//! delivery the timeout was about is struck, by this rule:
//!
//! > Of the deliveries whose handler had started and whose outcome was not
//! > yet settled when the close (or cancel) arrived, the one received
//! > earliest is struck, and so is every other received within
//! > [`MARGIN`] (1 s) of it. Deliveries only buffered (never started) and
//! > deliveries already settled are never struck.
//!
//! The broker times out the oldest unacknowledged delivery; deliveries
//! received within the margin of it are indistinguishable from it at the
//! broker's granularity, and any short handler among them has settled long
//! before the timeout (the margin is far below any sane `consumer_timeout`).
//!
//! A message is remembered by its `message_id` when it has one, else by a
//! digest of its body and headers (without `x-delivery-count` and
//! `x-acquired-count`, which change on every return), in a map of at most
//! [`CAPACITY`] messages per queue (the least recently struck is forgotten
//! first). A message settled by its handler is forgotten. The memory is
//! this process's: with two instances, a struck message may come back to
//! the other one, which starts counting afresh.

use crate::sync::Locked;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use acemq_layers::headers::DELIVERY_COUNT_HEADER;
use acemq_layers::{Delivery, Value};

/// Deliveries received within this of the earliest unsettled one are
/// struck with it.
pub(crate) const MARGIN: Duration = Duration::from_secs(1);

/// The most messages a queue's memory holds.
pub(crate) const CAPACITY: usize = 4096;

/// RabbitMQ 4.3's count of acquisitions: changes on every return, like
/// `x-delivery-count`.
const ACQUIRED_COUNT_HEADER: &str = "x-acquired-count";

/// What told the loop that the broker timed out an acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timeout {
    /// The broker closed the channel: `406 PRECONDITION_FAILED - delivery
    /// acknowledgement on channel N timed out` (RabbitMQ 3.x, 4.0).
    ChannelClosed,
    /// The broker cancelled the consumer with its channel left open
    /// (RabbitMQ 4.3's consumer timeout; also a deleted queue, whose
    /// messages never come back, so its strikes only age out).
    ConsumerCancelled,
}

impl Timeout {
    /// Whether `error` is the broker's acknowledgement timeout.
    pub(crate) fn of_close(error: &lapin::Error) -> Option<Timeout> {
        match error.kind() {
            lapin::ErrorKind::ProtocolError(e)
                if e.get_id() == 406 && is_ack_timeout(e.get_message().as_str()) =>
            {
                Some(Timeout::ChannelClosed)
            }
            _ => None,
        }
    }
}

/// The reply text of an acknowledgement timeout.
fn is_ack_timeout(text: &str) -> bool {
    text.contains("delivery acknowledgement") && text.contains("timed out")
}

/// The hasher of strike keys: rapidhash, several times faster than the
/// standard library's SipHash over a large body (the keys live in this
/// process only, so a fixed seed is fine).
type KeyHasher = rapidhash::quality::RapidHasher<'static>;

/// The key a message is remembered by: its `message_id`, else a digest of
/// its body and headers. It is taken only when asked ([`Key::value`]):
/// when the queue's memory holds a struck message or an acknowledgement
/// has timed out, never on the way of an ordinary delivery. Until then the
/// key keeps the delivery (a reference count; the stack holds the
/// delivery until its handler has finished anyway).
#[derive(Debug, Clone)]
pub(crate) enum Key {
    /// Taken.
    Value(u64),
    /// Not taken yet: from this delivery when asked.
    Of(Delivery),
}

impl Default for Key {
    fn default() -> Key {
        Key::Value(0)
    }
}

impl Key {
    /// `delivery`'s key, taken when asked.
    pub(crate) fn of(delivery: &Delivery) -> Key {
        Key::Of(delivery.clone())
    }

    /// `delivery`'s key, taken now.
    pub(crate) fn taken(delivery: &Delivery) -> Key {
        Key::Value(digest(delivery))
    }

    /// The key's value (taken now if it was not).
    pub(crate) fn value(&self) -> u64 {
        match self {
            Key::Value(value) => *value,
            Key::Of(delivery) => digest(delivery),
        }
    }
}

/// The digest of `delivery`'s message id, or of its headers (without the
/// return counts) and body.
fn digest(delivery: &Delivery) -> u64 {
    let mut h = KeyHasher::default();
    match delivery.properties().message_id.as_deref() {
        Some(id) if !id.is_empty() => {
            0u8.hash(&mut h);
            id.hash(&mut h);
        }
        _ => {
            1u8.hash(&mut h);
            for (name, value) in delivery.headers().iter() {
                if name == DELIVERY_COUNT_HEADER || name == ACQUIRED_COUNT_HEADER {
                    continue;
                }
                name.hash(&mut h);
                hash_value(value, &mut h);
            }
            delivery.body().hash(&mut h);
        }
    }
    h.finish()
}

#[cfg(test)]
impl From<u64> for Key {
    fn from(value: u64) -> Key {
        Key::Value(value)
    }
}

/// The value of a delivery's key.
#[cfg(test)]
pub(crate) fn key_of(delivery: &Delivery) -> u64 {
    Key::of(delivery).value()
}

fn hash_value(value: &Value, h: &mut KeyHasher) {
    value.type_name().hash(h);
    match value {
        Value::Bool(v) => v.hash(h),
        Value::F32(v) => v.to_bits().hash(h),
        Value::F64(v) => v.to_bits().hash(h),
        Value::Decimal { scale, value } => (scale, value).hash(h),
        Value::String(v) | Value::Bytes(v) => v.hash(h),
        Value::Array(vs) => {
            vs.len().hash(h);
            vs.iter().for_each(|v| hash_value(v, h));
        }
        Value::Table(t) => {
            for (k, v) in t.iter() {
                k.hash(h);
                hash_value(v, h);
            }
        }
        Value::Void => {}
        other => other.as_i64().hash(h),
    }
}

/// A queue's memory of struck messages, shared by its generations: key →
/// strikes, at most `capacity` keys, the least recently struck forgotten
/// first.
#[derive(Debug)]
pub(crate) struct Strikes {
    /// Keys held; read without the lock (empty: nothing to look up).
    len: AtomicUsize,
    capacity: usize,
    inner: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    /// key → (strikes, when last struck).
    entries: HashMap<u64, (u32, u64)>,
    clock: u64,
}

impl Default for Strikes {
    fn default() -> Self {
        Strikes::with_capacity(CAPACITY)
    }
}

impl Strikes {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Strikes {
            len: AtomicUsize::new(0),
            capacity: capacity.max(1),
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.inner.locked()
    }

    /// Nothing remembered (no lookup needed).
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// Keys remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// One more strike for `key`; its strikes now.
    pub(crate) fn strike(&self, key: u64) -> u32 {
        let mut lru = self.lock();
        lru.clock += 1;
        let now = lru.clock;
        if !lru.entries.contains_key(&key) && lru.entries.len() >= self.capacity {
            // Rare (a strike costs a whole consumer_timeout): a scan is fine.
            let oldest = lru
                .entries
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                lru.entries.remove(&k);
            }
        }
        let e = lru.entries.entry(key).or_insert((0, now));
        e.0 = e.0.saturating_add(1);
        e.1 = now;
        let n = e.0;
        self.len.store(lru.entries.len(), Ordering::Relaxed);
        n
    }

    /// `key`'s strikes (0 when not remembered).
    pub(crate) fn get(&self, key: u64) -> u32 {
        if self.is_empty() {
            return 0;
        }
        self.lock().entries.get(&key).map_or(0, |(n, _)| *n)
    }

    /// Forgets `key` (its message was settled).
    pub(crate) fn forget(&self, key: u64) {
        if self.is_empty() {
            return;
        }
        let mut lru = self.lock();
        lru.entries.remove(&key);
        self.len.store(lru.entries.len(), Ordering::Relaxed);
    }
}

/// One generation's started and unsettled deliveries: tag, received, key,
/// in order of tag. Tags count up on a channel and handlers start in the
/// order their deliveries arrived, so an entry goes on the back, and one
/// leaves from the front unless a later handler finished first (then it is
/// found by binary search): no hashing, and no allocation once the queue's
/// prefetch has been in flight once.
#[derive(Debug, Default)]
pub(crate) struct Started {
    by_tag: VecDeque<(u64, Instant, Key)>,
}

impl Started {
    /// A handler started for `tag`, received at `received`.
    pub(crate) fn insert(&mut self, tag: u64, received: Instant, key: Key) {
        match self.by_tag.back() {
            Some((last, _, _)) if *last >= tag => {
                // Not in arrival order (never seen on one channel): kept
                // sorted all the same.
                let at = self.by_tag.partition_point(|(t, _, _)| *t < tag);
                if self.by_tag.get(at).is_some_and(|(t, _, _)| *t == tag) {
                    self.by_tag[at] = (tag, received, key);
                } else {
                    self.by_tag.insert(at, (tag, received, key));
                }
            }
            _ => self.by_tag.push_back((tag, received, key)),
        }
    }

    /// `tag`'s handler finished; its key.
    pub(crate) fn remove(&mut self, tag: u64) -> Option<Key> {
        let at = match self.by_tag.front() {
            Some((first, _, _)) if *first == tag => 0,
            _ => self
                .by_tag
                .binary_search_by_key(&tag, |(t, _, _)| *t)
                .ok()?,
        };
        self.by_tag.remove(at).map(|(_, _, key)| key)
    }

    /// Started and not yet settled.
    pub(crate) fn len(&self) -> usize {
        self.by_tag.len()
    }

    /// Every entry, tag and key, taken out.
    pub(crate) fn take_all(&mut self) -> Vec<(u64, Key)> {
        self.by_tag
            .drain(..)
            .map(|(tag, _, key)| (tag, key))
            .collect()
    }

    /// The deliveries a timeout was about (see the module docs): tag and
    /// key of the one received earliest and of every other received within
    /// [`MARGIN`] of it.
    pub(crate) fn suspects(&self) -> Vec<(u64, u64)> {
        let Some(first) = self.by_tag.iter().map(|(_, at, _)| *at).min() else {
            return Vec::new();
        };
        self.by_tag
            .iter()
            .filter(|(_, at, _)| at.saturating_duration_since(first) <= MARGIN)
            .map(|(tag, _, key)| (*tag, key.value()))
            .collect()
    }

    /// The entry point of both signals (a channel closed for an
    /// acknowledgement timeout, a consumer cancelled by the broker): strikes
    /// the suspects in `memory`; each struck tag with its strikes now.
    pub(crate) fn strike(&self, memory: &Strikes, why: Timeout) -> Vec<(u64, u32)> {
        tracing::debug!(
            ?why,
            suspects = self.by_tag.len(),
            "an acknowledgement timed out"
        );
        self.suspects()
            .into_iter()
            .map(|(tag, key)| (tag, memory.strike(key)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_layers::{Headers, Properties};

    fn delivery(body: &str, id: Option<&str>, headers: &[(&str, Value)]) -> Delivery {
        let mut h = Headers::new();
        for (k, v) in headers {
            h.insert(*k, v.clone());
        }
        let mut p = Properties::default();
        p.message_id = id.map(str::to_owned);
        Delivery::builder()
            .queue("q")
            .body(body.to_owned())
            .headers(h)
            .properties(p)
            .build()
    }

    #[test]
    fn a_message_is_known_by_its_id_else_by_body_and_headers_whatever_its_return_counts() {
        let a = delivery("x", Some("m-1"), &[]);
        assert_eq!(
            key_of(&a),
            key_of(&delivery("other body", Some("m-1"), &[]))
        );
        assert_ne!(key_of(&a), key_of(&delivery("x", Some("m-2"), &[])));
        let plain = delivery("x", None, &[("k", Value::I32(1))]);
        let returned = delivery(
            "x",
            None,
            &[
                ("k", Value::I32(1)),
                (DELIVERY_COUNT_HEADER, Value::I64(3)),
                (ACQUIRED_COUNT_HEADER, Value::I64(4)),
            ],
        );
        assert_eq!(key_of(&plain), key_of(&returned));
        assert_ne!(
            key_of(&plain),
            key_of(&delivery("y", None, &[("k", Value::I32(1))]))
        );
        assert_ne!(
            key_of(&plain),
            key_of(&delivery("x", None, &[("k", Value::I32(2))]))
        );
        // An empty message id is no id.
        assert_eq!(
            key_of(&delivery("x", Some(""), &[])),
            key_of(&delivery("x", None, &[]))
        );
        // Taken when asked or at once, the same message gives the same key.
        let big = "b".repeat(64 * 1024);
        let deferred = Key::of(&delivery(&big, None, &[]));
        assert!(
            matches!(deferred, Key::Of(_)),
            "nothing digested on the way"
        );
        assert_eq!(deferred.value(), key_of(&delivery(&big, None, &[])));
        assert_eq!(
            deferred.value(),
            Key::taken(&delivery(&big, None, &[])).value()
        );
        assert_ne!(deferred.value(), key_of(&delivery(&big[1..], None, &[])));
        assert_eq!(Key::of(&a).value(), Key::taken(&a).value());
    }

    #[test]
    fn the_memory_counts_per_key_forgets_settled_ones_and_stays_within_its_capacity() {
        let m = Strikes::with_capacity(3);
        assert!(m.is_empty());
        assert_eq!((m.strike(1), m.strike(1), m.strike(2)), (1, 2, 1));
        assert_eq!((m.get(1), m.get(2), m.get(9)), (2, 1, 0));
        m.forget(2);
        assert_eq!((m.get(2), m.len()), (0, 1));
        m.strike(3);
        m.strike(4);
        m.strike(1); // 1 is now the most recently struck
        m.strike(5); // full: 3, the least recently struck, goes
        assert_eq!(m.len(), 3);
        assert_eq!((m.get(3), m.get(1), m.get(4), m.get(5)), (0, 3, 1, 1));
    }

    #[test]
    fn the_suspects_are_the_earliest_received_started_delivery_and_those_within_the_margin() {
        let t0 = Instant::now();
        let mut s = Started::default();
        assert!(s.suspects().is_empty());
        s.insert(1, t0, 11.into());
        s.insert(2, t0 + Duration::from_millis(200), 12.into());
        s.insert(3, t0 + MARGIN + Duration::from_millis(500), 13.into());
        assert_eq!(s.suspects(), [(1, 11), (2, 12)]);
        // Settled: no longer a suspect; the earliest unsettled one is.
        assert_eq!(s.remove(1).map(|k| k.value()), Some(11));
        assert_eq!(s.remove(2).map(|k| k.value()), Some(12));
        assert_eq!(s.suspects(), [(3, 13)]);
    }

    #[test]
    fn started_deliveries_finish_in_any_order_and_stay_in_tag_order() {
        let t0 = Instant::now();
        let mut s = Started::default();
        for tag in 1..=4 {
            s.insert(tag, t0, (tag * 10).into());
        }
        // A later handler finishes first; then the first; a tag never
        // started is not there.
        assert_eq!(s.remove(3).map(|k| k.value()), Some(30));
        assert_eq!(s.remove(1).map(|k| k.value()), Some(10));
        assert!(s.remove(3).is_none() && s.remove(9).is_none());
        assert_eq!(s.suspects(), [(2, 20), (4, 40)]);
        // A tag out of order (never seen on one channel) still goes in its
        // place, and one started again replaces its entry.
        s.insert(3, t0, 33.into());
        s.insert(4, t0, 44.into());
        assert_eq!(s.suspects(), [(2, 20), (3, 33), (4, 44)]);
        assert_eq!(s.len(), 3);
        let taken: Vec<_> = s
            .take_all()
            .into_iter()
            .map(|(t, k)| (t, k.value()))
            .collect();
        assert_eq!(taken, [(2, 20), (3, 33), (4, 44)]);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_consumer_cancelled_by_the_broker_strikes_the_same_suspects_as_a_timed_out_close() {
        let t0 = Instant::now();
        let mut s = Started::default();
        s.insert(7, t0, 70.into());
        s.insert(8, t0 + MARGIN * 2, 80.into()); // innocent: received later
        let memory = Strikes::default();
        // A synthetic server basic.cancel (RabbitMQ 4.3's consumer timeout).
        assert_eq!(s.strike(&memory, Timeout::ConsumerCancelled), [(7, 1)]);
        // And a synthetic channel.close for an acknowledgement timeout.
        let close: lapin::Error = lapin::ErrorKind::ProtocolError(
            lapin::protocol::AMQPError::from_id(
                406,
                "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. \
                 Timeout value used: 2000 ms."
                    .into(),
            )
            .unwrap(),
        )
        .into();
        let why = Timeout::of_close(&close).expect("an acknowledgement timeout");
        assert_eq!(why, Timeout::ChannelClosed);
        assert_eq!(s.strike(&memory, why), [(7, 2)]);
        assert_eq!((memory.get(70), memory.get(80)), (2, 0));
    }

    #[test]
    fn other_closes_are_not_acknowledgement_timeouts() {
        let other: lapin::Error = lapin::ErrorKind::ProtocolError(
            lapin::protocol::AMQPError::from_id(
                406,
                "PRECONDITION_FAILED - unknown delivery tag 9".into(),
            )
            .unwrap(),
        )
        .into();
        assert_eq!(Timeout::of_close(&other), None);
        let gone: lapin::Error = lapin::ErrorKind::InvalidChannelState(
            lapin::ChannelState::Closed,
            "the consumer's stream ended",
        )
        .into();
        assert_eq!(Timeout::of_close(&gone), None);
    }
}

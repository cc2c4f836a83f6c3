//! Where a message came from, believed only where the broker vouches for
//! it.
//!
//! The retry and dead-letter layers record a message's first exchange and
//! routing key in [`ORIGINAL_EXCHANGE_HEADER`] and
//! [`ORIGINAL_ROUTING_KEY_HEADER`] (and the telemetry its producer's trace
//! context in `x-acemq-original-traceparent`) on its first hop, so
//! [`Delivery::original_routing_key`](crate::Delivery::original_routing_key)
//! is the same on every attempt. A publisher can send those headers on a
//! first delivery as well; [`Delivery::received`](crate::Delivery::received)
//! (every transport's delivery) removes every `x-acemq-original-*` header
//! unless [`believed`]:
//!
//! - the delivery came through the default exchange with this queue's name
//!   as its routing key (as a rung's copy and a replayed one do), **and**
//! - its `x-death` names one of this queue's rungs (`{queue}.retry.*`: the
//!   broker dead-lettered it back from one), or it carries
//!   [`REPLAYED_HEADER`] (the replay put it back).
//!
//! A message published through any other exchange never has its
//! `x-acemq-original-*` believed. One published to this queue through the
//! default exchange can still carry them believed: the marker is a header
//! like any other, and on RabbitMQ 3.x a publisher can send `x-death` too.
//! Never authorise anything on these headers.

use crate::headers::{Headers, Value, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER};

/// The prefix of the provenance headers (exchange, routing key, the
/// producer's trace context).
pub const ORIGINAL_HEADER_PREFIX: &str = "x-acemq-original-";

/// The header the replay (`acemq::replay`) sets on a dead letter it puts
/// back on its queue, so that the copy's `x-acemq-original-*` are kept.
pub const REPLAYED_HEADER: &str = "x-acemq-replayed";

/// The broker's dead-lettering history header.
const X_DEATH: &str = "x-death";

// The two named headers are provenance headers.
const _: () = {
    assert!(starts_with(
        ORIGINAL_EXCHANGE_HEADER,
        ORIGINAL_HEADER_PREFIX
    ));
    assert!(starts_with(
        ORIGINAL_ROUTING_KEY_HEADER,
        ORIGINAL_HEADER_PREFIX
    ));
};

const fn starts_with(s: &str, prefix: &str) -> bool {
    let (s, p) = (s.as_bytes(), prefix.as_bytes());
    if s.len() < p.len() {
        return false;
    }
    let mut i = 0;
    while i < p.len() {
        if s[i] != p[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether the `x-acemq-original-*` headers of a delivery received on
/// `queue` through `exchange` with `routing_key` are believed (see the
/// [module docs](self)).
pub fn believed(headers: &Headers, queue: &str, exchange: &str, routing_key: &str) -> bool {
    exchange.is_empty()
        && routing_key == queue
        && (headers.get(REPLAYED_HEADER).is_some() || came_back_from_a_rung(headers, queue))
}

/// Removes the `x-acemq-original-*` headers unless [`believed`]; whether
/// it removed any.
pub fn strip_unbelieved(
    headers: &mut Headers,
    queue: &str,
    exchange: &str,
    routing_key: &str,
) -> bool {
    headers.has_prefixed(ORIGINAL_HEADER_PREFIX)
        && !believed(headers, queue, exchange, routing_key)
        && headers.remove_prefixed(ORIGINAL_HEADER_PREFIX) > 0
}

/// Whether the most recent `x-death` entry (the broker keeps them newest
/// first) is the broker dead-lettering the message out of `queue` itself
/// (expired, over a length limit, rejected): a copy the consumer never
/// handled, whose headers are the publisher's as sent.
pub fn dead_lettered_by_broker_from(headers: &Headers, queue: &str) -> bool {
    deaths(headers).next() == Some(queue)
}

fn came_back_from_a_rung(headers: &Headers, queue: &str) -> bool {
    deaths(headers).any(|q| {
        q.strip_prefix(queue)
            .is_some_and(|rest| rest.starts_with(".retry."))
    })
}

/// The queues of the `x-death` entries, newest first.
fn deaths(headers: &Headers) -> impl Iterator<Item = &str> {
    let entries = match headers.get(X_DEATH) {
        Some(Value::Array(entries)) => entries.as_slice(),
        _ => &[],
    };
    entries.iter().filter_map(|entry| match entry {
        Value::Table(t) => t.get("queue").and_then(Value::as_str),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn death(queue: &str) -> Value {
        let mut t = Headers::new();
        t.insert("queue", queue);
        t.insert("reason", "expired");
        Value::Table(t)
    }

    fn forged(deaths: &[&str]) -> Headers {
        let mut h = Headers::new();
        h.insert(ORIGINAL_EXCHANGE_HEADER, "payments");
        h.insert(ORIGINAL_ROUTING_KEY_HEADER, "refund.approved");
        h.insert("x-acemq-original-traceparent", "00-ab-cd-01");
        h.insert("x-custom", "kept");
        if !deaths.is_empty() {
            h.insert(
                X_DEATH,
                Value::Array(deaths.iter().map(|q| death(q)).collect()),
            );
        }
        h
    }

    fn stripped(mut h: Headers, exchange: &str, routing_key: &str) -> bool {
        let removed = strip_unbelieved(&mut h, "orders", exchange, routing_key);
        assert_eq!(h.get("x-custom"), Some(&Value::from("kept")));
        assert_eq!(removed, h.get(ORIGINAL_ROUTING_KEY_HEADER).is_none());
        removed
    }

    #[test]
    fn a_first_delivery_loses_the_provenance_its_publisher_sent() {
        assert!(stripped(forged(&[]), "shop", "orders.new"));
        assert!(
            stripped(forged(&[]), "", "orders"),
            "default exchange, no rung"
        );
        let mut h = forged(&[]);
        strip_unbelieved(&mut h, "orders", "shop", "orders.new");
        assert_eq!(h.iter().count(), 1, "every x-acemq-original-* gone: {h:?}");
    }

    #[test]
    fn a_copy_back_from_this_queues_rung_keeps_it() {
        assert!(!stripped(forged(&["orders.retry.60s"]), "", "orders"));
        assert!(!stripped(
            forged(&["orders.retry.120s", "orders.retry.60s"]),
            "",
            "orders"
        ));
    }

    #[test]
    fn another_queues_rung_or_another_route_is_not_believed() {
        assert!(stripped(forged(&["billing.retry.60s"]), "", "orders"));
        assert!(stripped(forged(&["orders.retryx"]), "", "orders"));
        assert!(stripped(forged(&["orders"]), "", "orders"));
        assert!(stripped(forged(&["orders.retry.60s"]), "shop", "orders"));
        assert!(stripped(forged(&["orders.retry.60s"]), "", "billing"));
    }

    #[test]
    fn a_replayed_copy_keeps_it_only_through_the_default_exchange() {
        let mut h = forged(&[]);
        h.insert(REPLAYED_HEADER, true);
        assert!(!stripped(h.clone(), "", "orders"));
        assert!(stripped(h, "amq.topic", "orders"));
    }

    #[test]
    fn the_newest_death_tells_a_broker_dead_letter_from_the_queue() {
        assert!(dead_lettered_by_broker_from(
            &forged(&["orders", "orders.retry.60s"]),
            "orders"
        ));
        assert!(!dead_lettered_by_broker_from(
            &forged(&["orders.retry.60s", "orders"]),
            "orders"
        ));
        assert!(!dead_lettered_by_broker_from(&forged(&[]), "orders"));
    }

    #[test]
    fn without_provenance_nothing_is_touched() {
        let mut h = Headers::new();
        h.insert("x-custom", "kept");
        assert!(!strip_unbelieved(&mut h, "orders", "shop", "x"));
        assert_eq!(h.len(), 1);
    }
}

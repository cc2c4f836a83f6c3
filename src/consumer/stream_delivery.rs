//! A stream message as a delivery of the queue's stack, and again after a
//! hand-back outside the drain (a stream has no requeue).

use std::sync::Arc;

use acemq_layers::{Delivery, Lifeline, Received};

use crate::stream::StreamMessage;

/// The offset a delivery was read at (kept in its extensions).
pub(super) fn delivery_offset(d: &Delivery) -> u64 {
    d.extensions().get::<StreamOffsetOf>().map_or(0, |o| o.0)
}

/// A stream message's offset, in its delivery's extensions: read it with
/// `delivery.extensions().get::<StreamOffsetOf>()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamOffsetOf(pub u64);

/// A stream message as a delivery: the routing key it was published with
/// (`x-routing-key`, where the broker kept it), else the partition's name.
pub(super) fn delivery_of(
    queue: &Arc<str>,
    stream: &str,
    m: StreamMessage,
    tag: u64,
    lifeline: &Lifeline,
) -> Delivery {
    let routing_key = match m.headers.get("x-routing-key") {
        Some(acemq_layers::Value::String(s)) => String::from_utf8_lossy(s).into_owned(),
        _ => stream.to_owned(),
    };
    let exchange = match m.headers.get("x-exchange") {
        Some(acemq_layers::Value::String(s)) => String::from_utf8_lossy(s).into_owned(),
        _ => String::new(),
    };
    // The broker counts no redelivery on a stream: what a publisher wrote
    // there is not believed (the loop counts its own re-runs).
    let mut headers = m.headers;
    for name in acemq_layers::headers::REDELIVERY_COUNT_HEADERS {
        headers.remove(name);
    }
    let mut d = Delivery::received(Received {
        queue: queue.clone(),
        exchange,
        routing_key,
        body: m.body,
        headers,
        properties: m.properties,
        delivery_tag: tag,
        redelivered: false,
        lifeline: lifeline.clone(),
    });
    d.extensions_mut().insert(StreamOffsetOf(m.offset));
    if let Some(why) = m.malformed {
        d.extensions_mut()
            .insert(acemq_layers::redelivery::MalformedHeaders::new(why));
    }
    d
}

/// The same message again, for a hand-back outside the drain: its
/// `runs`-th time, counted in `x-delivery-count`, so the redelivery limit
/// dead-letters one handed back more than `max_redeliveries` times.
pub(super) fn redelivered(d: &Delivery, tag: u64, lifeline: &Lifeline, runs: u32) -> Delivery {
    let mut headers = d.headers().clone();
    headers.insert(
        acemq_layers::headers::DELIVERY_COUNT_HEADER,
        acemq_layers::Value::I64(i64::from(runs)),
    );
    let mut again = Delivery::received(Received {
        queue: Arc::from(d.queue()),
        exchange: d.exchange().to_owned(),
        routing_key: d.routing_key().to_owned(),
        body: d.body().clone(),
        headers,
        properties: d.properties().clone(),
        delivery_tag: tag,
        redelivered: true,
        lifeline: lifeline.clone(),
    });
    again
        .extensions_mut()
        .insert(StreamOffsetOf(delivery_offset(d)));
    again
}

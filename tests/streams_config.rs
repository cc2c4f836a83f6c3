//! A stream entry's config and declarations, without a broker: its keys
//! and their errors, the super stream's partitions and bindings, rungs that
//! lead to the work queue.

use acemq::config::{Config, QueueType, StreamOffset};
use acemq::topology::Topology;
use lapin::types::AMQPValue;

fn load(yaml: &str) -> Result<Config, String> {
    Config::from_yaml_str(yaml).map_err(|e| e.to_string())
}

#[test]
fn a_stream_entry_reads_its_keys() {
    let c = load(
        "streams: { port: 5553, advertised_host: rabbit.internal }
queues:
  - name: events
    type: stream
    offset: 2026-12-07T17:00:00.5+01:00
    consumer_name: shop
    max_length_bytes: 1000000
    max_age: 2h
    stream_max_segment_size_bytes: 50000
    offset_store: { every: 10, within: 200ms }
",
    )
    .unwrap();
    let q = c.queue("events").unwrap();
    assert_eq!(q.kind, QueueType::Stream);
    assert_eq!(q.offset, Some(StreamOffset::Timestamp(1_796_659_200_500)));
    assert_eq!(q.stream_consumer_name(), "shop");
    assert!(
        !q.stream_single_active(),
        "off by default on a plain stream"
    );
    assert_eq!(q.offset_store.every, 10);
    assert_eq!(c.streams.port, 5553);
    assert_eq!(
        c.streams.advertised_host.as_deref(),
        Some("rabbit.internal")
    );
    let t = Topology::from_config(&c);
    let d = t.get("events").unwrap();
    let arg = |k: &str| d.arguments.inner().get(k).cloned();
    assert_eq!(
        arg("x-queue-type"),
        Some(AMQPValue::LongString("stream".into()))
    );
    assert_eq!(
        arg("x-max-age"),
        Some(AMQPValue::LongString("7200s".into()))
    );
    assert_eq!(
        arg("x-max-length-bytes"),
        Some(AMQPValue::LongLongInt(1_000_000))
    );
    assert_eq!(
        arg("x-stream-max-segment-size-bytes"),
        Some(AMQPValue::LongLongInt(50_000))
    );
    assert!(
        arg("x-dead-letter-exchange").is_none(),
        "a stream takes no dead-letter arguments"
    );
}

#[test]
fn a_super_stream_declares_its_partitions_exchange_and_ordered_bindings_and_its_rungs_lead_to_the_work_queue(
) {
    let c = load(
        "queues:
  - name: orders
    type: stream
    partitions: 3
    dead_letter: true
    retries: { max_attempts: 3, initial_delay: 5, max_delay: 10, broker_wait_threshold: 5 }
",
    )
    .unwrap();
    let q = c.queue("orders").unwrap();
    assert!(q.is_super_stream() && q.stream_single_active());
    let t = Topology::from_config(&c);
    let names: Vec<&str> = t.decls().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "orders-0",
            "orders-1",
            "orders-2",
            "orders.dlq",
            "orders.retry.5s",
            "orders.retry.10s",
            "orders.work"
        ]
    );
    assert!(t.exchanges().iter().any(|x| x.name == "orders"));
    let bindings: Vec<(String, String, Option<AMQPValue>)> = t
        .bindings()
        .iter()
        .map(|b| {
            (
                b.queue.clone(),
                b.routing_key.clone(),
                b.arguments.inner().get("x-stream-partition-order").cloned(),
            )
        })
        .collect();
    assert_eq!(
        bindings[1],
        ("orders-1".into(), "1".into(), Some(AMQPValue::LongInt(1)))
    );
    let rung = t.get("orders.retry.5s").unwrap();
    assert_eq!(
        rung.arguments.inner().get("x-dead-letter-routing-key"),
        Some(&AMQPValue::LongString("orders.work".into())),
        "nothing goes back to the stream"
    );
    assert!(
        rung.arguments.inner().get("x-queue-type").is_none(),
        "classic rungs"
    );
}

#[test]
fn stream_keys_are_refused_where_they_mean_nothing() {
    let cases = [
        ("queues: [{ name: q, offset: first }]", "queues[0].offset"),
        (
            "queues: [{ name: q, partitions: 3 }]",
            "queues[0].partitions",
        ),
        (
            "queues: [{ name: q, type: stream, partitions: 0 }]",
            "queues[0].partitions",
        ),
        (
            "queues: [{ name: q, type: stream, partitions: 2, binding_keys: [a] }]",
            "queues[0].binding_keys",
        ),
        (
            "queues: [{ name: q, type: stream, consumer_timeout: 5s }]",
            "queues[0].consumer_timeout",
        ),
        (
            "queues: [{ name: q, type: stream, offset_store: { every: 0 } }]",
            "queues[0].offset_store",
        ),
        (
            "queues: [{ name: q, type: stream, offset: yesterday }]",
            "yesterday",
        ),
    ];
    for (yaml, names) in cases {
        let e = load(yaml).expect_err(yaml);
        assert!(e.contains(names), "{yaml}: {e}");
    }
}

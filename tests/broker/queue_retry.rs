//! A quorum queue's own delayed retry (RabbitMQ 4.3 and later:
//! `x-delayed-retry-type|min|max`), as the broker does it and as acemq's
//! `retries: { in_queue: true }` uses it.

use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable};

use crate::broker_version::ctl_version;
use crate::support::{field_table, long_str, unique, Broker, QueueCleanup};

fn int_header(d: &lapin::message::Delivery, name: &str) -> Option<i64> {
    let h = d.properties.headers().as_ref()?;
    match h.inner().get(name)? {
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::LongInt(v) => Some(i64::from(*v)),
        AMQPValue::LongUInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortShortInt(v) => Some(i64::from(*v)),
        _ => None,
    }
}

/// What the broker does, measured with a plain client: a `basic.reject`
/// with requeue comes back after `min · x-delivery-count` (capped at max),
/// a `basic.nack` with requeue at once, and the message's own headers stay.
#[tokio::test(flavor = "current_thread")]
async fn a_quorum_queues_delayed_retry_delays_rejects_linearly_and_not_nacks() {
    let (said, version) = ctl_version().await;
    if version < (4, 3) {
        eprintln!(
            "RabbitMQ {said}: no delayed retry in quorum queues before 4.3; nothing to measure"
        );
        return;
    }
    let q = unique("qretry.facts");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    let mut broker = Broker::new().await;
    broker
        .declare(
            &q,
            field_table(vec![
                ("x-queue-type", long_str("quorum")),
                ("x-delayed-retry-type", long_str("failed")),
                ("x-delayed-retry-min", AMQPValue::LongLongInt(400)),
                ("x-delayed-retry-max", AMQPValue::LongLongInt(1000)),
            ]),
        )
        .await
        .expect("4.3 declares a quorum queue with a delayed retry");
    let headers = field_table(vec![
        ("x-acemq-attempt", AMQPValue::LongLongInt(1)),
        ("k", long_str("v")),
    ]);
    broker.publish(&q, b"m", headers).await;

    let ch = broker.conn.create_channel().await.expect("channel");
    ch.basic_qos(10, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = ch
        .basic_consume(
            q.as_str().into(),
            "facts".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let mut seen = Vec::new();
    let mut last = Instant::now();
    // Three rejects, then a nack, then an ack.
    for step in 0..5 {
        let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("redelivered within 10 s")
            .expect("a delivery")
            .expect("ok");
        let gap = last.elapsed();
        last = Instant::now();
        seen.push((
            gap.as_millis(),
            int_header(&d, "x-delivery-count"),
            int_header(&d, "x-acquired-count"),
            int_header(&d, "x-acemq-attempt"),
            d.redelivered,
        ));
        match step {
            0..=2 => {
                d.reject(BasicRejectOptions { requeue: true })
                    .await
                    .expect("reject");
            }
            3 => {
                d.nack(BasicNackOptions {
                    requeue: true,
                    multiple: false,
                })
                .await
                .expect("nack");
            }
            _ => {
                d.ack(Default::default()).await.expect("ack");
            }
        }
    }
    eprintln!("RabbitMQ {said}: (gap ms, x-delivery-count, x-acquired-count, x-acemq-attempt, redelivered) = {seen:?}");
    let gaps: Vec<u128> = seen.iter().map(|s| s.0).collect();
    // after reject 1, 2, 3: 400, 800, 1000 (capped); after the nack: at once
    assert!((380..700).contains(&gaps[1]), "{seen:?}");
    assert!((780..1100).contains(&gaps[2]), "{seen:?}");
    assert!((980..1300).contains(&gaps[3]), "{seen:?}");
    assert!(
        gaps[4] < 300,
        "a nack is not delayed under type failed: {seen:?}"
    );
    let counts: Vec<Option<i64>> = seen.iter().map(|s| s.1).collect();
    assert_eq!(
        counts,
        [None, Some(1), Some(2), Some(3), Some(3)],
        "{seen:?}"
    );
    assert!(
        seen.iter().all(|s| s.3 == Some(1)),
        "the message's own headers stay as published: {seen:?}"
    );
}

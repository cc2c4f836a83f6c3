//! A quorum queue's own delayed retry (RabbitMQ 4.3 and later:
//! `x-delayed-retry-type|min|max`), as the broker does it and as acemq's
//! `retries: { in_queue: true }` uses it.

use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable};

use crate::support::{ctl_version, field_table, long_str, unique, Broker, QueueCleanup};

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

/// A quorum queue's arguments with the broker's delayed retry of failed
/// returns: `min` · the delivery count, at most `max` (milliseconds).
fn delayed_retry(min: i64, max: i64) -> FieldTable {
    field_table(vec![
        ("x-queue-type", long_str("quorum")),
        ("x-delayed-retry-type", long_str("failed")),
        ("x-delayed-retry-min", AMQPValue::LongLongInt(min)),
        ("x-delayed-retry-max", AMQPValue::LongLongInt(max)),
    ])
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
        .declare(&q, delayed_retry(400, 1000))
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

/// A quorum queue whose 3 attempts, 400 ms then 800 ms apart, wait in the
/// queue itself.
fn in_queue_config(q: &str) -> acemq::Config {
    let mut queue = acemq::config::QueueConfig::new(q);
    queue.kind = acemq::config::QueueType::Quorum;
    queue.dead_letter = true;
    let mut retries = acemq::config::RetriesConfig::new(
        3,
        Duration::from_millis(400),
        Duration::from_millis(800),
    );
    retries.in_queue = true;
    queue.retries = Some(retries);
    let mut config = acemq::Config::new([queue]);
    config.shutdown_timeout = Duration::from_secs(10);
    config
}

/// Each call's attempt number and when it came.
type Calls = std::sync::Arc<std::sync::Mutex<Vec<(u32, Instant)>>>;

fn failing_until(succeed_at: u32, calls: Calls) -> impl crate::support::TestHandler {
    tower::service_fn(move |d: acemq::Delivery| {
        let calls = calls.clone();
        async move {
            calls.lock().unwrap().push((d.attempt(), Instant::now()));
            if d.attempt() >= succeed_at {
                Ok(())
            } else {
                Err::<(), acemq::BoxError>(format!("attempt {} fails", d.attempt()).into())
            }
        }
    })
}

/// On 4.3: attempts 1, 2, 3 of one message, rejected with requeue and held
/// back by the queue (about 400 ms, then 800 ms), the attempt read from
/// `x-delivery-count`, no rung declared, nothing dead-lettered. Before 4.3
/// the start ends with exit 78 naming the field, nothing declared.
#[tokio::test(flavor = "current_thread")]
async fn retries_in_the_queue_wait_in_the_queue_on_4_3_and_end_the_start_before() {
    let (said, version) = ctl_version().await;
    let q = unique("qretry.app");
    let dlq = format!("{q}.dlq");
    let _cleanup = QueueCleanup::new(vec![q.clone(), dlq.clone()]);
    let calls = Calls::default();
    let started = acemq::App::new(in_queue_config(&q))
        .consume(&q, failing_until(3, calls.clone()))
        .start()
        .await;
    let mut broker = Broker::new().await;
    if version < (4, 3) {
        let Err(e) = started else {
            panic!("retries.in_queue starts on RabbitMQ {said}");
        };
        assert_eq!(e.exit_code(), 78, "{e}");
        let text = e.to_string();
        assert!(
            text.contains("queues[0].retries.in_queue")
                && text.contains(&format!("RabbitMQ {said}")),
            "{text}"
        );
        assert_eq!(broker.ready(&q).await, None, "{q} was declared");
        return;
    }
    let running = started.expect("starts on 4.3");
    broker.publish(&q, b"order", FieldTable::default()).await;
    let done = crate::support::eventually(Duration::from_secs(15), || {
        let n = calls.lock().unwrap().len();
        async move { n >= 3 }
    })
    .await;
    assert!(done, "3 attempts within 15 s: {:?}", calls.lock().unwrap());
    assert!(
        crate::support::eventually(Duration::from_secs(5), || async {
            Broker::new().await.ready(&q).await == Some(0)
        })
        .await
    );
    running.drain().await.expect("drains");
    let calls = calls.lock().unwrap().clone();
    let attempts: Vec<u32> = calls.iter().map(|c| c.0).collect();
    assert_eq!(attempts, [1, 2, 3]);
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1].1 - w[0].1).collect();
    eprintln!("RabbitMQ {said}: gaps between attempts {gaps:?}");
    assert!(
        gaps[0] >= Duration::from_millis(380) && gaps[0] < Duration::from_secs(3),
        "{gaps:?}"
    );
    assert!(
        gaps[1] >= Duration::from_millis(780) && gaps[1] < Duration::from_secs(4),
        "{gaps:?}"
    );
    assert_eq!(broker.ready(&dlq).await, Some(0), "nothing dead-lettered");
    assert_eq!(
        broker.ready(&format!("{q}.retry.400ms")).await,
        None,
        "no rung declared"
    );
    broker.delete(&[q, dlq]).await;
}

/// On 4.3: a message that always fails is tried 3 times, in the queue, and
/// dead-lettered as `max-attempts` with `x-acemq-attempts: 3`.
#[tokio::test(flavor = "current_thread")]
async fn a_message_failing_every_attempt_in_the_queue_is_dead_lettered_after_the_last() {
    let (said, version) = ctl_version().await;
    if version < (4, 3) {
        eprintln!(
            "RabbitMQ {said}: retries in the queue need 4.3 (the start is refused: tested above)"
        );
        return;
    }
    let q = unique("qretry.dead");
    let dlq = format!("{q}.dlq");
    let _cleanup = QueueCleanup::new(vec![q.clone(), dlq.clone()]);
    let calls = Calls::default();
    let running = crate::support::start_consuming(
        in_queue_config(&q),
        &q,
        failing_until(u32::MAX, calls.clone()),
    )
    .await;
    let mut broker = Broker::new().await;
    broker.publish(&q, b"order", FieldTable::default()).await;
    assert!(
        broker.wait_ready(&dlq, 1, Duration::from_secs(15)).await,
        "dead-lettered within 15 s"
    );
    running.drain().await.expect("drains");
    let attempts: Vec<u32> = calls.lock().unwrap().iter().map(|c| c.0).collect();
    assert_eq!(attempts, [1, 2, 3]);
    let m = broker.get(&dlq).await.expect("the dead letter");
    let h = crate::support::message_headers(&m.properties);
    assert_eq!(
        h.get("x-acemq-reason").and_then(|v| v.as_str()),
        Some("max-attempts")
    );
    assert_eq!(h.get("x-acemq-attempts").and_then(|v| v.as_i64()), Some(3));
    broker.delete(&[q, dlq]).await;
}

/// The broker's CPU time so far (user + system), from `/proc/PID/stat`.
fn broker_cpu(pid: u32) -> Duration {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the broker's /proc stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<u64> = after.split(' ').map(|x| x.parse().unwrap_or(0)).collect();
    // utime and stime are fields 14 and 15 (1-based), 12 and 13 after ')'.
    let ticks = f[11] + f[12];
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

/// Rungs against the queue's own delayed retry, one run each on the same
/// broker: 1,000 messages, each failing 3 times and handled on its 4th
/// attempt (100 ms, 200 ms, 300 ms apart). Prints the queues declared and
/// the broker's CPU per retried message. Run by hand against a 4.3 node,
/// with the node's `beam.smp` in `ACEMQ_BROKER_PID`
/// (`scripts/broker-node.sh pid NAME PORT`); see docs/reliability/rabbitmq4.md.
#[tokio::test(flavor = "current_thread")]
#[ignore = "a measurement: needs a 4.3 node of its own and ACEMQ_BROKER_PID"]
async fn measure_rungs_against_the_queues_own_delayed_retry() {
    let pid: u32 = std::env::var("ACEMQ_BROKER_PID")
        .expect("ACEMQ_BROKER_PID: the node's beam.smp")
        .parse()
        .expect("a pid");
    let n = 1_000usize;
    for in_queue in [false, true] {
        let q = unique(if in_queue {
            "qretry.m.queue"
        } else {
            "qretry.m.rungs"
        });
        let mut queue = acemq::config::QueueConfig::new(&q);
        queue.kind = acemq::config::QueueType::Quorum;
        queue.dead_letter = true;
        let mut retries = acemq::config::RetriesConfig::new(
            4,
            Duration::from_millis(100),
            Duration::from_millis(300),
        );
        retries.in_queue = in_queue;
        retries.broker_wait_threshold = Duration::ZERO; // every wait in the broker
        queue.retries = Some(retries);
        let config = acemq::Config::new([queue]);
        let all = crate::support::topology_queues(&config);
        let _cleanup = QueueCleanup::new(all.clone());
        let calls = Calls::default();
        let running =
            crate::support::start_consuming(config, &q, failing_until(4, calls.clone())).await;
        let mut broker = Broker::new().await;
        let bodies: Vec<Vec<u8>> = (0..n).map(|i| i.to_string().into_bytes()).collect();
        let cpu0 = broker_cpu(pid);
        let t0 = Instant::now();
        broker
            .publish_many(&q, &bodies, lapin::BasicProperties::default())
            .await;
        let done = crate::support::eventually(Duration::from_secs(300), || {
            let handled = calls.lock().unwrap().iter().filter(|c| c.0 >= 4).count();
            async move { handled >= n }
        })
        .await;
        let wall = t0.elapsed();
        let cpu = broker_cpu(pid) - cpu0;
        assert!(done, "{n} messages handled within 300 s");
        let calls_made = calls.lock().unwrap().len();
        running.drain().await.expect("drains");
        eprintln!(
            "{}: {} queues declared ({all:?}), {calls_made} handler calls, {:.1} s wall, broker CPU {:.2} s = {:.0} µs per retry ({} retries)",
            if in_queue { "in the queue" } else { "rungs" },
            all.len(),
            wall.as_secs_f64(),
            cpu.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / (3 * n) as f64,
            3 * n
        );
        broker.delete(&all).await;
    }
}

/// On 4.3: a quorum queue that exists without a delayed retry refuses to be
/// declared again with one (`PRECONDITION_FAILED - inequivalent arg
/// 'x-delayed-retry-type'`), and a reject still comes back at once: acemq's
/// start names the queue and the argument.
#[tokio::test(flavor = "current_thread")]
async fn an_existing_quorum_queue_refuses_a_delayed_retry_declared_again() {
    let (said, version) = ctl_version().await;
    if version < (4, 3) {
        eprintln!("RabbitMQ {said}: no delayed retry before 4.3");
        return;
    }
    let q = unique("qretry.existing");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    let mut broker = Broker::new().await;
    broker
        .declare(&q, field_table(vec![("x-queue-type", long_str("quorum"))]))
        .await
        .expect("declared without");
    let mut config = in_queue_config(&q);
    config.queues[0].dead_letter = false;
    let started = acemq::App::new(config)
        .consume(&q, failing_until(1, Calls::default()))
        .start()
        .await;
    let Err(e) = started else {
        panic!("an existing queue without the delayed retry is declared again with it");
    };
    let text = e.to_string();
    eprintln!("RabbitMQ {said}: {text}");
    assert_eq!(e.exit_code(), 78, "{text}");
    assert!(
        text.contains(&q) && text.contains("x-delayed-retry-type"),
        "{text}"
    );
    let gap = reject_gap(&mut broker, &q).await;
    assert!(
        gap < Duration::from_millis(300),
        "no delay on the existing queue: {gap:?}"
    );
    broker.delete(&[q]).await;
}

/// Publishes one message, rejects its first delivery with requeue, and
/// returns how long the redelivery took (the message is then acknowledged).
async fn reject_gap(broker: &mut Broker, q: &str) -> Duration {
    broker.publish(q, b"m", FieldTable::default()).await;
    let ch = broker.conn.create_channel().await.expect("channel");
    let mut consumer = ch
        .basic_consume(
            q.into(),
            "gap".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let d = next(&mut consumer).await;
    d.reject(BasicRejectOptions { requeue: true })
        .await
        .expect("reject");
    let t = Instant::now();
    let d = next(&mut consumer).await;
    let gap = t.elapsed();
    d.ack(Default::default()).await.expect("ack");
    let _ = ch.close(200, "OK".into()).await;
    gap
}

async fn next(consumer: &mut lapin::Consumer) -> lapin::message::Delivery {
    tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("a delivery within 10 s")
        .expect("a delivery")
        .expect("ok")
}

/// On 4.3: a delivery whose connection closes unsettled counts as a failed
/// return, and the queue's delayed retry holds it back like a reject.
#[tokio::test(flavor = "current_thread")]
async fn a_delivery_left_by_a_closed_connection_waits_like_a_reject() {
    let (said, version) = ctl_version().await;
    if version < (4, 3) {
        eprintln!("RabbitMQ {said}: no delayed retry before 4.3");
        return;
    }
    let q = unique("qretry.closed");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    let mut broker = Broker::new().await;
    broker
        .declare(&q, delayed_retry(600, 600))
        .await
        .expect("declared");
    broker.publish(&q, b"m", FieldTable::default()).await;
    let conn = crate::support::connect().await;
    let ch = conn.create_channel().await.expect("channel");
    let mut consumer = ch
        .basic_consume(
            q.as_str().into(),
            "left".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let _unsettled = next(&mut consumer).await;
    conn.close(200, "OK".into()).await.expect("closed");
    let t = Instant::now();
    let ch = broker.conn.create_channel().await.expect("channel");
    let mut consumer = ch
        .basic_consume(
            q.as_str().into(),
            "again".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let d = next(&mut consumer).await;
    let gap = t.elapsed();
    let count = int_header(&d, "x-delivery-count");
    eprintln!(
        "RabbitMQ {said}: after a closed connection: back in {gap:?}, x-delivery-count {count:?}"
    );
    d.ack(Default::default()).await.expect("ack");
    assert_eq!(count, Some(1), "counted as a failed return");
    assert!(gap >= Duration::from_millis(550), "held back: {gap:?}");
    broker.delete(&[q]).await;
}

//! The shop as a black box on a quorum queue whose consumer timeout (3 s,
//! `x-consumer-timeout`) is shorter than an order's work (8 s): on
//! RabbitMQ 4.3 the broker cancels the consumer each time. The order is
//! dead-lettered as `consumer-timeout` within 60 s, its work completed at
//! most twice, and SIGTERM then exits 0. With `consumer_timeout: 20s` on
//! the queue the order is handled once. Before 4.3 the broker takes no
//! consumer timeout from a queue argument: the test says so and returns.

use std::time::{Duration, Instant};

use lapin::types::FieldTable;

use crate::support::{ctl_version, eventually, unique, Broker, QueueCleanup, ShopProcess};

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn yaml(q: &str, extra: &str) -> String {
    format!(
        "shutdown_timeout: 5\nqueues:\n  - name: {q}\n    type: quorum\n    dead_letter: true\n    \
         concurrency: 2\n    arguments: {{ x-consumer-timeout: 3000 }}\n{extra}"
    )
}

/// Lines of the shop's log that say an order's work completed.
fn completions(shop: &ShopProcess, id: &str) -> usize {
    shop.stderr()
        .lines()
        .chain(shop.stdout().lines())
        .filter(|l| l.contains(id) && l.contains("order handled"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_4_3_the_shops_long_order_is_dead_lettered_as_consumer_timeout_and_sigterm_exits_0(
) {
    let (said, version) = ctl_version().await;
    if version < (4, 3) {
        eprintln!("RabbitMQ {said}: no consumer timeout from a queue argument before 4.3; nothing to test here");
        return;
    }
    let q = unique("shop.timeout");
    let dlq = format!("{q}.dlq");
    let _cleanup = QueueCleanup::new(vec![q.clone(), dlq.clone()]);
    let mut shop = ShopProcess::spawn(&q, &yaml(&q, ""), &[]);
    shop.wait_ready().await;
    let mut broker = Broker::new().await;
    let t0 = Instant::now();
    broker
        .publish(
            &q,
            br#"{"id":"o-long","work_ms":8000}"#,
            FieldTable::default(),
        )
        .await;
    let dead_lettered = broker.wait_ready(&dlq, 1, SECS(60)).await;
    let took = t0.elapsed();
    let copy = broker.get(&dlq).await;
    let reason = copy.as_ref().and_then(|m| {
        m.delivery.properties.headers().as_ref().and_then(|h| {
            match h.inner().get("x-acemq-reason") {
                Some(lapin::types::AMQPValue::LongString(s)) => {
                    Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                }
                _ => None,
            }
        })
    });
    eprintln!("RabbitMQ {said}: dead-lettered {dead_lettered} after {took:.1?}, reason {reason:?}");
    assert!(
        dead_lettered,
        "dead-lettered within 60 s; stderr:\n{}",
        shop.stderr()
    );
    assert_eq!(
        reason.as_deref(),
        Some("consumer-timeout"),
        "stderr:\n{}",
        shop.stderr()
    );
    assert!(
        completions(&shop, "o-long") <= 2,
        "the order's work completed at most twice; stderr:\n{}",
        shop.stderr()
    );
    shop.signal("-TERM");
    let status = shop.exit_within(SECS(20)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_4_3_the_shops_long_order_on_a_queue_with_consumer_timeout_is_handled_once_without_a_strike(
) {
    let (said, version) = ctl_version().await;
    if version < (4, 3) {
        eprintln!("RabbitMQ {said}: the consumer argument x-consumer-timeout is honoured from 4.3; nothing to test here");
        return;
    }
    let q = unique("shop.long-job");
    let dlq = format!("{q}.dlq");
    let _cleanup = QueueCleanup::new(vec![q.clone(), dlq.clone()]);
    let mut shop = ShopProcess::spawn(&q, &yaml(&q, "    consumer_timeout: 20s\n"), &[]);
    shop.wait_ready().await;
    let mut broker = Broker::new().await;
    broker
        .publish(
            &q,
            br#"{"id":"o-job","work_ms":8000}"#,
            FieldTable::default(),
        )
        .await;
    let handled = eventually(SECS(30), || async {
        shop.readyz()
            .await
            .is_some_and(|(_, j)| j["queues"][0]["handled"].as_u64() == Some(1))
    })
    .await;
    assert!(handled, "handled; stderr:\n{}", shop.stderr());
    // Past the queue's 3 s again: a late cancel or a strike would show.
    tokio::time::sleep(SECS(4)).await;
    let stderr = shop.stderr();
    assert!(
        !stderr.contains("timed out this delivery's acknowledgement")
            && !stderr.contains("cancelled this consumer"),
        "no cancel, no strike; stderr:\n{stderr}"
    );
    shop.signal("-TERM");
    let status = shop.exit_within(SECS(20)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
    assert_eq!(broker.ready(&dlq).await, Some(0), "nothing dead-lettered");
    assert_eq!(broker.ready(&q).await, Some(0));
}

//! The shop consumes what its config names: every queue without
//! `--queue`, the named ones with it; its connection name is unique per
//! process.

use std::time::Duration;

use lapin::types::FieldTable;

use crate::support::{connection_listed, eventually, unique, Broker, QueueCleanup, ShopProcess};

fn two_queues(a: &str, b: &str) -> String {
    format!("shutdown_timeout: 5\nqueues:\n  - name: {a}\n  - name: {b}\n    concurrency: 2\n")
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_queue_the_shop_consumes_every_queue_its_config_names_under_a_name_unique_to_the_process(
) {
    let a = unique("shop.all-a");
    let b = unique("shop.all-b");
    let _cleanup = QueueCleanup::new(vec![a.clone(), b.clone()]);
    let mut shop = ShopProcess::spawn_with_args(&a, &two_queues(&a, &b), &["--no-seed"], &[]);
    shop.wait_ready().await;
    let (_, snapshot) = shop.readyz().await.expect("readyz");
    let names: Vec<&str> = snapshot["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .filter_map(|q| q["name"].as_str())
        .collect();
    assert_eq!(names, [a.as_str(), b.as_str()], "{snapshot}");

    let mut broker = Broker::new().await;
    for q in [&a, &b] {
        broker
            .publish(q, br#"{"id":"o-1"}"#, FieldTable::default())
            .await;
    }
    let handled = eventually(Duration::from_secs(10), || async {
        shop.readyz().await.is_some_and(|(_, j)| {
            j["queues"]
                .as_array()
                .is_some_and(|qs| qs.iter().all(|q| q["handled"].as_u64() == Some(1)))
        })
    })
    .await;
    assert!(
        handled,
        "one order handled on each queue; stderr:\n{}",
        shop.stderr()
    );
    let name = format!("acemq-shop@{}:{}", host(), shop.pid);
    assert!(connection_listed(&name).await, "connection {name:?} listed");

    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
    assert_eq!(broker.ready(&a).await, Some(0));
    assert_eq!(broker.ready(&b).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_queue_flags_consume_only_those_and_the_demo_batch_goes_to_the_first() {
    let a = unique("shop.some-a");
    let b = unique("shop.some-b");
    let c = unique("shop.some-c");
    // The demo batch's delayed order declares the default exchange's 2 s
    // bucket.
    let _cleanup = QueueCleanup::new(vec![
        a.clone(),
        b.clone(),
        c.clone(),
        "acemq.delay.2s".to_owned(),
    ]);
    let yaml =
        format!("shutdown_timeout: 5\nqueues:\n  - name: {a}\n  - name: {b}\n  - name: {c}\n");
    let mut shop = ShopProcess::spawn_with_args(&a, &yaml, &["--queue", &c, "--queue", &b], &[]);
    shop.wait_stderr("published the demo batch", Duration::from_secs(15))
        .await;
    let seeded = shop
        .stderr()
        .lines()
        .find(|l| l.contains("published the demo batch"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        seeded.contains(&c),
        "seeded into the first --queue: {seeded}"
    );
    shop.wait_ready().await;
    let (_, snapshot) = shop.readyz().await.expect("readyz");
    let names: Vec<&str> = snapshot["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .filter_map(|q| q["name"].as_str())
        .collect();
    assert!(!names.contains(&a.as_str()), "not consumed: {names:?}");
    assert!(
        names.contains(&b.as_str()) && names.contains(&c.as_str()),
        "{names:?}"
    );
    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(20)).await;
    assert!(
        matches!(status.code(), Some(0 | 75)),
        "a clean or timed-out drain; stderr:\n{}",
        shop.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_consumes_a_queue_with_consumer_timeout_and_says_at_start_what_each_broker_does_with_it(
) {
    let q = unique("shop.long-jobs");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    let yaml = format!(
        "shutdown_timeout: 5\nqueues:\n  - name: {q}\n    type: quorum\n    consumer_timeout: 20s\n"
    );
    let mut shop = ShopProcess::spawn(&q, &yaml, &[]);
    shop.wait_ready().await;
    // The consumer argument x-consumer-timeout goes with basic.consume on
    // a quorum queue: a broker that does not know it (3.10) still accepts
    // the consume; 4.3 honours it.
    let mut broker = Broker::new().await;
    broker
        .publish(&q, br#"{"id":"o-1"}"#, FieldTable::default())
        .await;
    let handled = eventually(Duration::from_secs(10), || async {
        shop.readyz()
            .await
            .is_some_and(|(_, j)| j["queues"][0]["handled"].as_u64() == Some(1))
    })
    .await;
    assert!(handled, "the order was handled; stderr:\n{}", shop.stderr());
    let stderr = shop.stderr();
    assert!(
        stderr.contains("consumer argument x-consumer-timeout = 20000 ms")
            && stderr.contains("earlier brokers ignore it"),
        "the start says what becomes of consumer_timeout; stderr:\n{stderr}"
    );
    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
    assert_eq!(broker.ready(&q).await, Some(0));
}

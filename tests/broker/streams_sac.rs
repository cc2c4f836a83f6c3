//! A single active consumer per partition and super streams, through shop
//! processes as black boxes: the active instance's successor takes over
//! where the drain stored the offset, a killed instance's partitions move
//! to the survivor, a new instance takes some partitions over, and the
//! drain stores and confirms every partition's offset.
//!
//! RabbitMQ 3.11 and later only: on an older broker each test asserts
//! instead that the shop refuses such a config at start (exit 78, naming
//! the key). Needs the stream plugin (`ACEMQ_STREAM_PORT`, see
//! `streams.rs`); on RabbitMQ 4.3: `scripts/rabbitmq4-suite.sh broker --
//! streams`.

use std::collections::HashMap;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ExchangeDeleteOptions};
use lapin::BasicProperties;

use crate::streams::handled_counts;
use crate::support::stream_port;
use crate::support::{ctl_version, eventually, unique, Broker, QueueCleanup, ShopProcess};

/// A shop config consuming stream `s` (`extra`: more keys of the entry,
/// indented by four), with a 1 s rung, a dead-letter queue and the
/// stream plugin at `port`.
pub fn shop_yaml(s: &str, port: u16, prefetch: usize, extra: &str) -> String {
    format!(
        "shutdown_timeout: 10\nstreams: {{ port: {port} }}\nqueues:\n  - name: {s}\n    type: stream\n    prefetch: {prefetch}\n    concurrency: 8\n    dead_letter: true\n    retries: {{ max_attempts: 3, initial_delay: 1, max_delay: 1, broker_wait_threshold: 1 }}\n{extra}"
    )
}

/// Every queue a stream entry `s` with `partitions` partitions (0: a plain
/// stream) and a 1 s rung declares.
pub fn declared(s: &str, partitions: usize) -> Vec<String> {
    let mut v: Vec<String> = if partitions == 0 {
        vec![s.to_owned()]
    } else {
        (0..partitions).map(|i| format!("{s}-{i}")).collect()
    };
    v.extend([
        format!("{s}.dlq"),
        format!("{s}.retry.1s"),
        format!("{s}.work"),
    ]);
    v
}

/// `n` orders `{prefix}-0`.. that take `work_ms` each.
pub fn orders(prefix: &str, n: usize, work_ms: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!(r#"{{"id":"{prefix}-{i}","work_ms":{work_ms}}}"#).into_bytes())
        .collect()
}

/// Publishes every body to `exchange` with routing key `keys[i % len]`
/// (round robin), then waits for all the confirms.
pub async fn publish_round_robin(
    broker: &mut Broker,
    exchange: &str,
    keys: &[&str],
    bodies: &[Vec<u8>],
) {
    let mut confirms = Vec::with_capacity(bodies.len());
    for (i, body) in bodies.iter().enumerate() {
        let key = keys[i % keys.len()];
        confirms.push(
            broker
                .ch
                .basic_publish(
                    exchange.into(),
                    key.into(),
                    BasicPublishOptions::default(),
                    body,
                    BasicProperties::default(),
                )
                .await
                .expect("publish"),
        );
    }
    for c in confirms {
        c.await.expect("confirm");
    }
}

/// Handlings beyond the first, over every order.
pub fn duplicates(counts: &HashMap<String, usize>) -> usize {
    counts.values().map(|n| n.saturating_sub(1)).sum()
}

/// Lines of `log` that contain `needle`.
pub fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

/// Waits (up to `within`) until the shops' logs together name `n`
/// distinct orders handled; fails with the count and the last lines.
pub async fn all_handled(shops: &[&ShopProcess], earlier: &[String], n: usize, within: Duration) {
    let logs = || {
        let mut logs = earlier.to_vec();
        logs.extend(shops.iter().map(|s| s.stderr()));
        logs
    };
    let ok = eventually(within, || async { handled_counts(&logs()).len() >= n }).await;
    let tails: Vec<String> = shops
        .iter()
        .map(|s| {
            s.stderr()
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    assert!(
        ok,
        "{} distinct orders handled within {within:?}, wanted {n}; last lines of each shop (newest first):\n{}",
        handled_counts(&logs()).len(),
        tails.join("\n----\n")
    );
}

/// Waits (up to `within`) until `shop`'s stderr has `n` lines with `needle`.
pub async fn lines_within(shop: &ShopProcess, needle: &str, n: usize, within: Duration) {
    let ok = eventually(within, || async { lines_with(&shop.stderr(), needle) >= n }).await;
    assert!(
        ok,
        "{} lines with {needle:?} within {within:?}, wanted {n}; stderr:\n{}",
        lines_with(&shop.stderr(), needle),
        shop.stderr()
    );
}

/// On RabbitMQ before 3.11: the shop refuses the config at start (exit 78)
/// naming `key`, and declares nothing. `true` when the broker is older
/// (the test is then done).
async fn refused_before_3_11(s: &str, yaml: &str, key: &str) -> bool {
    let (version, mm) = ctl_version().await;
    if mm >= (3, 11) {
        return false;
    }
    let mut shop = ShopProcess::spawn(s, yaml, &[("RUST_LOG", "info")]);
    let status = shop.exit_within(Duration::from_secs(30)).await;
    let err = shop.stderr();
    assert_eq!(
        status.code(),
        Some(78),
        "RabbitMQ {version}: stderr:\n{err}"
    );
    assert!(
        err.contains(key),
        "RabbitMQ {version}: the error names {key}; stderr:\n{err}"
    );
    let mut broker = Broker::new().await;
    assert_eq!(
        broker.ready(s).await,
        None,
        "nothing is declared before the check"
    );
    true
}

fn shop(tag: &str, s: &str, yaml: &str) -> ShopProcess {
    ShopProcess::spawn_with_args(
        tag,
        yaml,
        &["--no-seed", "--queue", s],
        &[("RUST_LOG", "info")],
    )
}

async fn delete_exchange(broker: &mut Broker, name: &str) {
    let _ = broker
        .ch
        .exchange_delete(name.into(), ExchangeDeleteOptions::default())
        .await;
}

const ACTIVE: &str = "active consumer of the partition: reading";
const STEPPED_DOWN: &str = "no longer the partition's active consumer";
const DRAIN_STORED: &str = "offset stored and confirmed at the drain";

#[tokio::test]
async fn sac_a_sigtermed_active_consumer_hands_the_stream_over_where_its_drain_stored() {
    let s = unique("sac-plain");
    let yaml = shop_yaml(&s, stream_port(), 200, "    single_active_consumer: true\n");
    if refused_before_3_11(&s, &yaml, "queues[0].single_active_consumer").await {
        return;
    }
    let _cleanup = QueueCleanup::new(declared(&s, 0));
    let mut broker = Broker::new().await;

    // Two shops under one consumer name: the first is the active one.
    let mut a = shop(&format!("{s}-a"), &s, &yaml);
    lines_within(&a, ACTIVE, 1, Duration::from_secs(30)).await;
    let b = shop(&format!("{s}-b"), &s, &yaml);
    lines_within(&b, "subscribed", 1, Duration::from_secs(30)).await;
    assert_eq!(
        lines_with(&b.stderr(), ACTIVE),
        0,
        "one active consumer:\n{}",
        b.stderr()
    );

    broker
        .publish_many(&s, &orders("o", 2000, 5), BasicProperties::default())
        .await;
    all_handled(&[&a], &[], 300, Duration::from_secs(60)).await;
    assert_eq!(
        handled_counts(&[b.stderr()]).len(),
        0,
        "the inactive shop handles nothing"
    );

    // SIGTERM the active one mid-way: the other takes over and handles
    // the rest, from where the drain stored the offset.
    a.signal("-TERM");
    let status = a.exit_within(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", a.stderr());
    assert!(a.stderr().contains(DRAIN_STORED), "stderr:\n{}", a.stderr());
    lines_within(&b, ACTIVE, 1, Duration::from_secs(30)).await;
    all_handled(&[&b], &[a.stderr()], 2000, Duration::from_secs(120)).await;

    let by_a = handled_counts(&[a.stderr()]).len();
    let counts = handled_counts(&[a.stderr(), b.stderr()]);
    let dup = duplicates(&counts);
    eprintln!("measured: the SIGTERM'd shop handled {by_a} of 2000, duplicates after the hand-over: {dup}");
    assert_eq!(counts.len(), 2000);
    // 0 expected: the drain stores the offset after its last handler and
    // only then ends the subscription. The bound, one handler per
    // concurrency slot, is the most a store lost in transit could cost.
    assert!(
        dup <= 8,
        "{dup} orders handled twice after a SIGTERM (0 expected, bound 8)"
    );
}

#[tokio::test]
async fn sac_a_super_stream_survives_a_killed_instance_within_the_store_bound() {
    let s = unique("sac-super");
    let every = 50;
    let prefetch = 50;
    let yaml = shop_yaml(
        &s,
        stream_port(),
        prefetch,
        &format!("    partitions: 3\n    offset_store: {{ every: {every}, within: 200ms }}\n"),
    );
    if refused_before_3_11(&s, &yaml, "queues[0].partitions").await {
        return;
    }
    let _cleanup = QueueCleanup::new(declared(&s, 3));
    let mut broker = Broker::new().await;

    let mut a = shop(&format!("{s}-a"), &s, &yaml);
    lines_within(&a, ACTIVE, 3, Duration::from_secs(30)).await;
    let b = shop(&format!("{s}-b"), &s, &yaml);
    // The group rebalances before anything is published: one partition
    // moves to the second shop.
    lines_within(&b, ACTIVE, 1, Duration::from_secs(30)).await;
    lines_within(&a, STEPPED_DOWN, 1, Duration::from_secs(30)).await;
    let a_active = 3 - lines_with(&a.stderr(), STEPPED_DOWN);

    publish_round_robin(&mut broker, &s, &["0", "1", "2"], &orders("o", 3000, 2)).await;
    let ok = eventually(Duration::from_secs(60), || async {
        handled_counts(&[a.stderr()]).len() >= 500
    })
    .await;
    assert!(
        ok,
        "the first shop never handled 500; stderr:\n{}",
        a.stderr()
    );
    a.signal("-KILL");
    let _ = a.exit_within(Duration::from_secs(10)).await;
    lines_within(&b, ACTIVE, 3, Duration::from_secs(60)).await;
    all_handled(&[&b], &[a.stderr()], 3000, Duration::from_secs(120)).await;

    let counts = handled_counts(&[a.stderr(), b.stderr()]);
    let dup = duplicates(&counts);
    let bound = (every + prefetch) * a_active;
    eprintln!(
        "measured: the killed shop was active on {a_active} partitions and handled {} of 3000; duplicates: {dup} (bound {bound})",
        handled_counts(&[a.stderr()]).len()
    );
    assert_eq!(counts.len(), 3000);
    assert!(
        dup <= bound,
        "{dup} duplicates, over (every {every} + prefetch {prefetch}) x {a_active} partitions"
    );
    delete_exchange(&mut broker, &s).await;
}

#[tokio::test]
async fn sac_a_second_instance_takes_partitions_over_and_nothing_is_lost() {
    let s = unique("sac-rebalance");
    let yaml = shop_yaml(&s, stream_port(), 100, "    partitions: 3\n");
    if refused_before_3_11(&s, &yaml, "queues[0].partitions").await {
        return;
    }
    let _cleanup = QueueCleanup::new(declared(&s, 3));
    let mut broker = Broker::new().await;
    let keys = ["0", "1", "2"];

    let mut a = shop(&format!("{s}-a"), &s, &yaml);
    lines_within(&a, ACTIVE, 3, Duration::from_secs(30)).await;
    publish_round_robin(&mut broker, &s, &keys, &orders("x", 300, 0)).await;
    all_handled(&[&a], &[], 300, Duration::from_secs(60)).await;

    // A second instance: within a bound some partitions move to it.
    let mut b = shop(&format!("{s}-b"), &s, &yaml);
    lines_within(&a, STEPPED_DOWN, 1, Duration::from_secs(30)).await;
    lines_within(&b, ACTIVE, 1, Duration::from_secs(30)).await;

    // Orders published afterwards are handled by both; nothing is lost.
    publish_round_robin(&mut broker, &s, &keys, &orders("y", 600, 1)).await;
    all_handled(&[&a, &b], &[], 900, Duration::from_secs(60)).await;
    let later = |log: &str| {
        handled_counts(&[log.to_owned()])
            .keys()
            .filter(|id| id.starts_with("y-"))
            .count()
    };
    let (by_a, by_b) = (later(&a.stderr()), later(&b.stderr()));
    let dup = duplicates(&handled_counts(&[a.stderr(), b.stderr()]));
    eprintln!("measured: after the rebalance the first shop handled {by_a} and the second {by_b} of 600; duplicates: {dup}");
    assert!(
        by_a > 0 && by_b > 0,
        "both handle orders: {by_a} and {by_b}"
    );
    assert_eq!(dup, 0, "nothing was in flight at the rebalance");

    for shop in [&mut a, &mut b] {
        shop.signal("-TERM");
        let status = shop.exit_within(Duration::from_secs(30)).await;
        assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
    }
    delete_exchange(&mut broker, &s).await;
}

#[tokio::test]
async fn sac_the_drain_stores_and_confirms_every_partitions_offset() {
    let s = unique("sac-drain");
    let yaml = shop_yaml(&s, stream_port(), 100, "    partitions: 3\n");
    if refused_before_3_11(&s, &yaml, "queues[0].partitions").await {
        return;
    }
    let _cleanup = QueueCleanup::new(declared(&s, 3));
    let mut broker = Broker::new().await;

    let mut a = shop(&format!("{s}-a"), &s, &yaml);
    lines_within(&a, ACTIVE, 3, Duration::from_secs(30)).await;
    publish_round_robin(&mut broker, &s, &["0", "1", "2"], &orders("o", 300, 0)).await;
    all_handled(&[&a], &[], 300, Duration::from_secs(60)).await;
    a.signal("-TERM");
    let status = a.exit_within(Duration::from_secs(30)).await;
    let err = a.stderr();
    assert_eq!(status.code(), Some(0), "stderr:\n{err}");
    for i in 0..3 {
        let partition = format!("stream={s}-{i} ");
        assert!(
            err.lines()
                .any(|l| l.contains(DRAIN_STORED) && l.contains(&partition)),
            "no confirmed store for {s}-{i}; stderr:\n{err}"
        );
    }

    // A restart reads nothing again.
    let b = shop(&format!("{s}-b"), &s, &yaml);
    lines_within(&b, ACTIVE, 3, Duration::from_secs(30)).await;
    publish_round_robin(&mut broker, &s, &["0", "1", "2"], &orders("p", 30, 0)).await;
    all_handled(
        &[&b],
        std::slice::from_ref(&err),
        330,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(duplicates(&handled_counts(&[err, b.stderr()])), 0);
    delete_exchange(&mut broker, &s).await;
}

#[tokio::test]
async fn sac_a_rebalance_under_load_loses_nothing() {
    let s = unique("sac-busy");
    let yaml = shop_yaml(
        &s,
        stream_port(),
        50,
        "    partitions: 3\n    offset_store: { every: 50, within: 200ms }\n",
    );
    if refused_before_3_11(&s, &yaml, "queues[0].partitions").await {
        return;
    }
    let _cleanup = QueueCleanup::new(declared(&s, 3));
    let mut broker = Broker::new().await;

    let mut a = shop(&format!("{s}-a"), &s, &yaml);
    lines_within(&a, ACTIVE, 3, Duration::from_secs(30)).await;
    publish_round_robin(&mut broker, &s, &["0", "1", "2"], &orders("o", 3000, 5)).await;
    let ok = eventually(Duration::from_secs(60), || async {
        handled_counts(&[a.stderr()]).len() >= 500
    })
    .await;
    assert!(
        ok,
        "the first shop never handled 500; stderr:\n{}",
        a.stderr()
    );

    // A second instance joins mid-stream: a partition moves while the
    // first has handlers running on it.
    let mut b = shop(&format!("{s}-b"), &s, &yaml);
    lines_within(&a, STEPPED_DOWN, 1, Duration::from_secs(30)).await;
    all_handled(&[&a, &b], &[], 3000, Duration::from_secs(120)).await;
    let dup = duplicates(&handled_counts(&[a.stderr(), b.stderr()]));
    let by_b = handled_counts(&[b.stderr()]).len();
    let gave_up: Vec<String> = a
        .stderr()
        .lines()
        .filter(|l| l.contains(STEPPED_DOWN))
        .map(str::to_owned)
        .collect();
    eprintln!("measured: a partition moved under load, the second shop handled {by_b} of 3000; duplicates: {dup}; {gave_up:?}");
    assert!(by_b > 0, "the second shop handled nothing");
    // 0 expected: the broker is answered once the partition's running
    // handlers have ended and their offsets are stored. The bound is what
    // answering at once costs (one message per concurrency slot).
    assert!(
        dup <= 8,
        "{dup} duplicates at the rebalance (0 expected, bound 8)"
    );

    for shop in [&mut a, &mut b] {
        shop.signal("-TERM");
        let status = shop.exit_within(Duration::from_secs(30)).await;
        assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
    }
    delete_exchange(&mut broker, &s).await;
}

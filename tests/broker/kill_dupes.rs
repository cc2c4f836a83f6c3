//! Duplicates per SIGKILL, with and without acknowledgement coalescing: the
//! `shop` binary killed again and again, each kill followed by a restart,
//! and every order a killed instance handled that a later one handled again
//! counted against that kill.
//!
//! `#[ignore]`d (seconds to minutes long); run it with
//! `scripts/kill-dupes.sh`, which runs every cell and prints the table.
//! Environment:
//!
//! - `ACEMQ_KILL_LOAD`: `saturation` (default: 5,000 orders queued before
//!   each instance, topped up before each restart) or `moderate` (a
//!   publisher at 200 orders/s for the whole run);
//! - `ACEMQ_SOAK_ACK_BATCH`: the queue's `ack_batch` (YAML as written, e.g.
//!   `0`; unset: the config's default);
//! - `ACEMQ_KILLS`: how many kills (default 10).
//!
//! Each order takes 5 ms of work (an await), prefetch 100, concurrency 8.
//! Nothing may be lost: every published order is handled at least once.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::BasicPublishOptions;
use lapin::BasicProperties;
use tokio_util::sync::CancellationToken;

use crate::support::{queue_counts, unique, Broker, QueueCleanup, ShopProcess};

const PREFETCH: usize = 100;
const CONCURRENCY: usize = 8;
const WORK_MS: u64 = 5;
/// Orders queued before each instance starts, at saturation.
const QUEUED: u32 = 5000;
/// Orders per second, at a moderate rate.
const RATE: u64 = 200;

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

fn config_yaml(q: &str) -> String {
    let mut yaml = format!(
        "shutdown_timeout: 10\nqueues:\n  - name: {q}\n    prefetch: {PREFETCH}\n    concurrency: {CONCURRENCY}\n    dead_letter: true\n"
    );
    if let Some(v) = env("ACEMQ_SOAK_ACK_BATCH") {
        yaml.push_str(&format!("    ack_batch: {v}\n"));
    }
    yaml
}

fn spawn_shop(q: &str) -> ShopProcess {
    ShopProcess::spawn(q, &config_yaml(q), &[("RUST_LOG", "info")])
}

fn order(prefix: &str, n: u64) -> (String, Vec<u8>) {
    let id = format!("{prefix}-{n}");
    let body = format!(r#"{{"id":"{id}","work_ms":{WORK_MS}}}"#).into_bytes();
    (id, body)
}

/// The order ids of every `order handled` line.
fn handled_ids(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.contains("order handled"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("order="))
                .map(|id| id.trim_matches('"').to_owned())
        })
        .collect()
}

/// Publishes orders `prefix-{from..from+n}`, pipelined, confirms awaited.
async fn publish_orders(
    broker: &mut Broker,
    q: &str,
    prefix: &str,
    from: u64,
    n: u64,
) -> Vec<String> {
    let mut ids = Vec::new();
    let mut bodies = Vec::new();
    for i in from..from + n {
        let (id, body) = order(prefix, i);
        ids.push(id);
        bodies.push(body);
    }
    // The shop logs the body's id: the props carry none.
    broker
        .publish_many(q, &bodies, BasicProperties::default().with_delivery_mode(2))
        .await;
    ids
}

/// A task publishing orders at [`RATE`] per second until stopped; returns
/// the confirmed ids.
fn steady_publisher(
    q: &str,
    prefix: &str,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Vec<String>> {
    let (q, prefix) = (q.to_owned(), prefix.to_owned());
    tokio::spawn(async move {
        let broker = Broker::new().await;
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut confirms = futures::stream::FuturesUnordered::new();
        let mut published = Vec::new();
        let mut i = 0u64;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                Some(id) = confirms.next() => { published.push(id); continue; }
                _ = tick.tick() => {}
            }
            let (id, body) = order(&prefix, i);
            i += 1;
            let confirm = broker
                .ch
                .basic_publish(
                    "".into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    &body,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .expect("publish");
            confirms.push(async move {
                assert!(confirm.await.expect("confirm").is_ack(), "nacked {id}");
                id
            });
        }
        while let Some(id) = confirms.next().await {
            published.push(id);
        }
        published
    })
}

async fn wait_empty(q: &str, within: Duration) {
    let end = Instant::now() + within;
    let mut last = None;
    while Instant::now() < end {
        last = queue_counts(q).await;
        if last == Some((0, 0)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{q} was not empty within {within:?}: (ready, unacked) = {last:?}");
}

/// How long instance `i` runs before its kill: 0.6–1.9 s, varied so kills
/// land at different points.
fn run_for(i: usize) -> Duration {
    Duration::from_millis(600 + (i as u64 * 370) % 1300)
}

fn median(sorted: &[usize]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2] as f64,
        n => (sorted[n / 2 - 1] + sorted[n / 2]) as f64 / 2.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run scripts/kill-dupes.sh"]
async fn kill_dupes() {
    let saturation = env("ACEMQ_KILL_LOAD").as_deref() != Some("moderate");
    let kills: usize = env("ACEMQ_KILLS").map_or(10, |v| v.parse().expect("ACEMQ_KILLS"));
    let ack_batch = env("ACEMQ_SOAK_ACK_BATCH").unwrap_or_else(|| "default".to_owned());
    let tag = if saturation { "kd-sat" } else { "kd-mod" };
    let q = unique(tag);
    let _cleanup = QueueCleanup::new(vec![q.clone(), format!("{q}.dlq")]);
    let mut broker = Broker::new().await;

    // The first instance declares the topology; it handles nothing.
    let mut first = spawn_shop(&q);
    first.wait_ready().await;
    first.signal("-TERM");
    first.exit_within(Duration::from_secs(30)).await;

    let mut published: Vec<String> = Vec::new();
    let stop = CancellationToken::new();
    let publisher = (!saturation).then(|| steady_publisher(&q, tag, stop.clone()));
    let mut next = 0u64;
    let mut per_instance: Vec<Vec<String>> = Vec::new();
    for i in 0..kills {
        if saturation {
            let ready = broker.ready(&q).await.unwrap_or(0);
            let n = u64::from(QUEUED.saturating_sub(ready));
            published.extend(publish_orders(&mut broker, &q, tag, next, n).await);
            next += n;
        }
        let mut shop = spawn_shop(&q);
        shop.wait_ready().await;
        tokio::time::sleep(run_for(i)).await;
        shop.signal("-KILL");
        let status = shop.exit_within(Duration::from_secs(30)).await;
        assert_eq!(status.code(), None, "killed by the signal");
        per_instance.push(handled_ids(&shop.stderr()));
    }
    if let Some(p) = publisher {
        stop.cancel();
        published.extend(p.await.expect("the publisher"));
    }
    let mut last = spawn_shop(&q);
    last.wait_ready().await;
    wait_empty(&q, Duration::from_secs(180)).await;
    last.signal("-TERM");
    last.exit_within(Duration::from_secs(30)).await;
    per_instance.push(handled_ids(&last.stderr()));

    // A kill's duplicates: what the killed instance handled and a later one
    // handled again.
    let mut dupes = Vec::new();
    for k in 0..kills {
        let later: HashSet<&str> = per_instance[k + 1..]
            .iter()
            .flatten()
            .map(String::as_str)
            .collect();
        dupes.push(
            per_instance[k]
                .iter()
                .filter(|id| later.contains(id.as_str()))
                .count(),
        );
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for id in per_instance.iter().flatten() {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    let lost = published
        .iter()
        .filter(|id| !seen.contains_key(id.as_str()))
        .count();
    let handled: usize = per_instance.iter().map(Vec::len).sum();
    let mut sorted = dupes.clone();
    sorted.sort_unstable();
    eprintln!(
        "kill-dupes: load {} | ack_batch {ack_batch} | kills {kills} | duplicates per kill: median {:.1}, max {}, mean {:.2} | lost {lost} | published {} | handled {handled} (by killed instances: {:?}) | per kill {dupes:?}",
        if saturation { "saturation" } else { "moderate" },
        median(&sorted),
        sorted.last().copied().unwrap_or(0),
        dupes.iter().sum::<usize>() as f64 / kills as f64,
        published.len(),
        per_instance[..kills].iter().map(Vec::len).collect::<Vec<_>>(),
    );
    assert_eq!(lost, 0, "published orders never handled");
    assert!(
        dupes.iter().all(|d| *d <= PREFETCH),
        "a kill repeats at most the prefetch window: {dupes:?}"
    );
}

//! The soak: the `shop` binary under a steady publisher, stopped and
//! restarted again and again, and every published order accounted for.
//!
//! These tests are `#[ignore]`d (CI's `cargo test --workspace` skips them);
//! run them with `scripts/soak.sh`, which runs
//! `cargo test --test broker soak -- --ignored --nocapture --test-threads=1`.
//!
//! Each test declares its own queue, publishes orders with unique ids at a
//! steady rate for the whole run, parses `order handled order=<id>` from
//! every instance's stderr and checks: every published id handled at least
//! once (nothing lost), duplicates within the bound, no 406 /
//! PRECONDITION_FAILED anywhere, the expected exit codes. It prints a figure
//! table (the numbers in RELIABILITY.md come from these tables).
//!
//! `ACEMQ_SOAK_ACK_BATCH` (unset: the config's default) is written into
//! every shop instance's queue config as `ack_batch: <value>` (YAML as
//! written, e.g. `0` for coalescing off), so the SIGKILL soak's duplicates
//! per kill can be measured with and without ack coalescing, one command
//! each (see scripts/soak.sh).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::BasicPublishOptions;
use lapin::BasicProperties;
use tokio_util::sync::CancellationToken;

use crate::support::{queue_counts, unique, Broker, QueueCleanup, ShopProcess};

/// Per-queue prefetch of every shop instance.
const PREFETCH: usize = 20;
/// Handlers at once per instance.
const CONCURRENCY: usize = 4;
/// Orders published per second, for the whole run.
const RATE: u64 = 200;
/// Stops under load (SIGTERM or SIGKILL), each followed by a restart.
const RESTARTS: usize = 6;
/// Work per order in the restart soaks, ms: 20–40, ~30 on average, so one
/// instance (concurrency 4) handles ~130/s, below [`RATE`]: the queue backs
/// up, every prefetch window is full when a stop lands, and the hand-back
/// (SIGTERM) or redelivery (SIGKILL) of a full window is what is exercised.
const WORK_MS: (u64, u64) = (20, 40);
/// How a shop instance logs: the delivery span is on at INFO, so each
/// `order handled` line of a redelivery carries `redelivered=true`, and the
/// consumer's debug lines (settles skipped on a closed channel) are kept.
const RUST_LOG: &str = "info,acemq::consumer=debug";

/// `ACEMQ_SOAK_ACK_BATCH`, the queues' `ack_batch` (YAML), when set.
fn ack_batch() -> Option<String> {
    std::env::var("ACEMQ_SOAK_ACK_BATCH")
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// What the table says about `ack_batch`.
fn ack_batch_label() -> String {
    ack_batch().map_or_else(
        || "ack_batch: the config's default".to_owned(),
        |v| format!("ack_batch: {v}"),
    )
}

fn config_yaml(q: &str) -> String {
    let mut yaml = format!(
        "shutdown_timeout: 10\nqueues:\n  - name: {q}\n    prefetch: {PREFETCH}\n    concurrency: {CONCURRENCY}\n    dead_letter: true\n"
    );
    if let Some(v) = ack_batch() {
        yaml.push_str(&format!("    ack_batch: {v}\n"));
    }
    yaml
}

fn spawn_shop(q: &str) -> ShopProcess {
    ShopProcess::spawn(q, &config_yaml(q), &[("RUST_LOG", RUST_LOG)])
}

/// How long instance `i` runs before it is stopped: 2.5–3.9 s, varied so the
/// stop lands at different points of the stream.
fn run_for(i: usize) -> Duration {
    Duration::from_millis(2500 + (i as u64 * 700) % 1500)
}

// ---- The publisher.

/// A task publishing orders `{prefix}-{n}` to a queue at [`RATE`] per second,
/// each with its confirm awaited, until stopped.
struct Publisher {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Vec<String>>,
    count: Arc<AtomicU64>,
    started: Instant,
}

impl Publisher {
    /// Starts publishing to `q` (which must exist: an unroutable publish to
    /// the default exchange is confirmed and dropped). `work_ms` spans the
    /// orders' work.
    fn start(q: &str, prefix: &str, work_ms: (u64, u64)) -> Publisher {
        let stop = CancellationToken::new();
        let count = Arc::new(AtomicU64::new(0));
        let (q, prefix, token, n) = (q.to_owned(), prefix.to_owned(), stop.clone(), count.clone());
        let task = tokio::spawn(async move {
            let broker = Broker::new().await;
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            // Confirms are awaited concurrently (a persistent publish takes a
            // few ms to confirm: awaiting each in turn caps the rate).
            let mut confirms = futures::stream::FuturesUnordered::new();
            let mut published = Vec::new();
            let span = work_ms.1 - work_ms.0 + 1;
            let mut i = 0u64;
            loop {
                tokio::select! {
                    () = token.cancelled() => break,
                    Some(id) = confirms.next() => {
                        published.push(id);
                        n.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    _ = tick.tick() => {}
                }
                let id = format!("{prefix}-{i}");
                // A spread of work, deterministic: 7 is prime to `span`.
                let work = work_ms.0 + (i * 7) % span;
                i += 1;
                let body = format!(r#"{{"id":"{id}","work_ms":{work}}}"#);
                let props = BasicProperties::default()
                    .with_message_id(id.as_str().into())
                    .with_content_type("application/json".into())
                    .with_delivery_mode(2);
                let confirm = broker
                    .ch
                    .basic_publish(
                        "".into(),
                        q.as_str().into(),
                        BasicPublishOptions::default(),
                        body.as_bytes(),
                        props,
                    )
                    .await
                    .expect("publish");
                confirms.push(async move {
                    let c = confirm.await.expect("confirm");
                    assert!(c.is_ack(), "the broker nacked order {id}");
                    id
                });
            }
            while let Some(id) = confirms.next().await {
                published.push(id);
            }
            published
        });
        Publisher {
            stop,
            task,
            count,
            started: Instant::now(),
        }
    }

    fn published_so_far(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Stops publishing; every id returned was confirmed by the broker.
    async fn finish(self) -> (Vec<String>, Duration) {
        self.stop.cancel();
        let ids = self.task.await.expect("the publisher task");
        (ids, self.started.elapsed())
    }
}

// ---- What an instance's stderr says.

#[derive(Debug, Default, Clone)]
struct LogFigures {
    /// `(order id, redelivered)` of every `order handled` line, in order.
    handled: Vec<(String, bool)>,
    /// From `drained in X s`.
    drained_secs: Option<f64>,
    /// From `every handler finished (N during the drain)`.
    finished_in_drain: Option<usize>,
    /// From `N deliveries were fetched but never handled` (0 when absent).
    handed_back: usize,
    /// Lines naming a 406 / PRECONDITION_FAILED (must stay empty).
    precondition: Vec<String>,
    /// The consumer's "settle skipped / failed / not settling" debug lines.
    settles_skipped: usize,
    /// WARN and ERROR lines (for the report).
    warnings: Vec<String>,
}

fn number_after(line: &str, marker: &str) -> Option<f64> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let num: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse().ok()
}

/// Whether `line` reports a channel or connection closed with 406: the words
/// PRECONDITION_FAILED / PRECONDITIONFAILED (lapin's spelling), or the
/// number 406 standing alone outside the timestamp, the order ids, delivery
/// tags and the status counters.
fn names_406(line: &str) -> bool {
    let upper = line.to_ascii_uppercase();
    if upper.contains("PRECONDITION_FAILED") || upper.contains("PRECONDITIONFAILED") {
        return true;
    }
    if line.contains("status: handled") {
        return false;
    }
    // Drop the timestamp and the span prefix (ids, tags), then look at
    // every remaining field that is not an id, tag or count.
    let body = line.split_once(' ').map_or(line, |(_, rest)| rest);
    let body = body.rsplit_once("}: ").map_or(body, |(_, rest)| rest);
    body.split_whitespace()
        .filter(|w| {
            !(w.starts_with("order=")
                || w.starts_with("delivery_tag=")
                || w.starts_with("attempt="))
        })
        .any(|w| {
            w.split(|c: char| !c.is_ascii_alphanumeric())
                .any(|t| t == "406")
        })
}

fn parse_log(stderr: &str) -> LogFigures {
    let mut f = LogFigures::default();
    for line in stderr.lines() {
        if let Some(pos) = line.find("order handled") {
            let rest = &line[pos..];
            let id = rest
                .split_whitespace()
                .find_map(|w| w.strip_prefix("order="))
                .unwrap_or_else(|| panic!("an `order handled` line without order=: {line}"));
            let redelivered = line.contains(" redelivered=true");
            f.handled
                .push((id.trim_matches('"').to_owned(), redelivered));
        }
        if line.contains("drained in ") {
            f.drained_secs = number_after(line, "drained in ");
            f.finished_in_drain =
                number_after(line, "every handler finished (").map(|n| n as usize);
            f.handed_back = line
                .find(" deliveries were fetched but never handled")
                .and_then(|end| line[..end].rsplit(' ').next()?.parse().ok())
                .unwrap_or(0);
        }
        if names_406(line) {
            f.precondition.push(line.to_owned());
        }
        if line.contains("settle skipped")
            || line.contains("settle failed")
            || line.contains("not settling on a closed channel")
        {
            f.settles_skipped += 1;
        }
        if line.contains(" WARN ") || line.contains(" ERROR ") {
            f.warnings.push(line.to_owned());
        }
    }
    f
}

// ---- One instance's record and the table.

struct Instance {
    label: String,
    stop: &'static str,
    ran: Duration,
    /// From the signal to the exit.
    stop_to_exit: Duration,
    exit: Option<i32>,
    log: LogFigures,
    stderr: String,
}

/// Stops `shop` with `sig` after it ran `ran`, waits for the exit and
/// returns its record.
async fn stop_instance(
    mut shop: ShopProcess,
    label: String,
    sig: &'static str,
    ran: Duration,
) -> Instance {
    let t0 = Instant::now();
    shop.signal(sig);
    let status = shop.exit_within(Duration::from_secs(30)).await;
    let stop_to_exit = t0.elapsed();
    let stderr = shop.stderr();
    Instance {
        label,
        stop: if sig == "-KILL" { "SIGKILL" } else { "SIGTERM" },
        ran,
        stop_to_exit,
        exit: status.code(),
        log: parse_log(&stderr),
        stderr,
    }
}

/// What the whole run adds up to.
struct Totals {
    published: usize,
    handled: usize,
    unique: usize,
    duplicates: usize,
    lost: Vec<String>,
    unexpected: usize,
    redelivered_handled: usize,
    handed_back: usize,
}

fn totals(published: &[String], instances: &[Instance]) -> Totals {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut handled = 0;
    let mut redelivered_handled = 0;
    for i in instances {
        for (id, redelivered) in &i.log.handled {
            *seen.entry(id.as_str()).or_default() += 1;
            handled += 1;
            redelivered_handled += usize::from(*redelivered);
        }
    }
    let published_set: HashSet<&str> = published.iter().map(String::as_str).collect();
    let lost: Vec<String> = published
        .iter()
        .filter(|id| !seen.contains_key(id.as_str()))
        .cloned()
        .collect();
    let unexpected = seen
        .keys()
        .filter(|id| !published_set.contains(*id))
        .count();
    Totals {
        published: published.len(),
        handled,
        unique: seen.len(),
        duplicates: handled - seen.len(),
        lost,
        unexpected,
        redelivered_handled,
        handed_back: instances.iter().map(|i| i.log.handed_back).sum(),
    }
}

fn print_table(
    title: &str,
    published_for: Duration,
    instances: &[Instance],
    t: &Totals,
    notes: &str,
) {
    let mut out = format!("\n==== soak: {title}\n");
    out.push_str(&format!(
        "{:<10} {:>7} {:>7} {:>6} {:>9} {:>12} {:>11} {:>11} {:>9} {:>5}\n",
        "instance",
        "stop",
        "ran s",
        "exit",
        "handled",
        "redelivered",
        "drained s",
        "finished*",
        "handed",
        "skip†"
    ));
    for i in instances {
        out.push_str(&format!(
            "{:<10} {:>7} {:>7.1} {:>6} {:>9} {:>12} {:>11} {:>11} {:>9} {:>5}\n",
            i.label,
            i.stop,
            i.ran.as_secs_f64(),
            i.exit.map_or("signal".to_owned(), |c| c.to_string()),
            i.log.handled.len(),
            i.log.handled.iter().filter(|(_, r)| *r).count(),
            i.log
                .drained_secs
                .map_or("-".to_owned(), |s| format!("{s:.2}")),
            i.log
                .finished_in_drain
                .map_or("-".to_owned(), |n| n.to_string()),
            if i.log.drained_secs.is_some() {
                i.log.handed_back.to_string()
            } else {
                "-".to_owned()
            },
            i.log.settles_skipped,
        ));
    }
    out.push_str(
        "  * handlers that finished during the drain; handed = prefetched deliveries handed back unhandled;\n  † settles skipped on a closed channel (debug lines)\n",
    );
    out.push_str(&format!(
        "published {} in {:.1} s ({:.0}/s) | handled {} | unique {} | duplicates {} | lost {} | handled but never published {} | handled with redelivered=true {} | handed back on SIGTERM {}\n",
        t.published,
        published_for.as_secs_f64(),
        t.published as f64 / published_for.as_secs_f64(),
        t.handled,
        t.unique,
        t.duplicates,
        t.lost.len(),
        t.unexpected,
        t.redelivered_handled,
        t.handed_back,
    ));
    let stop_times: Vec<String> = instances
        .iter()
        .map(|i| format!("{:.2}", i.stop_to_exit.as_secs_f64()))
        .collect();
    out.push_str(&format!("signal → exit, s: {}\n", stop_times.join(", ")));
    out.push_str(notes);
    out.push('\n');
    eprintln!("{out}");
}

/// The checks common to every soak: nothing lost, nothing unexpected, no
/// 406 anywhere, and the exit codes the stops promise.
fn check_common(instances: &[Instance], t: &Totals) {
    for i in instances {
        assert!(
            i.log.precondition.is_empty(),
            "{}: 406 / PRECONDITION_FAILED in the log:\n{}",
            i.label,
            i.log.precondition.join("\n")
        );
        if i.stop == "SIGTERM" {
            assert_eq!(
                i.exit,
                Some(0),
                "{}: SIGTERM must exit 0; stderr tail:\n{}",
                i.label,
                tail(&i.stderr, 40)
            );
            assert!(
                i.log.drained_secs.is_some(),
                "{}: no `drained in` line; stderr tail:\n{}",
                i.label,
                tail(&i.stderr, 40)
            );
        }
    }
    assert!(
        t.lost.is_empty(),
        "{} published orders were never handled (lost), e.g. {:?}",
        t.lost.len(),
        &t.lost[..t.lost.len().min(20)]
    );
    assert_eq!(t.unexpected, 0, "handled ids that were never published");
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Waits (up to `within`) until `q` holds nothing: ready 0 and unacked 0 as
/// `rabbitmqctl list_queues` reports them.
async fn wait_empty(q: &str, within: Duration) {
    let end = Instant::now() + within;
    let mut last = None;
    while Instant::now() < end {
        last = queue_counts(q).await;
        if last == Some((0, 0)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("{q} was not empty within {within:?}: (ready, unacked) = {last:?}");
}

/// Stops the last instance of a run once the queue is empty, and returns its
/// record (`label`, ran since `started`).
async fn drain_to_empty(q: &str, shop: ShopProcess, label: &str, started: Instant) -> Instance {
    wait_empty(q, Duration::from_secs(150)).await;
    stop_instance(shop, label.to_owned(), "-TERM", started.elapsed()).await
}

/// The dead-letter queue stays empty: no order failed.
async fn check_dlq_empty(broker: &mut Broker, q: &str) {
    assert_eq!(
        broker.ready(&format!("{q}.dlq")).await,
        Some(0),
        "an order was dead-lettered"
    );
}

/// `RESTARTS` stops with `sig` under a steady publisher, each followed by a
/// restart; then the publisher stops and a last instance drains the queue.
async fn restart_soak(tag: &str, sig: &'static str) -> (Vec<Instance>, Totals) {
    let q = unique(tag);
    let _cleanup = QueueCleanup::new(vec![q.clone(), format!("{q}.dlq")]);
    let mut broker = Broker::new().await;

    let mut shop = spawn_shop(&q);
    shop.wait_ready().await; // the queue exists before the first publish
    let mut started = Instant::now();
    let publisher = Publisher::start(&q, tag, WORK_MS);
    let mut instances = Vec::new();
    for i in 0..RESTARTS {
        tokio::time::sleep(run_for(i)).await;
        let label = format!("#{i}");
        let record = stop_instance(shop, label, sig, started.elapsed()).await;
        eprintln!(
            "soak {tag}: {} stopped with {} after {:.1} s (exit {:?}, handled {}, handed back {}); published so far {}",
            record.label,
            record.stop,
            record.ran.as_secs_f64(),
            record.exit,
            record.log.handled.len(),
            record.log.handed_back,
            publisher.published_so_far()
        );
        instances.push(record);
        shop = spawn_shop(&q);
        shop.wait_ready().await;
        started = Instant::now();
    }
    tokio::time::sleep(run_for(RESTARTS)).await;
    let (published, published_for) = publisher.finish().await;
    let backlog = broker.ready(&q).await.unwrap_or(0);
    let t_empty = Instant::now();
    let last = drain_to_empty(&q, shop, "final", started).await;
    let notes = format!(
        "backlog when the publisher stopped: {backlog} ready; the final instance emptied it in {:.1} s",
        t_empty.elapsed().as_secs_f64()
    );
    instances.push(last);
    check_dlq_empty(&mut broker, &q).await;

    let t = totals(&published, &instances);
    print_table(
        &format!(
            "{RESTARTS} × {} under load + a final drain, queue {q}, {}",
            &sig[1..],
            ack_batch_label()
        ),
        published_for,
        &instances,
        &t,
        &notes,
    );
    check_common(&instances, &t);
    (instances, t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: minutes long; run scripts/soak.sh"]
async fn soak_sigterm_under_load_repeated_loses_nothing_and_duplicates_at_most_prefetch_per_stop() {
    let (instances, t) = restart_soak("soak-term", "-TERM").await;
    assert!(
        t.duplicates <= PREFETCH * RESTARTS,
        "{} duplicates > prefetch {PREFETCH} × {RESTARTS} stops",
        t.duplicates
    );
    assert_eq!(instances.len(), RESTARTS + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: minutes long; run scripts/soak.sh"]
async fn soak_sigkill_under_load_repeated_loses_nothing() {
    let (instances, t) = restart_soak("soak-kill", "-KILL").await;
    for i in &instances[..RESTARTS] {
        assert_eq!(i.exit, None, "{}: killed by the signal", i.label);
    }
    // Duplicates per kill: what ack coalescing costs at a SIGKILL (run with
    // ACEMQ_SOAK_ACK_BATCH=0 to compare with coalescing off).
    eprintln!(
        "SIGKILL duplicates: {} in {RESTARTS} kills = {:.1} per kill (prefetch {PREFETCH}, concurrency {CONCURRENCY}, {RATE}/s, {})",
        t.duplicates,
        t.duplicates as f64 / RESTARTS as f64,
        ack_batch_label()
    );
    // What a kill can repeat is what was unacknowledged: at most the prefetch.
    assert!(
        t.duplicates <= PREFETCH * RESTARTS,
        "{} duplicates > prefetch {PREFETCH} × {RESTARTS} kills",
        t.duplicates
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: minutes long; run scripts/soak.sh"]
async fn soak_competing_consumers_one_stopped_mid_stream_the_other_takes_over() {
    let tag = "soak-compete";
    let q = unique(tag);
    let _cleanup = QueueCleanup::new(vec![q.clone(), format!("{q}.dlq")]);
    let mut broker = Broker::new().await;

    let a = spawn_shop(&q);
    a.wait_ready().await;
    let b = spawn_shop(&q);
    b.wait_ready().await;
    let started = Instant::now();
    // 40–60 ms of work: ~80/s per instance, the two together below the
    // publish rate, so the queue backs up and A's prefetch window is full
    // when it is stopped.
    let publisher = Publisher::start(&q, tag, (40, 60));
    tokio::time::sleep(Duration::from_secs(5)).await;

    let a_record = stop_instance(a, "A".to_owned(), "-TERM", started.elapsed()).await;
    let b_before = parse_log(&b.stderr()).handled.len();
    let at_stop = publisher.published_so_far();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (published, published_for) = publisher.finish().await;
    let backlog = broker.ready(&q).await.unwrap_or(0);
    let t_empty = Instant::now();
    let b_record = drain_to_empty(&q, b, "B", started).await;
    let notes = format!(
        "backlog when the publisher stopped: {backlog} ready; B emptied it in {:.1} s",
        t_empty.elapsed().as_secs_f64()
    );
    check_dlq_empty(&mut broker, &q).await;

    let b_after = b_record.log.handled.len() - b_before;
    let a_ids: HashSet<&str> = a_record
        .log
        .handled
        .iter()
        .map(|(id, _)| id.as_str())
        .collect();
    let b_redelivered: Vec<&str> = b_record
        .log
        .handled
        .iter()
        .filter(|(_, r)| *r)
        .map(|(id, _)| id.as_str())
        .collect();
    let (b_redelivered_n, b_redelivered_also_a) = (
        b_redelivered.len(),
        b_redelivered
            .iter()
            .filter(|id| a_ids.contains(*id))
            .count(),
    );
    let instances = vec![a_record, b_record];
    let t = totals(&published, &instances);
    print_table(
        &format!("two competing consumers, A SIGTERMed mid-stream, queue {q}"),
        published_for,
        &instances,
        &t,
        &notes,
    );
    eprintln!(
        "A handed back {}; B handled {} after A's exit (published at A's stop: {at_stop}); B handled {} with redelivered=true (only A can have had them), {} of them also handled by A",
        instances[0].log.handed_back,
        b_after,
        b_redelivered_n, b_redelivered_also_a,
    );
    check_common(&instances, &t);
    assert!(b_after > 0, "the survivor kept consuming");
    // B never restarted: every redelivered order it handled had been sent to
    // A first. A's hand-back (basic.nack, requeue) puts each of its buffered
    // deliveries back, so B handles at least that many redelivered.
    assert!(
        b_redelivered_n >= instances[0].log.handed_back,
        "A handed back {} but B handled only {b_redelivered_n} redelivered orders",
        instances[0].log.handed_back,
    );
    assert!(
        t.duplicates <= PREFETCH,
        "{} duplicates after one SIGTERM",
        t.duplicates
    );
}

#[test]
fn the_log_parser_reads_the_shops_lines() {
    let log = "\
2026-11-29T21:33:19.406371Z  INFO acemq.process{queue=q delivery_tag=406 message_id=\"t-406\" attempt=1 redelivered=true}: shop::handler: order handled order=t-406 attempt=1 outcome=\"handled\"
2026-11-29T21:33:19.959371Z  INFO shop: order handled order=t-7 attempt=1 outcome=\"handled\"
2026-11-29T21:33:20.000000Z  INFO shop: status: handled 406 (ok 406, failed attempts 0), retried via rung 0, dead-lettered 0, in flight 4, held 0, ready true
2026-11-29T21:33:21.412171Z  INFO acemq::app: drained in 0.03 s; every handler finished (4 during the drain); 16 deliveries were fetched but never handled — the broker will redeliver them (q: 16)
";
    let f = parse_log(log);
    assert_eq!(
        f.handled,
        vec![("t-406".to_owned(), true), ("t-7".to_owned(), false)]
    );
    assert_eq!(f.drained_secs, Some(0.03));
    assert_eq!(f.finished_in_drain, Some(4));
    assert_eq!(f.handed_back, 16);
    assert!(f.precondition.is_empty(), "{:?}", f.precondition);
    assert!(names_406(
        "2026-11-29T21:33:21Z WARN acemq::consumer: the consumer's channel closed error=protocol error: CHANNEL_ERROR 406 unknown delivery tag"
    ));
    assert!(names_406(
        "x ERROR y: AMQPError { kind: Soft(PRECONDITIONFAILED), message: \"PRECONDITION_FAILED - unknown delivery tag 5\" }"
    ));
}

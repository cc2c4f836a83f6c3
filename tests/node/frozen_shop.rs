//! The acemq process frozen (a paused VM, a long GC pause): the shop
//! example runs against the throwaway node with a 2 s heartbeat in its
//! config, consuming numbered orders that back up in its queue; the test
//! sends it SIGSTOP, waits until the broker has closed both its
//! connections for missed heartbeats, and sends SIGCONT. On continue the
//! shop finds its connections closed, reconnects and consumes again.
//!
//! Asserted: the node granted the 2 s heartbeat; the broker closed the
//! frozen shop's connections; after SIGCONT the shop logged the loss and
//! the reconnect and was ready again; every order was handled at least
//! once, duplicates within the prefetch; nothing was settled twice (no 406
//! PRECONDITION_FAILED, no "unknown delivery tag", in the shop's log or the
//! node's); the queue ends empty and a SIGTERM still drains and exits 0.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt;

use crate::freeze::Frozen;
use crate::support::{addr, counts, eventually, heartbeats, unique, Client, Node, NAME};

const SECS: fn(u64) -> Duration = Duration::from_secs;
const HEARTBEAT: u64 = 2;
const PREFETCH: u16 = 20;
const CONCURRENCY: usize = 4;
/// Orders published in all, and each one's work: 4 × 25 orders a second at
/// most, slower than the publisher, so the queue backs up.
const N: u64 = 800;
const WORK_MS: u64 = 40;

/// `<target>/<profile>/examples/shop`, built first (the test binary is
/// `<target>/<profile>/deps/node-<hash>`).
fn shop_binary() -> PathBuf {
    crate::common::example_binary("shop", &[])
}

/// The shop on the node: `shop --config FILE --no-seed --queue Q --http
/// ADDR`, `AMQP_ADDR` the node's; its stderr kept line by line with the
/// time each line was read. Killed when dropped.
struct Shop {
    child: tokio::process::Child,
    pid: u32,
    http: String,
    t0: Instant,
    lines: Arc<Mutex<Vec<(Duration, String)>>>,
    reader: Option<tokio::task::JoinHandle<()>>,
    config: PathBuf,
}

impl Shop {
    fn spawn(q: &str, yaml: &str) -> Shop {
        let config = std::env::temp_dir().join(format!("{q}.yaml"));
        std::fs::write(&config, yaml).expect("write the config");
        let http = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").to_string()
        };
        let mut child = tokio::process::Command::new(shop_binary())
            .arg("--config")
            .arg(&config)
            .args(["--no-seed", "--queue", q, "--http", &http])
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .env("AMQP_ADDR", addr())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the shop starts");
        let pid = child.id().expect("a pid");
        let t0 = Instant::now();
        let lines: Arc<Mutex<Vec<(Duration, String)>>> = Arc::default();
        let stderr = child.stderr.take().expect("stderr");
        let into = lines.clone();
        let reader = tokio::spawn(async move {
            // Bytes, not `lines()`: a line that is not UTF-8 must not stop
            // the reading (the child would block on a full pipe).
            let mut r = tokio::io::BufReader::new(stderr);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => into.lock().unwrap().push((
                        t0.elapsed(),
                        String::from_utf8_lossy(&buf).trim_end().to_owned(),
                    )),
                }
            }
        });
        Shop {
            child,
            pid,
            http,
            t0,
            lines,
            reader: Some(reader),
            config,
        }
    }

    /// `GET /readyz`'s status, or `None` when nothing answers.
    async fn readyz(&self) -> Option<u16> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.http).await.ok()?;
        s.write_all(b"GET /readyz HTTP/1.0\r\nHost: shop\r\n\r\n")
            .await
            .ok()?;
        let mut buf = Vec::new();
        tokio::time::timeout(SECS(2), s.read_to_end(&mut buf))
            .await
            .ok()?
            .ok()?;
        String::from_utf8_lossy(&buf)
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    /// The time (since the shop started) of the first line at or after
    /// `from` containing `needle`.
    fn first(&self, from: Duration, needle: &str) -> Option<Duration> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find(|(t, l)| *t >= from && l.contains(needle))
            .map(|(t, _)| *t)
    }

    /// How many times each order was handled ("order handled order=o-N").
    fn handled(&self) -> BTreeMap<u64, u32> {
        let mut out = BTreeMap::new();
        for (_, l) in self.lines.lock().unwrap().iter() {
            if !l.contains("order handled") {
                continue;
            }
            if let Some(n) = l
                .split("order=o-")
                .nth(1)
                .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|s| s.parse().ok())
            {
                *out.entry(n).or_default() += 1;
            }
        }
        out
    }

    /// Every line about order `o-<n>`, with the time it was read relative
    /// to `from` (the shop's clock).
    fn about(&self, n: u64, from: Duration) -> Vec<String> {
        let needle = format!("order=o-{n} ");
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, l)| l.contains(&needle))
            .map(|(t, l)| {
                let d = t.as_secs_f64() - from.as_secs_f64();
                format!("read at {d:+.3}s: {l}")
            })
            .collect()
    }

    /// Lines that tell of a settle the broker refused.
    fn refused_settles(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, l)| settle_refused(l))
            .map(|(_, l)| l.clone())
            .collect()
    }

    /// Lines from `from` on that are not "order handled", times relative
    /// to `from`.
    fn render(&self, from: Duration) -> String {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, l)| *t >= from && !l.contains("order handled"))
            .map(|(t, l)| format!("  +{:>7.3}s {l}", t.saturating_sub(from).as_secs_f64()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    /// SIGTERM; waits (up to `within`) for the exit and the last lines.
    async fn stop(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        crate::freeze::signal(self.pid, "TERM");
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .ok()?
            .ok();
        if let Some(r) = self.reader.take() {
            let _ = tokio::time::timeout(SECS(5), r).await;
        }
        status
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

/// Whether a log line (the shop's or the broker's) tells of a settle the
/// broker refused: a 406, PRECONDITION_FAILED, an unknown delivery tag.
fn settle_refused(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    l.contains("precondition_failed")
        || l.contains("unknown delivery tag")
        || l.contains("reply_code=406")
        || l.contains("channel (406")
}

/// `t` as the shop's log shows it: UTC, `HH:MM:SS.micros`.
fn utc(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let s = d.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:06}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        d.subsec_micros()
    )
}

/// The node's own log files, as text.
fn node_log() -> String {
    let root = std::env::var("ACEMQ_NODE_ROOT").unwrap_or_else(|_| "/tmp/acemq-nodes".to_owned());
    let dir = PathBuf::from(root).join(NAME).join("log");
    let mut text = String::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        if entry.path().extension().is_some_and(|e| e == "log") {
            text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    text
}

/// The shop's connections the node lists, with their heartbeats.
async fn shop_connections(pid: u32) -> Vec<(String, u64)> {
    heartbeats("acemq-shop@")
        .await
        .into_iter()
        .filter(|(name, _)| {
            name.split(" (")
                .next()
                .unwrap_or(name)
                .ends_with(&format!(":{pid}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a throwaway node: cargo test -p acemq --test node -- --ignored --test-threads=1 (.ci/run)"]
async fn the_shop_frozen_past_its_heartbeat_finds_its_connections_closed_recovers_and_settles_nothing_twice(
) {
    let node = Node::up();
    let q = unique("frozen-shop");
    let yaml = format!(
        "heartbeat: {HEARTBEAT}\nshutdown_timeout: 10\nconnect_timeout: 5\nqueues:\n  - name: {q}\n    prefetch: {PREFETCH}\n    concurrency: {CONCURRENCY}\n"
    );
    let mut shop = Shop::spawn(&q, &yaml);
    assert!(
        eventually(SECS(60), || async { shop.readyz().await == Some(200) }).await,
        "the shop became ready; its log:\n{}",
        shop.render(Duration::ZERO)
    );
    let granted = shop_connections(shop.pid).await;
    assert!(
        granted.len() == 2 && granted.iter().all(|(_, s)| *s == HEARTBEAT),
        "the node granted the shop's two connections a {HEARTBEAT} s heartbeat: {granted:?}"
    );

    // Orders o-0 … o-(N-1), each confirmed, from the test's own connection.
    let publishing = {
        let q = q.clone();
        tokio::spawn(async move {
            let client = Client::new(&format!("acemq-node-test-{q}-orders")).await;
            for n in 0..N {
                let body = format!(r#"{{"id":"o-{n}","work_ms":{WORK_MS}}}"#);
                client.publish(&q, body.as_bytes()).await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let _ = client.conn.close(200, "OK".into()).await;
        })
    };
    assert!(
        eventually(SECS(60), || async { shop.handled().len() >= 100 }).await,
        "100 orders handled before the freeze"
    );

    // The freeze.
    let queue_before = counts(&q).await;
    let handled_before = shop.handled().len();
    let stopped_at = (shop.elapsed(), std::time::SystemTime::now());
    let mut frozen = Frozen::stop(shop.pid, "the shop");
    let closed = eventually(SECS(30), || async {
        shop_connections(shop.pid).await.is_empty()
    })
    .await
    .then(|| frozen.at.elapsed());
    // Frozen for three heartbeats at least, and a second past the moment
    // the broker closed the connections.
    let hold = SECS(3 * HEARTBEAT).max(closed.unwrap_or_default() + SECS(1));
    tokio::time::sleep(hold.saturating_sub(frozen.at.elapsed())).await;
    let queue_frozen = counts(&q).await;
    // Taken before SIGCONT: a frozen shop writes nothing, so every line
    // read after this is from after SIGCONT.
    let from = shop.elapsed();
    let continued_at = std::time::SystemTime::now();
    let frozen_for = frozen.thaw();
    let thawed = Instant::now();

    let ready_after = eventually(SECS(60), || async { shop.readyz().await == Some(200) })
        .await
        .then(|| thawed.elapsed());
    let lost = eventually(SECS(30), || async {
        shop.first(from, "connection to the broker was lost")
            .is_some()
    })
    .await
    .then(|| shop.first(from, "connection to the broker was lost"))
    .flatten()
    .map(|t| t - from);
    let reconnected = eventually(SECS(60), || async {
        shop.first(from, "reconnected to the broker; topology declared again")
            .is_some()
    })
    .await
    .then(|| shop.first(from, "reconnected to the broker; topology declared again"))
    .flatten()
    .map(|t| t - from);
    let published = tokio::time::timeout(SECS(120), publishing).await;
    let all_handled = eventually(SECS(120), || async { shop.handled().len() as u64 >= N }).await;
    let emptied = eventually(SECS(30), || async {
        counts(&q).await.is_some_and(|c| c.messages == 0)
    })
    .await;
    let queue_end = counts(&q).await;
    let status = shop.stop(SECS(30)).await;

    let handled = shop.handled();
    let missing: Vec<u64> = (0..N).filter(|n| !handled.contains_key(n)).collect();
    let duplicates: u32 = handled.values().map(|c| c - 1).sum();
    let twice: Vec<u64> = handled
        .iter()
        .filter(|(_, c)| **c > 1)
        .map(|(n, _)| *n)
        .collect();
    let refused = shop.refused_settles();
    let broker_log = node_log();
    let broker_refused: Vec<&str> = broker_log.lines().filter(|l| settle_refused(l)).collect();
    let missed: Vec<&str> = broker_log
        .lines()
        .filter(|l| l.contains("missed heartbeats"))
        .collect();
    eprintln!(
        "frozen shop: SIGSTOP at {}, SIGCONT at {}; the lines about each order handled twice (read at: \
         relative to SIGSTOP):\n{}",
        utc(stopped_at.1),
        utc(continued_at),
        twice
            .iter()
            .flat_map(|&n| shop.about(n, stopped_at.0))
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!(
        "frozen shop: heartbeat {HEARTBEAT} s granted ({granted:?}); the queue before {queue_before:?}, \
         {handled_before} handled; frozen {frozen_for:?}; the broker closed its connections {closed:?} after \
         SIGSTOP; the queue while frozen {queue_frozen:?}; after SIGCONT: loss logged {lost:?}, reconnected \
         {reconnected:?}, ready {ready_after:?}; handled {} distinct of {N}, missing {}, duplicates \
         {duplicates} {twice:?}; queue at the end {queue_end:?}; exit {status:?}; refused settles: shop {refused:?}, \
         broker {broker_refused:?}\n  broker: {missed:?}\n  the shop's log from SIGCONT on (without \
         \"order handled\"):\n{}",
        handled.len(),
        missing.len(),
        shop.render(from)
    );
    assert!(
        closed.is_some(),
        "the broker closed the frozen shop's connections within 30 s"
    );
    assert!(
        !missed.is_empty(),
        "the broker's log says why: missed heartbeats"
    );
    assert!(lost.is_some(), "after SIGCONT the shop logged the loss");
    assert!(
        reconnected.is_some(),
        "after SIGCONT the shop reconnected and consumed again"
    );
    assert!(ready_after.is_some(), "ready again after SIGCONT");
    assert!(published.is_ok(), "the test's publisher finished");
    assert!(
        refused.is_empty() && broker_refused.is_empty(),
        "a settle refused (settled twice?): shop {refused:?}, broker {broker_refused:?}"
    );
    assert!(
        all_handled && missing.is_empty(),
        "{} order(s) never handled, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(
        duplicates <= u32::from(PREFETCH),
        "{duplicates} duplicate(s), more than the prefetch ({PREFETCH}) for one freeze"
    );
    assert!(emptied, "nothing left in {q}: {queue_end:?}");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "a SIGTERM after the recovery drains and exits 0"
    );
    drop(frozen);
    drop(node);
}

//! End-to-end throughput, client CPU and broker CPU: acemq's full stack
//! against plain lapin consumers, on a real broker, ratios in one run.
//!
//! Each run publishes `N` messages of 256 bytes with confirms — persistent
//! (`delivery_mode` 2) unless told otherwise — into a fresh, uniquely named
//! durable queue (declared exactly as acemq declares it: `Q` with its
//! dead-letter arguments, `Q.dlq`; classic, or quorum), waits (bounded) for
//! the machine's 1-min load average to fall below a threshold, then times one
//! consumer from its connect until the handler has seen all `N`, and deletes
//! the queues. The handler is the same everywhere: a checksum of the body.
//!
//! - **a** `task-per-delivery` — plain lapin, a task per delivery under a
//!   semaphore, the permit held until the ack completes;
//! - **b** `worker-pool` — `concurrency` long-lived workers sharing the
//!   stream, each awaiting its ack;
//! - **c** `futures-unordered` — handlers and acks in one task in
//!   `FuturesUnordered`, the slot released when the handler returns, before
//!   the ack is awaited (the fastest shape that acks each delivery);
//! - **m** `multi-ack` — plain lapin, the handler inline in the stream loop,
//!   one `basic.ack` with `multiple = true` every `M` deliveries (and at the
//!   last one): the limit, no settle bookkeeping at all. `M` is
//!   `ACEMQ_BENCH_MULTI_ACK` (default 50), capped at prefetch/2 (else the
//!   broker would stop sending before the `M`-th delivery); never tag 0;
//! - **B** — `acemq::App` with the full stack (pause, in-flight,
//!   dead-letter, redelivery limit, retry, cancel), `start()`, wait until
//!   `N` handled,
//!   `drain()`; `ack_batch` as the config's default, or as
//!   `ACEMQ_BENCH_ACK_BATCH` says;
//! - **B0** — the same with `ack_batch: 0` (coalescing off; only when
//!   `QueueConfig` has the field: the bench probes it and says so).
//!
//! Per consumer: msgs/s, client CPU per message (this process's
//! `CLOCK_PROCESS_CPUTIME_ID`; the user/sys split from `/proc/self/stat`),
//! broker CPU per message (utime + stime of the node's `beam.smp` from
//! `/proc/PID/stat`, over the same window), and the client's CPU split by
//! thread: lapin's I/O threads, tokio's workers, and how often a worker
//! parked per message. On a shared broker the broker's
//! figure includes everyone else's traffic: measure it on a node of the
//! bench's own (`ACEMQ_BENCH_ADDR` + `ACEMQ_BENCH_NODE`, see BENCHMARKS.md).
//!
//! Runs are interleaved, the order rotated each round (a b c m B B0, then
//! b c m B B0 a, …), so the load from anything else falls on every consumer;
//! each figure is the median of the rounds, and the ratios are taken between
//! medians of the same run: against the fastest plain shape that acks each
//! delivery (a, b or c; c in practice) and against m.
//!
//! Run with: `cargo bench --bench throughput` (add `-- --transient` for
//! transient messages). Environment:
//!
//! | variable | default | what |
//! |---|---|---|
//! | `ACEMQ_BENCH_N` | 50000 | messages per run |
//! | `ACEMQ_BENCH_ROUNDS` | 5 | rounds (medians of these) |
//! | `ACEMQ_BENCH_SHAPES` | `100x8,10x1` | prefetch × concurrency, each with an optional body size (`20x4`, `100x8@16k`) |
//! | `ACEMQ_BENCH_BODY` | 256 | body size in bytes of every shape without `@` (`16k`, `16KiB`, `1m`, `1MiB` also read) |
//! | `ACEMQ_BENCH_QUEUE_TYPES` | `classic` | `classic`, `quorum`, or both |
//! | `ACEMQ_BENCH_ONLY` | all | a comma list of `a,b,c,m,B,B0`, and `mv` (below) |
//! | `ACEMQ_BENCH_TRANSIENT` | unset | `1`: transient messages |
//! | `ACEMQ_BENCH_MULTI_ACK` | 50 | m's `M` (capped at prefetch/2) |
//! | `ACEMQ_BENCH_ACK_BATCH` | unset | B's `ack_batch`, YAML as written |
//! | `ACEMQ_BENCH_ACK_BATCH_OFF` | `0` | B0's `ack_batch`, YAML as written |
//! | `ACEMQ_BENCH_MAX_LOAD` | 1.5 | wait before a run until the 1-min load ≤ this |
//! | `ACEMQ_BENCH_LOAD_WAIT` | 90 | … for at most this many seconds, then warn |
//! | `ACEMQ_BENCH_ADDR` | `AMQP_ADDR` | the broker's AMQP address |
//! | `ACEMQ_BENCH_NODE` | `rabbitmqctl`'s | the node whose `beam.smp` is measured |
//! | `ACEMQ_BENCH_SHARED_QUEUE` | unset | `1`: one queue per round for all its consumers (each run fills and empties it) |
//! | `ACEMQ_BENCH_M_SPIN_US` | 0 | mv spins this many µs after each handling |
//! | `ACEMQ_BENCH_M_LIKE_APP` | unset | `1`: mv starts much as `App` does (an idle publishing connection beside it; a passive declare of `Q` and `Q.dlq` on a first channel, closed; qos and consume on a second) |
//!
//! **mv** is m varied as those two say, for experiments on the broker's
//! modes (docs/benchmarks/broker-modes.md); it runs only when
//! `ACEMQ_BENCH_ONLY` names it.
//!
//! Besides the ratios of medians, each table is followed by the ratios taken
//! inside each round, then their median over the rounds.
//!
//! Scenarios beyond the default two (same output, one table each):
//! `ACEMQ_BENCH_SHAPES=20x4` (m acks `multiple` every `min(50, prefetch/2)`
//! = 10 there), and `ACEMQ_BENCH_SHAPES=100x8@16k` (16 KiB bodies; the
//! handler's checksum reads every byte, in every consumer alike); both at
//! once: `ACEMQ_BENCH_SHAPES=20x4,100x8@16k`.

#![allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::disallowed_methods
)]

mod support;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use acemq::{App, Config, Delivery};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection};
use tokio::sync::{Mutex, Notify, Semaphore};
use tokio_util::task::TaskTracker;

use support::{median, Broker, BrokerProcess, Cpu};

const BODY_LEN: usize = 256;

/// Counts and checksums what the handler sees; notifies at `n`.
struct Sink {
    n: u64,
    handled: AtomicU64,
    sum: AtomicU64,
    done: Notify,
    /// When the first delivery was handled.
    first: OnceLock<Instant>,
}

impl Sink {
    fn new(n: u64) -> Arc<Sink> {
        Arc::new(Sink {
            n,
            handled: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            done: Notify::new(),
            first: OnceLock::new(),
        })
    }

    /// The trivial handler.
    fn handle(&self, body: &[u8]) {
        let s = body
            .iter()
            .fold(0u64, |a, &b| a.wrapping_mul(31).wrapping_add(u64::from(b)));
        self.sum.fetch_add(s, Ordering::Relaxed);
        let handled = self.handled.fetch_add(1, Ordering::AcqRel);
        if handled == 0 {
            let _ = self.first.set(Instant::now());
        }
        if handled + 1 == self.n {
            // Every waiter: the timer, and acemq's run (which drains then).
            self.done.notify_waiters();
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    TaskPerDelivery,
    WorkerPool,
    FuturesUnordered,
    MultiAck,
    Acemq,
    AcemqAckOff,
    /// m with the variation `ACEMQ_BENCH_M_SPIN_US` / `ACEMQ_BENCH_M_LIKE_APP`
    /// asks for: an experiment on the broker's modes, run only when named.
    MultiAckVariant,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::TaskPerDelivery,
        Kind::WorkerPool,
        Kind::FuturesUnordered,
        Kind::MultiAck,
        Kind::Acemq,
        Kind::AcemqAckOff,
        Kind::MultiAckVariant,
    ];

    fn letter(self) -> &'static str {
        match self {
            Kind::TaskPerDelivery => "a",
            Kind::WorkerPool => "b",
            Kind::FuturesUnordered => "c",
            Kind::MultiAck => "m",
            Kind::Acemq => "B",
            Kind::AcemqAckOff => "B0",
            Kind::MultiAckVariant => "mv",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::TaskPerDelivery => "a task-per-delivery",
            Kind::WorkerPool => "b worker-pool",
            Kind::FuturesUnordered => "c futures-unordered",
            Kind::MultiAck => "m multi-ack (the limit)",
            Kind::Acemq => "B acemq full stack",
            Kind::AcemqAckOff => "B0 acemq, ack_batch off",
            Kind::MultiAckVariant => "mv multi-ack, varied",
        }
    }

    /// A plain lapin shape that acknowledges each delivery with its own frame.
    fn acks_each(self) -> bool {
        matches!(
            self,
            Kind::TaskPerDelivery | Kind::WorkerPool | Kind::FuturesUnordered
        )
    }
}

/// Everything a run is told, from the environment and the arguments.
struct Settings {
    n: u64,
    rounds: usize,
    persistent: bool,
    queue_types: Vec<String>,
    /// Prefetch, concurrency, body size in bytes.
    shapes: Vec<(u16, usize, usize)>,
    /// The body size of the shapes that do not name one (`ACEMQ_BENCH_BODY`).
    body: usize,
    multi_ack: u64,
    /// B's `ack_batch` (YAML), `None`: the config's default.
    ack_batch: Option<String>,
    /// B0's `ack_batch` (YAML).
    ack_batch_off: String,
    /// Whether `QueueConfig` knows `ack_batch` (else B0 is skipped).
    ack_batch_known: bool,
    only: Option<Vec<String>>,
    max_load: f64,
    load_wait: Duration,
    broker_process: Option<BrokerProcess>,
    /// One queue per round, shared by that round's consumers (each run
    /// fills it with `n` and empties it), instead of a fresh queue per run.
    shared_queue: bool,
    /// What mv does differently from m.
    variant: Variant,
}

/// mv's variation of m (`ACEMQ_BENCH_M_SPIN_US`, `ACEMQ_BENCH_M_LIKE_APP`).
#[derive(Clone, Copy, Debug, Default)]
struct Variant {
    /// Spins this long after each handling: client CPU per message added
    /// without touching the broker.
    spin: Duration,
    /// Starts much as `App` does: an idle publishing connection with a confirm
    /// channel beside the consuming one, and on the consuming connection a
    /// passive declare of `Q` and `Q.dlq` on a channel closed before qos
    /// and consume on a second one.
    like_app: bool,
}

impl Variant {
    fn describe(self) -> String {
        let mut varied = Vec::new();
        if !self.spin.is_zero() {
            varied.push(format!(
                "spinning {} µs after each handling",
                self.spin.as_micros()
            ));
        }
        if self.like_app {
            varied.push(
                "started much as App starts (a publishing connection beside it, a passive declare on a first channel, consume on a second)".to_owned(),
            );
        }
        if varied.is_empty() {
            varied.push(
                "not varied (set ACEMQ_BENCH_M_SPIN_US or ACEMQ_BENCH_M_LIKE_APP)".to_owned(),
            );
        }
        format!("mv = m, {}", varied.join("; "))
    }
}

impl Settings {
    fn from_env() -> Settings {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let transient =
            args.iter().any(|a| a == "--transient") || support::env_flag("ACEMQ_BENCH_TRANSIENT");
        let queue_types: Vec<String> = std::env::var("ACEMQ_BENCH_QUEUE_TYPES")
            .unwrap_or_else(|_| "classic".into())
            .split(',')
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .collect();
        for t in &queue_types {
            if t != "classic" && t != "quorum" {
                fail(&format!(
                    "ACEMQ_BENCH_QUEUE_TYPES: {t:?} is not a queue type; use classic, quorum or classic,quorum"
                ));
            }
        }
        let body = match std::env::var("ACEMQ_BENCH_BODY") {
            Ok(b) if !b.trim().is_empty() => parse_size(&b).unwrap_or_else(|| {
                fail(&format!(
                    "ACEMQ_BENCH_BODY: {b:?} is not a size in bytes (e.g. 256, 16384, 16k, 1m)"
                ))
            }),
            _ => BODY_LEN,
        };
        let shapes = std::env::var("ACEMQ_BENCH_SHAPES")
            .unwrap_or_else(|_| "100x8,10x1".into())
            .split(',')
            .map(|shape| {
                let (pc, size) = match shape.trim().split_once('@') {
                    Some((pc, size)) => (pc, parse_size(size)),
                    None => (shape.trim(), Some(body)),
                };
                pc.split_once('x')
                    .and_then(|(p, c)| Some((p.parse().ok()?, c.parse().ok()?, size?)))
                    .filter(|&(p, c, _): &(u16, usize, usize)| p > 0 && c > 0)
                    .unwrap_or_else(|| {
                        fail(&format!(
                            "ACEMQ_BENCH_SHAPES: {shape:?} is not PREFETCHxCONCURRENCY[@BYTES], e.g. 100x8 or 100x8@16k"
                        ))
                    })
            })
            .collect();
        let multi_ack: u64 = support::env_or("ACEMQ_BENCH_MULTI_ACK", 50);
        if multi_ack == 0 {
            fail("ACEMQ_BENCH_MULTI_ACK: must be at least 1");
        }
        let rounds: usize = support::env_or("ACEMQ_BENCH_ROUNDS", 5);
        let ack_batch = std::env::var("ACEMQ_BENCH_ACK_BATCH")
            .ok()
            .filter(|v| !v.trim().is_empty());
        let ack_batch_off =
            std::env::var("ACEMQ_BENCH_ACK_BATCH_OFF").unwrap_or_else(|_| "0".into());
        if let Some(v) = &ack_batch {
            if let Err(e) = Config::from_yaml_str(&support::config_yaml(
                "acemq-bench.probe",
                10,
                1,
                "classic",
                &[("ack_batch", v)],
            )) {
                fail(&format!(
                    "ACEMQ_BENCH_ACK_BATCH={v:?} is not a valid `ack_batch`: {e}"
                ));
            }
        }
        let ack_batch_known = match Config::from_yaml_str(&support::config_yaml(
            "acemq-bench.probe",
            10,
            1,
            "classic",
            &[("ack_batch", &ack_batch_off)],
        )) {
            Ok(_) => true,
            Err(e) => {
                println!(
                    "note: `ack_batch: {ack_batch_off}` is not accepted by QueueConfig ({e}); \
                     B0 is skipped and B acks as today's consumer does"
                );
                false
            }
        };
        let only = std::env::var("ACEMQ_BENCH_ONLY").ok().map(|only| {
            only.split(',')
                .map(|k| k.trim().to_owned())
                .filter(|k| !k.is_empty())
                .collect::<Vec<_>>()
        });
        if let Some(only) = &only {
            for k in only {
                if !Kind::ALL.iter().any(|kind| kind.letter() == k) {
                    fail(&format!(
                        "ACEMQ_BENCH_ONLY: {k:?} is not a consumer; use a comma list of a,b,c,m,B,B0,mv"
                    ));
                }
            }
        }
        let node = support::node_from_env();
        if std::env::var("ACEMQ_BENCH_ADDR").is_ok() && node.is_none() {
            println!(
                "warning: ACEMQ_BENCH_ADDR is set but ACEMQ_BENCH_NODE is not: the broker CPU is \
                 read from rabbitmqctl's default node, which may not be the broker at that address"
            );
        }
        let broker_process = match BrokerProcess::find(node.as_deref()) {
            Ok(p) => Some(p),
            Err(e) => {
                println!("warning: broker CPU not measured: {e}");
                None
            }
        };
        Settings {
            n: support::env_or("ACEMQ_BENCH_N", 50_000),
            rounds: rounds.max(1),
            persistent: !transient,
            queue_types,
            shapes,
            body,
            multi_ack,
            ack_batch,
            ack_batch_off,
            ack_batch_known,
            only,
            max_load: support::env_or("ACEMQ_BENCH_MAX_LOAD", 1.5),
            load_wait: Duration::from_secs(support::env_or("ACEMQ_BENCH_LOAD_WAIT", 90)),
            broker_process,
            shared_queue: support::env_flag("ACEMQ_BENCH_SHARED_QUEUE"),
            variant: Variant {
                spin: Duration::from_micros(support::env_or("ACEMQ_BENCH_M_SPIN_US", 0)),
                like_app: support::env_flag("ACEMQ_BENCH_M_LIKE_APP"),
            },
        }
    }

    /// Whether `kind` runs: named by `ACEMQ_BENCH_ONLY` (if set), B0 only
    /// when `ack_batch` exists, mv only when named.
    fn runs(&self, kind: Kind) -> bool {
        if kind == Kind::AcemqAckOff && !self.ack_batch_known {
            return false;
        }
        match &self.only {
            Some(only) => only.iter().any(|k| k == kind.letter()),
            None => kind != Kind::MultiAckVariant,
        }
    }

    /// m's `M` at `prefetch`: at most prefetch/2 (at least 1).
    fn multi_ack_at(&self, prefetch: u16) -> u64 {
        self.multi_ack.min((u64::from(prefetch) / 2).max(1))
    }

    /// The config acemq's consumer runs with, for `kind` (B or B0).
    ///
    /// `QueueConfig::ack_batch` is set through the YAML key `ack_batch`, the
    /// value as `ACEMQ_BENCH_ACK_BATCH` / `ACEMQ_BENCH_ACK_BATCH_OFF` write
    /// it. Should the key or its off value (`0`) change, change only this
    /// function (or the env defaults above).
    fn acemq_config(
        &self,
        kind: Kind,
        queue: &str,
        queue_type: &str,
        prefetch: u16,
        concurrency: usize,
    ) -> Config {
        let ack_batch = match kind {
            Kind::AcemqAckOff => Some(self.ack_batch_off.as_str()),
            _ => self.ack_batch.as_deref(),
        };
        let extra: Vec<(&str, &str)> = ack_batch.map(|v| ("ack_batch", v)).into_iter().collect();
        let yaml = support::config_yaml(queue, prefetch, concurrency, queue_type, &extra);
        Config::from_yaml_str(&yaml).expect("bench config")
    }

    fn props(&self) -> BasicProperties {
        if self.persistent {
            BasicProperties::default().with_delivery_mode(2)
        } else {
            BasicProperties::default()
        }
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("throughput bench: {msg}");
    std::process::exit(2);
}

/// A size in bytes: `16384`, `16k`, `16K`, `16KiB` (×1024); at least 1.
fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, factor) = match s.find(|c: char| !c.is_ascii_digit()) {
        None => (s, 1),
        Some(i) => match &s[i..] {
            "k" | "K" | "KiB" | "kiB" => (&s[..i], 1024),
            "m" | "M" | "MiB" => (&s[..i], 1024 * 1024),
            _ => return None,
        },
    };
    digits
        .parse::<usize>()
        .ok()?
        .checked_mul(factor)
        .filter(|&n| n > 0)
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    msgs_per_s: f64,
    cpu_us_per_msg: f64,
    user_us_per_msg: f64,
    sys_us_per_msg: f64,
    /// NaN when the broker's CPU could not be read.
    broker_us_per_msg: f64,
    /// The 1-min load average just before the timed window.
    load: f64,
    /// From the window's start (before the consumer connects) to the first
    /// handling: the consumer's start-up, in milliseconds.
    first_ms: f64,
    /// From the first handling to the last: the rate once started.
    steady_msgs_per_s: f64,
    /// Client CPU in lapin's I/O threads and in tokio's workers.
    io_us_per_msg: f64,
    workers_us_per_msg: f64,
    /// How often a tokio worker parked (went to sleep) per delivery.
    parks_per_msg: f64,
}

/// Opens the plain consumer's connection and channel.
async fn plain_consumer(
    queue: &str,
    prefetch: u16,
) -> (Connection, lapin::Channel, lapin::Consumer) {
    let conn = support::connect("acemq-bench-plain").await;
    let (ch, consumer) = consume_on(&conn, queue, prefetch, "acemq-bench-plain").await;
    (conn, ch, consumer)
}

/// A new channel on `conn` with `basic.qos` and a consumer of `queue`.
async fn consume_on(
    conn: &Connection,
    queue: &str,
    prefetch: u16,
    tag: &str,
) -> (lapin::Channel, lapin::Consumer) {
    let ch = conn.create_channel().await.expect("channel");
    ch.basic_qos(prefetch, BasicQosOptions::default())
        .await
        .expect("qos");
    let consumer = ch
        .basic_consume(
            queue.into(),
            tag.into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    (ch, consumer)
}

/// (a) A task per delivery under a semaphore; the permit is held until the
/// ack completes.
async fn task_per_delivery(queue: String, prefetch: u16, concurrency: usize, sink: Arc<Sink>) {
    let (conn, _ch, mut consumer) = plain_consumer(&queue, prefetch).await;
    let permits = Arc::new(Semaphore::new(concurrency));
    let tracker = TaskTracker::new();
    for _ in 0..sink.n {
        let permit = permits.clone().acquire_owned().await.expect("semaphore");
        let d = consumer.next().await.expect("stream").expect("delivery");
        let sink = sink.clone();
        tracker.spawn(async move {
            sink.handle(&d.data);
            d.ack(BasicAckOptions::default()).await.expect("ack");
            drop(permit);
        });
    }
    tracker.close();
    tracker.wait().await;
    let _ = conn.close(200, "bench done".into()).await;
}

/// (b) `concurrency` long-lived workers sharing the stream; each awaits its
/// ack before taking the next delivery.
async fn worker_pool(queue: String, prefetch: u16, concurrency: usize, sink: Arc<Sink>) {
    let (conn, _ch, consumer) = plain_consumer(&queue, prefetch).await;
    let consumer = Arc::new(Mutex::new(consumer));
    let taken = Arc::new(AtomicU64::new(0));
    let tracker = TaskTracker::new();
    for _ in 0..concurrency {
        let (consumer, taken, sink) = (consumer.clone(), taken.clone(), sink.clone());
        tracker.spawn(async move {
            loop {
                let d = {
                    let mut c = consumer.lock().await;
                    if taken.load(Ordering::Relaxed) >= sink.n {
                        break;
                    }
                    taken.fetch_add(1, Ordering::Relaxed);
                    c.next().await.expect("stream").expect("delivery")
                };
                sink.handle(&d.data);
                d.ack(BasicAckOptions::default()).await.expect("ack");
            }
        });
    }
    tracker.close();
    tracker.wait().await;
    let _ = conn.close(200, "bench done".into()).await;
}

/// (c) Handlers and acks driven in one task with `FuturesUnordered`; a
/// concurrency slot is released when the handler returns, before its ack is
/// awaited.
async fn futures_unordered(queue: String, prefetch: u16, concurrency: usize, sink: Arc<Sink>) {
    let (conn, _ch, mut consumer) = plain_consumer(&queue, prefetch).await;
    let mut handlers = FuturesUnordered::new();
    let mut acks = FuturesUnordered::new();
    let mut taken = 0u64;
    loop {
        tokio::select! {
            biased;
            Some(acker) = handlers.next(), if !handlers.is_empty() => {
                acks.push(async move {
                    let acker: lapin::Acker = acker;
                    acker.ack(BasicAckOptions::default()).await.expect("ack");
                });
            }
            Some(()) = acks.next(), if !acks.is_empty() => {}
            next = consumer.next(), if taken < sink.n && handlers.len() < concurrency => {
                let d = next.expect("stream").expect("delivery");
                taken += 1;
                let sink = sink.clone();
                handlers.push(async move {
                    sink.handle(&d.data);
                    d.acker
                });
            }
            else => break,
        }
    }
    let _ = conn.close(200, "bench done".into()).await;
}

/// (m) The limit: the handler inline in the stream loop, one `basic.ack`
/// with `multiple = true` for every `every` deliveries and one at the last
/// delivery; the acks are driven beside the stream, never awaited in turn.
///
/// The acks go through `Channel::basic_ack`, polled once at once so that
/// each frame is queued in tag order. Not through `Acker::ack`: lapin sends
/// an `Acker`'s settle from a task it spawns per settle, so two of them can
/// reach the socket out of order — a `multiple` ack of tag 10 ahead of one
/// of tag 5, and the broker closes the channel with 406 "unknown delivery
/// tag 5" (seen here with `Acker`s, prefetch 10, every 5).
async fn multi_ack(queue: String, prefetch: u16, every: u64, sink: Arc<Sink>, variant: Variant) {
    // mv started much as `App` starts: the publishing connection stays open
    // (idle) until the run is over.
    let (publishing, (conn, ch, mut consumer)) = if variant.like_app {
        let publishing = like_app_publisher().await;
        (Some(publishing), like_app_consumer(&queue, prefetch).await)
    } else {
        (None, plain_consumer(&queue, prefetch).await)
    };
    let spin = variant.spin;
    let mut acks = FuturesUnordered::new();
    let mut taken = 0u64;
    loop {
        tokio::select! {
            biased;
            Some(()) = acks.next(), if !acks.is_empty() => {}
            next = consumer.next(), if taken < sink.n => {
                let d = next.expect("stream").expect("delivery");
                taken += 1;
                sink.handle(&d.data);
                if !spin.is_zero() {
                    let t = Instant::now();
                    while t.elapsed() < spin {
                        std::hint::spin_loop();
                    }
                }
                if taken.is_multiple_of(every) || taken == sink.n {
                    // `multiple` with tag 0 would make lapin drop its
                    // buffered deliveries; tags start at 1.
                    assert_ne!(d.delivery_tag, 0, "delivery tag 0 with multiple");
                    let ch = ch.clone();
                    let mut ack = Box::pin(async move {
                        ch.basic_ack(d.delivery_tag, BasicAckOptions { multiple: true })
                            .await
                            .expect("ack");
                    });
                    // The first poll queues the frame, here, in order.
                    if futures::poll!(ack.as_mut()).is_pending() {
                        acks.push(ack);
                    }
                }
            }
            else => break,
        }
    }
    let _ = conn.close(200, "bench done".into()).await;
    if let Some(p) = publishing {
        let _ = p.close(200, "bench done".into()).await;
    }
}

/// The connection `App` publishes rung and dead-letter copies on: a channel
/// in confirm mode, idle here.
async fn like_app_publisher() -> Connection {
    let conn = support::connect("acemq-bench-mv-publish").await;
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .expect("confirm_select");
    conn
}

/// The consuming connection much as `App` opens it: `Q` and `Q.dlq` declared
/// passively on a first channel, closed, then qos and consume on a second.
async fn like_app_consumer(
    queue: &str,
    prefetch: u16,
) -> (Connection, lapin::Channel, lapin::Consumer) {
    let conn = support::connect("acemq-bench-mv").await;
    let check = conn.create_channel().await.expect("channel");
    for q in [queue.to_owned(), format!("{queue}.dlq")] {
        check
            .queue_declare(
                q.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive declare");
    }
    check.close(200, "checked".into()).await.expect("close");
    let (ch, consumer) = consume_on(&conn, queue, prefetch, "acemq-bench-mv").await;
    (conn, ch, consumer)
}

/// B / B0: acemq with the full stack, on `config`.
async fn acemq(config: Config, queue: String, sink: Arc<Sink>) {
    // Registered before the first delivery can be handled: the drain waits
    // for the last one without a timer of its own (a timer pending in the
    // runtime makes every park of a worker arm one in the kernel).
    let all_handled = sink.done.notified();
    tokio::pin!(all_handled);
    all_handled.as_mut().enable();
    let s = sink.clone();
    let handler = tower::service_fn(move |d: Delivery| {
        let s = s.clone();
        async move {
            s.handle(d.body());
            Ok::<_, std::convert::Infallible>(())
        }
    });
    let running = App::new(config)
        .amqp_addr(support::addr())
        .connection_name("acemq-bench-b")
        .consume(&queue, handler)
        .start()
        .await
        .expect("acemq start");
    // Stop only once every delivery was handled (the timer has stopped).
    all_handled.await;
    // How well the acknowledgements coalesced (the last settles of the run
    // may still be on their way: read after the drain, which flushes them).
    let health = running.health();
    running.drain().await.expect("drain");
    if let Some(q) = health.snapshot().queues.first() {
        eprintln!(
            "    {} deliveries settled in {} frames ({:.1} per frame)",
            q.handled,
            q.settle_frames,
            q.handled as f64 / q.settle_frames.max(1) as f64
        );
    }
}

/// One scenario: queue type and prefetch × concurrency.
#[derive(Clone, Copy, Debug)]
struct Scenario<'a> {
    queue_type: &'a str,
    prefetch: u16,
    concurrency: usize,
    /// Body size in bytes.
    body: usize,
}

/// One timed run of `kind` on a queue holding `n` messages: a fresh one, or
/// the round's `shared` one (declared, and left empty, by the caller).
async fn run_one(
    broker: &mut Broker,
    st: &Settings,
    kind: Kind,
    sc: Scenario<'_>,
    shared: Option<&str>,
) -> Sample {
    let Scenario {
        queue_type,
        prefetch,
        concurrency,
        body,
    } = sc;
    let n = st.n;
    let queue = shared.map_or_else(|| support::unique("tp"), str::to_owned);
    let config = st.acemq_config(Kind::Acemq, &queue, queue_type, prefetch, concurrency);
    if shared.is_none() {
        broker.declare_again_on_failure(&config).await;
    }
    broker
        .publish_with(&queue, n, &vec![0x5a; body], st.props())
        .await;
    let (load, waited) = support::wait_for_load(st.max_load, st.load_wait).await;
    if waited >= Duration::from_secs(2) {
        eprintln!(
            "  (waited {:.0} s for the 1-min load to fall to {load:.2})",
            waited.as_secs_f64()
        );
    }

    let sink = Sink::new(n);
    let done = sink.done.notified();
    tokio::pin!(done);
    done.as_mut().enable();

    let broker_cpu = || st.broker_process.as_ref().and_then(BrokerProcess::cpu);
    let threads0 = support::Threads::now();
    let cpu0 = Cpu::now();
    let b0 = broker_cpu();
    let t0 = Instant::now();
    let (q, s) = (queue.clone(), sink.clone());
    let task = match kind {
        Kind::TaskPerDelivery => spawn(task_per_delivery(q, prefetch, concurrency, s)),
        Kind::WorkerPool => spawn(worker_pool(q, prefetch, concurrency, s)),
        Kind::FuturesUnordered => spawn(futures_unordered(q, prefetch, concurrency, s)),
        Kind::MultiAck | Kind::MultiAckVariant => {
            let variant = match kind {
                Kind::MultiAckVariant => st.variant,
                _ => Variant::default(),
            };
            spawn(multi_ack(
                q,
                prefetch,
                st.multi_ack_at(prefetch),
                s,
                variant,
            ))
        }
        Kind::Acemq | Kind::AcemqAckOff => {
            let config = st.acemq_config(kind, &q, queue_type, prefetch, concurrency);
            spawn(acemq(config, q, s))
        }
    };
    done.await;
    let end = Instant::now();
    let elapsed = end - t0;
    let first = sink.first.get().copied().unwrap_or(t0).max(t0);
    let cpu = Cpu::now().since(cpu0);
    let threads = support::Threads::now().since(threads0);
    let b1 = broker_cpu();
    task.await.expect("consumer task");
    if shared.is_none() {
        broker.delete(&config).await;
    }

    let per_msg = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    Sample {
        msgs_per_s: n as f64 / elapsed.as_secs_f64(),
        cpu_us_per_msg: per_msg(cpu.total),
        user_us_per_msg: per_msg(cpu.user),
        sys_us_per_msg: per_msg(cpu.sys),
        broker_us_per_msg: match (b0, b1) {
            (Some(b0), Some(b1)) => per_msg(b1.saturating_sub(b0)),
            _ => f64::NAN,
        },
        load,
        first_ms: (first - t0).as_secs_f64() * 1e3,
        steady_msgs_per_s: (n.saturating_sub(1)) as f64 / (end - first).as_secs_f64().max(1e-9),
        io_us_per_msg: per_msg(threads.io),
        workers_us_per_msg: per_msg(threads.workers),
        parks_per_msg: threads.worker_parks as f64 / n as f64,
    }
}

fn spawn(f: impl Future<Output = ()> + Send + 'static) -> tokio::task::JoinHandle<()> {
    tokio::spawn(f)
}

fn med(v: &[Sample], f: fn(&Sample) -> f64) -> f64 {
    median(&v.iter().map(f).collect::<Vec<_>>())
}

/// `x` with `digits` decimals, or `-` when it is not a number.
fn fmt(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "-".to_owned()
    }
}

/// One line of the summary at the end.
struct Summary {
    scenario: String,
    reference: &'static str,
    lines: Vec<String>,
}

async fn scenario(broker: &mut Broker, st: &Settings, sc: Scenario<'_>) -> Option<Summary> {
    let Scenario {
        queue_type,
        prefetch,
        concurrency,
        body,
    } = sc;
    let every = st.multi_ack_at(prefetch);
    let title = format!(
        "{queue_type} queue, {}, prefetch {prefetch} × concurrency {concurrency}{}",
        if st.persistent {
            "persistent"
        } else {
            "transient"
        },
        // Said only when not the 256 B of the default scenarios.
        if body == BODY_LEN {
            String::new()
        } else {
            format!(", {body} B bodies")
        }
    );
    println!(
        "\n## {title}, N = {}, {} rounds (m acks multiple every {every}; B's ack_batch: {})\n",
        st.n,
        st.rounds,
        st.ack_batch.as_deref().unwrap_or("the config's default")
    );
    let active: Vec<Kind> = Kind::ALL.iter().copied().filter(|k| st.runs(*k)).collect();
    if active.contains(&Kind::MultiAckVariant) {
        println!("{}\n", st.variant.describe());
    }
    let mut samples: Vec<(Kind, Vec<Sample>)> = active.iter().map(|k| (*k, Vec::new())).collect();
    for round in 0..st.rounds {
        eprintln!(
            "round {round}: 1-min load average {:.2}",
            support::load_1min()
        );
        // One queue for the round's consumers, when asked: the broker's
        // placement of the queue's process is then the same for each.
        let shared = st.shared_queue.then(|| {
            let q = support::unique("tp");
            let config = st.acemq_config(Kind::Acemq, &q, queue_type, prefetch, concurrency);
            (q, config)
        });
        if let Some((_, config)) = &shared {
            broker.declare_again_on_failure(config).await;
        }
        // Rotate the order so no consumer always runs first or last.
        for i in 0..active.len() {
            let idx = (i + round) % active.len();
            let kind = active[idx];
            let s = run_one(
                broker,
                st,
                kind,
                sc,
                shared.as_ref().map(|(q, _)| q.as_str()),
            )
            .await;
            eprintln!(
                "round {round} {:<26} {:>8.0} msgs/s ({:>8.0} from the first, started in {:>5.1} ms) {:>6.2} µs client CPU/msg {:>6} µs broker CPU/msg (load {:.2})",
                kind.name(),
                s.msgs_per_s,
                s.steady_msgs_per_s,
                s.first_ms,
                s.cpu_us_per_msg,
                fmt(s.broker_us_per_msg, 2),
                s.load,
            );
            samples[idx].1.push(s);
        }
        if let Some((_, config)) = &shared {
            broker.delete(config).await;
        }
    }

    println!("| consumer | msgs/s (median) | msgs/s (runs) | client CPU µs/msg (median) | user | sys | broker CPU µs/msg (median) | ms to the first handling | msgs/s from the first |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|");
    for (kind, v) in &samples {
        let runs: Vec<String> = v.iter().map(|s| format!("{:.0}", s.msgs_per_s)).collect();
        println!(
            "| {} | {:.0} | {} | {:.2} | {:.2} | {:.2} | {} | {:.1} | {:.0} |",
            kind.name(),
            med(v, |s| s.msgs_per_s),
            runs.join(", "),
            med(v, |s| s.cpu_us_per_msg),
            med(v, |s| s.user_us_per_msg),
            med(v, |s| s.sys_us_per_msg),
            fmt(med(v, |s| s.broker_us_per_msg), 2),
            med(v, |s| s.first_ms),
            med(v, |s| s.steady_msgs_per_s),
        );
    }
    println!("\nclient CPU by thread, medians (lapin's I/O threads: sockets and frames; tokio's workers: the consumer's own code; a park is a worker going to sleep):\n");
    println!("| consumer | lapin I/O µs/msg | tokio workers µs/msg | worker parks per msg |");
    println!("|---|---:|---:|---:|");
    for (kind, v) in &samples {
        println!(
            "| {} | {:.2} | {:.2} | {:.3} |",
            kind.name(),
            med(v, |s| s.io_us_per_msg),
            med(v, |s| s.workers_us_per_msg),
            med(v, |s| s.parks_per_msg),
        );
    }
    let loads: Vec<f64> = samples
        .iter()
        .flat_map(|(_, v)| v.iter().map(|s| s.load))
        .collect();
    println!(
        "\n1-min load average before each run: median {:.2}, max {:.2} (waited for ≤ {} up to {} s)",
        median(&loads),
        loads.iter().copied().fold(f64::NAN, f64::max),
        st.max_load,
        st.load_wait.as_secs()
    );

    // The reference: the fastest plain shape that acks each delivery.
    let reference = samples
        .iter()
        .filter(|(k, _)| k.acks_each())
        .max_by(|x, y| med(&x.1, |s| s.msgs_per_s).total_cmp(&med(&y.1, |s| s.msgs_per_s)));
    let limit = samples.iter().find(|(k, _)| *k == Kind::MultiAck);
    let ratio = |v: &[Sample], r: Option<&(Kind, Vec<Sample>)>, f: fn(&Sample) -> f64| {
        r.map_or(f64::NAN, |(_, r)| med(v, f) / med(r, f))
    };
    let ref_letter = reference.map_or("-", |(k, _)| k.letter());
    println!(
        "\nratios of medians in this run, against {} (the fastest plain shape that acks each delivery) and against m (multiple every {every}):\n",
        reference.map_or("— (no a, b or c ran)", |(k, _)| k.name()),
    );
    println!(
        "| consumer | msgs/s ×{ref_letter} | client CPU ×{ref_letter} | broker CPU ×{ref_letter} | msgs/s ×m | client CPU ×m | broker CPU ×m |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut lines = Vec::new();
    for (kind, v) in &samples {
        let cells = [
            ratio(v, reference, |s| s.msgs_per_s),
            ratio(v, reference, |s| s.cpu_us_per_msg),
            ratio(v, reference, |s| s.broker_us_per_msg),
            ratio(v, limit, |s| s.msgs_per_s),
            ratio(v, limit, |s| s.cpu_us_per_msg),
            ratio(v, limit, |s| s.broker_us_per_msg),
        ];
        let cells: Vec<String> = cells.iter().map(|x| fmt(*x, 3)).collect();
        println!("| {} | {} |", kind.name(), cells.join(" | "));
        if matches!(kind, Kind::Acemq | Kind::AcemqAckOff) {
            lines.push(format!(
                "{}: msgs/s ×{ref_letter} {}, ×m {}; client CPU ×{ref_letter} {}; broker CPU ×{ref_letter} {}",
                kind.letter(),
                cells[0],
                cells[3],
                cells[1],
                cells[2],
            ));
        }
    }
    // The same ratios taken inside each round, then the median over rounds:
    // a round whose broker ran in its slow mode for everyone cancels out.
    let per_round = |v: &[Sample], r: Option<&(Kind, Vec<Sample>)>, f: fn(&Sample) -> f64| {
        r.map_or(f64::NAN, |(_, r)| {
            median(
                &v.iter()
                    .zip(r)
                    .map(|(a, b)| f(a) / f(b))
                    .collect::<Vec<_>>(),
            )
        })
    };
    println!(
        "\nper-round ratios (each round's own, then the median over rounds{}):\n",
        if st.shared_queue {
            "; one queue per round, shared by its consumers"
        } else {
            ""
        }
    );
    println!(
        "| consumer | msgs/s ×{ref_letter} | client CPU ×{ref_letter} | broker CPU ×{ref_letter} | msgs/s ×m | client CPU ×m | broker CPU ×m |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (kind, v) in &samples {
        let cells = [
            per_round(v, reference, |s| s.msgs_per_s),
            per_round(v, reference, |s| s.cpu_us_per_msg),
            per_round(v, reference, |s| s.broker_us_per_msg),
            per_round(v, limit, |s| s.msgs_per_s),
            per_round(v, limit, |s| s.cpu_us_per_msg),
            per_round(v, limit, |s| s.broker_us_per_msg),
        ];
        let cells: Vec<String> = cells.iter().map(|x| fmt(*x, 3)).collect();
        println!("| {} | {} |", kind.name(), cells.join(" | "));
        if matches!(kind, Kind::Acemq | Kind::AcemqAckOff) {
            lines.push(format!(
                "{} per round: msgs/s ×{ref_letter} {}, ×m {}; client CPU ×{ref_letter} {}; broker CPU ×{ref_letter} {}",
                kind.letter(),
                cells[0],
                cells[3],
                cells[1],
                cells[2],
            ));
        }
    }
    let tp_target = if prefetch >= 100 { "1.3" } else { "1.2" };
    if body == BODY_LEN && matches!((prefetch, concurrency), (100, 8) | (10, 1)) {
        println!(
            "\ntargets, coalescing on (B): msgs/s ≥ {tp_target}×{ref_letter} and ≥ 0.9×m, broker CPU ≤ 0.7×{ref_letter}, client CPU ≤ 0.8×{ref_letter}; coalescing off (B0, or B before the ledger): msgs/s ≥ 1.0×{ref_letter}"
        );
    } else {
        println!(
            "\nno target set for this scenario (the targets are for 100 × 8 and 10 × 1 at {BODY_LEN} B; there, coalescing on (B): msgs/s ≥ 1.3 / 1.2×{ref_letter} and ≥ 0.9×m, broker CPU ≤ 0.7×{ref_letter}, client CPU ≤ 0.8×{ref_letter})"
        );
    }
    Some(Summary {
        scenario: format!("{title}, N = {}, {} rounds", st.n, st.rounds),
        reference: reference.map_or("-", |(k, _)| k.name()),
        lines,
    })
}

fn main() {
    // `cargo bench` passes `--bench`; the only option read is `--transient`.
    let st = Settings::from_env();
    support::runtime().block_on(async {
        let broker_cpu = match &st.broker_process {
            Some(p) => format!(", broker CPU from {} (pid {})", p.node, p.pid),
            None => ", broker CPU not measured".to_owned(),
        };
        let mut broker = support::start(
            "throughput",
            &format!(
                ", {} × {} B {}{broker_cpu}",
                st.n,
                st.body,
                if st.persistent {
                    "persistent"
                } else {
                    "transient"
                }
            ),
        )
        .await;
        let mut summaries = Vec::new();
        for queue_type in &st.queue_types {
            for &(prefetch, concurrency, body) in &st.shapes {
                let sc = Scenario {
                    queue_type,
                    prefetch,
                    concurrency,
                    body,
                };
                summaries.extend(scenario(&mut broker, &st, sc).await);
            }
        }
        println!("\n## summary (ratios of medians, each within its own scenario)\n");
        for s in &summaries {
            println!("- {} (reference: {})", s.scenario, s.reference);
            for l in &s.lines {
                println!("  - {l}");
            }
        }
    });
}

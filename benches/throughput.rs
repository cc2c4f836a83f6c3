//! End-to-end throughput and client CPU: acemq's full stack against the
//! fastest plain lapin consumer, on the real broker.
//!
//! Each run publishes `N` messages of 256 bytes with confirms into a fresh,
//! uniquely named queue (declared exactly as acemq declares it: `Q` with its
//! dead-letter arguments, `Q.dlq`), then times one consumer from its connect
//! until the handler has seen all `N`, and deletes the queues. The handler is
//! the same everywhere: a checksum of the body.
//!
//! - **A** — plain lapin, three shapes: `a-task-per-delivery` (a task per
//!   delivery under a semaphore, the permit held until the ack completes),
//!   `b-worker-pool` (`concurrency` long-lived workers sharing the stream,
//!   each awaiting its ack), `c-futures-unordered` (handlers and acks in one
//!   task in `FuturesUnordered`, the slot released when the handler returns,
//!   before the ack is awaited).
//! - **B** — `acemq::App` with the full stack (pause, in-flight,
//!   dead-letter, retry, cancel), `start()`, wait until `N` handled, `drain()`.
//!
//! Runs are interleaved (a b c B, rotating the order each round) so that the
//! load from anything else on the machine falls on both sides; the ratios
//! B/A are taken against the A shape with the best median throughput.
//!
//! Run with: `cargo bench --bench throughput`
//! (env: `ACEMQ_BENCH_N`, default 100000; `ACEMQ_BENCH_ROUNDS`, default 3;
//! `ACEMQ_BENCH_SHAPES`, default `100x8,10x1` (prefetch × concurrency);
//! `ACEMQ_BENCH_ONLY`, a comma list of `a`, `b`, `c`, `B` to run only
//! those consumers, e.g. under `perf record`; `AMQP_ADDR`).

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

mod support;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::{App, Delivery};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::Connection;
use tokio::sync::{Mutex, Notify, Semaphore};
use tokio_util::task::TaskTracker;

use support::{median, Broker, Cpu};

const BODY_LEN: usize = 256;

/// Counts and checksums what the handler sees; notifies at `n`.
struct Sink {
    n: u64,
    handled: AtomicU64,
    sum: AtomicU64,
    done: Notify,
}

impl Sink {
    fn new(n: u64) -> Arc<Sink> {
        Arc::new(Sink {
            n,
            handled: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            done: Notify::new(),
        })
    }

    /// The trivial handler.
    fn handle(&self, body: &[u8]) {
        let s = body
            .iter()
            .fold(0u64, |a, &b| a.wrapping_mul(31).wrapping_add(u64::from(b)));
        self.sum.fetch_add(s, Ordering::Relaxed);
        if self.handled.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.done.notify_one();
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    TaskPerDelivery,
    WorkerPool,
    FuturesUnordered,
    Acemq,
}

impl Kind {
    const ALL: [Kind; 4] = [
        Kind::TaskPerDelivery,
        Kind::WorkerPool,
        Kind::FuturesUnordered,
        Kind::Acemq,
    ];

    fn letter(self) -> &'static str {
        match self {
            Kind::TaskPerDelivery => "a",
            Kind::WorkerPool => "b",
            Kind::FuturesUnordered => "c",
            Kind::Acemq => "B",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::TaskPerDelivery => "A a-task-per-delivery",
            Kind::WorkerPool => "A b-worker-pool",
            Kind::FuturesUnordered => "A c-futures-unordered",
            Kind::Acemq => "B acemq full stack",
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    msgs_per_s: f64,
    cpu_us_per_msg: f64,
    user_us_per_msg: f64,
    sys_us_per_msg: f64,
}

/// Opens the plain consumer's connection and channel.
async fn plain_consumer(
    queue: &str,
    prefetch: u16,
) -> (Connection, lapin::Channel, lapin::Consumer) {
    let conn = support::connect("acemq-bench-plain").await;
    let ch = conn.create_channel().await.expect("channel");
    ch.basic_qos(prefetch, BasicQosOptions::default())
        .await
        .expect("qos");
    let consumer = ch
        .basic_consume(
            queue.into(),
            "acemq-bench-plain".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    (conn, ch, consumer)
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

/// B: acemq with the full stack.
async fn acemq(queue: String, prefetch: u16, concurrency: usize, sink: Arc<Sink>) {
    let config = support::config(&queue, prefetch, concurrency);
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
    while sink.handled.load(Ordering::Acquire) < sink.n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.drain().await.expect("drain");
}

/// One timed run of `kind` on a fresh queue holding `n` messages.
async fn run_one(broker: &Broker, kind: Kind, n: u64, prefetch: u16, concurrency: usize) -> Sample {
    let queue = support::unique("tp");
    let config = support::config(&queue, prefetch, concurrency);
    broker.declare(&config).await;
    broker.publish(&queue, n, &[0x5a; BODY_LEN]).await;

    let sink = Sink::new(n);
    let done = sink.done.notified();
    tokio::pin!(done);
    done.as_mut().enable();

    let cpu0 = Cpu::now();
    let t0 = Instant::now();
    let (q, s) = (queue.clone(), sink.clone());
    let task = match kind {
        Kind::TaskPerDelivery => spawn(task_per_delivery(q, prefetch, concurrency, s)),
        Kind::WorkerPool => spawn(worker_pool(q, prefetch, concurrency, s)),
        Kind::FuturesUnordered => spawn(futures_unordered(q, prefetch, concurrency, s)),
        Kind::Acemq => spawn(acemq(q, prefetch, concurrency, s)),
    };
    done.await;
    let elapsed = t0.elapsed();
    let cpu = Cpu::now().since(cpu0);
    task.await.expect("consumer task");
    broker.delete(&config).await;

    let per_msg = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    Sample {
        msgs_per_s: n as f64 / elapsed.as_secs_f64(),
        cpu_us_per_msg: per_msg(cpu.total),
        user_us_per_msg: per_msg(cpu.user),
        sys_us_per_msg: per_msg(cpu.sys),
    }
}

/// Whether `ACEMQ_BENCH_ONLY` (if set) names `kind`.
fn selected(kind: Kind) -> bool {
    match std::env::var("ACEMQ_BENCH_ONLY") {
        Ok(only) => only.split(',').any(|k| k.trim() == kind.letter()),
        Err(_) => true,
    }
}

fn spawn(f: impl Future<Output = ()> + Send + 'static) -> tokio::task::JoinHandle<()> {
    tokio::spawn(f)
}

async fn scenario(broker: &Broker, n: u64, rounds: usize, prefetch: u16, concurrency: usize) {
    println!("\n## prefetch {prefetch} × concurrency {concurrency}, N = {n}, {rounds} rounds\n");
    let mut samples: Vec<(Kind, Vec<Sample>)> =
        Kind::ALL.iter().map(|k| (*k, Vec::new())).collect();
    for round in 0..rounds {
        // Rotate the order so no shape always runs first or last.
        for i in 0..Kind::ALL.len() {
            let idx = (i + round) % Kind::ALL.len();
            let kind = Kind::ALL[idx];
            if !selected(kind) {
                continue;
            }
            let s = run_one(broker, kind, n, prefetch, concurrency).await;
            eprintln!(
                "round {round} {:<24} {:>8.0} msgs/s {:>6.2} µs CPU/msg",
                kind.name(),
                s.msgs_per_s,
                s.cpu_us_per_msg
            );
            samples[idx].1.push(s);
        }
    }

    samples.retain(|(k, _)| selected(*k));
    let med = |v: &[Sample], f: fn(&Sample) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    println!("| consumer | msgs/s (median) | msgs/s (runs) | CPU µs/msg (median) | user | sys |");
    println!("|---|---:|---|---:|---:|---:|");
    for (kind, v) in &samples {
        let runs: Vec<String> = v.iter().map(|s| format!("{:.0}", s.msgs_per_s)).collect();
        println!(
            "| {} | {:.0} | {} | {:.2} | {:.2} | {:.2} |",
            kind.name(),
            med(v, |s| s.msgs_per_s),
            runs.join(", "),
            med(v, |s| s.cpu_us_per_msg),
            med(v, |s| s.user_us_per_msg),
            med(v, |s| s.sys_us_per_msg),
        );
    }
    let Some((a_kind, a)) = samples
        .iter()
        .filter(|(k, _)| *k != Kind::Acemq)
        .max_by(|x, y| med(&x.1, |s| s.msgs_per_s).total_cmp(&med(&y.1, |s| s.msgs_per_s)))
    else {
        return;
    };
    let Some((_, b)) = samples.iter().find(|(k, _)| *k == Kind::Acemq) else {
        return;
    };
    let tp = med(b, |s| s.msgs_per_s) / med(a, |s| s.msgs_per_s);
    let cpu = med(b, |s| s.cpu_us_per_msg) / med(a, |s| s.cpu_us_per_msg);
    println!(
        "\nfastest A: {}; B/A throughput {tp:.3} (target ≥ 0.97), B/A CPU per message {cpu:.3} (target ≤ 1.10)",
        a_kind.name()
    );
}

fn main() {
    // `cargo bench` passes `--bench`; this harness has no options.
    let n: u64 = support::env_or("ACEMQ_BENCH_N", 100_000);
    let rounds: usize = support::env_or("ACEMQ_BENCH_ROUNDS", 3);
    support::runtime().block_on(async {
        let broker = support::start("throughput", &format!(", {n} × {BODY_LEN} B")).await;
        let shapes = std::env::var("ACEMQ_BENCH_SHAPES").unwrap_or_else(|_| "100x8,10x1".into());
        for shape in shapes.split(',') {
            let parsed = shape
                .trim()
                .split_once('x')
                .and_then(|(p, c)| Some((p.parse().ok()?, c.parse().ok()?)));
            let Some((prefetch, concurrency)) = parsed else {
                eprintln!("ACEMQ_BENCH_SHAPES: {shape:?} is not PREFETCHxCONCURRENCY, e.g. 100x8");
                std::process::exit(2);
            };
            scenario(&broker, n, rounds, prefetch, concurrency).await;
        }
    });
}

//! Batch consumption against the per-message consumer, at the same
//! prefetch, on a real broker: msgs/s, client CPU and broker CPU per
//! message, ratios taken in one run.
//!
//! Each run publishes `N` persistent messages of 256 bytes with confirms
//! into a fresh, uniquely named queue (declared as acemq declares it),
//! waits (bounded) for the 1-min load average to fall, then times one
//! consumer from its start until its handler has seen all `N`, drains it
//! and deletes the queues. Both consumers are `acemq::App` with the full
//! stack; the handler checksums each body, then waits `ACEMQ_BENCH_CALL_US`
//! once per call — a database round trip, paid per message by the
//! per-message consumer and per batch by the batch consumer:
//!
//! - **one** — `App::consume`, prefetch `P`, concurrency `C`;
//! - **batch** — `App::consume_batch`, prefetch `P`, batches of `S`
//!   (default `P / K`; `max_wait` 20 ms), `K` batches at once.
//!
//! Runs alternate (one batch, then batch one, …); each figure is the median
//! of the rounds, and the ratio is batch / one of the medians.
//!
//! Run with: `cargo bench --bench batch`. Environment:
//!
//! | variable | default | what |
//! |---|---|---|
//! | `ACEMQ_BENCH_N` | 20000 | messages per run |
//! | `ACEMQ_BENCH_ROUNDS` | 3 | rounds (medians of these) |
//! | `ACEMQ_BENCH_PREFETCH` | 200 | `P`, both consumers |
//! | `ACEMQ_BENCH_CONCURRENCY` | 8 | `C`, the per-message consumer's handlers |
//! | `ACEMQ_BENCH_BATCHES` | 2 | `K`, batches running at once |
//! | `ACEMQ_BENCH_MAX_SIZE` | `P / K` | `S`, the largest batch (at most `P / K`: a smaller one leaves room in the window for the next batches to form while `K` run) |
//! | `ACEMQ_BENCH_CALL_US` | `0,1000` | the wait per call, µs; a comma list runs a table each |
//! | `ACEMQ_BENCH_MAX_LOAD` | 1.5 | wait before a run until the 1-min load ≤ this |
//! | `ACEMQ_BENCH_LOAD_WAIT` | 60 | … for at most this many seconds |
//! | `ACEMQ_BENCH_ADDR` / `ACEMQ_BENCH_NODE` | | as for `throughput` |

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::batch::Batch;
use acemq::{App, Config, Delivery};
use lapin::BasicProperties;
use support::{median, BrokerProcess, Cpu};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    One,
    Batch,
}

struct Settings {
    n: u64,
    rounds: usize,
    prefetch: u16,
    concurrency: usize,
    batches: usize,
    max_size: usize,
    max_load: f64,
    load_wait: Duration,
    broker: Option<BrokerProcess>,
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    msgs_per_s: f64,
    cpu_us: f64,
    broker_us: f64,
    calls: u64,
    load: f64,
}

/// Counts what the handler saw; wakes the timer at the `n`-th.
struct Sink {
    n: u64,
    handled: AtomicU64,
    calls: AtomicU64,
    sum: AtomicU64,
    done: tokio::sync::Notify,
}

impl Sink {
    fn handle(&self, body: &[u8]) {
        let sum = body.iter().fold(0u64, |a, b| a.wrapping_add(u64::from(*b)));
        self.sum.fetch_add(sum, Ordering::Relaxed);
        if self.handled.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.done.notify_one();
        }
    }
}

/// One consumer until its handler has seen all `n`, then its drain.
async fn consume(
    kind: Kind,
    config: Config,
    queue: String,
    sink: Arc<Sink>,
    call: Duration,
    max_size: usize,
) {
    let app = App::new(config)
        .amqp_addr(support::addr())
        .connection_name("acemq-bench-batch");
    let app = match kind {
        Kind::One => {
            let s = sink.clone();
            app.consume(
                &queue,
                tower::service_fn(move |d: Delivery| {
                    let s = s.clone();
                    async move {
                        s.calls.fetch_add(1, Ordering::Relaxed);
                        if !call.is_zero() {
                            tokio::time::sleep(call).await;
                        }
                        s.handle(d.body());
                        Ok::<_, std::convert::Infallible>(())
                    }
                }),
            )
        }
        Kind::Batch => {
            let s = sink.clone();
            app.consume_batch(
                &queue,
                max_size,
                Duration::from_millis(20),
                tower::service_fn(move |batch: Batch| {
                    let s = s.clone();
                    async move {
                        s.calls.fetch_add(1, Ordering::Relaxed);
                        if !call.is_zero() {
                            tokio::time::sleep(call).await;
                        }
                        for d in &batch {
                            s.handle(d.body());
                        }
                        Ok::<_, std::convert::Infallible>(())
                    }
                }),
            )
        }
    };
    let running = app.start().await.expect("acemq start");
    while sink.handled.load(Ordering::Acquire) < sink.n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.drain().await.expect("drain");
}

/// One timed run of `kind` with `call` per handler call.
async fn run_one(broker: &support::Broker, st: &Settings, kind: Kind, call: Duration) -> Sample {
    let queue = support::unique("batch");
    let concurrency = match kind {
        Kind::One => st.concurrency,
        Kind::Batch => st.batches,
    };
    let max_size = st.max_size;
    let config = support::config(&queue, st.prefetch, concurrency);
    broker.declare(&config).await;
    broker
        .publish_with(
            &queue,
            st.n,
            &[0x5a; 256],
            BasicProperties::default().with_delivery_mode(2),
        )
        .await;
    let (load, _) = support::wait_for_load(st.max_load, st.load_wait).await;
    let sink = Arc::new(Sink {
        n: st.n,
        handled: AtomicU64::new(0),
        calls: AtomicU64::new(0),
        sum: AtomicU64::new(0),
        done: tokio::sync::Notify::new(),
    });
    let done = sink.done.notified();
    tokio::pin!(done);
    done.as_mut().enable();
    let broker_cpu = || st.broker.as_ref().and_then(BrokerProcess::cpu);
    let cpu0 = Cpu::now();
    let b0 = broker_cpu();
    let t0 = Instant::now();
    let task = tokio::spawn(consume(
        kind,
        config.clone(),
        queue,
        sink.clone(),
        call,
        max_size,
    ));
    done.await;
    let elapsed = t0.elapsed();
    let cpu = Cpu::now().since(cpu0);
    let b1 = broker_cpu();
    task.await.expect("consumer task");
    broker.delete(&config).await;
    let per_msg = |d: Duration| d.as_secs_f64() * 1e6 / st.n as f64;
    Sample {
        msgs_per_s: st.n as f64 / elapsed.as_secs_f64(),
        cpu_us: per_msg(cpu.total),
        broker_us: match (b0, b1) {
            (Some(b0), Some(b1)) => per_msg(b1.saturating_sub(b0)),
            _ => f64::NAN,
        },
        calls: sink.calls.load(Ordering::Relaxed),
        load,
    }
}

fn med(v: &[Sample], f: fn(&Sample) -> f64) -> f64 {
    median(&v.iter().map(f).collect::<Vec<_>>())
}

fn main() {
    let st = Settings {
        n: support::env_or("ACEMQ_BENCH_N", 20_000),
        rounds: support::env_or("ACEMQ_BENCH_ROUNDS", 3),
        prefetch: support::env_or("ACEMQ_BENCH_PREFETCH", 200),
        concurrency: support::env_or("ACEMQ_BENCH_CONCURRENCY", 8),
        batches: support::env_or("ACEMQ_BENCH_BATCHES", 2),
        max_size: 0,
        max_load: support::env_or("ACEMQ_BENCH_MAX_LOAD", 1.5),
        load_wait: Duration::from_secs(support::env_or("ACEMQ_BENCH_LOAD_WAIT", 60)),
        broker: match BrokerProcess::find(support::node_from_env().as_deref()) {
            Ok(b) => Some(b),
            Err(e) => {
                eprintln!("broker CPU not measured: {e}");
                None
            }
        },
    };
    let st = Settings {
        max_size: support::env_or(
            "ACEMQ_BENCH_MAX_SIZE",
            usize::from(st.prefetch) / st.batches.max(1),
        ),
        ..st
    };
    let calls: Vec<u64> = std::env::var("ACEMQ_BENCH_CALL_US")
        .unwrap_or_else(|_| "0,1000".to_owned())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let rt = support::runtime();
    rt.block_on(async {
        let broker = support::start(
            "batch",
            &format!(
                ", N={} persistent, prefetch {}, one: concurrency {}, batch: {} × {} (max_wait 20 ms), {} rounds",
                st.n,
                st.prefetch,
                st.concurrency,
                st.batches,
                st.max_size,
                st.rounds
            ),
        )
        .await;
        for call_us in calls {
            let call = Duration::from_micros(call_us);
            let (mut one, mut batch) = (Vec::new(), Vec::new());
            for round in 0..st.rounds {
                let order = if round % 2 == 0 {
                    [Kind::One, Kind::Batch]
                } else {
                    [Kind::Batch, Kind::One]
                };
                for kind in order {
                    let s = run_one(&broker, &st, kind, call).await;
                    eprintln!(
                        "  round {round} {kind:?}: {:.0} msgs/s, {} calls, load {:.2}",
                        s.msgs_per_s, s.calls, s.load
                    );
                    match kind {
                        Kind::One => one.push(s),
                        Kind::Batch => batch.push(s),
                    }
                }
            }
            println!("\n## {call_us} µs per handler call\n");
            println!("| consumer | msgs/s | client CPU µs/msg | broker CPU µs/msg | handler calls | load |");
            println!("|---|---:|---:|---:|---:|---:|");
            for (name, v) in [("one (consume)", &one), ("batch (consume_batch)", &batch)] {
                println!(
                    "| {name} | {:.0} | {:.1} | {:.1} | {:.0} | {:.2} |",
                    med(v, |s| s.msgs_per_s),
                    med(v, |s| s.cpu_us),
                    med(v, |s| s.broker_us),
                    med(v, |s| s.calls as f64),
                    med(v, |s| s.load),
                );
            }
            println!(
                "\nbatch / one: msgs/s ×{:.2}, client CPU per message ×{:.2}, broker CPU per message ×{:.2}",
                med(&batch, |s| s.msgs_per_s) / med(&one, |s| s.msgs_per_s),
                med(&batch, |s| s.cpu_us) / med(&one, |s| s.cpu_us),
                med(&batch, |s| s.broker_us) / med(&one, |s| s.broker_us),
            );
        }
    });
}

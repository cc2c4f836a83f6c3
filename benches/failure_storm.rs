//! The publisher under a failure storm: how fast acemq sends rung copies
//! (each a publish with its confirm awaited) when 1,000 deliveries fail at
//! once, against plain lapin publishing the same messages in the same run.
//!
//! Each round:
//!
//! - **storm** — `N` (default 1,000) persistent 256-byte messages wait in a
//!   fresh queue whose retry schedule sends every retry to a rung (delay
//!   30 s, `broker_wait_threshold` 1 s), then `App::start` with a handler
//!   that fails every delivery. Timed from the first handler call until the
//!   health snapshot counts `N` retried (a delivery counts once its rung copy
//!   is confirmed); the rate is `N` over that. Client CPU over the same window.
//! - **plain, window W** — plain lapin on one confirm-mode channel publishes
//!   the same `N` messages (mandatory, persistent, to a durable queue) with at
//!   most `W` confirms outstanding: `W` = 1 (each confirm awaited in turn),
//!   `W` = concurrency (what `concurrency` handlers that each await their
//!   confirm could reach at best), `W` = prefetch (the storm's own window:
//!   a copy frees its handler slot once sent, and the deliveries waiting
//!   for their confirms are bounded by the prefetch) and `W` = `N`
//!   (everything pipelined).
//!
//! Under the table: the storm's most deliveries in flight at once (the
//! health snapshot's count: handlers and deliveries confirming their copy),
//! the confirm window the storm reaches.
//!
//! Medians of the rounds, the order rotated each round, the 1-min load
//! average waited for (bounded) before each run, as in `throughput`. The
//! ratios say where the time goes: near `W = concurrency` the rung rate is
//! bounded by the confirm round trip per handler slot; far below it, by the
//! stack or the publisher.
//!
//! Run with: `cargo bench --bench failure_storm` (env: `ACEMQ_BENCH_STORM_N`,
//! default 1000; `ACEMQ_BENCH_ROUNDS`, default 5; `ACEMQ_BENCH_SHAPES`,
//! default `50x8` (prefetch × concurrency, the retry volume test's);
//! `ACEMQ_BENCH_MAX_LOAD`, `ACEMQ_BENCH_LOAD_WAIT`, `ACEMQ_BENCH_ADDR`,
//! `ACEMQ_BENCH_NODE` as in `throughput`).

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

mod support;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use acemq::{App, BoxError, Config, Delivery};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::BasicProperties;

use support::{median, Broker, Cpu};

const BODY_LEN: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Storm,
    /// Plain lapin with at most this many confirms outstanding.
    Plain(usize),
}

impl Kind {
    fn name(self, n: usize, concurrency: usize, prefetch: usize) -> String {
        match self {
            Kind::Storm => "acemq rung publishes (failure storm)".to_owned(),
            Kind::Plain(1) => "plain lapin, window 1 (each confirm in turn)".to_owned(),
            Kind::Plain(w) if w == concurrency => {
                format!("plain lapin, window {w} (= concurrency)")
            }
            Kind::Plain(w) if w == prefetch => {
                format!("plain lapin, window {w} (= prefetch, the storm's)")
            }
            Kind::Plain(w) if w == n => format!("plain lapin, window {w} (all pipelined)"),
            Kind::Plain(w) => format!("plain lapin, window {w}"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    per_s: f64,
    cpu_us_per_msg: f64,
    load: f64,
    /// The storm's most deliveries in flight at once, as the health
    /// snapshot counts them (handlers and confirming deliveries: beyond
    /// `concurrency`, copies' confirms outstanding); 0 for plain lapin.
    most_in_flight: usize,
}

fn config(queue: &str, prefetch: u16, concurrency: usize) -> Config {
    let yaml = format!(
        "shutdown_timeout: 20\n\
         queues:\n  \
           - name: {queue}\n    \
             prefetch: {prefetch}\n    \
             concurrency: {concurrency}\n    \
             dead_letter: true\n    \
             retries: {{ max_attempts: 3, initial_delay: 30, max_delay: 30, broker_wait_threshold: 1 }}\n"
    );
    Config::from_yaml_str(&yaml).expect("storm config")
}

fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

async fn wait_for_load() -> f64 {
    let max = support::env_or("ACEMQ_BENCH_MAX_LOAD", 1.5);
    let bound = Duration::from_secs(support::env_or("ACEMQ_BENCH_LOAD_WAIT", 90));
    support::wait_for_load(max, bound).await.0
}

/// One storm: `n` deliveries that all fail, each retried through its rung.
async fn storm(broker: &Broker, n: usize, prefetch: u16, concurrency: usize) -> Sample {
    let queue = support::unique("storm");
    let config = config(&queue, prefetch, concurrency);
    broker.declare(&config).await;
    broker
        .publish_with(&queue, n as u64, &[0x5a; BODY_LEN], persistent())
        .await;
    let load = wait_for_load().await;

    let first: Arc<OnceLock<Instant>> = Arc::default();
    let handler = {
        let first = first.clone();
        tower::service_fn(move |_d: Delivery| {
            first.get_or_init(Instant::now);
            async { Err::<(), BoxError>("the failure storm".into()) }
        })
    };
    let cpu0 = Cpu::now();
    let running = App::new(config.clone())
        .amqp_addr(support::addr())
        .connection_name("acemq-bench-storm")
        .consume(&queue, handler)
        .start()
        .await
        .expect("acemq start");
    let health = running.health();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut most_in_flight = 0;
    let end = loop {
        let snapshot = health.snapshot();
        most_in_flight = most_in_flight.max(snapshot.queues[0].in_flight);
        if snapshot.queues[0].retried >= n {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "the storm did not reach {n} retried within 120 s: {:?}",
            health.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let cpu = Cpu::now().since(cpu0);
    let took = end - *first.get().expect("a handler ran");
    running.drain().await.expect("drain");
    broker.delete(&config).await;
    Sample {
        per_s: n as f64 / took.as_secs_f64(),
        cpu_us_per_msg: cpu.total.as_secs_f64() * 1e6 / n as f64,
        load,
        most_in_flight,
    }
}

/// Plain lapin: `n` mandatory persistent publishes on the bench's confirm
/// channel, at most `window` confirms outstanding.
async fn plain(broker: &Broker, n: usize, window: usize) -> Sample {
    let queue = support::unique("storm-plain");
    broker
        .ch
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare");
    let load = wait_for_load().await;
    let body = [0x5a; BODY_LEN];
    let cpu0 = Cpu::now();
    let t0 = Instant::now();
    let mut pending = FuturesUnordered::new();
    for _ in 0..n {
        if pending.len() >= window {
            pending.next().await;
        }
        let confirm = broker
            .ch
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &body,
                persistent(),
            )
            .await
            .expect("publish");
        pending.push(async move {
            assert!(confirm.await.expect("confirm").is_ack(), "broker nacked");
        });
    }
    while pending.next().await.is_some() {}
    let took = t0.elapsed();
    let cpu = Cpu::now().since(cpu0);
    let _ = broker
        .ch
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    Sample {
        per_s: n as f64 / took.as_secs_f64(),
        cpu_us_per_msg: cpu.total.as_secs_f64() * 1e6 / n as f64,
        load,
        most_in_flight: 0,
    }
}

fn main() {
    let n: usize = support::env_or("ACEMQ_BENCH_STORM_N", 1000);
    let rounds: usize = support::env_or("ACEMQ_BENCH_ROUNDS", 5);
    let shapes = std::env::var("ACEMQ_BENCH_SHAPES").unwrap_or_else(|_| "50x8".into());
    support::runtime().block_on(async {
        let broker = support::start(
            "failure storm",
            &format!(", {n} × {BODY_LEN} B persistent, every delivery failing"),
        )
        .await;
        for shape in shapes.split(',') {
            let Some((prefetch, concurrency)) = shape
                .trim()
                .split_once('x')
                .and_then(|(p, c)| Some((p.parse::<u16>().ok()?, c.parse::<usize>().ok()?)))
                .filter(|&(p, c)| p > 0 && c > 0)
            else {
                eprintln!("ACEMQ_BENCH_SHAPES: {shape:?} is not PREFETCHxCONCURRENCY, e.g. 50x8");
                std::process::exit(2);
            };
            // The storm's own window is the prefetch (a copy frees its
            // handler slot once sent; the delivery stays unacknowledged
            // until its confirm): plain lapin at that window is the
            // like-for-like row.
            let mut kinds = vec![Kind::Storm, Kind::Plain(1), Kind::Plain(concurrency)];
            for w in [usize::from(prefetch), n] {
                if !kinds.contains(&Kind::Plain(w)) {
                    kinds.push(Kind::Plain(w));
                }
            }
            println!("\n## prefetch {prefetch} × concurrency {concurrency}, N = {n}, {rounds} rounds\n");
            let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); kinds.len()];
            for round in 0..rounds {
                for i in 0..kinds.len() {
                    let idx = (i + round) % kinds.len();
                    let s = match kinds[idx] {
                        Kind::Storm => storm(&broker, n, prefetch, concurrency).await,
                        Kind::Plain(w) => plain(&broker, n, w).await,
                    };
                    eprintln!(
                        "round {round} {:<44} {:>8.0} /s {:>7.2} µs client CPU/msg (load {:.2})",
                        kinds[idx].name(n, concurrency, usize::from(prefetch)),
                        s.per_s,
                        s.cpu_us_per_msg,
                        s.load
                    );
                    samples[idx].push(s);
                }
            }
            let med = |v: &[Sample], f: fn(&Sample) -> f64| {
                median(&v.iter().map(f).collect::<Vec<_>>())
            };
            let storm_rate = med(&samples[0], |s| s.per_s);
            println!("| publisher | publishes/s with confirms (median) | runs | client CPU µs/msg | storm ÷ this |");
            println!("|---|---:|---|---:|---:|");
            for (kind, v) in kinds.iter().zip(&samples) {
                let runs: Vec<String> = v.iter().map(|s| format!("{:.0}", s.per_s)).collect();
                println!(
                    "| {} | {:.0} | {} | {:.1} | {:.3} |",
                    kind.name(n, concurrency, usize::from(prefetch)),
                    med(v, |s| s.per_s),
                    runs.join(", "),
                    med(v, |s| s.cpu_us_per_msg),
                    storm_rate / med(v, |s| s.per_s),
                );
            }
            let most: Vec<String> = samples[0]
                .iter()
                .map(|s| s.most_in_flight.to_string())
                .collect();
            println!(
                "\nstorm: most deliveries in flight at once (handlers + confirming; concurrency {concurrency}, prefetch {prefetch}): {}",
                most.join(", ")
            );
            let loads: Vec<f64> = samples.iter().flatten().map(|s| s.load).collect();
            println!(
                "\n1-min load average before each run: median {:.2}, max {:.2}",
                median(&loads),
                loads.iter().copied().fold(f64::NAN, f64::max)
            );
        }
    });
}

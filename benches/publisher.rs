//! acemq's confirmed publisher against plain lapin publishing with
//! confirms, at the same confirm windows, ratios in one run.
//!
//! Each run publishes `N` messages of 256 bytes (`ACEMQ_BENCH_BODY`),
//! persistent (`delivery_mode` 2) and mandatory, through the default
//! exchange into a fresh, uniquely named durable classic queue (declared as
//! acemq declares a queue, no dead-letter queue), with at most `W` confirms
//! outstanding, and deletes the queue. The connection (and its confirm
//! channel) is opened before the timed window and closed after it; the window
//! runs from the first publish to the last confirm.
//!
//! - **acemq** — [`acemq::Publisher`] (`Publisher::new(connection,
//!   topology)`, the same type and code path as `App::publisher()`'s handle):
//!   `W` concurrent `publish` calls in flight, in one `FuturesUnordered`
//!   bounded at `W` (a new call as soon as one returns). Each call sends the
//!   message and awaits its own confirm.
//! - **plain** — lapin on one confirm-mode channel: `basic_publish`, then at
//!   most `W` `PublisherConfirm`s outstanding in a `FuturesUnordered` (as
//!   the failure-storm bench's plain publisher). Each `basic_publish` is
//!   awaited before the next is sent, and lapin resolves it only once its
//!   frames are written to the socket: one hand-over to lapin's I/O loop and
//!   back per message, whatever `W`.
//! - **plain-concurrent** — lapin on one confirm-mode channel, in acemq's
//!   shape: `W` futures in flight, each `basic_publish` then its confirm,
//!   so the sends overlap too. Against it, the ratio is what acemq's own
//!   code costs (connection and blocked checks, the channel's mutex, the
//!   properties' conversion, the confirm's match).
//!
//! `W` = 1 is one confirm round trip per message (a persistent message's
//! confirm waits for the broker's fsync); `W` = 8 what 8 handlers that each
//! await a publish reach; `W` = 1,000 pipelined publishing.
//!
//! Per run: msgs/s, client CPU per message (this process's
//! `CLOCK_PROCESS_CPUTIME_ID`, the user/sys split from `/proc/self/stat`),
//! broker CPU per message (the node's `beam.smp`, as in `throughput`; on a
//! shared broker it includes everyone else's traffic). Each round runs every
//! window, the publishers back to back, their order rotated from one round
//! to the next; the 1-min load average is waited for (bounded) before
//! each run. Figures are medians of the rounds; the ratio acemq ÷ plain is
//! taken per window between medians of the same run, against each plain
//! shape, with the median of the per-round ratios beside it.
//!
//! Run with: `cargo bench --bench publisher`. Environment:
//!
//! | variable | default | what |
//! |---|---|---|
//! | `ACEMQ_BENCH_N` | 20000 | messages per run |
//! | `ACEMQ_BENCH_ROUNDS` | 5 | rounds (medians of these) |
//! | `ACEMQ_BENCH_WINDOWS` | `1,8,1000` | confirm windows `W` |
//! | `ACEMQ_BENCH_BODY` | 256 | body size in bytes |
//! | `ACEMQ_BENCH_ONLY` | all | a comma list of `acemq,plain,plain-concurrent` |
//! | `ACEMQ_BENCH_MAX_LOAD` | 1.5 | wait before a run until the 1-min load ≤ this |
//! | `ACEMQ_BENCH_LOAD_WAIT` | 90 | … for at most this many seconds, then warn |
//! | `ACEMQ_BENCH_ADDR` | `AMQP_ADDR` | the broker's AMQP address |
//! | `ACEMQ_BENCH_NODE` | `rabbitmqctl`'s | the node whose `beam.smp` is measured |

#![allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::disallowed_methods
)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::topology::Topology;
use acemq::{Config, Properties, PublishError, Publisher};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::BasicProperties;

use support::{median, Broker, BrokerProcess, Cpu};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Acemq,
    Plain,
    PlainConcurrent,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Acemq, Kind::Plain, Kind::PlainConcurrent];

    fn key(self) -> &'static str {
        match self {
            Kind::Acemq => "acemq",
            Kind::Plain => "plain",
            Kind::PlainConcurrent => "plain-concurrent",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Acemq => "acemq Publisher",
            Kind::Plain => "plain lapin",
            Kind::PlainConcurrent => "plain lapin, concurrent sends",
        }
    }
}

struct Settings {
    n: usize,
    rounds: usize,
    windows: Vec<usize>,
    body: usize,
    kinds: Vec<Kind>,
    max_load: f64,
    load_wait: Duration,
    broker_process: Option<BrokerProcess>,
}

fn fail(msg: &str) -> ! {
    eprintln!("publisher bench: {msg}");
    std::process::exit(2);
}

impl Settings {
    fn from_env() -> Settings {
        let windows: Vec<usize> = std::env::var("ACEMQ_BENCH_WINDOWS")
            .unwrap_or_else(|_| "1,8,1000".into())
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .map(|w| {
                w.parse()
                    .ok()
                    .filter(|&w: &usize| w > 0)
                    .unwrap_or_else(|| {
                        fail(&format!(
                            "ACEMQ_BENCH_WINDOWS: {w:?} is not a window (a positive number)"
                        ))
                    })
            })
            .collect();
        if windows.is_empty() {
            fail("ACEMQ_BENCH_WINDOWS: no window");
        }
        let kinds: Vec<Kind> = match std::env::var("ACEMQ_BENCH_ONLY") {
            Ok(only) => {
                let wanted: Vec<&str> = only.split(',').map(str::trim).collect();
                for w in &wanted {
                    if !w.is_empty() && !Kind::ALL.iter().any(|k| k.key() == *w) {
                        fail(&format!(
                            "ACEMQ_BENCH_ONLY: {w:?} is not a publisher; use a comma list of acemq, plain, plain-concurrent"
                        ));
                    }
                }
                Kind::ALL
                    .iter()
                    .copied()
                    .filter(|k| wanted.contains(&k.key()))
                    .collect()
            }
            Err(_) => Kind::ALL.to_vec(),
        };
        let n: usize = support::env_or("ACEMQ_BENCH_N", 20_000);
        if n == 0 {
            fail("ACEMQ_BENCH_N: must be at least 1");
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
            n,
            rounds: support::env_or("ACEMQ_BENCH_ROUNDS", 5usize).max(1),
            windows,
            body: support::env_or("ACEMQ_BENCH_BODY", 256usize),
            kinds,
            max_load: support::env_or("ACEMQ_BENCH_MAX_LOAD", 1.5),
            load_wait: Duration::from_secs(support::env_or("ACEMQ_BENCH_LOAD_WAIT", 90)),
            broker_process,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    msgs_per_s: f64,
    cpu_us_per_msg: f64,
    user_us_per_msg: f64,
    sys_us_per_msg: f64,
    /// NaN when the broker's CPU could not be read.
    broker_us_per_msg: f64,
    load: f64,
}

/// One durable classic queue, declared as acemq declares it (no `.dlq`).
fn queue_config(queue: &str) -> Config {
    Config::from_yaml_str(&format!(
        "queues:\n  - name: {queue}\n    type: classic\n    consume: false\n"
    ))
    .expect("bench config")
}

/// acemq: `window` concurrent `Publisher::publish` calls in flight.
async fn acemq_publish(publisher: &Publisher, queue: &str, n: usize, window: usize, body: &[u8]) {
    let mut pending = FuturesUnordered::new();
    for _ in 0..n {
        if pending.len() >= window {
            let done: Option<Result<(), PublishError>> = pending.next().await;
            done.expect("a publish in flight").expect("acemq publish");
        }
        // Persistent (the publisher's default when `delivery_mode` is unset).
        pending.push(publisher.publish("", queue, body, Properties::default()));
    }
    while let Some(r) = pending.next().await {
        r.expect("acemq publish");
    }
}

/// Plain lapin: `basic_publish`, at most `window` confirms outstanding.
async fn plain_publish(ch: &lapin::Channel, queue: &str, n: usize, window: usize, body: &[u8]) {
    let props = BasicProperties::default().with_delivery_mode(2);
    let mut pending = FuturesUnordered::new();
    for _ in 0..n {
        if pending.len() >= window {
            pending.next().await;
        }
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                props.clone(),
            )
            .await
            .expect("publish");
        pending.push(async move {
            let c = confirm.await.expect("confirm");
            assert!(
                matches!(c, lapin::Confirmation::Ack(None)),
                "not a plain ack: {c:?}"
            );
        });
    }
    while pending.next().await.is_some() {}
}

/// Plain lapin in acemq's shape: `window` futures in flight, each sending
/// its message and awaiting its confirm.
async fn plain_concurrent_publish(
    ch: &lapin::Channel,
    queue: &str,
    n: usize,
    window: usize,
    body: &[u8],
) {
    let props = BasicProperties::default().with_delivery_mode(2);
    let one = || async {
        let c = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                props.clone(),
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
        assert!(
            matches!(c, lapin::Confirmation::Ack(None)),
            "not a plain ack: {c:?}"
        );
    };
    let mut pending = FuturesUnordered::new();
    for _ in 0..n {
        if pending.len() >= window {
            pending.next().await;
        }
        pending.push(one());
    }
    while pending.next().await.is_some() {}
}

/// One timed run of `kind` at `window`.
async fn run_one(broker: &Broker, st: &Settings, kind: Kind, window: usize) -> Sample {
    let queue = support::unique("pub");
    let config = queue_config(&queue);
    broker.declare(&config).await;
    let body = vec![0x5a; st.body];
    let conn = Arc::new(support::connect(&format!("acemq-bench-pub-{}", kind.key())).await);
    // Each publisher's channel is opened before the window.
    let publisher = match kind {
        Kind::Acemq => Some(
            Publisher::new(conn.clone(), Topology::from_config(&config))
                .await
                .expect("acemq Publisher::new"),
        ),
        Kind::Plain | Kind::PlainConcurrent => None,
    };
    let plain_ch = match kind {
        Kind::Plain | Kind::PlainConcurrent => {
            let ch = conn.create_channel().await.expect("channel");
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .expect("confirm_select");
            Some(ch)
        }
        Kind::Acemq => None,
    };
    let (load, waited) = support::wait_for_load(st.max_load, st.load_wait).await;
    if waited >= Duration::from_secs(2) {
        eprintln!(
            "  (waited {:.0} s for the 1-min load to fall to {load:.2})",
            waited.as_secs_f64()
        );
    }

    let broker_cpu = || st.broker_process.as_ref().and_then(BrokerProcess::cpu);
    let cpu0 = Cpu::now();
    let b0 = broker_cpu();
    let t0 = Instant::now();
    match (kind, &publisher, &plain_ch) {
        (Kind::Acemq, Some(p), _) => acemq_publish(p, &queue, st.n, window, &body).await,
        (Kind::Plain, _, Some(ch)) => plain_publish(ch, &queue, st.n, window, &body).await,
        (Kind::PlainConcurrent, _, Some(ch)) => {
            plain_concurrent_publish(ch, &queue, st.n, window, &body).await;
        }
        _ => unreachable!("one publisher per run"),
    }
    let elapsed = t0.elapsed();
    let cpu = Cpu::now().since(cpu0);
    let b1 = broker_cpu();

    drop(publisher);
    if let Some(ch) = plain_ch {
        let _ = ch.close(200, "bench done".into()).await;
    }
    let _ = conn.close(200, "bench done".into()).await;
    broker.delete(&config).await;

    let per_msg = |d: Duration| d.as_secs_f64() * 1e6 / st.n as f64;
    Sample {
        msgs_per_s: st.n as f64 / elapsed.as_secs_f64(),
        cpu_us_per_msg: per_msg(cpu.total),
        user_us_per_msg: per_msg(cpu.user),
        sys_us_per_msg: per_msg(cpu.sys),
        broker_us_per_msg: match (b0, b1) {
            (Some(b0), Some(b1)) => per_msg(b1.saturating_sub(b0)),
            _ => f64::NAN,
        },
        load,
    }
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

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the arguments.
    let st = Settings::from_env();
    support::runtime().block_on(async {
        let broker_cpu = match &st.broker_process {
            Some(p) => format!(", broker CPU from {} (pid {})", p.node, p.pid),
            None => ", broker CPU not measured".to_owned(),
        };
        let windows: Vec<String> = st.windows.iter().map(usize::to_string).collect();
        let broker = support::start(
            "publisher",
            &format!(
                ", {} × {} B persistent mandatory into a durable classic queue, windows {}, {} rounds{broker_cpu}",
                st.n,
                st.body,
                windows.join(", "),
                st.rounds
            ),
        )
        .await;

        // samples[window index][kind index]
        let mut samples: Vec<Vec<Vec<Sample>>> =
            vec![vec![Vec::new(); st.kinds.len()]; st.windows.len()];
        for round in 0..st.rounds {
            eprintln!(
                "round {round}: 1-min load average {:.2}",
                support::load_1min()
            );
            for (wi, &window) in st.windows.iter().enumerate() {
                // Rotate which publisher goes first.
                for i in 0..st.kinds.len() {
                    let ki = (i + round) % st.kinds.len();
                    let kind = st.kinds[ki];
                    let s = run_one(&broker, &st, kind, window).await;
                    eprintln!(
                        "round {round} window {window:>5} {:<29} {:>8.0} msgs/s {:>7.2} µs client CPU/msg {:>7} µs broker CPU/msg (load {:.2})",
                        kind.name(),
                        s.msgs_per_s,
                        s.cpu_us_per_msg,
                        fmt(s.broker_us_per_msg, 2),
                        s.load
                    );
                    samples[wi][ki].push(s);
                }
            }
        }

        for (wi, &window) in st.windows.iter().enumerate() {
            let at_most = window.min(st.n);
            println!(
                "\n## window {window} ({at_most} confirm{} outstanding at most), N = {}, {} rounds\n",
                if at_most == 1 { "" } else { "s" },
                st.n,
                st.rounds
            );
            println!("| publisher | msgs/s (median) | msgs/s (runs) | client CPU µs/msg (median) | user | sys | broker CPU µs/msg (median) |");
            println!("|---|---:|---|---:|---:|---:|---:|");
            for (ki, kind) in st.kinds.iter().enumerate() {
                let v = &samples[wi][ki];
                let runs: Vec<String> = v.iter().map(|s| format!("{:.0}", s.msgs_per_s)).collect();
                println!(
                    "| {} | {:.0} | {} | {:.2} | {:.2} | {:.2} | {} |",
                    kind.name(),
                    med(v, |s| s.msgs_per_s),
                    runs.join(", "),
                    med(v, |s| s.cpu_us_per_msg),
                    med(v, |s| s.user_us_per_msg),
                    med(v, |s| s.sys_us_per_msg),
                    fmt(med(v, |s| s.broker_us_per_msg), 2),
                );
            }
        }

        let loads: Vec<f64> = samples.iter().flatten().flatten().map(|s| s.load).collect();
        println!(
            "\n1-min load average before each run: median {:.2}, max {:.2} (waited for ≤ {} up to {} s)",
            median(&loads),
            loads.iter().copied().fold(f64::NAN, f64::max),
            st.max_load,
            st.load_wait.as_secs()
        );

        let position = |kind: Kind| st.kinds.iter().position(|k| *k == kind);
        let references: Vec<(Kind, usize)> = [Kind::Plain, Kind::PlainConcurrent]
            .into_iter()
            .filter_map(|k| Some((k, position(k)?)))
            .collect();
        let Some(ai) = position(Kind::Acemq).filter(|_| !references.is_empty()) else {
            println!("\n(acemq or every plain shape left out: no ratios)");
            return;
        };
        println!(
            "\n## acemq ÷ plain lapin, per window: ratios of medians in this run (in brackets the median of the per-round ratios)\n"
        );
        println!("| window | against | acemq msgs/s | its msgs/s | msgs/s × | client CPU/msg × | broker CPU/msg × |");
        println!("|---:|---|---:|---:|---:|---:|---:|");
        for (wi, &window) in st.windows.iter().enumerate() {
            for &(reference, pi) in &references {
                let (a, p) = (&samples[wi][ai], &samples[wi][pi]);
                let cell = |f: fn(&Sample) -> f64| {
                    let of_medians = med(a, f) / med(p, f);
                    let per_round =
                        median(&a.iter().zip(p).map(|(a, p)| f(a) / f(p)).collect::<Vec<_>>());
                    format!("{} ({})", fmt(of_medians, 3), fmt(per_round, 3))
                };
                println!(
                    "| {window} | {} | {:.0} | {:.0} | {} | {} | {} |",
                    reference.name(),
                    med(a, |s| s.msgs_per_s),
                    med(p, |s| s.msgs_per_s),
                    cell(|s| s.msgs_per_s),
                    cell(|s| s.cpu_us_per_msg),
                    cell(|s| s.broker_us_per_msg),
                );
            }
        }
    });
}

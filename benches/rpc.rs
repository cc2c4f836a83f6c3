//! `acemq::rpc`'s client against plain lapin direct reply-to clients, with
//! the same server and the same number of calls in flight, ratios in one run.
//!
//! One server for the whole run: an `App` consuming a fresh, uniquely named
//! queue through a [`Responder`] that upper-cases the body (concurrency 8,
//! prefetch 16), in this process; its reply is published confirmed before
//! the request is acknowledged. Each run makes `N` calls of 64 bytes with at
//! most `W` in flight (a `FuturesUnordered` bounded at `W`, a new call as
//! soon as one returns), on a connection of its own opened (and warmed with
//! one call) before the timed window.
//!
//! - **acemq** — [`RpcClient`] through its `tower::Service` (`ready`, then
//!   `call`): the request published mandatory with a confirm awaited, its
//!   deadline as `expiration`, the reply routed by correlation id.
//! - **acemq-unconfirmed** — the same client with `confirm_requests(false)`:
//!   no confirm, not mandatory (an unroutable request ends at its deadline).
//! - **plain** — lapin on one channel, the usual hand-written client: a
//!   consumer on `amq.rabbitmq.reply-to` (no-ack) whose task routes each
//!   reply by correlation id through a `Mutex<HashMap>` of oneshot senders;
//!   each call inserts its sender, `basic_publish`es (no confirm, not
//!   mandatory) with `reply_to`, `correlation_id` and `expiration`, and
//!   awaits its reply.
//! - **plain-confirmed** — the same, with what acemq adds to each publish:
//!   a confirm-mode channel, mandatory, the confirm awaited before the
//!   reply. acemq against it is what acemq's own code costs; acemq against
//!   **plain**, that plus the confirm; acemq-unconfirmed against **plain**,
//!   acemq's code without the confirm.
//!
//! Each round runs every window, the clients back to back, their order
//! rotated from one round to the next; the 1-min load average is printed
//! each round and waited for (bounded) before each run. Figures are medians
//! of the rounds; the ratio acemq ÷ plain is taken per window between
//! medians of the same run, with the median of the per-round ratios beside
//! it. The server shares this process and its 2 runtime threads with the
//! client being measured, as it shares the broker: the ratio, not the
//! absolute figure, is the result.
//!
//! Run with: `cargo bench --bench rpc`. Environment:
//!
//! | variable | default | what |
//! |---|---|---|
//! | `ACEMQ_BENCH_N` | 5000 | calls per run |
//! | `ACEMQ_BENCH_ROUNDS` | 5 | rounds (medians of these) |
//! | `ACEMQ_BENCH_WINDOWS` | `1,8` | calls in flight `W` |
//! | `ACEMQ_BENCH_ONLY` | all | a comma list of `acemq,acemq-unconfirmed,plain,plain-confirmed` |
//! | `ACEMQ_BENCH_MAX_LOAD` | 1.5 | wait before a run until the 1-min load ≤ this |
//! | `ACEMQ_BENCH_LOAD_WAIT` | 90 | … for at most this many seconds, then warn |
//! | `ACEMQ_BENCH_ADDR` | `AMQP_ADDR` | the broker's AMQP address |

#![allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::disallowed_methods
)]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::rpc::{Responder, RpcClient, RpcRequest, REPLY_TO};
use acemq::{App, BoxError, Delivery};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation};
use tokio::sync::oneshot;
use tower::{service_fn, Service, ServiceExt};

use support::median;

const BODY: usize = 64;
const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Acemq,
    AcemqUnconfirmed,
    Plain,
    PlainConfirmed,
}

impl Kind {
    const ALL: [Kind; 4] = [
        Kind::Acemq,
        Kind::AcemqUnconfirmed,
        Kind::Plain,
        Kind::PlainConfirmed,
    ];

    /// Which acemq client is set against which plain one.
    const PAIRS: [(Kind, Kind); 3] = [
        (Kind::Acemq, Kind::PlainConfirmed),
        (Kind::Acemq, Kind::Plain),
        (Kind::AcemqUnconfirmed, Kind::Plain),
    ];

    fn key(self) -> &'static str {
        match self {
            Kind::Acemq => "acemq",
            Kind::AcemqUnconfirmed => "acemq-unconfirmed",
            Kind::Plain => "plain",
            Kind::PlainConfirmed => "plain-confirmed",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Acemq => "acemq RpcClient",
            Kind::AcemqUnconfirmed => "acemq RpcClient, confirm_requests(false)",
            Kind::Plain => "plain lapin",
            Kind::PlainConfirmed => "plain lapin, confirmed mandatory",
        }
    }
}

struct Settings {
    n: usize,
    rounds: usize,
    windows: Vec<usize>,
    kinds: Vec<Kind>,
    max_load: f64,
    load_wait: Duration,
}

fn fail(msg: &str) -> ! {
    eprintln!("rpc bench: {msg}");
    std::process::exit(2);
}

impl Settings {
    fn from_env() -> Settings {
        let windows: Vec<usize> = std::env::var("ACEMQ_BENCH_WINDOWS")
            .unwrap_or_else(|_| "1,8".into())
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .map(|w| {
                w.parse().ok().filter(|&w: &usize| w > 0).unwrap_or_else(|| {
                    fail(&format!(
                        "ACEMQ_BENCH_WINDOWS: {w:?} is not a number of calls in flight (a positive number)"
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
                            "ACEMQ_BENCH_ONLY: {w:?} is not a client; use a comma list of acemq, acemq-unconfirmed, plain, plain-confirmed"
                        ));
                    }
                }
                Kind::ALL
                    .into_iter()
                    .filter(|k| wanted.contains(&k.key()))
                    .collect()
            }
            Err(_) => Kind::ALL.to_vec(),
        };
        let n: usize = support::env_or("ACEMQ_BENCH_N", 5_000);
        if n == 0 {
            fail("ACEMQ_BENCH_N: must be at least 1");
        }
        Settings {
            n,
            rounds: support::env_or("ACEMQ_BENCH_ROUNDS", 5usize).max(1),
            windows,
            kinds,
            max_load: support::env_or("ACEMQ_BENCH_MAX_LOAD", 1.5),
            load_wait: Duration::from_secs(support::env_or("ACEMQ_BENCH_LOAD_WAIT", 90)),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    calls_per_s: f64,
    load: f64,
}

/// The server: `queue` answered by a `Responder` that upper-cases the body.
async fn serve(queue: &str) -> acemq::Running {
    let config = acemq::Config::from_yaml_str(&format!(
        "queues:\n  - name: {queue}\n    type: classic\n    prefetch: 16\n    concurrency: 8\n"
    ))
    .expect("bench config");
    let app = App::new(config);
    let publisher = app.publisher();
    let upper =
        service_fn(|d: Delivery| async move { Ok::<_, BoxError>(d.body().to_ascii_uppercase()) });
    app.consume(queue, Responder::new(publisher, upper))
        .start()
        .await
        .expect("the bench server starts")
}

/// A hand-written direct reply-to client on one lapin channel.
struct PlainClient {
    channel: Channel,
    pending: Arc<Mutex<HashMap<String, oneshot::Sender<Vec<u8>>>>>,
    next: AtomicU64,
    confirmed: bool,
}

impl PlainClient {
    async fn new(conn: &lapin::Connection, confirmed: bool) -> PlainClient {
        let channel = conn.create_channel().await.expect("channel");
        if confirmed {
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .expect("confirm_select");
        }
        let mut consumer = channel
            .basic_consume(
                REPLY_TO.into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("consume replies");
        let pending: Arc<Mutex<HashMap<String, oneshot::Sender<Vec<u8>>>>> = Arc::default();
        let routes = pending.clone();
        tokio::spawn(async move {
            while let Some(Ok(d)) = consumer.next().await {
                let Some(id) = d.properties.correlation_id() else {
                    continue;
                };
                let tx = routes.lock().unwrap().remove(id.as_str());
                if let Some(tx) = tx {
                    let _ = tx.send(d.data);
                }
            }
        });
        PlainClient {
            channel,
            pending,
            next: AtomicU64::new(1),
            confirmed,
        }
    }

    async fn call(&self, queue: &str, body: &[u8]) -> Vec<u8> {
        let id = self.next.fetch_add(1, Ordering::Relaxed).to_string();
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id.clone(), tx);
        let properties = BasicProperties::default()
            .with_correlation_id(id.into())
            .with_reply_to(REPLY_TO.into())
            .with_expiration(DEADLINE.as_millis().to_string().into());
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions {
                    mandatory: self.confirmed,
                    ..BasicPublishOptions::default()
                },
                body,
                properties,
            )
            .await
            .expect("publish");
        if self.confirmed {
            let c = confirm.await.expect("confirm");
            assert!(
                matches!(c, Confirmation::Ack(None)),
                "not a plain ack: {c:?}"
            );
        }
        tokio::time::timeout(DEADLINE, rx)
            .await
            .expect("a reply within the deadline")
            .expect("the reply router is running")
    }
}

/// `n` calls, at most `window` in flight, each through `one`.
async fn calls<F, Fut>(n: usize, window: usize, one: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
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
async fn run_one(st: &Settings, queue: &str, kind: Kind, window: usize) -> Sample {
    let body = vec![b'a'; BODY];
    let expected = body.to_ascii_uppercase();
    let conn = support::connect(&format!("acemq-bench-rpc-{}", kind.key())).await;
    let conn = Arc::new(conn);
    let acemq_client = match kind {
        Kind::Acemq => Some(RpcClient::new(conn.clone())),
        Kind::AcemqUnconfirmed => Some(RpcClient::new(conn.clone()).confirm_requests(false)),
        Kind::Plain | Kind::PlainConfirmed => None,
    };
    let plain = match kind {
        Kind::Acemq | Kind::AcemqUnconfirmed => None,
        Kind::Plain => Some(PlainClient::new(&conn, false).await),
        Kind::PlainConfirmed => Some(PlainClient::new(&conn, true).await),
    };
    let acemq_call = || {
        let mut client = acemq_client.clone().expect("the acemq client");
        let request = RpcRequest::new("", queue, body.clone(), DEADLINE);
        let expected = &expected;
        async move {
            let reply = client
                .ready()
                .await
                .expect("ready")
                .call(request)
                .await
                .expect("a reply");
            assert_eq!(reply.body(), &expected[..]);
        }
    };
    let plain_call = || async {
        let reply = plain
            .as_ref()
            .expect("the plain client")
            .call(queue, &body)
            .await;
        assert_eq!(reply, expected);
    };
    // Warm: the client's channel and reply consumer exist before the window.
    match kind {
        Kind::Acemq | Kind::AcemqUnconfirmed => acemq_call().await,
        Kind::Plain | Kind::PlainConfirmed => plain_call().await,
    }
    let (load, waited) = support::wait_for_load(st.max_load, st.load_wait).await;
    if waited >= Duration::from_secs(2) {
        eprintln!(
            "  (waited {:.0} s for the 1-min load; it is {load:.2})",
            waited.as_secs_f64()
        );
    }
    let t0 = Instant::now();
    match kind {
        Kind::Acemq | Kind::AcemqUnconfirmed => calls(st.n, window, acemq_call).await,
        Kind::Plain | Kind::PlainConfirmed => calls(st.n, window, plain_call).await,
    }
    let elapsed = t0.elapsed();
    drop(acemq_client);
    if let Some(p) = plain {
        let _ = p.channel.close(200, "bench done".into()).await;
    }
    let _ = conn.close(200, "bench done".into()).await;
    Sample {
        calls_per_s: st.n as f64 / elapsed.as_secs_f64(),
        load,
    }
}

fn med(v: &[Sample], f: fn(&Sample) -> f64) -> f64 {
    median(&v.iter().map(f).collect::<Vec<_>>())
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the arguments.
    let st = Settings::from_env();
    support::runtime().block_on(async {
        let windows: Vec<String> = st.windows.iter().map(usize::to_string).collect();
        let broker = support::start(
            "rpc",
            &format!(
                ", {} calls of {BODY} B per run to one acemq Responder (concurrency 8) in this process, in flight {}, {} rounds",
                st.n,
                windows.join(", "),
                st.rounds
            ),
        )
        .await;
        let queue = support::unique("rpc");
        let server = serve(&queue).await;

        // samples[window index][kind index]
        let mut samples: Vec<Vec<Vec<Sample>>> =
            vec![vec![Vec::new(); st.kinds.len()]; st.windows.len()];
        for round in 0..st.rounds {
            eprintln!("round {round}: 1-min load average {:.2}", support::load_1min());
            for (wi, &window) in st.windows.iter().enumerate() {
                // Rotate which client goes first.
                for i in 0..st.kinds.len() {
                    let ki = (i + round) % st.kinds.len();
                    let kind = st.kinds[ki];
                    let s = run_one(&st, &queue, kind, window).await;
                    eprintln!(
                        "round {round} in flight {window:>3} {:<33} {:>8.0} calls/s (load {:.2})",
                        kind.name(),
                        s.calls_per_s,
                        s.load
                    );
                    samples[wi][ki].push(s);
                }
            }
        }
        server.drain().await.expect("the bench server drains");
        broker
            .delete(
                &acemq::Config::from_yaml_str(&format!("queues:\n  - name: {queue}\n"))
                    .expect("bench config"),
            )
            .await;

        for (wi, &window) in st.windows.iter().enumerate() {
            println!(
                "\n## {window} in flight, N = {}, {} rounds\n",
                st.n, st.rounds
            );
            println!("| client | calls/s (median) | calls/s (runs) |");
            println!("|---|---:|---|");
            for (ki, kind) in st.kinds.iter().enumerate() {
                let v = &samples[wi][ki];
                let runs: Vec<String> = v.iter().map(|s| format!("{:.0}", s.calls_per_s)).collect();
                println!(
                    "| {} | {:.0} | {} |",
                    kind.name(),
                    med(v, |s| s.calls_per_s),
                    runs.join(", ")
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
        let pairs: Vec<(Kind, usize, Kind, usize)> = Kind::PAIRS
            .into_iter()
            .filter_map(|(a, p)| Some((a, position(a)?, p, position(p)?)))
            .collect();
        if pairs.is_empty() {
            println!("\n(no acemq client beside a plain one: no ratios)");
            return;
        }
        println!(
            "\n## acemq ÷ plain lapin, per number in flight: ratio of medians in this run (in brackets the median of the per-round ratios)\n"
        );
        println!("| in flight | acemq | against | acemq calls/s | its calls/s | calls/s × |");
        println!("|---:|---|---|---:|---:|---:|");
        for (wi, &window) in st.windows.iter().enumerate() {
            for &(acemq, ai, reference, pi) in &pairs {
                let (a, p) = (&samples[wi][ai], &samples[wi][pi]);
                let of_medians = med(a, |s| s.calls_per_s) / med(p, |s| s.calls_per_s);
                let per_round = median(
                    &a.iter()
                        .zip(p)
                        .map(|(a, p)| a.calls_per_s / p.calls_per_s)
                        .collect::<Vec<_>>(),
                );
                println!(
                    "| {window} | {} | {} | {:.0} | {:.0} | {of_medians:.3} ({per_round:.3}) |",
                    acemq.name(),
                    reference.name(),
                    med(a, |s| s.calls_per_s),
                    med(p, |s| s.calls_per_s),
                );
            }
        }
    });
}

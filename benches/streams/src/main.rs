//! acemq's stream consumer against a plain `rabbitmq-stream-client`
//! consumer, on one stream of N messages, and acemq on a classic queue of
//! the same N messages on the same broker.
//!
//! One run, rotated rounds: every round runs each contender once (the
//! order rotated each round), waits before it for the 1-min load average
//! and prints it. Each stream contender reads the stream from `first`
//! under a consumer name of its own, with the same store cadence (an
//! offset stored every 1,000 messages):
//!
//! - **plain**: the crate's `Consumer` (offset `First`, its own credit
//!   policy: one chunk, one credit back per chunk buffered), a handler that
//!   does nothing, `store_offset` on the consumer's own client every 1,000
//!   messages;
//! - **plain-nostore**: the same consumer storing no offset: the crate at
//!   its fastest (it sets no `TCP_NODELAY`: likely why a credit sent right
//!   after a store is slow to leave);
//! - **acemq**: an `acemq::App` consuming the stream (`type: stream`,
//!   `offset: first`, `offset_store: { every: 1000, within: 1s }`) through
//!   its full stack with a no-op `service_fn` handler that counts;
//! - **classic**: the same `App` on a classic queue holding the same N
//!   messages (published, persistent, before the round's load check).
//!
//! Each contender is timed from its start (connecting) until the N-th
//! message is handled; then it stops (acemq drains). Client CPU is this
//! process's `getrusage(RUSAGE_SELF)` user + sys over the same window.
//!
//! Environment (defaults in brackets):
//!
//! - `ACEMQ_BENCH_ADDR` AMQP address [amqp://guest:guest@127.0.0.1:5704/%2f]
//! - `ACEMQ_STREAM_PORT` the stream plugin's port on that host [5584]
//! - `ACEMQ_BENCH_N` messages [500000]; `ACEMQ_BENCH_ROUNDS` [9]
//! - `ACEMQ_BENCH_PREFETCH` [1000], `ACEMQ_BENCH_CONCURRENCY` [8]: acemq's
//! - `ACEMQ_BENCH_ONLY` e.g. `plain,acemq` [plain,plain-nostore,acemq,classic]
//! - `ACEMQ_BENCH_MAX_LOAD` [1.5], `ACEMQ_BENCH_LOAD_WAIT` seconds [90]
//! - `ACEMQ_BENCH_BROKER_PID` the node's beam.smp (`scripts/rabbitmq4.sh
//!   pid`): its CPU per message is printed too

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::{App, Config, Delivery};
use futures::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions};
use lapin::BasicProperties;
use rabbitmq_stream_client::types::{Message, OffsetSpecification};
use rabbitmq_stream_client::Environment;
use tokio::sync::{Notify, Semaphore};

const BODY: usize = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plain,
    /// The plain consumer storing no offset (the crate at its fastest).
    PlainNoStore,
    Acemq,
    Classic,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Plain, Kind::PlainNoStore, Kind::Acemq, Kind::Classic];
    fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::PlainNoStore => "plain-nostore",
            Kind::Acemq => "acemq",
            Kind::Classic => "classic",
        }
    }
}

struct Opts {
    addr: String,
    host: String,
    stream_port: u16,
    n: u64,
    rounds: usize,
    prefetch: u16,
    concurrency: usize,
    kinds: Vec<Kind>,
    max_load: f64,
    load_wait: Duration,
    broker_pid: Option<u32>,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

impl Opts {
    fn from_env() -> Opts {
        let addr = std::env::var("ACEMQ_BENCH_ADDR")
            .ok()
            .filter(|a| !a.trim().is_empty())
            .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5704/%2f".to_owned());
        let host = addr
            .split('@')
            .nth(1)
            .and_then(|r| r.split([':', '/']).next())
            .unwrap_or("127.0.0.1")
            .to_owned();
        let kinds = match std::env::var("ACEMQ_BENCH_ONLY") {
            Ok(s) if !s.trim().is_empty() => Kind::ALL
                .into_iter()
                .filter(|k| s.split(',').any(|x| x.trim() == k.name()))
                .collect(),
            _ => Kind::ALL.to_vec(),
        };
        Opts {
            addr,
            host,
            stream_port: env_or("ACEMQ_STREAM_PORT", 5584),
            n: env_or("ACEMQ_BENCH_N", 500_000),
            rounds: env_or("ACEMQ_BENCH_ROUNDS", 9),
            prefetch: env_or("ACEMQ_BENCH_PREFETCH", 1000),
            concurrency: env_or("ACEMQ_BENCH_CONCURRENCY", 8),
            kinds,
            max_load: env_or("ACEMQ_BENCH_MAX_LOAD", 1.5),
            load_wait: Duration::from_secs(env_or("ACEMQ_BENCH_LOAD_WAIT", 90)),
            broker_pid: std::env::var("ACEMQ_BENCH_BROKER_PID")
                .ok()
                .and_then(|p| p.trim().parse().ok()),
        }
    }
}

/// This process's user + sys CPU time so far (`getrusage(RUSAGE_SELF)`).
fn cpu_self() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let ru = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let tv =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    tv(ru.user_time()) + tv(ru.system_time())
}

/// utime + stime of `pid` from `/proc/PID/stat` (10 ms ticks).
fn cpu_of(pid: Option<u32>) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i)?.parse::<u64>().ok();
    Some(Duration::from_millis(10 * (t(11)? + t(12)?)))
}

fn load_1min() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

async fn wait_for_load(max: f64, bound: Duration) -> (f64, Duration) {
    let t0 = Instant::now();
    loop {
        let load = load_1min();
        if load.is_nan() || load <= max {
            return (load, t0.elapsed());
        }
        if t0.elapsed() >= bound {
            eprintln!("warning: the 1-min load average is {load:.2}, above {max} after {} s; running anyway", bound.as_secs());
            return (load, t0.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn unique(prefix: &str) -> String {
    format!(
        "acemq-bench.{prefix}.{}.{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() % 1_000_000)
    )
}

/// The App's config: one queue of `queue_type` with the full stack, as the
/// end-to-end bench configures it; a stream gets its consumer name, `first`
/// and the store cadence.
fn config(o: &Opts, queue: &str, queue_type: &str, consumer_name: &str) -> Config {
    let mut yaml = format!(
        "shutdown_timeout: 20\n\
         streams: {{ port: {port} }}\n\
         queues:\n  \
           - name: {queue}\n    \
             type: {queue_type}\n    \
             prefetch: {prefetch}\n    \
             concurrency: {concurrency}\n    \
             dead_letter: true\n    \
             retries: {{ max_attempts: 3, initial_delay: 1, max_delay: 4, broker_wait_threshold: 10 }}\n",
        port = o.stream_port,
        prefetch = o.prefetch,
        concurrency = o.concurrency,
    );
    if queue_type == "stream" {
        yaml.push_str(&format!(
            "    offset: first\n    consumer_name: {consumer_name}\n    offset_store: {{ every: 1000, within: 1s }}\n"
        ));
    }
    Config::from_yaml_str(&yaml).expect("bench config")
}

/// Counts what the handler sees; notifies at `n`.
struct Sink {
    n: u64,
    handled: AtomicU64,
    done: Notify,
    first: std::sync::OnceLock<Instant>,
}

struct Run {
    secs: f64,
    /// From the first message handled to the N-th.
    secs_from_first: f64,
    cpu: Duration,
    broker_cpu: Option<Duration>,
}

/// plain: the crate's Consumer, store_offset every 1,000 messages.
async fn plain(o: &Opts, env: &Environment, stream: &str, name: &str, store: bool) -> Run {
    let t0 = Instant::now();
    let c0 = cpu_self();
    let b0 = cpu_of(o.broker_pid);
    let mut consumer = env
        .consumer()
        .name(name)
        .offset(OffsetSpecification::First)
        .build(stream)
        .await
        .expect("plain consumer");
    let mut count = 0u64;
    let mut sum = 0u64;
    let mut first = None;
    let mut last = 0;
    while let Some(d) = consumer.next().await {
        let d = d.expect("delivery");
        if first.is_none() {
            first = Some(Instant::now());
        }
        // The handler: nothing but look at the body.
        sum = sum.wrapping_add(d.message().data().map_or(0, <[u8]>::len) as u64);
        last = d.offset();
        count += 1;
        if store && count % 1000 == 0 {
            consumer.store_offset(last).await.expect("store_offset");
        }
        if count == o.n {
            break;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_self().saturating_sub(c0);
    let broker_cpu = cpu_of(o.broker_pid)
        .zip(b0)
        .map(|(a, b)| a.saturating_sub(b));
    assert_eq!(count, o.n, "plain: the stream ended early");
    assert_eq!(sum, o.n * BODY as u64);
    if store {
        consumer.store_offset(last).await.expect("store_offset");
    }
    let _ = consumer.handle().close().await;
    Run {
        secs,
        secs_from_first: first.map_or(secs, |f| f.elapsed().as_secs_f64().min(secs)),
        cpu,
        broker_cpu,
    }
}

/// acemq (on the stream, or the classic queue): an App with a no-op
/// handler that counts; timed until the N-th is handled, then drained.
async fn acemq_app(o: &Opts, config: Config, queue: &str) -> Run {
    let sink = Arc::new(Sink {
        n: o.n,
        handled: AtomicU64::new(0),
        done: Notify::new(),
        first: std::sync::OnceLock::new(),
    });
    let all = sink.done.notified();
    tokio::pin!(all);
    all.as_mut().enable();
    let s = sink.clone();
    let handler = tower::service_fn(move |d: Delivery| {
        let s = s.clone();
        async move {
            std::hint::black_box(d.body().len());
            let h = s.handled.fetch_add(1, Ordering::AcqRel);
            if h == 0 {
                let _ = s.first.set(Instant::now());
            }
            if h + 1 == s.n {
                s.done.notify_waiters();
            }
            Ok::<_, Infallible>(())
        }
    });
    let t0 = Instant::now();
    let c0 = cpu_self();
    let b0 = cpu_of(o.broker_pid);
    let running = App::new(config)
        .amqp_addr(o.addr.clone())
        .connection_name("acemq-bench-streams")
        .consume(queue, handler)
        .start()
        .await
        .expect("acemq start");
    all.await;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_self().saturating_sub(c0);
    let broker_cpu = cpu_of(o.broker_pid)
        .zip(b0)
        .map(|(a, b)| a.saturating_sub(b));
    let secs_from_first = sink
        .first
        .get()
        .map_or(secs, |f| f.elapsed().as_secs_f64().min(secs));
    running.drain().await.expect("drain");
    Run {
        secs,
        secs_from_first,
        cpu,
        broker_cpu,
    }
}

/// Fills `stream` with `n` messages of BODY bytes through the crate's
/// Producer (`batch_send`), waiting for every confirm.
async fn fill_stream(env: &Environment, stream: &str, n: u64) {
    const BATCH: u64 = 500;
    let producer = env.producer().build(stream).await.expect("producer");
    let confirmed = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Notify::new());
    // At most this many batches unconfirmed.
    let window = Arc::new(Semaphore::new(40));
    let mut sent = 0;
    while sent < n {
        let k = BATCH.min(n - sent);
        let batch = (0..k)
            .map(|_| Message::builder().body(vec![b'x'; BODY]).build())
            .collect();
        let permit = window.clone().acquire_many_owned(1).await.expect("window");
        let left = Arc::new(AtomicU64::new(k));
        let permit = Arc::new(std::sync::Mutex::new(Some(permit)));
        let (c, d) = (confirmed.clone(), done.clone());
        producer
            .batch_send(batch, move |status| {
                let (c, d, left, permit) = (c.clone(), d.clone(), left.clone(), permit.clone());
                async move {
                    assert!(
                        status.is_ok_and(|s| s.confirmed()),
                        "a message was not confirmed"
                    );
                    if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                        permit.lock().unwrap().take();
                    }
                    c.fetch_add(1, Ordering::AcqRel);
                    d.notify_one();
                }
            })
            .await
            .expect("batch_send");
        sent += k;
    }
    while confirmed.load(Ordering::Acquire) < n {
        let _ = tokio::time::timeout(Duration::from_millis(100), done.notified()).await;
    }
    producer.close().await.expect("producer close");
}

/// Publishes `n` persistent messages of BODY bytes to `queue` with
/// confirms (2,000 outstanding at most).
async fn fill_classic(ch: &lapin::Channel, queue: &str, n: u64) {
    let body = vec![b'x'; BODY];
    let props = BasicProperties::default().with_delivery_mode(2);
    let mut pending = Vec::with_capacity(2_000);
    for _ in 0..n {
        let c = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &body,
                props.clone(),
            )
            .await
            .expect("publish");
        pending.push(c);
        if pending.len() == 2_000 {
            for c in pending.drain(..) {
                assert!(c.await.expect("confirm").is_ack(), "broker nacked");
            }
        }
    }
    for c in pending {
        assert!(c.await.expect("confirm").is_ack(), "broker nacked");
    }
}

#[tokio::main]
async fn main() {
    let o = Opts::from_env();
    let (probe, _events) = acemq::stream::StreamClient::connect(&acemq::stream::StreamOptions {
        host: o.host.clone(),
        port: o.stream_port,
        ..Default::default()
    })
    .await
    .expect("the stream plugin: start the node (ACEMQ_NODE_PLUGINS=rabbitmq_stream scripts/rabbitmq4.sh up) or set ACEMQ_STREAM_PORT");
    let version = probe.server_version().unwrap_or("unknown").to_owned();
    let _ = probe.close().await;
    println!(
        "# streams: {} cores, RabbitMQ {version}, N = {} messages of {BODY} B, {} rounds, acemq prefetch {} x concurrency {}, offsets stored every 1,000",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        o.n,
        o.rounds,
        o.prefetch,
        o.concurrency,
    );
    let env = Environment::builder()
        .host(&o.host)
        .port(o.stream_port)
        .build()
        .await
        .expect("environment");
    let stream = unique("stream");
    let classic = unique("classic");
    let conn = acemq::connection::connect(
        &o.addr,
        "acemq-bench-streams-setup",
        Duration::from_secs(10),
    )
    .await
    .expect("AMQP connection");
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm_select");
    let stream_config = config(&o, &stream, "stream", "setup");
    let classic_config = config(&o, &classic, "classic", "");
    for c in [&stream_config, &classic_config] {
        acemq::topology::Topology::from_config(c)
            .declare(&conn)
            .await
            .expect("declare");
    }
    let t = Instant::now();
    fill_stream(&env, &stream, o.n).await;
    println!(
        "# filled {stream} with {} messages in {:.1} s",
        o.n,
        t.elapsed().as_secs_f64()
    );

    let mut runs: Vec<Vec<(Kind, Run)>> = Vec::new();
    for round in 0..o.rounds {
        if o.kinds.contains(&Kind::Classic) {
            fill_classic(&ch, &classic, o.n).await;
        }
        let (load, waited) = wait_for_load(o.max_load, o.load_wait).await;
        println!(
            "round {} (1-min load {load:.2}, waited {:.0} s)",
            round + 1,
            waited.as_secs_f64()
        );
        let mut order = o.kinds.clone();
        let len = order.len();
        order.rotate_left(round % len);
        let mut this = Vec::new();
        for kind in order {
            let name = format!("bench-{}-{round}", kind.name());
            let run = match kind {
                Kind::Plain => plain(&o, &env, &stream, &name, true).await,
                Kind::PlainNoStore => plain(&o, &env, &stream, &name, false).await,
                Kind::Acemq => acemq_app(&o, config(&o, &stream, "stream", &name), &stream).await,
                Kind::Classic => acemq_app(&o, classic_config.clone(), &classic).await,
            };
            println!(
                "  {:<13} {:>9.0} msgs/s ({:>9.0} from the first message), client CPU {:>5.2} µs/msg{}",
                kind.name(),
                o.n as f64 / run.secs,
                o.n as f64 / run.secs_from_first,
                run.cpu.as_secs_f64() * 1e6 / o.n as f64,
                run.broker_cpu
                    .map(|b| format!(", broker CPU {:.2} µs/msg", b.as_secs_f64() * 1e6 / o.n as f64))
                    .unwrap_or_default(),
            );
            this.push((kind, run));
        }
        runs.push(this);
    }

    println!("\n# medians over {} rounds", o.rounds);
    let of = |k: Kind, f: &dyn Fn(&Run) -> f64| -> Vec<f64> {
        runs.iter()
            .filter_map(|r| r.iter().find(|(kk, _)| *kk == k).map(|(_, run)| f(run)))
            .collect()
    };
    let rate = |r: &Run| o.n as f64 / r.secs;
    let rate_first = |r: &Run| o.n as f64 / r.secs_from_first;
    let cpu = |r: &Run| r.cpu.as_secs_f64() * 1e6 / o.n as f64;
    let bcpu = |r: &Run| {
        r.broker_cpu
            .map_or(f64::NAN, |b| b.as_secs_f64() * 1e6 / o.n as f64)
    };
    println!("| contender | msgs/s | msgs/s from the first message | client CPU µs/msg | broker CPU µs/msg |");
    println!("|---|---:|---:|---:|---:|");
    for k in &o.kinds {
        println!(
            "| {} | {:.0} | {:.0} | {:.2} | {:.2} |",
            k.name(),
            median(&of(*k, &rate)),
            median(&of(*k, &rate_first)),
            median(&of(*k, &cpu)),
            median(&of(*k, &bcpu)),
        );
    }
    let ratio = |a: Kind, b: Kind, f: &dyn Fn(&Run) -> f64| -> (f64, f64) {
        let (xa, xb) = (of(a, f), of(b, f));
        let per_round: Vec<f64> = xa.iter().zip(&xb).map(|(x, y)| x / y).collect();
        (median(&xa) / median(&xb), median(&per_round))
    };
    for base in [Kind::Plain, Kind::PlainNoStore] {
        if !(o.kinds.contains(&base) && o.kinds.contains(&Kind::Acemq)) {
            continue;
        }
        let (m, r) = ratio(Kind::Acemq, base, &rate);
        let (mf, rf) = ratio(Kind::Acemq, base, &rate_first);
        let (c, cr) = ratio(Kind::Acemq, base, &cpu);
        println!(
            "acemq / {} msgs/s: {m:.3} (median of per-round ratios {r:.3}); from the first message {mf:.3} ({rf:.3}); client CPU a message {c:.2} ({cr:.2})",
            base.name()
        );
    }
    if o.kinds.contains(&Kind::Classic) && o.kinds.contains(&Kind::Acemq) {
        let (m, r) = ratio(Kind::Acemq, Kind::Classic, &rate);
        println!("acemq on the stream / acemq on the classic queue msgs/s: {m:.2} ({r:.2})");
    }

    let _ = env.delete_stream(&stream).await;
    for c in [&stream_config, &classic_config] {
        for d in acemq::topology::Topology::from_config(c).decls() {
            let _ = ch
                .queue_delete(d.name.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
    let _ = conn.close(200, "done".into()).await;
}

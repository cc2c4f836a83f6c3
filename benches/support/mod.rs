//! Helpers shared by the broker benches: connecting, unique queues declared
//! as `acemq` declares them, publishing with confirms, process CPU time.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use acemq::topology::Topology;
use acemq::Config;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions};
use lapin::{BasicProperties, Channel, Connection};

/// The broker address (`AMQP_ADDR`, or the local default).
pub fn addr() -> String {
    acemq::connection::amqp_addr_from_env()
}

/// Connects, naming the connection, or exits with a message saying how to
/// start RabbitMQ.
pub async fn connect(name: &str) -> Connection {
    match acemq::connection::connect(&addr(), name, Duration::from_secs(10)).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "bench: no RabbitMQ at {}: {e}. Start it (`rabbitmq-server -detached && \
                 rabbitmqctl await_startup`) or set AMQP_ADDR.",
                acemq::connection::redact(&addr())
            );
            std::process::exit(69);
        }
    }
}

/// A queue name unique to this process and call.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "acemq-bench.{prefix}.{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The config of one queue, as YAML, with the full stack switched on
/// (dead-letter queue, retries in process — no rung queue needed).
pub fn config(queue: &str, prefetch: u16, concurrency: usize) -> Config {
    let yaml = format!(
        "shutdown_timeout: 20\n\
         queues:\n  \
           - name: {queue}\n    \
             prefetch: {prefetch}\n    \
             concurrency: {concurrency}\n    \
             dead_letter: true\n    \
             retries: {{ max_attempts: 3, initial_delay: 1, max_delay: 4, broker_wait_threshold: 10 }}\n"
    );
    Config::from_yaml_str(&yaml).expect("bench config")
}

/// A confirm-mode channel for publishing and cleanup.
pub struct Broker {
    pub conn: Connection,
    pub ch: Channel,
}

impl Broker {
    pub async fn new() -> Self {
        let conn = connect("acemq-bench-publisher").await;
        let ch = conn.create_channel().await.expect("channel");
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm_select");
        Broker { conn, ch }
    }

    /// Declares the queues of `config` exactly as `acemq` does.
    pub async fn declare(&self, config: &Config) {
        Topology::from_config(config)
            .declare(&self.conn)
            .await
            .expect("declare the bench topology");
    }

    /// Publishes `n` copies of `body` to `queue`, waiting for every confirm
    /// (at most 2,000 unconfirmed at a time).
    pub async fn publish(&self, queue: &str, n: u64, body: &[u8]) {
        let mut pending = Vec::with_capacity(2_000);
        for _ in 0..n {
            let confirm = self
                .ch
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    body,
                    BasicProperties::default(),
                )
                .await
                .expect("publish");
            pending.push(confirm);
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

    /// Deletes every queue `config` declares.
    pub async fn delete(&self, config: &Config) {
        for d in Topology::from_config(config).decls() {
            let _ = self
                .ch
                .queue_delete(d.name.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
}

/// CPU time this process has used so far: the precise user+sys total
/// (`CLOCK_PROCESS_CPUTIME_ID`), and the split from `/proc/self/stat`
/// (clock ticks, so 10 ms resolution).
#[derive(Clone, Copy, Debug)]
pub struct Cpu {
    pub total: Duration,
    pub user: Duration,
    pub sys: Duration,
}

impl Cpu {
    pub fn now() -> Cpu {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        let total = Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
        let (user, sys) = proc_stat_times().unwrap_or_default();
        Cpu { total, user, sys }
    }

    pub fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            total: self.total.saturating_sub(earlier.total),
            user: self.user.saturating_sub(earlier.user),
            sys: self.sys.saturating_sub(earlier.sys),
        }
    }
}

/// utime and stime of this process from `/proc/self/stat` (100 ticks/s).
fn proc_stat_times() -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of proc(5); `after` starts at field 3.
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let tick = Duration::from_millis(10);
    Some((tick * ticks(11)? as u32, tick * ticks(12)? as u32))
}

/// The median of `xs` (sorted copy; mean of the middle two when even).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A multi-thread tokio runtime for a bench's `main`.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Prints the report's header, `# {title}: N cores, RabbitMQ V{details}`,
/// and connects the [`Broker`].
pub async fn start(title: &str, details: &str) -> Broker {
    println!(
        "# {title}: {} cores, RabbitMQ {}{details}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        rabbitmq_version()
    );
    Broker::new().await
}

/// `rabbitmqctl version`, or `unknown`.
pub fn rabbitmq_version() -> String {
    std::process::Command::new("rabbitmqctl")
        .arg("version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// An environment variable parsed as a number, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

//! Helpers shared by the broker benches: connecting, unique queues declared
//! as `acemq` declares them, publishing with confirms, process CPU time, the
//! broker's CPU time (its `beam.smp`) and the machine's load average.
//!
//! Which broker: `ACEMQ_BENCH_ADDR` (else `AMQP_ADDR`, else the local
//! default) is the AMQP address, `ACEMQ_BENCH_NODE` (else `rabbitmqctl`'s
//! default node) the node name whose `beam.smp` is measured and that
//! `rabbitmqctl -n` asks. Set both to run against a node of the bench's own
//! (BENCHMARKS.md says how to start one).

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use acemq::topology::Topology;
use acemq::Config;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions};
use lapin::{BasicProperties, Channel, Connection};

/// The broker address: `ACEMQ_BENCH_ADDR`, else `AMQP_ADDR`, else the local
/// default.
pub fn addr() -> String {
    std::env::var("ACEMQ_BENCH_ADDR")
        .ok()
        .filter(|a| !a.trim().is_empty())
        .unwrap_or_else(acemq::connection::amqp_addr_from_env)
}

/// The node named by `ACEMQ_BENCH_NODE`, if set.
pub fn node_from_env() -> Option<String> {
    std::env::var("ACEMQ_BENCH_NODE")
        .ok()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
}

/// `rabbitmqctl [-n NODE] ARGS…`'s stdout, when it succeeds.
pub fn rabbitmqctl(node: Option<&str>, args: &[&str]) -> Option<String> {
    let mut cmd = std::process::Command::new("rabbitmqctl");
    if let Some(node) = node {
        cmd.args(["-n", node]);
    }
    let out = cmd.args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Connects, naming the connection, or exits with a message saying how to
/// start RabbitMQ.
pub async fn connect(name: &str) -> Connection {
    match acemq::connection::connect(&addr(), name, Duration::from_secs(10)).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "bench: no RabbitMQ at {}: {e}. Start it (`rabbitmq-server -detached && \
                 rabbitmqctl await_startup`) or set ACEMQ_BENCH_ADDR (or AMQP_ADDR).",
                acemq::connection::redact(&addr())
            );
            std::process::exit(i32::from(acemq::app::EXIT_UNAVAILABLE));
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

/// The YAML of [`config`] with the queue's `type` set and `extra` appended
/// to the queue's entry: each `(key, value)` becomes the line `key: value`,
/// the value YAML as written (e.g. `("ack_batch", "0")`).
pub fn config_yaml(
    queue: &str,
    prefetch: u16,
    concurrency: usize,
    queue_type: &str,
    extra: &[(&str, &str)],
) -> String {
    let mut yaml = format!(
        "shutdown_timeout: 20\n\
         queues:\n  \
           - name: {queue}\n    \
             type: {queue_type}\n    \
             prefetch: {prefetch}\n    \
             concurrency: {concurrency}\n    \
             dead_letter: true\n    \
             retries: {{ max_attempts: 3, initial_delay: 1, max_delay: 4, broker_wait_threshold: 10 }}\n"
    );
    for (key, value) in extra {
        yaml.push_str(&format!("    {key}: {value}\n"));
    }
    yaml
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

    /// [`Broker::declare`] that survives the broker closing this
    /// connection (RabbitMQ 3.10's quorum-queue log writer can crash when a
    /// queue is deleted, which closes every connection): on a failure it
    /// opens a new connection and declares again, up to 5 times, 2 s apart,
    /// saying so on stderr. A long bench run then loses a few seconds, not
    /// the run.
    pub async fn declare_again_on_failure(&mut self, config: &Config) {
        let mut tries = 0;
        loop {
            match Topology::from_config(config).declare(&self.conn).await {
                Ok(()) => return,
                Err(e) if tries < 5 => {
                    tries += 1;
                    eprintln!("  (declaring failed: {e}; opening a new connection and declaring again in 2 s, try {tries} of 5)");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    *self = Broker::new().await;
                }
                Err(e) => panic!("declare the bench topology: {e}"),
            }
        }
    }

    /// Publishes `n` transient copies of `body` to `queue`, waiting for every
    /// confirm (at most 2,000 unconfirmed at a time).
    pub async fn publish(&self, queue: &str, n: u64, body: &[u8]) {
        self.publish_with(queue, n, body, BasicProperties::default())
            .await;
    }

    /// [`Broker::publish`] with `props` on every message (e.g.
    /// `delivery_mode` 2, persistent).
    pub async fn publish_with(&self, queue: &str, n: u64, body: &[u8], props: BasicProperties) {
        let mut pending = Vec::with_capacity(2_000);
        for _ in 0..n {
            let confirm = self
                .ch
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    body,
                    props.clone(),
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

/// This process's CPU time by kind of thread, from each thread's
/// `/proc/self/task/TID/schedstat` (nanoseconds on the CPU) and `status`
/// (voluntary context switches: how often it parked). A thread that exits
/// between two readings drops out of the later one; the benches read both
/// while their connections are open.
#[derive(Clone, Copy, Debug, Default)]
pub struct Threads {
    /// lapin's I/O threads (`lapin-io-loop`: the sockets, frame parsing,
    /// waking the tasks that wait on a delivery or a settle).
    pub io: Duration,
    /// tokio's workers (`tokio-rt-worker`: the consumers' own code).
    pub workers: Duration,
    /// The workers' voluntary context switches (each one a park).
    pub worker_parks: u64,
}

impl Threads {
    pub fn now() -> Threads {
        let mut t = Threads::default();
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return t;
        };
        for task in dir.flatten() {
            let path = task.path();
            let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            let on_cpu = std::fs::read_to_string(path.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .map_or(Duration::ZERO, Duration::from_nanos);
            if name.starts_with("lapin-io") {
                t.io += on_cpu;
            } else if name.starts_with("tokio-rt-worker") {
                t.workers += on_cpu;
                t.worker_parks += std::fs::read_to_string(path.join("status"))
                    .ok()
                    .and_then(|s| {
                        s.lines()
                            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
                            .trim()
                            .parse::<u64>()
                            .ok()
                    })
                    .unwrap_or(0);
            }
        }
        t
    }

    pub fn since(self, earlier: Threads) -> Threads {
        Threads {
            io: self.io.saturating_sub(earlier.io),
            workers: self.workers.saturating_sub(earlier.workers),
            worker_parks: self.worker_parks.saturating_sub(earlier.worker_parks),
        }
    }
}

/// utime and stime of this process from `/proc/self/stat` (100 ticks/s).
fn proc_stat_times() -> Option<(Duration, Duration)> {
    pid_stat_times("self")
}

/// utime and stime of `/proc/{pid}/stat`. Linux reports them in USER_HZ
/// ticks, 100 per second on every architecture this runs on.
fn pid_stat_times(pid: &str) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of proc(5); `after` starts at field 3.
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let tick = Duration::from_millis(10);
    Some((tick * ticks(11)? as u32, tick * ticks(12)? as u32))
}

/// The broker node's Erlang VM (`beam.smp`), whose CPU time is read from
/// `/proc/PID/stat` as the bench reads its own.
#[derive(Clone, Debug)]
pub struct BrokerProcess {
    pub node: String,
    pub pid: u32,
}

impl BrokerProcess {
    /// Finds the `beam.smp` of `node` (`ACEMQ_BENCH_NODE`, else the node
    /// `rabbitmqctl status` reports): the process whose environment holds
    /// `RABBITMQ_NODENAME=node` (a node started by hand with that variable),
    /// else the OS PID the node itself reports (`rabbitmqctl -n node status`,
    /// e.g. a default broker started without the variable). `Err` says why
    /// not.
    pub fn find(node: Option<&str>) -> Result<BrokerProcess, String> {
        let status = rabbitmqctl(node, &["status"]);
        let node = match node {
            Some(n) => n.to_owned(),
            None => status
                .as_deref()
                .and_then(|s| {
                    let rest = &s[s.find("Status of node ")? + "Status of node ".len()..];
                    Some(
                        rest.split_whitespace()
                            .next()?
                            .trim_end_matches('.')
                            .to_owned(),
                    )
                })
                .ok_or("`rabbitmqctl status` failed: set ACEMQ_BENCH_NODE to the node's name")?,
        };
        if let Some(pid) = beam_by_nodename(&node) {
            return Ok(BrokerProcess { node, pid });
        }
        let pid = status
            .as_deref()
            .and_then(|s| {
                let rest = &s[s.find("OS PID: ")? + "OS PID: ".len()..];
                rest.split_whitespace().next()?.parse::<u32>().ok()
            })
            .ok_or_else(|| {
                format!(
                    "no beam.smp with RABBITMQ_NODENAME={node} in its environment, and \
                     `rabbitmqctl -n {node} status` gave no OS PID: is the node up, and is \
                     ACEMQ_BENCH_NODE its name?"
                )
            })?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "beam.smp" {
            return Err(format!(
                "node {node} reports OS PID {pid}, which is not a local beam.smp ({:?}): \
                 the broker runs elsewhere; broker CPU cannot be read",
                comm.trim()
            ));
        }
        Ok(BrokerProcess { node, pid })
    }

    /// The VM's utime + stime so far (10 ms resolution).
    pub fn cpu(&self) -> Option<Duration> {
        let (user, sys) = pid_stat_times(&self.pid.to_string())?;
        Some(user + sys)
    }
}

/// The `beam.smp` whose environment says `RABBITMQ_NODENAME=node`.
fn beam_by_nodename(node: &str) -> Option<u32> {
    let want = format!("RABBITMQ_NODENAME={node}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        if comm.trim() != "beam.smp" {
            return None;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        env.split(|b| *b == 0)
            .any(|kv| kv == want.as_bytes())
            .then_some(pid)
    })
}

/// The 1-minute load average (`/proc/loadavg`), NaN when unreadable.
pub fn load_1min() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Waits, at most `bound`, until the 1-minute load average is at or below
/// `max`, polling every 2 s. Returns the load it last read and how long it
/// waited; prints a warning when the bound passed first.
pub async fn wait_for_load(max: f64, bound: Duration) -> (f64, Duration) {
    let t0 = std::time::Instant::now();
    loop {
        let load = load_1min();
        if load.is_nan() || load <= max {
            return (load, t0.elapsed());
        }
        if t0.elapsed() >= bound {
            eprintln!(
                "warning: the 1-min load average is {load:.2}, still above {max} after waiting \
                 {} s; running anyway (the figures of this run are from a loaded machine)",
                bound.as_secs()
            );
            return (load, t0.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
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

/// `rabbitmqctl [-n ACEMQ_BENCH_NODE] version`, or `unknown`.
pub fn rabbitmq_version() -> String {
    rabbitmqctl(node_from_env().as_deref(), &["version"])
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Whether an environment variable is set to `1` or `true`.
pub fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1" || v == "true")
}

/// An environment variable parsed as a number, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

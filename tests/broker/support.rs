//! Shared helpers for the broker tests: a connection to the real RabbitMQ at
//! `AMQP_ADDR`, unique queue names, publishing, reading and cleanup.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

#[allow(unused_imports)] // each crate that includes this file uses some of them
pub use crate::common::{addr, eventually, unique};

/// [`addr`] with `user` and `password` in place of its credentials (the same
/// broker, host, port and vhost).
pub fn addr_as(user: &str, password: &str) -> String {
    let mut url = url::Url::parse(&addr()).expect("AMQP_ADDR is a URL");
    url.set_username(user).expect("a username fits the URL");
    url.set_password(Some(password))
        .expect("a password fits the URL");
    url.to_string()
}

/// Connects, or fails the test with a message saying how to start RabbitMQ.
pub async fn connect() -> Connection {
    match tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(&addr(), ConnectionProperties::default().with_connection_name("acemq-test-support".into())),
    )
    .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => panic!(
            "no RabbitMQ answered at {}: {e}. Start it (`rabbitmq-server -detached && rabbitmqctl await_startup`) or set AMQP_ADDR. Broker tests never skip.",
            acemq::connection::redact(&addr())
        ),
        Err(_) => panic!("RabbitMQ at {} did not answer within 10 s", acemq::connection::redact(&addr())),
    }
}

/// A broker-side helper: publish, count, get and delete queues.
pub struct Broker {
    pub conn: Connection,
    pub ch: Channel,
}

impl Broker {
    pub async fn new() -> Self {
        let conn = connect().await;
        let ch = conn.create_channel().await.expect("channel");
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm");
        Broker { conn, ch }
    }

    async fn channel(&mut self) -> &Channel {
        if !self.ch.status().connected() {
            self.ch = self.conn.create_channel().await.expect("channel");
            self.ch
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .expect("confirm");
        }
        &self.ch
    }

    /// Publishes `body` to `queue` with `headers`, and waits for the confirm.
    pub async fn publish(&mut self, queue: &str, body: &[u8], headers: FieldTable) {
        self.publish_props(
            queue,
            body,
            BasicProperties::default().with_headers(headers),
        )
        .await;
    }

    pub async fn publish_props(&mut self, queue: &str, body: &[u8], props: BasicProperties) {
        let ch = self.channel().await;
        ch.basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            body,
            props,
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    }

    /// `queue` as a passive declare reports it; `None` when it does not exist.
    async fn passive_declare(&mut self, queue: &str) -> Option<lapin::Queue> {
        let ch = self.channel().await;
        ch.queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .ok()
    }

    /// Messages ready in `queue` (passive declare).
    pub async fn ready(&mut self, queue: &str) -> Option<u32> {
        self.passive_declare(queue).await.map(|q| q.message_count())
    }

    /// Takes one message from `queue` (acked).
    pub async fn get(&mut self, queue: &str) -> Option<lapin::message::BasicGetMessage> {
        let ch = self.channel().await;
        ch.basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .ok()
            .flatten()
    }

    /// Waits (up to `within`) for a message in `queue` and takes it.
    pub async fn get_within(
        &mut self,
        queue: &str,
        within: Duration,
    ) -> Option<lapin::message::BasicGetMessage> {
        let end = Instant::now() + within;
        loop {
            if let Some(m) = self.get(queue).await {
                return Some(m);
            }
            if Instant::now() > end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (up to `within`) until `queue` holds `n` ready messages.
    pub async fn wait_ready(&mut self, queue: &str, n: u32, within: Duration) -> bool {
        let end = Instant::now() + within;
        loop {
            if self.ready(queue).await == Some(n) {
                return true;
            }
            if Instant::now() > end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Deletes queues (missing ones are fine).
    pub async fn delete(&mut self, queues: &[String]) {
        for q in queues {
            let ch = self.channel().await;
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
}

/// Every queue the topology of a config with one queue `q` may declare.
pub fn all_queues(q: &str) -> Vec<String> {
    let mut v = vec![q.to_owned(), format!("{q}.dlq")];
    for d in ["200ms", "400ms", "800ms", "1s", "2s", "4s", "8s"] {
        v.push(format!("{q}.retry.{d}"));
    }
    v
}

// ---- Helpers for the topology, config, retry, dead-letter and bad-input tests.

/// Every queue the topology of `config` declares (main, `.dlq`, rungs).
pub fn topology_queues(config: &acemq::Config) -> Vec<String> {
    acemq::topology::Topology::from_config(config)
        .decls()
        .iter()
        .map(|d| d.name.clone())
        .collect()
}

/// A one-queue config: `name`, dead-lettering on, and retries on the schedule
/// `initial` (doubling, capped at `max`) for `max_attempts` in all, waiting
/// in the broker from `threshold` on.
pub fn retry_config(
    name: &str,
    max_attempts: u32,
    initial: Duration,
    threshold: Duration,
    max: Duration,
) -> acemq::Config {
    let mut q = acemq::config::QueueConfig::new(name);
    q.dead_letter = true;
    let mut retries = acemq::config::RetriesConfig::new(max_attempts, initial, max);
    retries.broker_wait_threshold = threshold;
    q.retries = Some(retries);
    let mut config = acemq::Config::new([q]);
    config.shutdown_timeout = Duration::from_secs(10);
    config
}

/// The ladder most broker tests use: `name` with dead-lettering on and 4
/// attempts in all, waiting 200ms in process, then on the 400ms and 800ms
/// rungs.
pub fn ladder_config(name: &str) -> acemq::Config {
    retry_config(
        name,
        4,
        Duration::from_millis(200),
        Duration::from_millis(400),
        Duration::from_millis(800),
    )
}

/// A config with the one queue `name`, everything else as the defaults.
pub fn plain_config(name: &str) -> acemq::Config {
    acemq::Config::new([acemq::config::QueueConfig::new(name)])
}

/// What the test handlers are: a `Service<Delivery>` that `App::consume`
/// takes, answering `()` or a [`BoxError`](acemq::BoxError).
pub trait TestHandler:
    tower::Service<acemq::Delivery, Response = (), Error = acemq::BoxError, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<T> TestHandler for T where
    T: tower::Service<
            acemq::Delivery,
            Response = (),
            Error = acemq::BoxError,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// Starts an app on `config` consuming `queue` with `handler`, or fails the
/// test.
pub async fn start_consuming<H>(config: acemq::Config, queue: &str, handler: H) -> acemq::Running
where
    H: tower::Service<acemq::Delivery> + Clone + Send + 'static,
    H::Error: Into<acemq::BoxError>,
    H::Future: Send + 'static,
    H::Response: acemq::IntoVerdict + Send + 'static,
{
    acemq::App::new(config)
        .consume(queue, handler)
        .start()
        .await
        .expect("starts")
}

/// Starts an app on [`ladder_config`] consuming `queue` with `handler`;
/// returns it with every queue of its topology (to delete at the end).
pub async fn start_on_ladder(
    queue: &str,
    handler: impl TestHandler,
) -> (acemq::Running, Vec<String>) {
    let config = ladder_config(queue);
    let all = topology_queues(&config);
    (start_consuming(config, queue, handler).await, all)
}

/// A field table from `(name, value)` pairs.
pub fn field_table(entries: Vec<(&str, lapin::types::AMQPValue)>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(k.into(), v);
    }
    t
}

/// An AMQP long string value.
pub fn long_str(s: &str) -> lapin::types::AMQPValue {
    lapin::types::AMQPValue::LongString(s.into())
}

/// A message's headers as acemq [`acemq::Headers`] (empty when it has none).
pub fn message_headers(props: &BasicProperties) -> acemq::Headers {
    props
        .headers()
        .as_ref()
        .map(acemq::convert::headers_from_table)
        .unwrap_or_default()
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Broker {
    /// Consumers on `queue` (passive declare); `None` when it does not exist.
    pub async fn consumers(&mut self, queue: &str) -> Option<u32> {
        self.passive_declare(queue)
            .await
            .map(|q| q.consumer_count())
    }

    /// Declares `queue` durable with `arguments`, on a channel of its own (a
    /// refused declare closes its channel). The broker's refusal is the error.
    pub async fn declare(
        &mut self,
        queue: &str,
        arguments: FieldTable,
    ) -> Result<(), lapin::Error> {
        let ch = self.conn.create_channel().await.expect("channel");
        let res = ch
            .queue_declare(
                queue.into(),
                lapin::options::QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await
            .map(|_| ());
        if ch.status().connected() {
            let _ = ch.close(200, "OK".into()).await;
        }
        res
    }

    /// Publishes every body to `queue` with `props`, then waits for all the
    /// confirms (pipelined, for volume).
    pub async fn publish_many(&mut self, queue: &str, bodies: &[Vec<u8>], props: BasicProperties) {
        let ch = self.channel().await.clone();
        let mut confirms = Vec::with_capacity(bodies.len());
        for body in bodies {
            confirms.push(
                ch.basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    body,
                    props.clone(),
                )
                .await
                .expect("publish"),
            );
        }
        for c in confirms {
            c.await.expect("confirm");
        }
    }
}

// ---- rabbitmqctl of the broker under test.

/// The command line that runs `rabbitmqctl` for the broker at `AMQP_ADDR`:
/// `ACEMQ_RABBITMQCTL` split on whitespace, default `rabbitmqctl` (the
/// default broker's, on PATH). For the RabbitMQ 4 node of
/// `scripts/rabbitmq4.sh`: `ACEMQ_RABBITMQCTL="scripts/rabbitmq4.sh ctl"`.
/// A relative path in the first word (one with a `/`) is taken from the
/// repository root (`CARGO_MANIFEST_DIR`), so it works from any directory.
pub fn rabbitmqctl_argv() -> Vec<String> {
    let line = std::env::var("ACEMQ_RABBITMQCTL").unwrap_or_default();
    let mut argv: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    if argv.is_empty() {
        return vec!["rabbitmqctl".to_owned()];
    }
    if argv[0].contains('/') && !argv[0].starts_with('/') {
        argv[0] = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(&argv[0])
            .to_string_lossy()
            .into_owned();
    }
    argv
}

/// `rabbitmqctl` (as [`rabbitmqctl_argv`] says) as a tokio command; add the
/// subcommand and its arguments.
pub fn rabbitmqctl() -> tokio::process::Command {
    let argv = rabbitmqctl_argv();
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd
}

/// [`rabbitmqctl`] as a blocking `std` command (for `Drop`).
pub fn rabbitmqctl_blocking() -> std::process::Command {
    let argv = rabbitmqctl_argv();
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd
}

/// What the panics say when `rabbitmqctl` cannot be started.
pub const RABBITMQCTL_RUNS: &str =
    "rabbitmqctl runs (the broker tests need it on PATH, or ACEMQ_RABBITMQCTL set)";

// ---- Helpers for the drain and process tests.

/// `rabbitmqctl list_connections -q --no-table-headers COLUMNS…`: one line
/// per connection, the columns tab-separated.
pub async fn list_connections(columns: &[&str]) -> String {
    let out = rabbitmqctl()
        .args(["list_connections", "-q", "--no-table-headers"])
        .args(columns)
        .output()
        .await
        .expect(RABBITMQCTL_RUNS);
    assert!(
        out.status.success(),
        "rabbitmqctl list_connections failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `rabbitmqctl list_connections client_properties` shows a
/// connection whose client-provided name is `name`.
pub async fn connection_listed(name: &str) -> bool {
    list_connections(&["client_properties"])
        .await
        .contains(&format!("\"{name}\""))
}

/// The pid of the connection whose client-provided name is exactly `name`.
pub async fn connection_pid(name: &str) -> Option<String> {
    let needle = format!("\"{name}\"");
    list_connections(&["pid", "client_properties"])
        .await
        .lines()
        .find(|l| l.contains(&needle))
        .and_then(|l| l.split('\t').next())
        .map(str::to_owned)
}

/// Has the broker close the connection named exactly `name` (a test's own:
/// never another's), or fails the test.
pub async fn close_connection_named(name: &str, reason: &str) {
    let pid = connection_pid(name)
        .await
        .unwrap_or_else(|| panic!("a connection named {name:?} is listed"));
    let out = rabbitmqctl()
        .args(["close_connection", &pid, reason])
        .output()
        .await
        .expect(RABBITMQCTL_RUNS);
    assert!(
        out.status.success(),
        "rabbitmqctl close_connection failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- Helpers for the reliability tests: logs, CPU time, the shop process.

/// Records the level, target and text of every event seen by the subscriber
/// it is installed in (use `tracing::subscriber::set_default` in a
/// `current_thread` test, so the runner's tasks log to it).
#[derive(Clone, Default)]
pub struct CapturedLogs(
    pub std::sync::Arc<std::sync::Mutex<Vec<(tracing::Level, String, String)>>>,
);

impl CapturedLogs {
    /// Every event so far: (level, target, text with its fields).
    pub fn events(&self) -> Vec<(tracing::Level, String, String)> {
        self.0.lock().unwrap().clone()
    }

    /// Events from acemq (its crates' targets) at `level` or more severe.
    pub fn acemq_at_least(&self, level: tracing::Level) -> Vec<(tracing::Level, String, String)> {
        self.events()
            .into_iter()
            .filter(|(l, target, _)| *l <= level && target.starts_with("acemq"))
            .collect()
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CapturedLogs {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                use std::fmt::Write;
                let _ = write!(self.0, " {}={:?}", field.name(), value);
            }
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        self.0.lock().unwrap().push((
            *event.metadata().level(),
            event.metadata().target().to_owned(),
            text.0,
        ));
    }
}

/// CPU time used so far by the calling thread (Linux: the first field of
/// `/proc/thread-self/schedstat`, in nanoseconds).
pub fn thread_cpu_time() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("/proc/thread-self/schedstat is readable (Linux)");
    let ns: u64 = text
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .expect("schedstat starts with the CPU time in ns");
    Duration::from_nanos(ns)
}

/// The `shop` example binary, built once per test run.
pub fn shop_binary() -> &'static std::path::PathBuf {
    static SHOP: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    SHOP.get_or_init(|| example_binary("shop"))
}

/// Builds the example `name` beside the test binary and returns its path.
pub fn example_binary(name: &str) -> std::path::PathBuf {
    crate::common::example_binary(name, &[])
}

/// A shop process: `shop --config FILE --no-seed --queue Q --http ADDR`,
/// its stdout and stderr collected line by line (ANSI escapes removed). The
/// config file is removed when it is dropped; the process is killed.
pub struct ShopProcess {
    child: tokio::process::Child,
    pub pid: u32,
    http: String,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    config: std::path::PathBuf,
}

impl ShopProcess {
    /// Writes `yaml` to a config file named after `q` and starts the shop on
    /// `q` with it; `envs` are set after `RUST_LOG` is removed.
    pub fn spawn(q: &str, yaml: &str, envs: &[(&str, &str)]) -> ShopProcess {
        ShopProcess::spawn_with_args(q, yaml, &["--no-seed", "--queue", q], envs)
    }

    /// Writes `yaml` to a config file named after `tag` and starts the shop
    /// with it, `args` and `--http`; `envs` are set after `RUST_LOG` is
    /// removed.
    pub fn spawn_with_args(
        tag: &str,
        yaml: &str,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> ShopProcess {
        let config = std::env::temp_dir().join(format!("{tag}.yaml"));
        std::fs::write(&config, yaml).expect("write the config");
        let http = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").to_string()
        };
        let mut cmd = tokio::process::Command::new(shop_binary());
        cmd.arg("--config")
            .arg(&config)
            .args(args)
            .args(["--http", &http])
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("the shop starts");
        let pid = child.id().expect("a pid");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stdout = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let readers = vec![
            collect_lines(child.stderr.take().expect("stderr"), stderr.clone()),
            collect_lines(child.stdout.take().expect("stdout"), stdout.clone()),
        ];
        ShopProcess {
            child,
            pid,
            http,
            stderr,
            stdout,
            readers,
            config,
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// The admin address (`--http`).
    pub fn http(&self) -> &str {
        &self.http
    }

    /// `GET /readyz`: (HTTP status, JSON body), or `None` when nothing answers.
    pub async fn readyz(&self) -> Option<(u16, serde_json::Value)> {
        self.get_json("/readyz").await
    }

    /// `GET path` on the admin address: (HTTP status, JSON body), or `None`
    /// when nothing answers.
    pub async fn get_json(&self, path: &str) -> Option<(u16, serde_json::Value)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.http).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: shop\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf);
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split("\r\n\r\n").nth(1)?;
        Some((status, serde_json::from_str(body).ok()?))
    }

    /// Waits (bounded) until `/readyz` reports ready.
    pub async fn wait_ready(&self) {
        let ok = eventually(Duration::from_secs(15), || async {
            matches!(self.readyz().await, Some((200, _)))
        })
        .await;
        assert!(
            ok,
            "the shop never became ready; stderr:\n{}",
            self.stderr()
        );
    }

    /// Waits (bounded) until `/readyz` reports `n` handlers in flight.
    pub async fn wait_in_flight(&self, n: u64) {
        let ok = eventually(Duration::from_secs(10), || async {
            self.readyz()
                .await
                .and_then(|(_, j)| j["queues"][0]["in_flight"].as_u64())
                == Some(n)
        })
        .await;
        assert!(ok, "never {n} in flight; stderr:\n{}", self.stderr());
    }

    /// Waits (up to `within`) until stderr contains `needle`.
    pub async fn wait_stderr(&self, needle: &str, within: Duration) {
        let ok = eventually(within, || async { self.stderr().contains(needle) }).await;
        assert!(
            ok,
            "stderr never said {needle:?} within {within:?}; stderr:\n{}",
            self.stderr()
        );
    }

    /// Sends `sig` (e.g. `-TERM`) to the process.
    pub fn signal(&self, sig: &str) {
        let status = std::process::Command::new("kill")
            .args([sig, &self.pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {sig} {} failed", self.pid);
    }

    /// Waits (up to `within`) for the process to exit and its output to be
    /// read to the end.
    pub async fn exit_within(&mut self, within: Duration) -> std::process::ExitStatus {
        let status = match tokio::time::timeout(within, self.child.wait()).await {
            Ok(s) => s.expect("wait"),
            Err(_) => panic!(
                "the shop did not exit within {within:?}; stderr:\n{}",
                self.stderr()
            ),
        };
        for r in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
        }
        status
    }
}

impl Drop for ShopProcess {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

fn collect_lines(
    stream: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    into: std::sync::Arc<std::sync::Mutex<String>>,
) -> tokio::task::JoinHandle<()> {
    use tokio::io::AsyncBufReadExt;
    tokio::spawn(async move {
        // Bytes, not `lines()`: a line that is not UTF-8 must not stop the
        // reading (the child would block on a full pipe).
        let mut reader = tokio::io::BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let mut s = into.lock().unwrap();
                    s.push_str(&strip_ansi_codes(line.trim_end_matches('\n')));
                    s.push('\n');
                }
            }
        }
    })
}

fn strip_ansi_codes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---- Helpers for the soak (tests/broker/soak.rs).

/// `(messages_ready, messages_unacknowledged)` of `queue` as
/// `rabbitmqctl list_queues` reports them; `None` when it is not listed.
pub async fn queue_counts(queue: &str) -> Option<(u64, u64)> {
    let out = rabbitmqctl()
        .args([
            "list_queues",
            "-q",
            "--no-table-headers",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ])
        .output()
        .await
        .expect(RABBITMQCTL_RUNS);
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut f = l.split('\t');
        if f.next()? != queue {
            return None;
        }
        Some((
            f.next()?.trim().parse().ok()?,
            f.next()?.trim().parse().ok()?,
        ))
    })
}

/// Deletes its queues when dropped, also when the test failed half-way (on
/// a thread of its own with its own runtime: `Drop` cannot await).
pub struct QueueCleanup(pub Vec<String>);

impl QueueCleanup {
    pub fn new(queues: Vec<String>) -> Self {
        QueueCleanup(queues)
    }
}

impl Drop for QueueCleanup {
    fn drop(&mut self) {
        let queues = std::mem::take(&mut self.0);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the cleanup");
            rt.block_on(async {
                Broker::new().await.delete(&queues).await;
            });
        })
        .join();
    }
}

/// The broker's version as `rabbitmqctl eval 'rabbit_misc:version().'`
/// says it, and (major, minor).
pub async fn ctl_version() -> (String, (u32, u32)) {
    let out = rabbitmqctl()
        .args(["-q", "eval", "rabbit_misc:version()."])
        .output()
        .await
        .expect("rabbitmqctl runs");
    let text = String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_matches('"')
        .to_owned();
    let mut parts = text.split('.').map(|p| p.parse().unwrap_or(0));
    let mm = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (text, mm)
}

/// The stream plugin's port of the broker under test: `ACEMQ_STREAM_PORT`,
/// or the AMQP port less 120 (5552 beside 5672, as the helper nodes of
/// `scripts/` place it: 5584 beside 5704).
pub fn stream_port() -> u16 {
    if let Some(p) = std::env::var("ACEMQ_STREAM_PORT")
        .ok()
        .and_then(|p| p.trim().parse().ok())
    {
        return p;
    }
    let amqp = url::Url::parse(&addr())
        .ok()
        .and_then(|u| u.port())
        .unwrap_or(5672);
    amqp - 120
}

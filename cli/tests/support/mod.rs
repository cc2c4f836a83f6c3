//! Helpers for the command's tests: the built binary, unique names,
//! temporary configs, and a connection to the real RabbitMQ at `AMQP_ADDR`
//! (default `amqp://guest:guest@127.0.0.1:5672/%2f`) to set up and check
//! what the command did. No mock broker.

#![allow(dead_code)]

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use acemq::lapin::message::BasicGetMessage;
use acemq::lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use acemq::lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use acemq::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

/// The broker address the tests use (and the command gets through the
/// environment it inherits).
pub fn addr() -> String {
    acemq::connection::amqp_addr_from_env()
}

/// A name unique to this call: a prefix, the process, a counter and a
/// random part, so parallel tests and runs never share a queue.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u32(N.fetch_add(1, Ordering::Relaxed));
    format!(
        "acemq-cli-test.{prefix}.{}.{:08x}",
        std::process::id(),
        h.finish() as u32
    )
}

/// What one run of the command gave.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(out: Output) -> Self {
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// stdout and stderr together, for assertions about either.
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// stdout parsed as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// The built `acemq` binary with `args`.
pub fn command(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_acemq"));
    cmd.args(args).kill_on_drop(true);
    cmd
}

/// Runs `acemq args` to the end (within 60 s).
pub async fn acemq(args: &[&str]) -> Run {
    run(command(args)).await
}

/// Runs `cmd` to the end (within 60 s).
pub async fn run(mut cmd: tokio::process::Command) -> Run {
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the command finishes within 60 s")
        .expect("the command runs");
    Run::from(out)
}

/// A config file of its own, removed when dropped.
pub struct ConfigFile(PathBuf);

impl ConfigFile {
    /// Writes `yaml` to a new `.yaml` file in the temporary directory.
    pub fn yaml(yaml: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{}.yaml", unique("config")));
        std::fs::write(&path, yaml).expect("write the config");
        ConfigFile(path)
    }

    pub fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 temporary path")
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn long_str(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.to_owned()))
}

pub fn table(entries: Vec<(&str, AMQPValue)>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(ShortString::from(k), v);
    }
    t
}

/// A connection to the broker to set up and check what the command did.
pub struct Broker {
    pub conn: Connection,
    ch: Channel,
}

impl Broker {
    pub async fn new() -> Self {
        let conn = match tokio::time::timeout(
            Duration::from_secs(10),
            Connection::connect(
                &addr(),
                ConnectionProperties::default().with_connection_name("acemq-cli-test".into()),
            ),
        )
        .await
        {
            Ok(Ok(c)) => c,
            other => panic!(
                "no RabbitMQ answered at {} ({other:?}). Start it (`rabbitmq-server -detached && \
                 rabbitmqctl await_startup`) or set AMQP_ADDR. Broker tests never skip.",
                acemq::connection::redact(&addr())
            ),
        };
        let ch = Self::open(&conn).await;
        Broker { conn, ch }
    }

    async fn open(conn: &Connection) -> Channel {
        let ch = conn.create_channel().await.expect("channel");
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm");
        ch
    }

    async fn channel(&mut self) -> &Channel {
        if !self.ch.status().connected() {
            self.ch = Self::open(&self.conn).await;
        }
        &self.ch
    }

    /// Declares a durable queue with `arguments`.
    pub async fn declare(&mut self, queue: &str, arguments: FieldTable) {
        let ch = self.channel().await;
        ch.queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await
        .unwrap_or_else(|e| panic!("declare {queue}: {e}"));
    }

    /// Publishes `body` to `queue` with `props`, and waits for the confirm.
    pub async fn publish(&mut self, queue: &str, body: &[u8], props: BasicProperties) {
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

    /// Ready messages in `queue`; `None` when it does not exist.
    pub async fn ready(&mut self, queue: &str) -> Option<u32> {
        let ch = self.channel().await;
        ch.queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .ok()
        .map(|q| q.message_count())
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

    /// Whether exchange `name` exists.
    pub async fn exchange_exists(&mut self, name: &str) -> bool {
        let ch = self.channel().await;
        ch.exchange_declare(
            name.into(),
            acemq::lapin::ExchangeKind::Direct,
            acemq::lapin::options::ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .is_ok()
    }

    /// Takes every message of `queue` (acknowledged), in order.
    pub async fn drain(&mut self, queue: &str) -> Vec<BasicGetMessage> {
        let mut out = Vec::new();
        let ch = self.channel().await.clone();
        while let Some(m) = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            out.push(m);
        }
        out
    }
}

/// Deletes its queues and exchanges when dropped, also when the test failed
/// half-way (on a thread of its own with its own runtime: `Drop` cannot
/// await).
pub struct Cleanup {
    pub queues: Vec<String>,
    pub exchanges: Vec<String>,
}

impl Cleanup {
    pub fn queues(queues: Vec<String>) -> Self {
        Cleanup {
            queues,
            exchanges: Vec::new(),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let queues = std::mem::take(&mut self.queues);
        let exchanges = std::mem::take(&mut self.exchanges);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the cleanup");
            rt.block_on(async {
                let broker = Broker::new().await;
                // A refused delete closes its channel: a fresh one each time.
                for q in &queues {
                    if let Ok(ch) = broker.conn.create_channel().await {
                        let _ = ch
                            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                            .await;
                        let _ = ch.close(200, "OK".into()).await;
                    }
                }
                for x in &exchanges {
                    if let Ok(ch) = broker.conn.create_channel().await {
                        let _ = ch
                            .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
                            .await;
                        let _ = ch.close(200, "OK".into()).await;
                    }
                }
                let _ = broker.conn.close(200, "OK".into()).await;
            });
        })
        .join();
    }
}

// ---- What the tests publish and declare.

/// A config with one exchange and one queue bound to it, with a
/// dead-letter queue and two retry rungs (2s and 4s).
pub fn shop_config(x: &str, q: &str) -> ConfigFile {
    ConfigFile::yaml(&format!(
        r#"
exchanges:
  - {{ name: {x}, type: topic }}
queues:
  - name: {q}
    dead_letter: true
    retries: {{ max_attempts: 4, initial_delay: 1, max_delay: 4, broker_wait_threshold: 2 }}
    bindings:
      - {{ exchange: {x}, routing_keys: ["orders.*"] }}
"#
    ))
}

/// Everything [`shop_config`] declares, for the cleanup.
pub fn shop_cleanup(x: &str, q: &str) -> Cleanup {
    Cleanup {
        queues: vec![
            q.to_owned(),
            format!("{q}.dlq"),
            format!("{q}.retry.2s"),
            format!("{q}.retry.4s"),
        ],
        exchanges: vec![x.to_owned()],
    }
}

/// The headers acemq's dead-letter layer writes.
pub fn dead_lettered(q: &str, reason: &str, attempts: i64, id: &str) -> BasicProperties {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    BasicProperties::default()
        .with_message_id(id.into())
        .with_headers(table(vec![
            ("x-acemq-reason", long_str(reason)),
            ("x-acemq-error", long_str("boom: the order has no lines")),
            ("x-acemq-attempts", AMQPValue::LongLongInt(attempts)),
            ("x-acemq-attempt", AMQPValue::LongLongInt(attempts)),
            ("x-acemq-queue", long_str(q)),
            (
                "x-acemq-dead-lettered-at",
                AMQPValue::LongLongInt(now_ms - 90_000),
            ),
            ("x-acemq-original-exchange", long_str("shop")),
            (
                "x-acemq-original-routing-key",
                long_str(&format!("orders.{id}")),
            ),
            ("x-custom", long_str("kept")),
        ]))
}

/// Message ids of `queue`'s messages, in order, taking them all.
pub async fn ids(broker: &mut Broker, queue: &str) -> Vec<String> {
    broker
        .drain(queue)
        .await
        .iter()
        .map(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default()
        })
        .collect()
}

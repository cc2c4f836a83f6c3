//! Shared helpers for the broker tests: a connection to the real RabbitMQ at
//! `AMQP_ADDR`, unique queue names, publishing, reading and cleanup.

#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

/// The broker address the tests use.
pub fn addr() -> String {
    acemq::connection::amqp_addr_from_env()
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

/// A queue name unique to this test run and call.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "acemq-test.{prefix}.{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
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

    /// Messages ready in `queue` (passive declare).
    pub async fn ready(&mut self, queue: &str) -> Option<u32> {
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
        .map(|q| q.message_count())
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

/// Waits for `cond` to hold, checking every 20 ms, up to `within`.
pub async fn eventually<F, Fut>(within: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + within;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
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
    q.retries = Some(acemq::config::RetriesConfig {
        max_attempts,
        initial_delay: initial,
        max_delay: max,
        broker_wait_threshold: threshold,
        jitter: false,
        retry_panics: false,
    });
    acemq::Config {
        shutdown_timeout: Duration::from_secs(10),
        queues: vec![q],
        ..acemq::Config::default()
    }
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

// ---- Helpers for the drain and process tests.

/// Whether `rabbitmqctl list_connections client_properties` shows a
/// connection whose client-provided name is `name`.
pub async fn connection_listed(name: &str) -> bool {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args([
            "list_connections",
            "--no-table-headers",
            "client_properties",
        ])
        .output()
        .await
        .expect("rabbitmqctl runs (the broker tests need it on PATH)");
    assert!(
        out.status.success(),
        "rabbitmqctl list_connections failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).contains(&format!("\"{name}\""))
}

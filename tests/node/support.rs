//! The throwaway node these tests share, its drop guard, and small helpers:
//! a confirmed publisher of the test's own, queue counts from `rabbitmqctl`,
//! a readiness recorder, waiting on conditions with bounds.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::Confirmation;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

pub use crate::common::{eventually, unique};

/// The node's short name (`acemq-fault@localhost`).
pub const NAME: &str = "acemq-fault";
/// The node's full name, for `rabbitmqctl -n`.
pub const NODE: &str = "acemq-fault@localhost";
/// The node's AMQP port (distribution on 25690).
pub const PORT: u16 = 5690;
/// The node's stream port (`scripts/broker-node.sh`: PORT − 120).
pub const STREAM_PORT: u16 = PORT - 120;
/// What the node's `rabbitmq.conf` adds to the script's listener lines.
/// `consumer_timeout` is checked by the broker about once a minute.
pub const NODE_CONF: &str = "consumer_timeout = 5000\n";

/// The node's AMQP address.
pub fn addr() -> String {
    format!("amqp://guest:guest@127.0.0.1:{PORT}/%2f")
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/broker-node.sh")
}

/// Runs `rabbitmqctl -n NODE args…` (bounded); its stdout, or the error.
pub fn ctl(args: &[&str]) -> Result<String, String> {
    let out = Command::new("timeout")
        .arg("60")
        .arg("rabbitmqctl")
        .arg("-q")
        .arg("-n")
        .arg(NODE)
        .args(args)
        .output()
        .map_err(|e| format!("rabbitmqctl could not run: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "rabbitmqctl {args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Like [`ctl`], but off the async runtime's thread.
pub async fn ctl_async(args: &[&str]) -> Result<String, String> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        ctl(&a)
    })
    .await
    .expect("rabbitmqctl task")
}

static LOCK: Mutex<()> = Mutex::new(());

/// The node, up for one test. Holding it keeps the other tests of this
/// target off the node; dropping it restores the memory watermark and a
/// stopped app, then stops the node and removes its files (unless
/// `ACEMQ_KEEP_NODE` is set), also when the test panicked.
pub struct Node {
    _lock: MutexGuard<'static, ()>,
    t0: Instant,
}

impl Node {
    /// Brings the node up (or finds it up), or fails the test saying why.
    pub fn up() -> Node {
        let lock = LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let conf =
            std::env::temp_dir().join(format!("acemq-node-test-{}.conf", std::process::id()));
        std::fs::write(&conf, NODE_CONF).expect("write the node's extra config");
        let t0 = Instant::now();
        let out = Command::new("bash")
            .arg(script())
            // The stream plugin too (its port: STREAM_PORT).
            .env("ACEMQ_NODE_PLUGINS", "rabbitmq_stream")
            .args(["up", NAME, &PORT.to_string()])
            .arg(&conf)
            .output()
            .expect("run scripts/broker-node.sh");
        let _ = std::fs::remove_file(&conf);
        assert!(
            out.status.success(),
            "scripts/broker-node.sh up {NAME} {PORT} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "{} ({:?})",
            String::from_utf8_lossy(&out.stdout).trim(),
            t0.elapsed()
        );
        // A node found up from an earlier, interrupted run may still be in
        // the state that run left: put it back.
        let node = Node {
            _lock: lock,
            t0: Instant::now(),
        };
        node.restore();
        node
    }

    /// Undoes what a test may have changed on the node: first of all a
    /// frozen `beam.smp` (SIGSTOP) runs again, or nothing below answers.
    fn restore(&self) {
        if let Some(pid) = beam_pid() {
            crate::freeze::ensure_running(pid, NODE);
        }
        if let Err(e) = ctl(&["start_app"]) {
            eprintln!("restoring the node: {e}");
        }
        if let Err(e) = ctl(&["set_vm_memory_high_watermark", "0.4"]) {
            eprintln!("restoring the node: {e}");
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.restore();
        if std::env::var_os("ACEMQ_KEEP_NODE").is_some() {
            return;
        }
        let out = Command::new("bash")
            .arg(script())
            .args(["down", NAME, &PORT.to_string()])
            .output();
        match out {
            Ok(o) => eprintln!(
                "{}{} (test took {:?})",
                String::from_utf8_lossy(&o.stdout).trim(),
                String::from_utf8_lossy(&o.stderr).trim(),
                self.t0.elapsed()
            ),
            Err(e) => eprintln!("scripts/broker-node.sh down failed: {e}"),
        }
    }
}

/// The pid of the node's `beam.smp` (found by `RABBITMQ_NODENAME`).
pub fn beam_pid() -> Option<u32> {
    crate::freeze::beam_pid_of(NODE)
}

/// The heartbeat (`timeout`, seconds) the node has negotiated with each
/// connection whose client-provided name starts with `prefix`: (name,
/// seconds), from `rabbitmqctl list_connections client_properties timeout`.
pub async fn heartbeats(prefix: &str) -> Vec<(String, u64)> {
    let Ok(out) = ctl_async(&[
        "list_connections",
        "--no-table-headers",
        "client_properties",
        "timeout",
    ])
    .await
    else {
        return Vec::new();
    };
    out.lines()
        .filter_map(|l| {
            let (props, timeout) = l.rsplit_once('\t')?;
            // `{"connection_name",longstr,"NAME"}`: the next quoted string.
            let rest = props.split_once("connection_name\"")?.1;
            let name = rest.split('"').nth(1)?;
            name.starts_with(prefix)
                .then(|| (name.to_owned(), timeout.trim().parse().ok()))
                .and_then(|(n, t)| Some((n, t?)))
        })
        .collect()
}

/// Connects to the node as `name`.
pub async fn connect(name: &str) -> Result<Connection, String> {
    connect_to(&addr(), name).await
}

/// Connects to `uri` (the node's address, e.g. with a `?heartbeat=`) as
/// `name`, within 10 s.
pub async fn connect_to(uri: &str, name: &str) -> Result<Connection, String> {
    match tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(
            uri,
            ConnectionProperties::default().with_connection_name(name.to_owned().into()),
        ),
    )
    .await
    {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("no answer within 10 s".to_owned()),
    }
}

/// A test's own connection to the node, with a confirm-mode channel.
pub struct Client {
    pub conn: Connection,
    pub ch: Channel,
}

impl Client {
    pub async fn new(name: &str) -> Self {
        let conn = connect(name)
            .await
            .unwrap_or_else(|e| panic!("the test node at {} did not answer: {e}", addr()));
        let ch = conn.create_channel().await.expect("channel");
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm");
        Client { conn, ch }
    }

    /// Publishes `body` (persistent) to `queue` and waits for the confirm.
    pub async fn publish(&self, queue: &str, body: &[u8]) {
        let c = publish_on(&self.ch, queue, body)
            .await
            .expect("publish")
            .await
            .expect("confirm");
        assert!(matches!(c, Confirmation::Ack(None)), "{queue}: {c:?}");
    }

    /// Deletes `queues` (missing ones are fine).
    pub async fn delete(&self, queues: &[String]) {
        for q in queues {
            if let Ok(ch) = self.conn.create_channel().await {
                let _ = ch
                    .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                    .await;
                let _ = ch.close(200, "OK".into()).await;
            }
        }
    }
}

/// Starts a persistent, mandatory publish of `body` to `queue` on `ch`.
pub async fn publish_on(
    ch: &Channel,
    queue: &str,
    body: &[u8],
) -> lapin::Result<lapin::PublisherConfirm> {
    ch.basic_publish(
        "".into(),
        queue.into(),
        BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        },
        body,
        BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(FieldTable::default()),
    )
    .await
}

/// One queue as `rabbitmqctl list_queues` sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Ready and unacknowledged.
    pub messages: u64,
    pub unacked: u64,
    pub consumers: u64,
}

/// `queue`'s counts on the node; `None` when it does not exist.
pub async fn counts(queue: &str) -> Option<QueueCounts> {
    let out = ctl_async(&[
        "list_queues",
        "--no-table-headers",
        "name",
        "messages",
        "messages_unacknowledged",
        "consumers",
    ])
    .await
    .ok()?;
    out.lines().find_map(|l| {
        let f: Vec<&str> = l.split('\t').collect();
        (f.len() == 4 && f[0] == queue).then(|| QueueCounts {
            messages: f[1].trim().parse().unwrap_or(0),
            unacked: f[2].trim().parse().unwrap_or(0),
            consumers: f[3].trim().parse().unwrap_or(0),
        })
    })
}

/// Readiness as it changed, sampled every 5 ms from the start.
#[derive(Clone)]
pub struct ReadinessLog {
    t0: Instant,
    changes: Arc<Mutex<Vec<(Duration, bool)>>>,
    stop: tokio_util::sync::CancellationToken,
}

impl ReadinessLog {
    pub fn start(health: acemq::Health) -> Self {
        let log = ReadinessLog {
            t0: Instant::now(),
            changes: Arc::default(),
            stop: tokio_util::sync::CancellationToken::new(),
        };
        let l = log.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let now = health.is_ready();
                if last != Some(now) {
                    l.changes.lock().unwrap().push((l.t0.elapsed(), now));
                    last = Some(now);
                }
                tokio::select! {
                    _ = l.stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
            }
        });
        log
    }

    /// Every change: (time since start, ready).
    pub fn changes(&self) -> Vec<(Duration, bool)> {
        self.changes.lock().unwrap().clone()
    }

    /// When readiness first went off, if it did.
    pub fn first_off(&self) -> Option<Duration> {
        self.changes().iter().find(|(_, r)| !r).map(|(t, _)| *t)
    }

    /// Whether readiness went off and then on again after `after`.
    pub fn off_then_on_after(&self, after: Duration) -> bool {
        let c = self.changes();
        c.iter()
            .position(|(t, r)| *t >= after && !r)
            .is_some_and(|i| c[i..].iter().any(|(_, r)| *r))
    }

    pub fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }
}

impl Drop for ReadinessLog {
    fn drop(&mut self) {
        if Arc::strong_count(&self.changes) <= 2 {
            self.stop.cancel();
        }
    }
}

/// The number `n` of a test message whose body is `m-<n>`, as the tests'
/// publishers write them; anything else is an error the handler returns.
pub fn message_number(d: &acemq::Delivery) -> Result<u64, acemq::BoxError> {
    Ok(std::str::from_utf8(d.body())
        .ok()
        .and_then(|s| s.strip_prefix("m-"))
        .and_then(|s| s.parse().ok())
        .ok_or("not a test message")?)
}

//! Databases, queues and example processes for the postgres tests.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::outbox::{self, Outbox, OutboxMessage};
use deadpool_postgres::Pool;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::io::{AsyncBufReadExt, BufReader};

pub use crate::common::{addr, unique};

pub fn pg_base() -> String {
    std::env::var("ACEMQ_TEST_PG").unwrap_or_else(|_| "host=127.0.0.1 user=postgres".to_owned())
}

static N: AtomicU32 = AtomicU32::new(0);

fn nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

/// Waits until `check` is true, polling every 20 ms, or panics after `bound`
/// saying what was awaited.
pub async fn wait_until<F, Fut>(what: &str, bound: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    loop {
        if check().await {
            return;
        }
        assert!(
            t0.elapsed() < bound,
            "timed out after {bound:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn admin() -> tokio_postgres::Client {
    let settings = format!("{} dbname=postgres", pg_base());
    let (client, conn) = tokio_postgres::connect(&settings, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL at {settings:?} is not reachable ({e}): start it (.ci/run does)")
        });
    tokio::spawn(conn);
    client
}

/// A database of the test's own, migrated; dropped with the guard.
pub struct TestDb {
    pub name: String,
    pub settings: String,
    pub pool: Pool,
}

impl TestDb {
    pub async fn create() -> TestDb {
        let name = format!(
            "acemq_test_{}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            nanos()
        );
        admin()
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the test database");
        let settings = format!("{} dbname={name}", pg_base());
        let pool = outbox::pool(&settings, 16).expect("pool");
        let client = pool.get().await.expect("a connection");
        assert_eq!(outbox::migrate(&client).await.expect("migrate"), 2);
        assert_eq!(outbox::migrate(&client).await.expect("migrate again"), 0);
        client
            .batch_execute(
                "CREATE TABLE shipments (id bigserial PRIMARY KEY, order_id text NOT NULL, message_id text NOT NULL)",
            )
            .await
            .expect("create shipments");
        TestDb {
            name,
            settings,
            pool,
        }
    }

    pub async fn count(&self, sql: &str) -> i64 {
        let client = self.pool.get().await.expect("a connection");
        client.query_one(sql, &[]).await.expect(sql).get(0)
    }

    /// Enqueues `n` messages to `queue` in one committed transaction,
    /// returning their message ids.
    pub async fn enqueue(&self, queue: &str, n: usize) -> Vec<String> {
        let mut client = self.pool.get().await.expect("a connection");
        let tx = client.transaction().await.expect("begin");
        let messages: Vec<OutboxMessage> = (0..n)
            .map(|i| OutboxMessage::to_queue(queue, format!("{{\"id\":\"o-{i}\",\"item\":\"x\"}}")))
            .collect();
        let mut ids = Vec::with_capacity(n);
        for chunk in messages.chunks(500) {
            let batch =
                futures::future::join_all(chunk.iter().map(|m| Outbox::enqueue(&tx, m))).await;
            ids.extend(batch.into_iter().map(|r| r.expect("enqueue")));
        }
        tx.commit().await.expect("commit");
        ids
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let _ = admin()
                    .await
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await;
            });
        })
        .join();
    }
}

/// A broker connection of the test's own, with the queues it declared
/// (deleted by the guard).
pub struct Broker {
    pub conn: Arc<Connection>,
    channel: Channel,
    queues: Mutex<Vec<String>>,
}

impl Broker {
    pub async fn new() -> Broker {
        let conn = Connection::connect(
            &addr(),
            ConnectionProperties::default().with_connection_name("acemq-test-postgres".into()),
        )
        .await
        .expect("RabbitMQ is reachable at AMQP_ADDR (start it: .ci/run does)");
        let channel = conn.create_channel().await.expect("channel");
        Broker {
            conn: Arc::new(conn),
            channel,
            queues: Mutex::new(Vec::new()),
        }
    }

    /// Declares `q` durable, as acemq's topology does.
    pub async fn declare(&self, q: &str) {
        self.channel
            .queue_declare(
                q.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare");
        self.own(q);
    }

    /// Deletes `q` when the guard drops (a queue a process declared).
    pub fn own(&self, q: &str) {
        self.queues.lock().unwrap().push(q.to_owned());
    }

    pub async fn publish(&self, q: &str, body: &[u8], message_id: &str) {
        self.channel
            .basic_publish(
                "".into(),
                q.into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default().with_message_id(message_id.into()),
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
    }

    /// Messages ready in `q`.
    pub async fn ready(&self, q: &str) -> u32 {
        self.channel
            .queue_declare(
                q.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive declare")
            .message_count()
    }

    /// Takes every message ready in `q` (acknowledged), returning message ids.
    pub async fn take_all(&self, q: &str) -> Vec<String> {
        let mut ids = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(q.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            ids.push(
                m.delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            );
        }
        ids
    }
}

impl Drop for Broker {
    /// Deletes the test's queues on a connection of its own, each step
    /// bounded: the test's connection may be the one a fault closed, and a
    /// call on it may then never return (a drop that waits on it hangs the
    /// whole test binary).
    fn drop(&mut self) {
        let queues = std::mem::take(&mut *self.queues.lock().unwrap());
        let conn = self.conn.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let cleanup = async {
                    let fresh = Connection::connect(
                        &addr(),
                        ConnectionProperties::default()
                            .with_connection_name("acemq-test-postgres-cleanup".into()),
                    )
                    .await
                    .ok()?;
                    if let Ok(ch) = fresh.create_channel().await {
                        for q in queues {
                            let _ = ch
                                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                                .await;
                        }
                    }
                    fresh.close(200, "OK".into()).await.ok()
                };
                if tokio::time::timeout(Duration::from_secs(20), cleanup)
                    .await
                    .is_err()
                {
                    eprintln!("the test's queues could not be deleted within 20 s");
                }
                let _ = tokio::time::timeout(Duration::from_secs(2), conn.close(200, "OK".into()))
                    .await;
            });
        })
        .join();
    }
}

/// The `outbox` example binary, built once per test run.
pub fn example_binary() -> &'static std::path::PathBuf {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| crate::common::example_binary("outbox", &["postgres"]))
}

/// A running `outbox` example.
pub struct ExampleProcess {
    child: tokio::process::Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

impl ExampleProcess {
    /// Starts the example with `args` on database `db`, with `envs`.
    pub fn spawn(db: &TestDb, args: &[&str], envs: &[(&str, &str)]) -> ExampleProcess {
        let mut cmd = tokio::process::Command::new(example_binary());
        cmd.args(args)
            .env("DATABASE_URL", &db.settings)
            .env("AMQP_ADDR", addr())
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("the example starts");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        let (o, e) = (stdout.clone(), stderr.clone());
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                o.lock().unwrap().push(l);
            }
        });
        tokio::spawn(async move {
            let mut lines = BufReader::new(err).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                let mut s = e.lock().unwrap();
                s.push_str(&l);
                s.push('\n');
            }
        });
        ExampleProcess {
            child,
            stdout,
            stderr,
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (bounded) until a stdout line starts with `prefix`.
    pub async fn wait_line(&self, prefix: &str, bound: Duration) -> String {
        let t0 = Instant::now();
        loop {
            if let Some(l) = self.lines().into_iter().find(|l| l.starts_with(prefix)) {
                return l;
            }
            if t0.elapsed() > bound {
                panic!(
                    "no stdout line {prefix:?} within {bound:?}; stdout: {:?}\nstderr:\n{}",
                    self.lines(),
                    self.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many stdout lines start with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        self.lines()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL");
        let _ = self.child.wait().await;
    }

    /// SIGTERM, and the exit status within `bound`.
    pub async fn terminate(mut self, bound: Duration) -> std::process::ExitStatus {
        let pid = self.child.id().expect("running").to_string();
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        assert!(ok.success());
        match tokio::time::timeout(bound, self.child.wait()).await {
            Ok(s) => s.expect("wait"),
            Err(_) => panic!(
                "did not exit within {bound:?} of SIGTERM:\n{}",
                self.stderr()
            ),
        }
    }
}

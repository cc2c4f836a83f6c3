//! Process tests: run the `shop` example binary against the real broker,
//! send it SIGTERM / SIGKILL, and count what the broker holds afterwards.
//!
//! Each test writes its own config naming a unique queue and runs
//! `shop --config FILE --no-seed --queue Q --http ADDR`; orders are JSON
//! bodies published to `Q`. `/readyz` (JSON) says when an order is in flight.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lapin::types::FieldTable;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::support::{all_queues, eventually, unique, Broker};

/// The shop binary, built once per test run (so a fresh `cargo test` works).
fn shop_binary() -> &'static PathBuf {
    static SHOP: OnceLock<PathBuf> = OnceLock::new();
    SHOP.get_or_init(|| {
        // The test binary is <target>/<profile>/deps/broker-<hash>; the
        // example goes to <target>/<profile>/examples/shop.
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("<target>/<profile>/deps");
        let target_dir = profile_dir.parent().expect("<target>");
        let mut build = std::process::Command::new(env!("CARGO"));
        build
            .args(["build", "--example", "shop", "--target-dir"])
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("cargo build --example shop runs");
        assert!(status.success(), "cargo build --example shop failed");
        let shop = profile_dir.join("examples").join("shop");
        assert!(shop.exists(), "no shop binary at {}", shop.display());
        shop
    })
}

/// A free local port for `--http` (bound, read, released).
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

/// A config file in the temp dir naming `q`, with `extra` top-level keys.
fn write_config(q: &str, extra: &str, queue_extra: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("{q}.yaml"));
    let yaml = format!("{extra}\nqueues:\n  - name: {q}\n{queue_extra}\n");
    std::fs::write(&path, yaml).expect("write the config");
    path
}

/// A running shop, its stderr collected line by line.
struct Shop {
    child: Child,
    pid: u32,
    http: String,
    stderr: Arc<Mutex<String>>,
    stdout: Arc<Mutex<String>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    config: PathBuf,
}

fn collect(
    stream: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    into: Arc<Mutex<String>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut s = into.lock().unwrap();
            s.push_str(&strip_ansi(&line));
            s.push('\n');
        }
    })
}

fn strip_ansi(s: &str) -> String {
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

impl Shop {
    /// Starts the shop on queue `q` with `config`, env `envs`.
    fn spawn(q: &str, config: PathBuf, envs: &[(&str, &str)]) -> Shop {
        let http = free_addr();
        let mut cmd = Command::new(shop_binary());
        cmd.args(["--config"])
            .arg(&config)
            .args(["--no-seed", "--queue", q, "--http", &http])
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("the shop starts");
        let pid = child.id().expect("a pid");
        let stderr = Arc::new(Mutex::new(String::new()));
        let stdout = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect(child.stderr.take().expect("stderr"), stderr.clone()),
            collect(child.stdout.take().expect("stdout"), stdout.clone()),
        ];
        Shop {
            child,
            pid,
            http,
            stderr,
            stdout,
            readers,
            config,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// `GET /readyz`: (HTTP status, JSON body), or `None` when nothing answers.
    async fn readyz(&self) -> Option<(u16, serde_json::Value)> {
        let mut s = tokio::net::TcpStream::connect(&self.http).await.ok()?;
        s.write_all(b"GET /readyz HTTP/1.0\r\nHost: shop\r\n\r\n")
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
    async fn wait_ready(&self) {
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
    async fn wait_in_flight(&self, n: u64) {
        let ok = eventually(Duration::from_secs(10), || async {
            self.readyz()
                .await
                .and_then(|(_, j)| j["queues"][0]["in_flight"].as_u64())
                == Some(n)
        })
        .await;
        assert!(ok, "never {n} in flight; stderr:\n{}", self.stderr());
    }

    fn signal(&self, sig: &str) {
        let status = std::process::Command::new("kill")
            .args([sig, &self.pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {sig} {} failed", self.pid);
    }

    /// Waits (up to `within`) for the process to exit and its output to be
    /// read to the end.
    async fn exit_within(&mut self, within: Duration) -> ExitStatus {
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

impl Drop for Shop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

/// Publishes one order to `q`.
async fn order(broker: &mut Broker, q: &str, json: &str) {
    broker
        .publish(q, json.as_bytes(), FieldTable::default())
        .await;
}

/// The drain's own log lines from a run (for the report and for failures).
fn drain_lines(stderr: &str) -> String {
    stderr
        .lines()
        .filter(|l| l.contains("drain") || l.contains("signal") || l.contains("acemq:"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_an_order_in_flight_waits_for_it_acknowledges_it_and_exits_0() {
    let q = unique("proc-term");
    let mut broker = Broker::new().await;
    let config = write_config(&q, "shutdown_timeout: 10", "");
    let mut shop = Shop::spawn(&q, config, &[]);
    shop.wait_ready().await;
    order(&mut broker, &q, r#"{"id":"o-term","work_ms":1500}"#).await;
    shop.wait_in_flight(1).await;

    let t0 = Instant::now();
    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(15)).await;
    let took = t0.elapsed();
    let stderr = shop.stderr();
    eprintln!(
        "--- shop drain, clean with an order in flight:\n{}",
        drain_lines(&stderr)
    );
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(
        took >= Duration::from_millis(1000) && took <= Duration::from_secs(4),
        "the drain should wait out the 1.5 s order: took {took:?}"
    );
    assert!(stderr.contains("order handled"), "stderr:\n{stderr}");
    assert!(
        stderr.contains("every handler finished (1 during the drain)"),
        "stderr:\n{stderr}"
    );
    assert_eq!(
        broker.ready(&q).await,
        Some(0),
        "the order was acknowledged"
    );
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_orders_buffered_behind_the_running_one_finishes_it_and_hands_the_rest_back() {
    let q = unique("proc-held");
    let mut broker = Broker::new().await;
    let config = write_config(
        &q,
        "shutdown_timeout: 10",
        "    prefetch: 20\n    concurrency: 1",
    );
    let mut shop = Shop::spawn(&q, config, &[]);
    shop.wait_ready().await;
    for i in 0..5 {
        order(
            &mut broker,
            &q,
            &format!(r#"{{"id":"o-held-{i}","work_ms":1500}}"#),
        )
        .await;
    }
    shop.wait_in_flight(1).await;
    assert!(
        broker.wait_ready(&q, 0, Duration::from_secs(5)).await,
        "the broker sent all five ahead"
    );

    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(15)).await;
    let stderr = shop.stderr();
    eprintln!("--- shop drain, deliveries held:\n{}", drain_lines(&stderr));
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(
        stderr.contains("every handler finished (1 during the drain); 4 deliveries were fetched but never handled"),
        "stderr:\n{stderr}"
    );
    assert!(
        broker.wait_ready(&q, 4, Duration::from_secs(5)).await,
        "the four unhandled orders are back"
    );
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_an_order_that_ignores_cancellation_exits_75_naming_the_queue_and_hands_the_order_back(
) {
    let q = unique("proc-timeout");
    let mut broker = Broker::new().await;
    let config = write_config(&q, "shutdown_timeout: 1", "");
    let mut shop = Shop::spawn(&q, config, &[]);
    shop.wait_ready().await;
    order(
        &mut broker,
        &q,
        r#"{"id":"o-stuck","work_ms":60000,"ignore_cancel":true}"#,
    )
    .await;
    shop.wait_in_flight(1).await;

    let t0 = Instant::now();
    shop.signal("-TERM");
    // shutdown_timeout 1 s + abandon_after 5 s + exit, with slack.
    let status = shop.exit_within(Duration::from_secs(12)).await;
    let took = t0.elapsed();
    let stderr = shop.stderr();
    eprintln!(
        "--- shop drain, deadline expired:\n{}",
        drain_lines(&stderr)
    );
    assert_eq!(status.code(), Some(75), "stderr:\n{stderr}");
    assert!(
        took >= Duration::from_millis(5500) && took <= Duration::from_secs(9),
        "1 s deadline + 5 s grace: took {took:?}"
    );
    let last = stderr
        .lines()
        .find(|l| l.starts_with("acemq: "))
        .unwrap_or_else(|| panic!("no one-line reason on stderr:\n{stderr}"));
    assert!(
        last.contains(&format!("{q}: 1 in flight")),
        "the reason names the queue and the count: {last}"
    );
    assert!(
        broker.wait_ready(&q, 1, Duration::from_secs(5)).await,
        "the order is back on the queue"
    );
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_handler_leaves_the_order_to_the_broker_which_redelivers_it() {
    let q = unique("proc-kill");
    let mut broker = Broker::new().await;
    let config = write_config(&q, "", "");
    let mut shop = Shop::spawn(&q, config, &[]);
    shop.wait_ready().await;
    order(&mut broker, &q, r#"{"id":"o-kill","work_ms":30000}"#).await;
    shop.wait_in_flight(1).await;

    shop.signal("-KILL");
    let status = shop.exit_within(Duration::from_secs(5)).await;
    assert_eq!(status.code(), None, "killed by a signal");
    let m = broker
        .get_within(&q, Duration::from_secs(10))
        .await
        .expect("the order is back on the queue");
    assert!(m.delivery.redelivered, "redelivered is set");
    assert_eq!(&m.delivery.data[..], br#"{"id":"o-kill","work_ms":30000}"#);
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_with_prefetch_zero_exits_78_naming_prefetch() {
    let q = unique("proc-badconfig");
    let config = write_config(&q, "", "    prefetch: 0");
    let mut shop = Shop::spawn(&q, config, &[]);
    let status = shop.exit_within(Duration::from_secs(10)).await;
    let stderr = shop.stderr();
    assert_eq!(status.code(), Some(78), "stderr:\n{stderr}");
    assert!(stderr.contains("prefetch"), "stderr:\n{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_exits_69_at_once_saying_rabbitmq_is_not_there() {
    let q = unique("proc-refused");
    let config = write_config(&q, "connect_timeout: 2", "");
    shop_binary(); // built before the clock starts
    let t0 = Instant::now();
    let mut shop = Shop::spawn(
        &q,
        config,
        &[("AMQP_ADDR", "amqp://guest:guest@127.0.0.1:1/%2f")],
    );
    let status = shop.exit_within(Duration::from_secs(10)).await;
    let stderr = shop.stderr();
    assert_eq!(status.code(), Some(69), "stderr:\n{stderr}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        stderr.contains("could not connect") && stderr.contains("is RabbitMQ running there"),
        "stderr:\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_address_where_nothing_answers_exits_69_after_connect_timeout_saying_no_broker_answered(
) {
    // Accepts TCP connections (the kernel's backlog) but never speaks AMQP.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = format!("amqp://guest:guest@{}/%2f", silent.local_addr().unwrap());
    let q = unique("proc-silent");
    let config = write_config(&q, "connect_timeout: 2", "");
    shop_binary(); // built before the clock starts
    let t0 = Instant::now();
    let mut shop = Shop::spawn(&q, config, &[("AMQP_ADDR", &addr)]);
    let status = shop.exit_within(Duration::from_secs(10)).await;
    let took = t0.elapsed();
    let stderr = shop.stderr();
    assert_eq!(status.code(), Some(69), "stderr:\n{stderr}");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(6),
        "connect_timeout 2 s: took {took:?}"
    );
    assert!(stderr.contains("no broker answered"), "stderr:\n{stderr}");
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_exits_69_saying_authentication_failed_and_never_prints_the_password() {
    let q = unique("proc-auth");
    let config = write_config(&q, "connect_timeout: 5", "");
    let mut shop = Shop::spawn(
        &q,
        config,
        &[(
            "AMQP_ADDR",
            "amqp://guest:wrong-pass-XYZ@127.0.0.1:5672/%2f",
        )],
    );
    let status = shop.exit_within(Duration::from_secs(10)).await;
    let (stderr, stdout) = (shop.stderr(), shop.stdout());
    assert_eq!(status.code(), Some(69), "stderr:\n{stderr}");
    assert!(
        stderr.contains("authentication failed"),
        "stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("wrong-pass-XYZ") && !stdout.contains("wrong-pass-XYZ"),
        "the password leaked:\n{stdout}\n{stderr}"
    );
}

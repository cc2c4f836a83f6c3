//! A second throwaway node whose `consumer_timeout` (2 s) is checked every
//! second: `channel_tick_interval` is not a `rabbitmq.conf` key on 3.10, so
//! it goes in the node's `advanced.config`. Node `acemq-ticks@localhost` on
//! port 5720 (distribution 25720), started and stopped like the fault-test
//! node ([`crate::support::Node`]), by `scripts/broker-node.sh`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lapin::options::BasicGetOptions;

/// The node's short name.
pub const NAME: &str = "acemq-ticks";
/// The node's full name, for `rabbitmqctl -n`.
pub const NODE: &str = "acemq-ticks@localhost";
/// The node's AMQP port.
pub const PORT: u16 = 5720;
/// The broker's acknowledgement timeout on this node.
pub const CONSUMER_TIMEOUT: Duration = Duration::from_secs(2);
const CONF: &str = "consumer_timeout = 2000\n";
const ADVANCED: &str = "[{rabbit, [{channel_tick_interval, 1000}]}].\n";

/// The node's AMQP address.
pub fn addr() -> String {
    format!("amqp://guest:guest@127.0.0.1:{PORT}/%2f")
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/broker-node.sh")
}

/// `rabbitmqctl -n acemq-ticks@localhost args…` (bounded), off the runtime.
pub async fn ctl(args: &[&str]) -> Result<String, String> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new("timeout")
            .arg("60")
            .arg("rabbitmqctl")
            .args(["-q", "-n", NODE])
            .args(&args)
            .output()
            .map_err(|e| format!("rabbitmqctl could not run: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "rabbitmqctl {args:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    })
    .await
    .expect("rabbitmqctl task")
}

static LOCK: Mutex<()> = Mutex::new(());

/// The node, up for one test; dropping it stops the node (unless
/// `ACEMQ_KEEP_NODE` is set), also when the test panicked.
pub struct TicksNode {
    _lock: MutexGuard<'static, ()>,
    t0: Instant,
}

impl TicksNode {
    pub fn up() -> TicksNode {
        let lock = LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir();
        let conf = dir.join(format!("acemq-ticks-{}.conf", std::process::id()));
        let advanced = dir.join(format!(
            "acemq-ticks-{}.advanced.config",
            std::process::id()
        ));
        std::fs::write(&conf, CONF).expect("write the node's extra config");
        std::fs::write(&advanced, ADVANCED).expect("write the node's advanced.config");
        let t0 = Instant::now();
        let out = Command::new("bash")
            .arg(script())
            .args(["up", NAME, &PORT.to_string()])
            .arg(&conf)
            .arg(&advanced)
            .output()
            .expect("run scripts/broker-node.sh");
        let _ = std::fs::remove_file(&conf);
        let _ = std::fs::remove_file(&advanced);
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
        TicksNode {
            _lock: lock,
            t0: Instant::now(),
        }
    }
}

impl Drop for TicksNode {
    fn drop(&mut self) {
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

/// `queue`'s ready and unacknowledged messages on this node.
pub async fn messages(queue: &str) -> Option<u64> {
    let out = ctl(&["list_queues", "--no-table-headers", "name", "messages"])
        .await
        .ok()?;
    out.lines().find_map(|l| {
        let (name, n) = l.split_once('\t')?;
        (name == queue).then(|| n.trim().parse().ok()).flatten()
    })
}

/// Takes every message in `queue` (acknowledged): body and `x-acemq-reason`.
pub async fn take_all(ch: &lapin::Channel, queue: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
    {
        let reason = m.delivery.properties.headers().as_ref().and_then(|h| {
            match h.inner().get("x-acemq-reason") {
                Some(lapin::types::AMQPValue::LongString(s)) => {
                    Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                }
                _ => None,
            }
        });
        out.push((
            String::from_utf8_lossy(&m.delivery.data).into_owned(),
            reason,
        ));
    }
    out
}

//! The cluster these tests share, its drop guard, and helpers: `rabbitmqctl`
//! on a node, a node's `beam.smp` (found by its environment), `kill -9`,
//! queue leaders and the node a connection is on.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::common::eventually;

/// The cluster's nodes (1-based in the names): (short name, AMQP port).
pub const NODES: [(&str, u16); 3] = [("acemq-1", 5681), ("acemq-2", 5682), ("acemq-3", 5683)];

/// Node `i`'s (0-based) AMQP address.
pub fn addr(i: usize) -> String {
    format!("amqp://guest:guest@127.0.0.1:{}/%2f", NODES[i].1)
}

/// Node `i`'s full name.
pub fn node_name(i: usize) -> String {
    format!("{}@localhost", NODES[i].0)
}

/// The index of the node named `name` (`acemq-2@localhost` → 1).
pub fn node_index(name: &str) -> Option<usize> {
    (0..NODES.len()).find(|&i| node_name(i) == name)
}

fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts")
}

fn run_script(args: &[&str]) -> Result<String, String> {
    let out = Command::new("bash")
        .arg(scripts().join("cluster.sh"))
        .args(args)
        .output()
        .map_err(|e| format!("scripts/cluster.sh could not run: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text.trim().to_owned())
    } else {
        Err(format!(
            "scripts/cluster.sh {args:?} failed ({}): {text}",
            out.status
        ))
    }
}

/// The cluster, up for the test. Dropping it stops all three nodes and
/// removes their files (unless `ACEMQ_KEEP_CLUSTER` is set), also when the
/// test panicked.
pub struct Cluster {
    t0: Instant,
}

impl Cluster {
    pub fn up() -> Cluster {
        let t0 = Instant::now();
        let out = run_script(&["up"]).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{} ({:?})", out.lines().last().unwrap_or(""), t0.elapsed());
        Cluster { t0: Instant::now() }
    }

    /// Starts node `i` again (after a kill), rejoining on its data.
    pub async fn start(&self, i: usize) -> Duration {
        let t0 = Instant::now();
        let n = (i + 1).to_string();
        tokio::task::spawn_blocking(move || run_script(&["start", &n]))
            .await
            .expect("cluster.sh task")
            .unwrap_or_else(|e| panic!("{e}"));
        t0.elapsed()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A node left frozen (SIGSTOP) answers nothing: it runs again first,
        // also when the cluster is kept.
        for i in 0..NODES.len() {
            if let Some(pid) = beam_pid(i) {
                crate::freeze::ensure_running(pid, &node_name(i));
            }
        }
        if std::env::var_os("ACEMQ_KEEP_CLUSTER").is_some() {
            return;
        }
        match run_script(&["down"]) {
            Ok(out) => eprintln!(
                "{} (test took {:?})",
                out.lines().last().unwrap_or(""),
                self.t0.elapsed()
            ),
            Err(e) => eprintln!("{e}"),
        }
    }
}

/// `rabbitmqctl -q -n <node i> args…`, off the runtime's thread, bounded.
pub async fn ctl(i: usize, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("timeout");
    cmd.arg("30")
        .arg("rabbitmqctl")
        .arg("-q")
        .arg("-n")
        .arg(node_name(i))
        .args(args);
    let what = format!("rabbitmqctl -n {} {args:?}", node_name(i));
    tokio::task::spawn_blocking(move || {
        let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "{what} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    })
    .await
    .expect("rabbitmqctl task")
}

/// `rabbitmqctl` on the first of `alive` that answers.
pub async fn ctl_any(alive: &[usize], args: &[&str]) -> Result<String, String> {
    let mut last = String::from("no node given");
    for &i in alive {
        match ctl(i, args).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The pid of node `i`'s `beam.smp`: the process whose environment has
/// `RABBITMQ_NODENAME=<node>` (its arguments do not name it reliably).
pub fn beam_pid(i: usize) -> Option<u32> {
    let want = format!("RABBITMQ_NODENAME={}", node_name(i));
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim() != "beam.smp" {
            continue;
        }
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// The leader of quorum queue `queue` as node `i` knows it
/// (`ra_leaderboard:lookup_leader/1`: a local table, so it answers while
/// another node is frozen, where `list_queues` and `ra:members` wait on
/// the frozen one).
pub async fn leader_seen_by(i: usize, queue: &str) -> Option<usize> {
    let expr = format!(
        "ra_leaderboard:lookup_leader('%2F_{}').",
        queue.replace('\'', "")
    );
    let out = ctl(i, &["eval", &expr]).await.ok()?;
    // {'%2F_q','acemq-2@localhost'}, or undefined
    let node = out.trim().trim_end_matches('}').rsplit_once(',')?.1;
    node_index(node.trim_matches('\''))
}

/// Quorum queue `queue` as node `i`'s own member sees it, raw: (messages
/// ready, checked out to consumers), each `{ok,{{Index,Term},N},Leader}`
/// (`ra:local_query`: answered by the local member alone).
pub async fn local_counts(i: usize, queue: &str) -> String {
    let server = format!("{{'%2F_{}', node()}}", queue.replace('\'', ""));
    let expr = format!(
        "{{ra:local_query({server}, fun rabbit_fifo:query_messages_ready/1, 2000), \
         ra:local_query({server}, fun rabbit_fifo:query_messages_checked_out/1, 2000)}}."
    );
    ctl(i, &["eval", &expr])
        .await
        .unwrap_or_else(|e| e)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The index of the node an address (redacted or not) points at, by port.
pub fn node_of_address(address: &str) -> Option<usize> {
    NODES
        .iter()
        .position(|(_, port)| address.contains(&format!(":{port}/")))
}

/// `kill -9` node `i`'s `beam.smp`, and waits until it is gone.
pub async fn kill9(i: usize) {
    let pid = beam_pid(i).unwrap_or_else(|| panic!("{} has no beam.smp", node_name(i)));
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {pid}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))
        })
        .await,
        "beam.smp {pid} of {} is gone",
        node_name(i)
    );
}

/// The node leading quorum queue `queue`, asked of the nodes in `alive`.
pub async fn leader(alive: &[usize], queue: &str) -> Option<usize> {
    let out = ctl_any(
        alive,
        &["list_queues", "--no-table-headers", "name", "leader"],
    )
    .await
    .ok()?;
    out.lines().find_map(|l| {
        let mut f = l.split('\t');
        (f.next()? == queue).then(|| node_index(f.next()?.trim()))?
    })
}

/// `queue`'s ready + unacked messages, asked of the nodes in `alive`.
pub async fn messages(alive: &[usize], queue: &str) -> Option<u64> {
    let out = ctl_any(
        alive,
        &["list_queues", "--no-table-headers", "name", "messages"],
    )
    .await
    .ok()?;
    out.lines().find_map(|l| {
        let mut f = l.split('\t');
        (f.next()? == queue).then(|| f.next()?.trim().parse().ok())?
    })
}

/// The node the connection named `name` is on (from its pid,
/// `<acemq-2@localhost.…>`).
pub async fn connection_node(alive: &[usize], name: &str) -> Option<usize> {
    let out = ctl_any(
        alive,
        &[
            "list_connections",
            "--no-table-headers",
            "pid",
            "client_properties",
        ],
    )
    .await
    .ok()?;
    out.lines()
        .filter(|l| l.contains(&format!("\"{name}\"")))
        .find_map(|l| {
            let pid = l.split('\t').next()?;
            let node = pid.trim_start_matches('<').split('.').next()?;
            node_index(node)
        })
}

/// Whether all three nodes run as one cluster again.
pub async fn all_running(alive_hint: usize) -> bool {
    ctl(alive_hint, &["eval", "rabbit_nodes:all_running()."])
        .await
        .is_ok_and(|s| (0..NODES.len()).all(|i| s.contains(&node_name(i))))
}

/// Readiness as it changed, sampled every 5 ms from the start.
#[derive(Clone)]
pub struct ReadinessLog {
    t0: Instant,
    changes: Arc<Mutex<Vec<(Duration, bool)>>>,
}

impl ReadinessLog {
    pub fn start(health: acemq::Health) -> Self {
        let t0 = Instant::now();
        let changes: Arc<Mutex<Vec<(Duration, bool)>>> = Arc::default();
        let weak = Arc::downgrade(&changes);
        tokio::spawn(async move {
            let mut last = None;
            while let Some(changes) = weak.upgrade() {
                let now = health.is_ready();
                if last != Some(now) {
                    changes.lock().unwrap().push((t0.elapsed(), now));
                    last = Some(now);
                }
                drop(changes);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        ReadinessLog { t0, changes }
    }

    pub fn changes(&self) -> Vec<(Duration, bool)> {
        self.changes.lock().unwrap().clone()
    }

    pub fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    /// Whether readiness went off at or after `after` and then on again.
    pub fn off_then_on_after(&self, after: Duration) -> bool {
        let c = self.changes();
        c.iter()
            .position(|(t, r)| *t >= after && !r)
            .is_some_and(|i| c[i..].iter().any(|(_, r)| *r))
    }
}

/// The dead-letter backlog of quorum queue `queue` (messages its broker has
/// discarded, e.g. expired on a rung, but not yet seen confirmed by their
/// target): `rabbit_fifo:query_stat_dlx/1` on its local member, raw.
pub async fn dlx_backlog(alive: &[usize], queue: &str) -> String {
    let expr = format!(
        "ra:local_query({{'%2F_{}', node()}}, fun rabbit_fifo:query_stat_dlx/1).",
        queue.replace('\'', "")
    );
    ctl_any(alive, &["eval", &expr])
        .await
        .unwrap_or_else(|e| e)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether every member of quorum queue `queue` is up as leader or follower,
/// with a commit index within `lag` entries of the leader's
/// (`rabbitmq-queues quorum_status`). A node restarted after a kill has
/// rejoined the cluster before its members have caught up; killing the
/// leader before they have leaves the queue without a quorum of current
/// members.
pub async fn members_in_sync(alive: &[usize], queue: &str, lag: u64) -> bool {
    for &i in alive {
        let mut cmd = Command::new("timeout");
        cmd.args(["30", "rabbitmq-queues", "-q", "-n"])
            .arg(node_name(i))
            .args(["quorum_status", queue, "--formatter", "json"]);
        let Ok(Ok(out)) = tokio::task::spawn_blocking(move || cmd.output()).await else {
            continue;
        };
        if !out.status.success() {
            continue;
        }
        let Ok(members) = serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout) else {
            continue;
        };
        let states: Vec<(String, u64)> = members
            .iter()
            .map(|m| {
                (
                    m["Raft State"].as_str().unwrap_or("down").to_owned(),
                    m["Commit Index"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        let leader = states.iter().find(|(s, _)| s == "leader").map(|(_, c)| *c);
        return states.len() == NODES.len()
            && states.iter().all(|(s, _)| s == "leader" || s == "follower")
            && leader.is_some_and(|l| states.iter().all(|(_, c)| c + lag >= l));
    }
    false
}

/// How many discarded messages quorum queue `queue` holds in its
/// dead-letter backlog (expired on a rung, not yet confirmed by their
/// target): the first number of [`dlx_backlog`]'s `{Count, Bytes}`.
pub async fn dlx_backlog_count(alive: &[usize], queue: &str) -> Option<u64> {
    let raw = dlx_backlog(alive, queue).await;
    // {ok,{{Index,Term},{Count,Bytes}}, ...}
    let after = raw.split("},{").nth(1)?;
    after.split(',').next()?.trim().parse().ok()
}

/// Restarts the Ra server leading quorum queue `queue` (kills the process;
/// its supervisor starts it again and another member takes over). On
/// RabbitMQ 3.10.8 this makes a stalled at-least-once dead-letter worker
/// start again: an operator's workaround, used only when the test saw the
/// backlog stall.
pub async fn restart_queue_leader_process(alive: &[usize], queue: &str) -> Result<String, String> {
    let lead = leader(alive, queue).await.ok_or("no leader known")?;
    let expr = format!("exit(whereis('%2F_{}'), kill).", queue.replace('\'', ""));
    ctl(lead, &["eval", &expr]).await.map(|_| node_name(lead))
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

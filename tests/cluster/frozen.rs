//! Nodes frozen (Jepsen's pause: SIGSTOP of a node's `beam.smp`, then
//! SIGCONT) under load, on the three-node cluster. A quorum queue declared
//! through node 1 (so node 1 leads it); the App given all three addresses
//! and a 2 s heartbeat, consuming from node 2 or 3; a publisher with
//! confirms on its own connection, also with a 2 s heartbeat, through all
//! three addresses. A frozen node keeps its TCP connections open and
//! answers nothing: only the heartbeat tells a client, and only Ra's
//! failure detector tells the queue's other members.
//!
//! - The consumer's node frozen: acemq notices by heartbeat, reconnects to
//!   another node while that one is still frozen, and consumes on.
//! - The queue leader's node frozen: the other members elect a new leader
//!   and consumption resumes while the old leader is still frozen.
//!
//! Each time: every confirmed message handled, duplicates within the
//! prefetch, the queue empty at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::config::{QueueConfig, QueueType};
use acemq::connection::{connect_any, ConnectOptions};
use acemq::{App, BoxError, Config, Delivery, Health, Running};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Confirmation};
use tokio_util::sync::CancellationToken;
use tower::service_fn;

use crate::freeze::{Frozen, Logs};
use crate::support::{
    addr, all_running, beam_pid, connection_node, eventually, leader, leader_seen_by, local_counts,
    members_in_sync, message_number, messages, node_name, node_of_address, Cluster, ReadinessLog,
};

const SECS: fn(u64) -> Duration = Duration::from_secs;
const PREFETCH: u16 = 20;
const CONCURRENCY: usize = 4;
/// The heartbeat the App and the publisher ask for, in seconds.
const HEARTBEAT: u64 = 2;
/// A handler's work: 4 × 10 a second at most, below what the publisher
/// gets confirmed on a quorum queue here (~50 a second), so the queue
/// backs up slowly and the prefetch window is full.
const WORK: Duration = Duration::from_millis(100);
const ALL: [usize; 3] = [0, 1, 2];
/// The longest a node stays frozen: well under the Erlang distribution's
/// tick (60 s), past which the others would take it for down and the
/// thaw would be a partition, another test.
const FREEZE_MAX: Duration = Duration::from_secs(30);

/// What is left of [`FREEZE_MAX`] for a freeze begun `at`.
fn left(at: Instant) -> Duration {
    FREEZE_MAX.saturating_sub(at.elapsed())
}

/// Handled calls per message number.
#[derive(Default)]
struct Handled {
    counts: Mutex<BTreeMap<u64, u32>>,
    calls: AtomicU64,
}

impl Handled {
    fn distinct(&self) -> usize {
        self.counts.lock().unwrap().len()
    }
}

fn handler(
    handled: Arc<Handled>,
) -> impl tower::Service<Delivery, Response = (), Error = BoxError, Future: Send + 'static>
       + Clone
       + Send
       + 'static {
    service_fn(move |d: Delivery| {
        let handled = handled.clone();
        async move {
            let n = message_number(&d)?;
            tokio::time::sleep(WORK).await;
            *handled.counts.lock().unwrap().entry(n).or_default() += 1;
            handled.calls.fetch_add(1, Ordering::Relaxed);
            Ok::<(), BoxError>(())
        }
    })
}

fn config(q: &str) -> Config {
    let mut queue = QueueConfig::new(q);
    queue.kind = QueueType::Quorum;
    queue.prefetch = PREFETCH;
    queue.concurrency = CONCURRENCY;
    let mut config = Config::new([queue]);
    config.heartbeat = Some(SECS(HEARTBEAT));
    // A connect to a frozen node hangs in the AMQP handshake (the kernel
    // accepts the TCP connection): give up on it soon and try the next.
    config.connect_timeout = SECS(3);
    config.shutdown_timeout = SECS(10);
    config
}

/// What the publisher got confirmed, and what happened to it.
#[derive(Default)]
struct Published {
    confirmed: Mutex<BTreeSet<u64>>,
    sent: AtomicU64,
    events: Mutex<Vec<String>>,
}

impl Published {
    fn event(&self, t0: Instant, what: String) {
        self.events
            .lock()
            .unwrap()
            .push(format!("{:.1}s {what}", t0.elapsed().as_secs_f64()));
    }
}

/// Publishes `m-0`, `m-1`, … to `queue` until stopped, one after the other
/// about every 10 ms, each awaited for its confirm (15 s at most; an unconfirmed message is not
/// counted), through any of the three addresses with a 2 s heartbeat;
/// reconnects, to any node, when its connection dies or a publish is not
/// confirmed.
async fn publisher(queue: String, out: Arc<Published>, stop: CancellationToken) {
    let addresses: Vec<String> = ALL.iter().map(|&i| addr(i)).collect();
    let options = ConnectOptions::default().with_heartbeat(Some(SECS(HEARTBEAT)));
    let t0 = Instant::now();
    let mut n = 0u64;
    while !stop.is_cancelled() {
        let c = match connect_any(
            &addresses,
            "acemq-cluster-test-publisher",
            SECS(3),
            &options,
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                out.event(t0, format!("connect failed: {e}"));
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        out.event(t0, format!("connected to {}", c.address));
        let conn = c.connection;
        let ch = match tokio::time::timeout(SECS(5), async {
            let ch = conn.create_channel().await?;
            ch.confirm_select(ConfirmSelectOptions::default()).await?;
            Ok::<_, lapin::Error>(ch)
        })
        .await
        {
            Ok(Ok(ch)) => ch,
            other => {
                out.event(t0, format!("no confirm channel: {other:?}"));
                continue;
            }
        };
        while !stop.is_cancelled() {
            let body = format!("m-{n}");
            out.sent.fetch_add(1, Ordering::Relaxed);
            let confirm = async {
                ch.basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    body.as_bytes(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?
                .await
            };
            let result = tokio::time::timeout(SECS(15), confirm).await;
            n += 1;
            match result {
                Ok(Ok(Confirmation::Ack(None))) => {
                    out.confirmed.lock().unwrap().insert(n - 1);
                }
                other => {
                    out.event(t0, format!("m-{} not confirmed: {other:?}", n - 1));
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = tokio::time::timeout(SECS(2), conn.close(200, "OK".into())).await;
    }
}

/// Starts the App consuming `q` through all three addresses.
async fn start_app(q: &str, name: &str, handled: Arc<Handled>) -> (Running, Health) {
    let list: Vec<String> = ALL.iter().map(|&i| addr(i)).collect();
    let app = App::new(config(q))
        .amqp_addr(list.join(","))
        .connection_name(name)
        .consume(q, handler(handled));
    let health = app.health();
    let running = app.start().await.expect("starts on the cluster");
    (running, health)
}

/// The node the App's consumer connection is on, from its health snapshot.
fn consumer_node(health: &Health) -> Option<usize> {
    health
        .snapshot()
        .broker
        .as_deref()
        .and_then(node_of_address)
}

/// A cluster, a quorum queue led by node 1, the App consuming from node 2
/// or 3 through all three addresses, and the publisher running: the
/// ground both tests stand on.
struct Setup {
    cluster: Cluster,
    q: String,
    app_name: String,
    handled: Arc<Handled>,
    running: Running,
    health: Health,
    readiness: ReadinessLog,
    published: Arc<Published>,
    stop: CancellationToken,
    publishing: tokio::task::JoinHandle<()>,
    /// How many starts it took to land the App on node 2 or 3.
    starts: u32,
}

async fn setup(tag: &str) -> Setup {
    let cluster = Cluster::up();
    let q = format!("acemq-cluster-test.{tag}.{}", std::process::id());
    let handled = Arc::new(Handled::default());
    // Declared through node 1 only: led from there (client-local placement).
    let declarer = App::new(config(&q))
        .amqp_addr(addr(0))
        .connection_name("acemq-cluster-test-declare")
        .consume(&q, handler(handled.clone()));
    declarer
        .start()
        .await
        .expect("declares on node 1")
        .drain()
        .await
        .expect("a clean drain of the declaring app");
    assert_eq!(leader(&ALL, &q).await, Some(0), "{q} is led by node 1");

    // acemq shuffles the addresses: start until it lands off the leader.
    let app_name = format!("acemq-cluster-test-app-{tag}-{}", std::process::id());
    let mut starts = 0;
    let (running, health) = loop {
        starts += 1;
        let (running, health) = start_app(&q, &app_name, handled.clone()).await;
        let on = consumer_node(&health);
        if on.is_some_and(|i| i != 0) || starts >= 10 {
            break (running, health);
        }
        let _ = running.drain().await;
    };
    assert_ne!(
        consumer_node(&health),
        Some(0),
        "the App consumes from node 2 or 3 ({starts} starts)"
    );
    let readiness = ReadinessLog::start(health.clone());
    let published = Arc::new(Published::default());
    let stop = CancellationToken::new();
    let publishing = tokio::spawn(publisher(q.clone(), published.clone(), stop.clone()));
    assert!(
        eventually(SECS(60), || async { handled.distinct() >= 300 }).await,
        "steady state: 300 handled"
    );
    Setup {
        cluster,
        q,
        app_name,
        handled,
        running,
        health,
        readiness,
        published,
        stop,
        publishing,
        starts,
    }
}

impl Setup {
    /// Stops the publisher, waits for every confirmed message to be
    /// handled and the queue to empty, drains, and asserts nothing was lost
    /// and duplicates stayed within `bound`.
    async fn account(self, what: &str, bound: u32) {
        let Setup {
            cluster,
            q,
            handled,
            running,
            published,
            stop,
            publishing,
            ..
        } = self;
        stop.cancel();
        let _ = tokio::time::timeout(SECS(30), publishing).await;
        let confirmed = published.confirmed.lock().unwrap().clone();
        // The backlog goes at the handlers' pace: wait as long as it moves.
        let all_handled = while_progressing(&handled, || {
            let h = handled.counts.lock().unwrap();
            confirmed.iter().all(|n| h.contains_key(n))
        })
        .await;
        let emptied = eventually(SECS(30), || async { messages(&ALL, &q).await == Some(0) }).await;
        let t0 = Instant::now();
        let report = tokio::time::timeout(SECS(40), running.drain()).await;
        let drain_took = t0.elapsed();
        let left = messages(&ALL, &q).await;
        let h = handled.counts.lock().unwrap().clone();
        let missing: Vec<u64> = confirmed
            .iter()
            .filter(|n| !h.contains_key(n))
            .copied()
            .collect();
        let duplicates: u32 = h.values().map(|c| c - 1).sum();
        let twice: Vec<u64> = h.iter().filter(|(_, c)| **c > 1).map(|(n, _)| *n).collect();
        eprintln!(
            "{what}: sent {}, confirmed {}, handled {} distinct, missing {}, duplicates {duplicates} {twice:?}; \
             queue at the end {left:?}; drain {drain_took:?} {report:?}; publisher: {:?}",
            published.sent.load(Ordering::Relaxed),
            confirmed.len(),
            h.len(),
            missing.len(),
            published.events.lock().unwrap()
        );
        assert!(
            all_handled && missing.is_empty(),
            "{} confirmed message(s) never handled, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        );
        assert!(
            duplicates <= bound,
            "{duplicates} duplicate(s), more than {bound}"
        );
        assert!(report.is_ok(), "the drain returned");
        assert!(emptied, "{q} ends empty: {left:?}");
        drop(cluster);
    }
}

/// Waits until `done()`, as long as `handled` keeps growing (no 15 s
/// without a new message handled), 10 minutes at most.
async fn while_progressing(handled: &Handled, done: impl Fn() -> bool) -> bool {
    let end = Instant::now() + SECS(600);
    let mut last = (handled.distinct(), Instant::now());
    loop {
        if done() {
            return true;
        }
        let now = handled.distinct();
        if now != last.0 {
            last = (now, Instant::now());
        }
        if last.1.elapsed() > SECS(15) || Instant::now() > end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Holds the freeze until it has lasted `at_least`, then thaws; how long
/// it lasted.
async fn thaw_after(frozen: &mut Frozen, at_least: Duration) -> Duration {
    tokio::time::sleep(at_least.saturating_sub(frozen.at.elapsed())).await;
    frozen.thaw()
}

/// After a thaw: the node back in the cluster and `q`'s members current.
async fn caught_up(q: &str) -> Option<Duration> {
    let t0 = Instant::now();
    (eventually(SECS(60), || async { all_running(0).await }).await
        && eventually(SECS(60), || async { members_in_sync(&ALL, q, 200).await }).await)
        .then(|| t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a local three-node cluster: cargo test -p acemq --test cluster -- --ignored --test-threads=1 (.ci/run)"]
async fn the_consumer_s_node_frozen_is_noticed_by_the_heartbeat_and_consuming_moves_to_another_node_losing_nothing(
) {
    let logs = Logs::install();
    let s = setup("frozen-consumer").await;
    let c = consumer_node(&s.health).expect("the consumer's node");
    let listed = connection_node(&ALL, &s.app_name).await;
    let pid = beam_pid(c).expect("its beam.smp");
    let distinct_before = s.handled.distinct();
    let t_freeze = s.readiness.elapsed();
    let mut frozen = Frozen::stop(pid, &node_name(c));
    let log_from = logs.at(frozen.at);

    let at = frozen.at;
    // The consumer connection's own loss and return: the App's publishing
    // connection may be on the frozen node too, and be noticed and moved
    // apart from it.
    let noticed = eventually(left(at), || async { !s.health.snapshot().connected })
        .await
        .then(|| at.elapsed());
    let ready_again = eventually(left(at), || async {
        s.health.is_ready() && consumer_node(&s.health).is_some_and(|i| i != c)
    })
    .await
    .then(|| at.elapsed());
    let now_on = consumer_node(&s.health);
    let resumed = eventually(left(at), || async {
        s.handled.distinct() >= distinct_before + 100
    })
    .await
    .then(|| at.elapsed());
    let frozen_for = thaw_after(&mut frozen, SECS(3 * HEARTBEAT)).await;
    let still_on = consumer_node(&s.health);
    let caught_up = caught_up(&s.q).await;
    eprintln!(
        "consumer's node {} (listed on {:?}) frozen {frozen_for:?}, {} start(s) to land off the leader: \
         consumer connection lost {noticed:?} after SIGSTOP, ready again on another node {ready_again:?} ({:?}), 100 more handled {resumed:?} \
         (all while frozen); after SIGCONT still on {:?}, cluster and members current after {caught_up:?}; \
         readiness {:?}; publisher {:?}\n  log from the freeze on:\n{}",
        node_name(c),
        listed.map(node_name),
        s.starts,
        now_on.map(node_name),
        still_on.map(node_name),
        s.readiness.changes(),
        s.published.events.lock().unwrap(),
        logs.render(log_from)
    );
    let noticed =
        noticed.expect("the consumer connection's loss noticed while its node was frozen");
    let bound = SECS(HEARTBEAT) * 5 / 2 + SECS(1);
    assert!(
        noticed <= bound + SECS(4),
        "noticed {noticed:?} after SIGSTOP, past the heartbeat's bound {bound:?} (+4 s)"
    );
    let ready_again = ready_again.expect("ready again while the node was frozen");
    assert!(
        ready_again < frozen_for,
        "ready again {ready_again:?} after SIGSTOP, while the node was still frozen ({frozen_for:?})"
    );
    assert!(
        now_on.is_some_and(|i| i != c),
        "reconnected to another node than the frozen {}: {:?}",
        node_name(c),
        now_on.map(node_name)
    );
    assert!(
        resumed.is_some_and(|r| r < frozen_for),
        "100 more handled while the node was frozen: {resumed:?}"
    );
    assert!(
        eventually(SECS(2), || async {
            s.readiness.off_then_on_after(t_freeze)
        })
        .await,
        "readiness off then on: {:?}",
        s.readiness.changes()
    );
    assert!(caught_up.is_some(), "{} back in the cluster", node_name(c));
    s.account("consumer's node frozen", u32::from(PREFETCH))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a local three-node cluster: cargo test -p acemq --test cluster -- --ignored --test-threads=1 (.ci/run)"]
async fn the_quorum_leader_s_node_frozen_is_replaced_by_a_new_leader_and_consuming_resumes_losing_nothing(
) {
    let logs = Logs::install();
    let s = setup("frozen-leader").await;
    let c = consumer_node(&s.health).expect("the consumer's node");
    let lead = leader(&ALL, &s.q).await.expect("a leader");
    assert_ne!(lead, c, "the consumer is not on the leader's node");
    let pid = beam_pid(lead).expect("its beam.smp");
    let alive: Vec<usize> = ALL.iter().copied().filter(|&i| i != lead).collect();
    let distinct_before = s.handled.distinct();
    let t_freeze = s.readiness.elapsed();
    let mut frozen = Frozen::stop(pid, &node_name(lead));
    let log_from = logs.at(frozen.at);

    // While frozen, every half second: who leads as the consumer's node
    // and the third node know it, and the queue as the consumer's node's
    // member sees it.
    let at = frozen.at;
    let other = alive
        .iter()
        .copied()
        .find(|&i| i != c)
        .expect("a third node");
    let trace: Arc<Mutex<Vec<String>>> = Arc::default();
    let elected: Arc<Mutex<Option<(Duration, usize)>>> = Arc::default();
    let stop_trace = CancellationToken::new();
    let tracer = {
        let (trace, elected, stop) = (trace.clone(), elected.clone(), stop_trace.clone());
        let (q, handled, published) = (s.q.clone(), s.handled.clone(), s.published.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let t = at.elapsed();
                let (by_c, by_other, local) = tokio::join!(
                    leader_seen_by(c, &q),
                    leader_seen_by(other, &q),
                    local_counts(c, &q)
                );
                if let Some(l) = by_c.filter(|l| *l != lead) {
                    elected.lock().unwrap().get_or_insert((t, l));
                }
                trace.lock().unwrap().push(format!(
                    "{:.1}s: leader by {} {:?}, by {} {:?}; on {} (ready, checked out) {local}; handled {}, confirmed {}",
                    t.as_secs_f64(),
                    node_name(c),
                    by_c.map(node_name),
                    node_name(other),
                    by_other.map(node_name),
                    node_name(c),
                    handled.distinct(),
                    published.confirmed.lock().unwrap().len()
                ));
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        })
    };
    let first = eventually(left(at), || async {
        s.handled.distinct() > distinct_before
    })
    .await
    .then(|| at.elapsed());
    let resumed = eventually(left(at), || async {
        s.handled.distinct() >= distinct_before + 100
    })
    .await
    .then(|| at.elapsed());
    eventually(left(at), || async { elected.lock().unwrap().is_some() }).await;
    let handled_at_thaw = s.handled.distinct();
    let frozen_for = thaw_after(&mut frozen, SECS(3 * HEARTBEAT)).await;
    let thawed = Instant::now();
    let resumed_after_thaw = eventually(SECS(60), || async {
        s.handled.distinct() >= handled_at_thaw + 100
    })
    .await
    .then(|| thawed.elapsed());
    stop_trace.cancel();
    let _ = tokio::time::timeout(SECS(40), tracer).await;
    let caught_up = caught_up(&s.q).await;
    let leader_after = leader(&ALL, &s.q).await;
    let (elected, new_leader) = match *elected.lock().unwrap() {
        Some((t, l)) => (Some(t), Some(l)),
        None => (None, None),
    };
    eprintln!(
        "leader {} frozen {frozen_for:?} (consumer on {}, {} start(s) to land there; {distinct_before} handled \
         before): new leader {:?} seen by {} {elected:?} after SIGSTOP; first message handled {first:?}, 100 more \
         {resumed:?} ({handled_at_thaw} handled at SIGCONT); after SIGCONT 100 more {resumed_after_thaw:?}, the \
         leader is {:?}, cluster and members current after {caught_up:?}; readiness {:?} (frozen at {t_freeze:?}); \
         consumer still on {:?}; publisher {:?}\n  while frozen:\n    {}\n  log from the freeze on:\n{}",
        node_name(lead),
        node_name(c),
        s.starts,
        new_leader.map(node_name),
        node_name(c),
        leader_after.map(node_name),
        s.readiness.changes(),
        consumer_node(&s.health).map(node_name),
        s.published.events.lock().unwrap(),
        trace.lock().unwrap().join("\n    "),
        logs.render(log_from)
    );
    assert!(
        alive.contains(&new_leader.expect("a new leader while the old one was frozen")),
        "the new leader is a live node"
    );
    let resumed = resumed.expect("100 more handled while the old leader was frozen");
    assert!(
        resumed < frozen_for,
        "consuming resumed while the old leader was still frozen: {resumed:?} vs {frozen_for:?}"
    );
    assert!(
        caught_up.is_some(),
        "{} back in the cluster",
        node_name(lead)
    );
    assert!(
        eventually(SECS(20), || async { s.health.is_ready() }).await,
        "ready: {:?}",
        s.health.snapshot()
    );
    s.account("queue leader's node frozen", u32::from(PREFETCH))
        .await;
}

//! The node frozen (Jepsen's pause): under load — a publisher with confirms
//! putting `N` numbered messages in a durable queue, the App consuming
//! them — the node's `beam.smp` gets SIGSTOP, stays stopped past the
//! heartbeat's bound, and gets SIGCONT. A frozen node keeps its TCP
//! connections open and answers nothing, so only the heartbeat can tell:
//! the App asks for a 2 s heartbeat (`Config::heartbeat`), and lapin gives a
//! connection up when nothing has been read on it for more than two
//! intervals (checked every half interval).
//!
//! The handlers are slower than the publisher, so the queue backs up and
//! the prefetch window is full when the node stops.
//!
//! Asserted: the node granted the 2 s heartbeat; readiness went off while
//! the node was frozen, within the heartbeat's bound; it came back once the
//! node ran again; every confirmed message was handled; duplicates stayed
//! within the prefetch (one connection lost); the queue ends empty.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::config::QueueConfig;
use acemq::{App, BoxError, Config, Delivery};
use lapin::options::ConfirmSelectOptions;
use lapin::Confirmation;
use tower::service_fn;

use crate::freeze::{Frozen, Logs};
use crate::support::{
    addr, beam_pid, connect_to, counts, eventually, heartbeats, message_number, publish_on, unique,
    Node, ReadinessLog, NODE,
};

const SECS: fn(u64) -> Duration = Duration::from_secs;
const PREFETCH: u16 = 20;
const CONCURRENCY: usize = 4;
/// The heartbeat the App (and the test's publisher) ask for, in seconds.
const HEARTBEAT: u64 = 2;
/// Messages published in all: the publisher, about 5 ms apart, is still
/// at it when the node stops, and goes on after.
const N: u64 = 2500;
/// A handler's work: slower in all (4 × 25 a second) than the publisher,
/// so the queue backs up and the prefetch window is full at the freeze.
const WORK: Duration = Duration::from_millis(40);

/// The longest a frozen peer can go unnoticed: lapin gives up on a
/// connection after more than two intervals without a read, looked at
/// every half interval (2.5 intervals), and acemq's supervisor looks at a
/// connection's status at least every second.
pub(crate) fn detection_bound(heartbeat: Duration) -> Duration {
    heartbeat * 5 / 2 + SECS(1)
}

/// How many times each message number was handled.
#[derive(Default)]
struct Handled {
    counts: Mutex<HashMap<u64, u32>>,
    calls: AtomicU64,
}

impl Handled {
    fn distinct(&self) -> usize {
        self.counts.lock().unwrap().len()
    }
    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

/// What the publisher got confirmed, and what happened to it.
#[derive(Default)]
struct Published {
    confirmed: Mutex<BTreeSet<u64>>,
    sent: AtomicU64,
    events: Mutex<Vec<String>>,
}

/// Publishes `m-0` … `m-<n-1>` to `queue`, about every 5 ms, each awaited
/// for its confirm (15 s at most; an unconfirmed message is not counted),
/// on a connection of its own with the same short heartbeat, so that a
/// frozen node is noticed here too; reconnects when its connection dies.
async fn publisher(queue: String, n_total: u64, out: Arc<Published>) {
    let uri = format!("{}?heartbeat={HEARTBEAT}", addr());
    let name = format!("acemq-node-test-{queue}-publisher");
    let t0 = Instant::now();
    let event = |what: String| {
        out.events
            .lock()
            .unwrap()
            .push(format!("{:.1}s {what}", t0.elapsed().as_secs_f64()))
    };
    let mut n = 0u64;
    while n < n_total {
        let conn = match connect_to(&uri, &name).await {
            Ok(c) => c,
            Err(e) => {
                event(format!("connect failed: {e}"));
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let ch = match tokio::time::timeout(SECS(5), async {
            let ch = conn.create_channel().await?;
            ch.confirm_select(ConfirmSelectOptions::default()).await?;
            Ok::<_, lapin::Error>(ch)
        })
        .await
        {
            Ok(Ok(ch)) => ch,
            other => {
                event(format!("no confirm channel: {other:?}"));
                continue;
            }
        };
        while n < n_total {
            let body = format!("m-{n}");
            out.sent.fetch_add(1, Ordering::Relaxed);
            let confirm = async { publish_on(&ch, &queue, body.as_bytes()).await?.await };
            let result = tokio::time::timeout(SECS(15), confirm).await;
            n += 1;
            match result {
                Ok(Ok(Confirmation::Ack(None))) => {
                    out.confirmed.lock().unwrap().insert(n - 1);
                }
                other => {
                    event(format!("m-{} not confirmed: {other:?}", n - 1));
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = tokio::time::timeout(SECS(2), conn.close(200, "OK".into())).await;
    }
    event("done".to_owned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a throwaway node: cargo test -p acemq --test node -- --ignored --test-threads=1 (.ci/run)"]
async fn a_frozen_node_is_noticed_by_the_heartbeat_readiness_goes_off_then_on_and_every_confirmed_message_is_handled_with_duplicates_within_the_prefetch(
) {
    let logs = Logs::install();
    let node = Node::up();
    let q = unique("frozen");
    let handled = Arc::new(Handled::default());
    let handler = {
        let handled = handled.clone();
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
    };
    let mut queue = QueueConfig::new(&q);
    queue.prefetch = PREFETCH;
    queue.concurrency = CONCURRENCY;
    let mut config = Config::new([queue]);
    config.heartbeat = Some(SECS(HEARTBEAT));
    config.connect_timeout = SECS(5);
    config.shutdown_timeout = SECS(10);
    let name = format!("acemq-node-test-{q}-app");
    let app = App::new(config)
        .amqp_addr(addr())
        .connection_name(&name)
        .consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts on the test node");
    let readiness = ReadinessLog::start(health.clone());

    // RabbitMQ takes the lower of its own (60 s) and the client's.
    let granted = heartbeats(&name).await;
    assert!(
        granted.len() == 2 && granted.iter().all(|(_, s)| *s == HEARTBEAT),
        "the node granted the App's two connections a {HEARTBEAT} s heartbeat: {granted:?}"
    );

    let published = Arc::new(Published::default());
    let publishing = tokio::spawn(publisher(q.clone(), N, published.clone()));
    assert!(
        eventually(SECS(60), || async { handled.distinct() >= 300 }).await,
        "steady state before the freeze: {} handled",
        handled.distinct()
    );

    // The freeze.
    let beam = beam_pid().expect("the node's beam.smp");
    let queue_before = counts(&q).await;
    let sent_before = published.sent.load(Ordering::Relaxed);
    let calls_before = handled.calls();
    let log_from = logs.now();
    let t_freeze = readiness.elapsed();
    let mut frozen = Frozen::stop(beam, NODE);
    let noticed = eventually(SECS(20), || async { !health.is_ready() })
        .await
        .then(|| frozen.at.elapsed());
    // Frozen for three heartbeats at least, and a second past the moment
    // readiness went off (the outage itself, like a restart's 5 s).
    let hold = (SECS(3 * HEARTBEAT)).max(noticed.unwrap_or_default() + SECS(1));
    tokio::time::sleep(hold.saturating_sub(frozen.at.elapsed())).await;
    let handled_while_frozen = handled.calls() - calls_before;
    let snapshot_frozen = health.snapshot();
    let frozen_for = frozen.thaw();
    let thawed = Instant::now();
    let calls_at_thaw = handled.calls();
    let distinct_at_thaw = handled.distinct();

    let ready_after = eventually(SECS(60), || async { health.is_ready() })
        .await
        .then(|| thawed.elapsed());
    let first_after = eventually(SECS(60), || async { handled.calls() > calls_at_thaw })
        .await
        .then(|| thawed.elapsed());
    let resumed_after = eventually(SECS(60), || async {
        handled.distinct() >= distinct_at_thaw + 100
    })
    .await
    .then(|| thawed.elapsed());
    // The log samples every 5 ms: a bounded moment to see the "on".
    let off_then_on = eventually(SECS(2), || async { readiness.off_then_on_after(t_freeze) }).await;
    let lost_line = |role: &str| {
        logs.first(
            log_from,
            &format!("the {role} connection to the broker was lost"),
        )
        .map(|l| l.0.saturating_sub(logs.at(frozen.at)))
    };
    let (consumer_lost, publisher_lost) = (lost_line("consumer"), lost_line("publisher"));
    eprintln!(
        "frozen node: heartbeat {HEARTBEAT} s granted ({granted:?}); frozen {frozen_for:?}; readiness off \
         {noticed:?} after SIGSTOP (bound {:?}); the queue before {queue_before:?}, the publisher at {sent_before} of {N}; loss logged {consumer_lost:?} (consumer), {publisher_lost:?} \
         (publisher) after SIGSTOP; {handled_while_frozen} handled while frozen; after SIGCONT: ready again \
         {ready_after:?}, first handled {first_after:?}, 100 more {resumed_after:?}; readiness {:?}; while frozen \
         {snapshot_frozen:?}\n  log from the freeze on:\n{}",
        detection_bound(SECS(HEARTBEAT)),
        readiness.changes(),
        logs.render(logs.at(frozen.at))
    );
    let noticed = noticed.expect("readiness went off while the node was frozen");
    // A generous margin over the bound for a loaded machine, and never
    // sooner than half an interval (nothing else than the heartbeat can
    // tell a frozen node from a quiet one).
    assert!(
        noticed <= detection_bound(SECS(HEARTBEAT)) + SECS(4),
        "readiness went off {noticed:?} after SIGSTOP, past the heartbeat's bound {:?} (+4 s)",
        detection_bound(SECS(HEARTBEAT))
    );
    assert!(
        noticed >= Duration::from_millis(HEARTBEAT * 1000 / 2),
        "readiness went off {noticed:?} after SIGSTOP: sooner than a heartbeat could tell"
    );
    let consumer_lost = consumer_lost.expect("acemq logged the consumer connection's loss");
    assert!(
        consumer_lost <= detection_bound(SECS(HEARTBEAT)) + SECS(4),
        "the consumer connection's loss logged {consumer_lost:?} after SIGSTOP, past the heartbeat's bound"
    );
    let ready_after = ready_after.expect("ready again within 60 s of SIGCONT");
    assert!(
        off_then_on,
        "readiness off then on: {:?}",
        readiness.changes()
    );
    resumed_after.expect("100 more messages handled within 60 s of SIGCONT");

    assert!(
        tokio::time::timeout(SECS(180), publishing).await.is_ok(),
        "the publisher finished its {N} messages: {:?}",
        published.events.lock().unwrap()
    );
    let confirmed = published.confirmed.lock().unwrap().clone();
    let all_handled = eventually(SECS(60), || async {
        let h = handled.counts.lock().unwrap();
        confirmed.iter().all(|n| h.contains_key(n))
    })
    .await;
    let report = tokio::time::timeout(SECS(30), running.drain())
        .await
        .expect("the drain returns");
    let emptied = eventually(SECS(10), || async {
        counts(&q).await.is_some_and(|c| c.messages == 0)
    })
    .await;
    let h = handled.counts.lock().unwrap().clone();
    let missing: Vec<u64> = confirmed
        .iter()
        .filter(|n| !h.contains_key(n))
        .copied()
        .collect();
    let duplicates: u32 = h.values().map(|c| c - 1).sum();
    let mut twice: Vec<u64> = h.iter().filter(|(_, c)| **c > 1).map(|(n, _)| *n).collect();
    twice.sort_unstable();
    let queue_end = counts(&q).await;
    eprintln!(
        "frozen node: sent {}, confirmed {}, handled {} distinct, missing {}, duplicates {duplicates} {twice:?}; \
         ready again {ready_after:?} after SIGCONT; publisher: {:?}; drain: {report:?}; queue at the end {queue_end:?}",
        published.sent.load(Ordering::Relaxed),
        confirmed.len(),
        h.len(),
        missing.len(),
        published.events.lock().unwrap(),
    );
    assert!(
        all_handled && missing.is_empty(),
        "{} confirmed message(s) never handled, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(
        duplicates <= u32::from(PREFETCH),
        "{duplicates} duplicate(s), more than the prefetch ({PREFETCH}) for one lost connection"
    );
    assert!(emptied, "nothing left in {q}: {:?}", counts(&q).await);
    drop(node);
}

/// The guard's promise, checked on a process of the test's own (no node
/// needed, so it runs in the main suite): a test that fails while it has
/// a process frozen leaves it running.
#[test]
fn a_frozen_process_runs_again_when_the_test_that_froze_it_panics() {
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep starts");
    let pid = child.id();
    let failed = std::panic::catch_unwind(|| {
        let _frozen = Frozen::stop(pid, "sleep 60");
        assert_eq!(crate::freeze::state(pid), Some('T'), "stopped");
        panic!("the test fails while the process is frozen");
    });
    assert!(failed.is_err());
    // SIGCONT was sent when the guard dropped; the kernel shows it soon.
    let end = Instant::now() + SECS(5);
    let mut running = crate::freeze::state(pid);
    while running == Some('T') && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
        running = crate::freeze::state(pid);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        matches!(running, Some(s) if s != 'T'),
        "running again after the panic: state {running:?}"
    );
}

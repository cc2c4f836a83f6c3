//! Nodes lost under load: a quorum queue with dead-lettering and
//! a quorum rung, declared on the cluster; a steady confirmed publisher on
//! its own connection through all three addresses; the consumer on another
//! node than the queue's leader. Then, in turn: the consumer's node killed
//! (`kill -9`) and restarted; the leader's node killed while messages wait
//! on the rung, and restarted; a drain while the consumer's node is lost.
//! At the end every confirmed message is handled or in `Q.dlq`, and the
//! duplicates stay within what was prefetched at each kill.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::config::{QueueConfig, QueueType, RetriesConfig};
use acemq::connection::{connect_any, ConnectOptions};
use acemq::{App, BoxError, Config, Delivery, Health, Running};
use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Confirmation};
use tokio_util::sync::CancellationToken;
use tower::service_fn;

use crate::support::{
    addr, all_running, connection_node, dlx_backlog, dlx_backlog_count, eventually, kill9, leader,
    members_in_sync, message_number, messages, node_name, restart_queue_leader_process, Cluster,
    ReadinessLog, NODES,
};

const SECS: fn(u64) -> Duration = Duration::from_secs;
const PREFETCH: u16 = 20;
const CONCURRENCY: usize = 4;
/// Every tenth message fails once and waits 2 s on the quorum rung.
const RETRY_EVERY: u64 = 10;

/// Successful calls per message number, and calls that failed on purpose.
#[derive(Default)]
struct Handled {
    ok: Mutex<BTreeMap<u64, u32>>,
    failed_once: Mutex<BTreeSet<u64>>,
}

impl Handled {
    fn distinct(&self) -> usize {
        self.ok.lock().unwrap().len()
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
            tokio::time::sleep(Duration::from_millis(2)).await;
            if n.is_multiple_of(RETRY_EVERY) && handled.failed_once.lock().unwrap().insert(n) {
                return Err::<(), BoxError>("transient: wait on the rung".into());
            }
            *handled.ok.lock().unwrap().entry(n).or_default() += 1;
            Ok(())
        }
    })
}

fn config(q: &str) -> Config {
    let mut queue = QueueConfig::new(q);
    queue.kind = QueueType::Quorum;
    queue.prefetch = PREFETCH;
    queue.concurrency = CONCURRENCY;
    queue.dead_letter = true;
    queue.retries = Some({
        let mut r = RetriesConfig::new(5, SECS(2), SECS(2));
        r.broker_wait_threshold = SECS(1);
        r
    });
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    config.connect_timeout = SECS(5);
    config
}

/// What the steady publisher got confirmed, and what it sent.
#[derive(Default)]
struct Published {
    confirmed: Mutex<BTreeSet<u64>>,
    sent: Mutex<u64>,
    connections: Mutex<Vec<String>>,
    /// What happened to the publisher, with the time since it started.
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

/// Publishes `m-<n>` to `queue` about every 10 ms through any of the three
/// addresses (shuffled), awaiting each confirm (15 s at most: an
/// unconfirmed message is not counted); reconnects, to any node, when its
/// node is lost or a publish is nacked.
async fn steady_publisher(queue: String, out: Arc<Published>, stop: CancellationToken) {
    let addresses: Vec<String> = (0..NODES.len()).map(addr).collect();
    let t0 = Instant::now();
    let mut n = 0u64;
    while !stop.is_cancelled() {
        let c = match connect_any(
            &addresses,
            "acemq-cluster-test-publisher",
            SECS(5),
            &ConnectOptions::default(),
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
        out.connections.lock().unwrap().push(c.address.clone());
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
            *out.sent.lock().unwrap() += 1;
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
                Ok(Ok(other)) => {
                    // A nack: this node cannot take the message now (after
                    // a leader's loss, 3.10.8 nacked every publish on such
                    // a channel for a minute). Publish elsewhere.
                    out.event(t0, format!("m-{} not confirmed: {other:?}", n - 1));
                    break;
                }
                Ok(Err(e)) => {
                    out.event(t0, format!("m-{} failed: {e}", n - 1));
                    break;
                }
                Err(_) => {
                    out.event(t0, format!("m-{}: no confirm within 15 s", n - 1));
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = tokio::time::timeout(SECS(2), conn.close(200, "OK".into())).await;
    }
}

/// Starts the App consuming `q` through `addrs` (comma-separated).
async fn start_app(
    q: &str,
    addrs: &[usize],
    name: &str,
    handled: Arc<Handled>,
) -> (Running, Health) {
    let list: Vec<String> = addrs.iter().map(|&i| addr(i)).collect();
    let app = App::new(config(q))
        .amqp_addr(list.join(","))
        .connection_name(name)
        .consume(q, handler(handled));
    let health = app.health();
    let running = app.start().await.expect("starts on the cluster");
    (running, health)
}

/// One kill's figures (printed with `Debug`): how long readiness was off,
/// when the first new message was handled after the kill, when 100 more
/// were, and when the restarted node had rejoined.
#[allow(dead_code)]
#[derive(Debug)]
struct Loss {
    what: &'static str,
    node: String,
    not_ready_for: Option<Duration>,
    first_handled_after: Duration,
    resumed_after: Duration,
    rejoined_after: Option<Duration>,
}

/// Waits until `n` more messages are handled than at `before`; the time it
/// took, or a failure naming what was seen.
async fn resumes(handled: &Handled, before: usize, n: usize, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    eventually(within, || async { handled.distinct() >= before + n })
        .await
        .then(|| t0.elapsed())
}

fn not_ready_span(log: &ReadinessLog, from: Duration) -> Option<Duration> {
    let c = log.changes();
    let off = c.iter().find(|(t, r)| *t >= from && !r)?.0;
    let on = c.iter().find(|(t, r)| *t > off && *r)?.0;
    Some(on - off)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a local three-node cluster: cargo test -p acemq --test cluster -- --ignored --test-threads=1 (.ci/run)"]
async fn nodes_killed_under_load_lose_no_confirmed_message_and_consuming_resumes_on_another_node_each_time(
) {
    let cluster = Cluster::up();
    let q = format!("acemq-cluster-test.orders.{}", std::process::id());
    let dlq = format!("{q}.dlq");
    let rung = format!("{q}.retry.2s");
    let handled = Arc::new(Handled::default());
    let all = [0usize, 1, 2];

    // Declared through node 1 only: the queue, its rung and its dead-letter
    // queue are led from there (client-local leader placement).
    let (declarer, _) = start_app(&q, &[0], "acemq-cluster-test-declare", handled.clone()).await;
    declarer
        .drain()
        .await
        .expect("a clean drain of the declaring app");
    let first_leader = leader(&all, &q).await;
    eprintln!(
        "declared {q} ({:?} leads it), {rung} ({:?}), {dlq}",
        first_leader.map(node_name),
        leader(&all, &rung).await.map(node_name)
    );
    assert_eq!(first_leader, Some(0), "the queue is led by node 1");

    // The consumer on node 2 or 3; the publisher anywhere.
    let app_name = format!("acemq-cluster-test-app-{}", std::process::id());
    let (running, health) = start_app(&q, &[1, 2], &app_name, handled.clone()).await;
    let readiness = ReadinessLog::start(health.clone());
    let published = Arc::new(Published::default());
    let stop = CancellationToken::new();
    let publisher = tokio::spawn(steady_publisher(q.clone(), published.clone(), stop.clone()));
    assert!(
        resumes(&handled, 0, 200, SECS(60)).await.is_some(),
        "steady state: 200 handled"
    );
    let mut losses = Vec::new();

    // 1. The consumer's node dies.
    let consumer_node = connection_node(&all, &app_name)
        .await
        .expect("the app's connection is on a node");
    assert_ne!(consumer_node, 0, "the consumer is on node 2 or 3");
    let before = handled.distinct();
    let t_kill = readiness.elapsed();
    kill9(consumer_node).await;
    let t0 = Instant::now();
    let alive: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| i != consumer_node)
        .collect();
    let first = resumes(&handled, before, 1, SECS(60)).await;
    let resumed = resumes(&handled, before, 100, SECS(60))
        .await
        .map(|_| t0.elapsed());
    let now_on = connection_node(&alive, &app_name).await;
    eprintln!(
        "consumer's node {} killed: resumed after {resumed:?} on {:?}; readiness {:?}; publisher: {:?}",
        node_name(consumer_node),
        now_on.map(node_name),
        readiness.changes(),
        published.events.lock().unwrap()
    );
    let resumed = resumed.expect("consuming resumed on another node within 60 s");
    assert!(
        eventually(SECS(10), || async { health.is_ready() }).await,
        "ready again"
    );
    // The log samples every few ms: a bounded moment to see the "on".
    assert!(
        eventually(SECS(2), || async { readiness.off_then_on_after(t_kill) }).await,
        "readiness off then on: {:?}",
        readiness.changes()
    );
    // Restarted under load, it rejoins.
    let t_start = Instant::now();
    cluster.start(consumer_node).await;
    let rejoined = eventually(SECS(60), || async { all_running(0).await })
        .await
        .then(|| t_start.elapsed());
    assert!(rejoined.is_some(), "{} rejoined", node_name(consumer_node));
    losses.push(Loss {
        what: "consumer's node",
        node: node_name(consumer_node),
        not_ready_for: not_ready_span(&readiness, t_kill),
        first_handled_after: first.expect("a first message handled"),
        resumed_after: resumed,
        rejoined_after: rejoined,
    });

    // The restarted node's members catch up before the next kill.
    let t_sync = Instant::now();
    for name in [&q, &rung, &dlq] {
        assert!(
            eventually(SECS(60), || async {
                members_in_sync(&all, name, 200).await
            })
            .await,
            "{name}'s members caught up after {} rejoined",
            node_name(consumer_node)
        );
    }
    eprintln!("members in sync {:?} after the rejoin", t_sync.elapsed());

    // 2. The queue's leader dies, with messages waiting on its quorum rung.
    let lead = leader(&all, &q).await.expect("the queue has a leader");
    let consumer_node = connection_node(&all, &app_name).await;
    assert!(
        eventually(SECS(10), || async {
            messages(&all, &rung).await.is_some_and(|m| m > 0)
        })
        .await,
        "messages wait on {rung}"
    );
    let on_rung = messages(&all, &rung).await;
    let before = handled.distinct();
    let t_kill = readiness.elapsed();
    kill9(lead).await;
    let alive: Vec<usize> = all.iter().copied().filter(|&i| i != lead).collect();
    let t0 = Instant::now();
    let mut new_leader = None;
    while t0.elapsed() < SECS(30) {
        new_leader = leader(&alive, &q).await.filter(|l| *l != lead);
        if new_leader.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elected_after = t0.elapsed();
    let first = if handled.distinct() > before {
        Some(elected_after) // at most: it happened during the election wait
    } else {
        resumes(&handled, before, 1, SECS(60))
            .await
            .map(|d| d + elected_after)
    };
    let resumed = resumes(&handled, before, 100, SECS(60))
        .await
        .map(|_| t0.elapsed());
    eprintln!(
        "leader {} killed ({on_rung:?} on the rung, consumer on {:?}): new leader {:?} after {elected_after:?}; \
         resumed after {resumed:?}; readiness {:?}; handled {} (was {before}), confirmed {}; publisher: {:?}; health {:?}",
        node_name(lead),
        consumer_node.map(node_name),
        new_leader.map(node_name),
        readiness.changes(),
        handled.distinct(),
        published.confirmed.lock().unwrap().len(),
        published.events.lock().unwrap(),
        health.snapshot()
    );
    assert!(new_leader.is_some(), "a new leader was elected");
    let resumed = resumed.expect("consuming resumed after the leader's loss within 60 s");
    let t_start = Instant::now();
    cluster.start(lead).await;
    let rejoined = eventually(SECS(60), || async { all_running(alive[0]).await })
        .await
        .then(|| t_start.elapsed());
    assert!(rejoined.is_some(), "{} rejoined", node_name(lead));
    losses.push(Loss {
        what: "queue leader's node",
        node: node_name(lead),
        not_ready_for: not_ready_span(&readiness, t_kill),
        first_handled_after: first.expect("a first message handled"),
        resumed_after: resumed,
        rejoined_after: rejoined,
    });
    assert!(
        eventually(SECS(20), || async { health.is_ready() }).await,
        "ready after the leader's loss: {:?}",
        health.snapshot()
    );

    for name in [&q, &rung, &dlq] {
        assert!(
            eventually(SECS(60), || async {
                members_in_sync(&all, name, 200).await
            })
            .await,
            "{name}'s members caught up after {} rejoined",
            node_name(lead)
        );
    }

    // 3. A drain while the consumer's node is lost stays within its deadline.
    let consumer_node = connection_node(&all, &app_name)
        .await
        .expect("the app's connection is on a node");
    kill9(consumer_node).await;
    let t0 = Instant::now();
    let report = tokio::time::timeout(SECS(40), running.drain()).await;
    let drain_took = t0.elapsed();
    eprintln!(
        "drain with {} lost: {drain_took:?}, {report:?}",
        node_name(consumer_node)
    );
    assert!(report.is_ok(), "the drain returned");
    let deadline = config(&q).shutdown_timeout + config(&q).abandon_after;
    assert!(
        drain_took < deadline + SECS(5),
        "the drain took {drain_took:?}, beyond its deadline {deadline:?} (+5 s)"
    );
    cluster.start(consumer_node).await;
    assert!(
        eventually(SECS(60), || async { all_running(0).await }).await,
        "{} rejoined",
        node_name(consumer_node)
    );

    // The publisher stops; a second app takes what is left.
    stop.cancel();
    publisher.await.expect("publisher task");
    let (second, _) = start_app(&q, &all, "acemq-cluster-test-second", handled.clone()).await;
    let confirmed = published.confirmed.lock().unwrap().clone();
    let every_confirmed_handled = || async {
        let ok = handled.ok.lock().unwrap();
        confirmed.iter().all(|n| ok.contains_key(n))
    };
    let mut all_handled = eventually(SECS(45), every_confirmed_handled).await;
    // RabbitMQ 3.10.8: after leader changes, a quorum rung's at-least-once
    // dead-letter worker can stall with expired messages in its backlog
    // (kept, not forwarded). Seen, counted and worked around the way an
    // operator would, so the rest of the accounting still runs.
    let mut stalled_on_rung = None;
    if !all_handled {
        if let Some(n) = dlx_backlog_count(&all, &rung).await.filter(|n| *n > 0) {
            let restarted = restart_queue_leader_process(&all, &rung).await;
            eprintln!(
                "{rung}: {n} expired message(s) stalled in its dead-letter backlog; \
                 restarted its leader's Ra process ({restarted:?})"
            );
            stalled_on_rung = Some(n);
            all_handled = eventually(SECS(45), every_confirmed_handled).await;
        }
    }
    // Then until the queue and its rung are empty, so that the copies still
    // on their way (duplicates) are counted too.
    let emptied = eventually(SECS(30), || async {
        messages(&all, &q).await == Some(0) && messages(&all, &rung).await == Some(0)
    })
    .await;
    let _ = second.drain().await;
    let backlog = format!(
        "{rung}: {:?} messages, dead-letter backlog {}; {q}: {:?} messages",
        messages(&all, &rung).await,
        dlx_backlog(&all, &rung).await,
        messages(&all, &q).await
    );

    // Accounting: handled, or in Q.dlq.
    let mut in_dlq = BTreeSet::new();
    if let Ok(c) = connect_any(
        &all.iter().map(|&i| addr(i)).collect::<Vec<_>>(),
        "acemq-cluster-test-dlq",
        SECS(5),
        &ConnectOptions::default(),
    )
    .await
    {
        let ch = c.connection.create_channel().await.expect("channel");
        while let Ok(Some(m)) = ch
            .basic_get(dlq.as_str().into(), BasicGetOptions { no_ack: true })
            .await
        {
            if let Some(n) = std::str::from_utf8(&m.delivery.data)
                .ok()
                .and_then(|s| s.strip_prefix("m-"))
                .and_then(|s| s.parse::<u64>().ok())
            {
                in_dlq.insert(n);
            }
        }
        for name in [&q, &dlq, &rung] {
            let _ = ch
                .queue_delete(name.as_str().into(), Default::default())
                .await;
        }
        let _ = c.connection.close(200, "OK".into()).await;
    }
    let ok = handled.ok.lock().unwrap().clone();
    let lost: Vec<u64> = confirmed
        .iter()
        .filter(|n| !ok.contains_key(n) && !in_dlq.contains(n))
        .copied()
        .collect();
    let duplicates: u32 = ok.values().map(|c| c - 1).sum();
    let retried = handled.failed_once.lock().unwrap().len();
    eprintln!("cluster figures:");
    eprintln!("  at the end: {backlog}; emptied: {emptied}; stalled on the rung until its leader's Ra process was restarted: {stalled_on_rung:?}");
    for l in &losses {
        eprintln!("  {l:?}");
    }
    eprintln!(
        "  sent {}, confirmed {}, handled {} distinct, retried via the rung {retried}, in {dlq} {}, \
         lost {}, duplicates {duplicates}; drain during a node loss {drain_took:?}; publisher connected to {:?}",
        published.sent.lock().unwrap(),
        confirmed.len(),
        ok.len(),
        in_dlq.len(),
        lost.len(),
        published.connections.lock().unwrap()
    );
    assert!(
        all_handled || lost.is_empty(),
        "{} confirmed message(s) neither handled nor dead-lettered, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    assert!(lost.is_empty(), "lost: {lost:?}");
    let bound = 3 * (u32::from(PREFETCH) + CONCURRENCY as u32);
    assert!(
        duplicates <= bound,
        "{duplicates} duplicates over three kills, more than 3 × (prefetch + concurrency) = {bound}"
    );
    drop(cluster);
}

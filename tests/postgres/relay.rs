//! The relay in process: rollback, commit, unroutable, two relays, broker
//! down, stop with rows pending, batches in flight, a crash mid-way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::layers::PublishError;
use acemq::outbox::{
    Outbox, OutboxMessage, OutboxPublish, OutboxRecord, Relay, RelayConfig, StandalonePublisher,
};
use acemq::topology::Topology;
use acemq::Publisher;

use crate::proxy::Proxy;
use crate::support::{addr, unique, wait_until, Broker, TestDb};

const BOUND: Duration = Duration::from_secs(30);

fn fast() -> RelayConfig {
    RelayConfig::new()
        .poll_interval(Duration::from_millis(20))
        .retry(Duration::from_millis(50), Duration::from_millis(300))
}

#[test]
fn a_relay_config_is_built_outside_the_crate_with_a_setter_per_field() {
    let c = RelayConfig::new()
        .batch_size(7)
        .poll_interval(Duration::from_millis(1))
        .retry(Duration::from_millis(2), Duration::from_millis(3))
        .publish_timeout(Duration::from_millis(4))
        .retention(Duration::from_millis(5))
        .cleanup_interval(Duration::from_millis(6));
    assert_eq!(c.batch_size, 7);
    assert_eq!(
        [
            c.poll_interval,
            c.retry_initial,
            c.retry_max,
            c.publish_timeout,
            c.retention,
            c.cleanup_interval
        ],
        [1, 2, 3, 4, 5, 6].map(Duration::from_millis)
    );
    let d = RelayConfig::new();
    assert_eq!(
        (d.batch_size, d.publish_timeout),
        (200, Duration::from_secs(30)),
        "new() is the defaults"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_enqueue_publishes_nothing_and_a_committed_one_is_published_once_confirmed_and_marked_sent(
) {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("commit");
    broker.declare(&q).await;

    let mut client = db.pool.get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let rolled_back = Outbox::enqueue(&tx, &OutboxMessage::to_queue(q.as_str(), "no"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let committed = Outbox::enqueue(
        &tx,
        &OutboxMessage::to_queue(q.as_str(), "yes")
            .message_id("m-committed")
            .header("x-tenant", "t1"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    drop(client);
    assert_eq!(committed, "m-committed");
    assert_ne!(rolled_back, committed);

    // Through `Publisher`, as App's relay would.
    let publisher = Publisher::new(broker.conn.clone(), Topology::default())
        .await
        .unwrap();
    let relay = Relay::new(db.pool.clone(), publisher)
        .config(fast())
        .spawn();
    wait_until("the committed row marked sent", BOUND, || async {
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await
            == 1
    })
    .await;
    let stats = relay.stop().await;
    assert_eq!(stats.published, 1);
    assert_eq!(stats.failed, 0);
    assert_eq!(db.count("SELECT count(*) FROM acemq_outbox").await, 1);
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox WHERE sent_at IS NOT NULL")
            .await,
        1
    );
    assert_eq!(broker.take_all(&q).await, vec!["m-committed".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_row_is_marked_failed_with_the_reason_counted_and_not_retried() {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("unroutable");
    broker.declare(&q).await;
    let missing = unique("no-such-queue");
    db.enqueue(&missing, 1).await;

    let relay = Relay::new(
        db.pool.clone(),
        StandalonePublisher::new(addr(), "acemq-test-relay-unroutable"),
    )
    .config(fast())
    .spawn();
    wait_until("the unroutable row marked failed", BOUND, || async {
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'failed'")
            .await
            == 1
    })
    .await;
    // Later batches run (a routable row goes through) and leave it failed.
    db.enqueue(&q, 1).await;
    wait_until("the routable row sent", BOUND, || async {
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await
            == 1
    })
    .await;
    let stats = relay.stop().await;
    assert_eq!((stats.published, stats.failed), (1, 1));
    let client = db.pool.get().await.unwrap();
    let row = client
        .query_one(
            "SELECT status, error FROM acemq_outbox WHERE routing_key = $1",
            &[&missing],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "failed");
    let error: String = row.get(1);
    assert!(
        error.contains("unroutable") && error.contains(&missing),
        "{error}"
    );
    assert_eq!(broker.take_all(&q).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_table_publish_ten_thousand_rows_each_at_least_once_without_duplicates() {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("two-relays");
    broker.declare(&q).await;
    let ids = db.enqueue(&q, 10_000).await;

    let mut config = fast();
    config.batch_size = 100;
    let a = Relay::new(
        db.pool.clone(),
        StandalonePublisher::new(addr(), "acemq-test-relay-a"),
    )
    .config(config.clone())
    .spawn();
    let b = Relay::new(
        db.pool.clone(),
        StandalonePublisher::new(addr(), "acemq-test-relay-b"),
    )
    .config(config)
    .spawn();
    wait_until("10,000 rows sent", Duration::from_secs(120), || async {
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await
            == 10_000
    })
    .await;
    let (sa, sb) = (a.stop().await, b.stop().await);
    let got = broker.take_all(&q).await;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for id in &got {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    let missing = ids
        .iter()
        .filter(|id| !seen.contains_key(id.as_str()))
        .count();
    let duplicates = got.len() - seen.len();
    eprintln!(
        "two relays: relay a published {}, relay b {}; broker held {} messages, {} distinct, {} duplicates, {} missing",
        sa.published,
        sb.published,
        got.len(),
        seen.len(),
        duplicates,
        missing
    );
    assert_eq!(missing, 0, "every row published at least once");
    assert_eq!(duplicates, 0, "SKIP LOCKED: no row published twice");
    assert_eq!(sa.published + sb.published, 10_000);
    assert!(
        sa.published > 0 && sb.published > 0,
        "both relays took part: {sa:?} {sb:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_committed_while_the_broker_is_unreachable_are_published_when_it_returns_none_lost() {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("outage");
    broker.declare(&q).await;
    let proxy = Proxy::start().await;
    proxy.cut();
    let relay = Relay::new(
        db.pool.clone(),
        StandalonePublisher::new(proxy.amqp_addr(), "acemq-test-relay-outage"),
    )
    .config(fast())
    .spawn();
    let ids = db.enqueue(&q, 50).await;
    wait_until(
        "two failed batches while the broker is cut off",
        BOUND,
        || async { relay.stats().failed_batches >= 2 },
    )
    .await;
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'pending'")
            .await,
        50,
        "the rows wait"
    );
    proxy.restore();
    wait_until("50 rows sent after the broker returned", BOUND, || async {
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await
            == 50
    })
    .await;
    let stats = relay.stop().await;
    let mut got = broker.take_all(&q).await;
    got.sort();
    let mut want = ids;
    want.sort();
    eprintln!(
        "broker outage: {} failed batches, then {} published",
        stats.failed_batches, stats.published
    );
    assert_eq!(got, want, "every row once, none lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_relay_leaves_unpublished_rows_pending_and_the_next_start_publishes_them() {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("stop");
    broker.declare(&q).await;
    let proxy = Proxy::start().await;
    proxy.cut();
    let publisher = Arc::new(StandalonePublisher::new(
        proxy.amqp_addr(),
        "acemq-test-relay-stop",
    ));
    let relay = Relay::new(db.pool.clone(), publisher.clone())
        .config(fast())
        .spawn();
    db.enqueue(&q, 20).await;
    wait_until("a failed batch", BOUND, || async {
        relay.stats().failed_batches >= 1
    })
    .await;
    let stats = tokio::time::timeout(Duration::from_secs(10), relay.stop())
        .await
        .expect("stop returns while the broker is unreachable");
    assert_eq!(stats.published, 0);
    proxy.restore();
    // Stopped: nothing publishes them, though the broker is back.
    db.enqueue(&q, 5).await;
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'pending'")
            .await,
        25
    );
    assert_eq!(broker.ready(&q).await, 0);
    let relay = Relay::new(db.pool.clone(), publisher)
        .config(fast())
        .spawn();
    wait_until("25 rows sent by the next start", BOUND, || async {
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await
            == 25
    })
    .await;
    relay.stop().await;
    assert_eq!(broker.take_all(&q).await.len(), 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_deletes_sent_rows_past_the_retention_and_keeps_failed_ones() {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("cleanup");
    broker.declare(&q).await;
    db.enqueue(&q, 3).await;
    db.enqueue(&unique("no-such-queue"), 1).await;
    let mut config = fast();
    config.retention = Duration::ZERO;
    config.cleanup_interval = Duration::from_millis(50);
    let relay = Relay::new(
        db.pool.clone(),
        StandalonePublisher::new(addr(), "acemq-test-relay-cleanup"),
    )
    .config(config)
    .spawn();
    wait_until("sent rows cleaned up", BOUND, || async {
        relay.stats().cleaned == 3
    })
    .await;
    relay.stop().await;
    assert_eq!(db.count("SELECT count(*) FROM acemq_outbox").await, 1);
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'failed'")
            .await,
        1
    );
    assert_eq!(broker.take_all(&q).await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_runs_the_relay_on_its_publishing_connection_and_stops_it_first_in_the_drain() {
    use acemq::config::QueueConfig;
    use acemq::{App, BoxError, Config, Delivery};

    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("app-relay");
    broker.own(&q);
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let config = Config::new(vec![QueueConfig::new(q.clone())]);
    let running = App::new(config)
        .amqp_addr(addr())
        .outbox(db.pool.clone(), fast())
        .consume(
            &q,
            tower::service_fn(move |_d: Delivery| {
                let h = h.clone();
                async move {
                    h.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), BoxError>(())
                }
            }),
        )
        .start()
        .await
        .expect("starts");
    // Committed rows are published by the App's relay and consumed.
    db.enqueue(&q, 20).await;
    wait_until(
        "20 rows published, marked sent and handled",
        BOUND,
        || async {
            handled.load(Ordering::SeqCst) == 20
                && db
                    .count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
                    .await
                    == 20
        },
    )
    .await;
    // The drain stops the relay first: rows committed after it began wait.
    let report = running.drain().await.expect("a clean drain");
    db.enqueue(&q, 5).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'pending'")
            .await,
        5,
        "no relay after the drain: {report:?}"
    );
}

/// A publisher whose publishes wait at a gate the test opens; counts the
/// publishes started and finished, and the most under way at once.
struct Gated {
    inner: StandalonePublisher,
    open: tokio::sync::watch::Receiver<bool>,
    started: AtomicUsize,
    finished: AtomicUsize,
    under_way: AtomicUsize,
    most: AtomicUsize,
}

impl Gated {
    fn new(name: &str) -> (Arc<Gated>, tokio::sync::watch::Sender<bool>) {
        let (gate, open) = tokio::sync::watch::channel(false);
        let gated = Arc::new(Gated {
            inner: StandalonePublisher::new(addr(), name),
            open,
            started: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            under_way: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        });
        (gated, gate)
    }
}

impl OutboxPublish for Gated {
    async fn publish(&self, record: &OutboxRecord) -> Result<(), PublishError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let now = self.under_way.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let mut open = self.open.clone();
        let _ = open.wait_for(|o| *o).await;
        let result = self.inner.publish(record).await;
        self.under_way.fetch_sub(1, Ordering::SeqCst);
        self.finished.fetch_add(1, Ordering::SeqCst);
        result
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_claimed_ahead_while_one_publishes_publishing_stays_one_batch_at_a_time_and_stop_releases_the_claimed_ones(
) {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("overlap");
    broker.declare(&q).await;
    let ids = db.enqueue(&q, 40).await;
    let (gated, gate) = Gated::new("acemq-test-relay-overlap");
    let mut config = fast();
    config.batch_size = 10;
    let relay = Relay::new(db.pool.clone(), gated.clone())
        .config(config.clone())
        .spawn();
    // The first batch's publishes wait at the gate; two more batches claim
    // their rows meanwhile, and wait for their turn to publish; no fourth.
    wait_until(
        "two batches claimed ahead while the first publishes",
        BOUND,
        || async { gated.started.load(Ordering::SeqCst) == 10 && relay.stats().in_flight == 30 },
    )
    .await;
    assert_eq!(
        gated.started.load(Ordering::SeqCst),
        10,
        "the batches claimed ahead wait for the first to finish publishing"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'pending'")
            .await,
        40
    );
    // Stop while three are in flight: the publishing batch finishes and is
    // marked; those claimed ahead are released unpublished.
    let stop = relay.stop();
    tokio::pin!(stop);
    assert!(
        futures::poll!(&mut stop).is_pending(),
        "the first batch is still at the gate"
    );
    gate.send_replace(true);
    let stats = tokio::time::timeout(BOUND, stop)
        .await
        .expect("stop returns once the publishing batch is marked");
    assert_eq!((stats.published, stats.in_flight), (10, 0), "{stats:?}");
    assert_eq!(
        gated.started.load(Ordering::SeqCst),
        10,
        "the released batches published nothing"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'pending'")
            .await,
        30
    );
    assert_eq!(broker.ready(&q).await, 10);

    // The next start publishes the released rows; at most one batch
    // publishes at a time throughout.
    let relay = Relay::new(db.pool.clone(), gated.clone())
        .config(config)
        .spawn();
    wait_until("the 40 rows sent", BOUND, || async {
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await
            == 40
    })
    .await;
    let stats = relay.stop().await;
    assert_eq!((stats.published, stats.in_flight), (30, 0), "{stats:?}");
    assert!(
        gated.most.load(Ordering::SeqCst) <= 10,
        "publishes under way at once: {} (one batch of 10 at a time)",
        gated.most.load(Ordering::SeqCst)
    );
    let mut got = broker.take_all(&q).await;
    got.sort();
    let mut want = ids;
    want.sort();
    assert_eq!(got, want, "every row once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_marks_cannot_commit_at_most_two_batches_are_published_the_third_waits() {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("marks-held");
    broker.declare(&q).await;
    let ids = db.enqueue(&q, 40).await;
    // A SHARE lock on the table: the relay's claims (row locks) go
    // through, its marks (UPDATE) wait for the lock.
    let mut holder = db.pool.get().await.unwrap();
    let lock = holder.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE acemq_outbox IN SHARE MODE")
        .await
        .unwrap();
    let (gated, gate) = Gated::new("acemq-test-relay-marks-held");
    gate.send_replace(true);
    let mut config = fast();
    config.batch_size = 10;
    config.cleanup_interval = Duration::from_secs(3600);
    let relay = Relay::new(db.pool.clone(), gated.clone())
        .config(config)
        .spawn();
    wait_until(
        "two batches published (confirmed) and a third claimed, nothing marked",
        BOUND,
        || async { gated.finished.load(Ordering::SeqCst) == 20 && relay.stats().in_flight == 30 },
    )
    .await;
    assert_eq!(
        gated.started.load(Ordering::SeqCst),
        20,
        "the third batch waits for the first's mark before publishing"
    );
    lock.rollback().await.unwrap();
    drop(holder);
    wait_until("the 40 rows sent", BOUND, || async {
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await
            == 40
    })
    .await;
    let stats = relay.stop().await;
    assert_eq!(stats.published, 40, "{stats:?}");
    let mut got = broker.take_all(&q).await;
    got.sort();
    let mut want = ids;
    want.sort();
    assert_eq!(got, want, "every row once");
}

/// A publisher that crashes the relay (a panic in its task, every open
/// transaction dropped) once `at` publishes were confirmed: the relay
/// killed after confirms and before their marks, with batches in flight.
struct Crashing {
    inner: StandalonePublisher,
    at: usize,
    confirmed: AtomicUsize,
}

impl OutboxPublish for Crashing {
    async fn publish(&self, record: &OutboxRecord) -> Result<(), PublishError> {
        let result = self.inner.publish(record).await;
        if result.is_ok() && self.confirmed.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
            panic!(
                "the relay crashes here (test hook), after {} confirms",
                self.at
            );
        }
        result
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_crashing_with_batches_in_flight_loses_nothing_and_its_next_start_publishes_at_most_two_batches_again(
) {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("crash");
    broker.declare(&q).await;
    let batch = 50;
    let ids = db.enqueue(&q, 400).await;
    let mut config = fast();
    config.batch_size = batch;
    // Mid-way through the fourth batch's publishes.
    let crashing = Arc::new(Crashing {
        inner: StandalonePublisher::new(addr(), "acemq-test-relay-crash"),
        at: 3 * batch + batch / 2,
        confirmed: AtomicUsize::new(0),
    });
    let relay = Relay::new(db.pool.clone(), crashing.clone())
        .config(config.clone())
        .spawn();
    wait_until("the crash", BOUND, || async {
        crashing.confirmed.load(Ordering::SeqCst) >= crashing.at
    })
    .await;
    let crashed = tokio::time::timeout(BOUND, relay.stop())
        .await
        .expect("the crashed relay's handle stops");
    assert!(crashed.published < 400, "crashed mid-way: {crashed:?}");

    let relay = Relay::new(
        db.pool.clone(),
        StandalonePublisher::new(addr(), "acemq-test-relay-after-crash"),
    )
    .config(config)
    .spawn();
    wait_until("the 400 rows sent after the restart", BOUND, || async {
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await
            == 400
    })
    .await;
    relay.stop().await;
    let got = broker.take_all(&q).await;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for id in &got {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    let missing = ids
        .iter()
        .filter(|id| !seen.contains_key(id.as_str()))
        .count();
    let duplicates = got.len() - seen.len();
    eprintln!(
        "relay crash after {} confirms ({} rows marked by then): {} messages, {} distinct, {duplicates} duplicates, {missing} missing",
        crashing.at,
        crashed.published,
        got.len(),
        seen.len()
    );
    assert_eq!(missing, 0, "every row published at least once");
    assert!(
        duplicates <= 2 * batch,
        "{duplicates} duplicates: more than two batches published and not marked"
    );
    // Batches publish one at a time: the crash came with half of the fourth
    // batch confirmed and none of it marked.
    assert!(
        duplicates >= batch / 2,
        "{duplicates} duplicates: the confirmed, unmarked rows were published again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_publishes_every_row_committed_before_it_without_the_poll_interval_then_stops() {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("finish");
    broker.declare(&q).await;
    let publisher = Publisher::new(broker.conn.clone(), Topology::default())
        .await
        .unwrap();
    // A long poll interval: an empty first look makes the relay wait 60 s,
    // which `finish` does not.
    let relay = Relay::new(db.pool.clone(), publisher)
        .config(
            RelayConfig::new()
                .batch_size(10)
                .poll_interval(Duration::from_secs(60))
                .cleanup_interval(Duration::from_secs(3600)),
        )
        .spawn();
    // Committed after the relay looked (and found nothing): 3.5 batches.
    tokio::time::sleep(Duration::from_millis(300)).await;
    db.enqueue(&q, 35).await;
    let t0 = std::time::Instant::now();
    let stats = tokio::time::timeout(BOUND, relay.finish())
        .await
        .expect("finish ends");
    let took = t0.elapsed();
    assert_eq!(stats.published, 35, "every committed row, in four batches");
    assert!(
        took < Duration::from_secs(20),
        "not the poll interval: {took:?}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await,
        35
    );
    assert_eq!(broker.take_all(&q).await.len(), 35);
    eprintln!("finish published 35 rows in {took:?}");
}

//! A consumer the broker cancels while its channel stays open (a deleted
//! queue here; RabbitMQ 4.3's consumer timeout does the same): its
//! unsettled deliveries are the broker's again, so the old consumer's
//! running handlers are cancelled through their tokens and their outcomes
//! are dropped. acemq consumes the queue again on a new channel while those
//! handlers still run; no outcome of theirs settles anything — least of all
//! a stale delivery tag on the new consumer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::config::{QueueConfig, QueueType};
use acemq::{App, BoxError, Config, Delivery};
use lapin::types::FieldTable;
use tokio::sync::Semaphore;
use tower::service_fn;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::{
    eventually, list_connections, queue_counts, topology_queues, unique, Broker, CapturedLogs,
    QueueCleanup,
};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The channels the consumers' connection named `name` has open.
async fn channels_of(name: &str) -> Option<u32> {
    let listing = list_connections(&["client_properties", "channels"]).await;
    listing
        .lines()
        .find(|l| l.contains(&format!("\"{name}\"")))
        .and_then(|l| l.rsplit('\t').next())
        .and_then(|n| n.trim().parse().ok())
}

async fn old_handlers_never_settle_on_the_new_consumer(kind: QueueType) {
    let logs = CapturedLogs::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
    let q = unique("cancelled.open");
    let mut queue = QueueConfig::new(&q);
    queue.kind = kind;
    queue.dead_letter = true;
    queue.prefetch = 8;
    queue.concurrency = 8;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    // The old handlers ignore their tokens: not abandoned within the test.
    config.abandon_after = SECS(60);
    config.host_timeout = SECS(120);
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let mut broker = Broker::new().await;

    // Bodies "old-*" wait for `old`, "new-*" for `new`; then both ack.
    let old = Arc::new(Semaphore::new(0));
    let new = Arc::new(Semaphore::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let handled = Arc::new(Mutex::new(Vec::<String>::new()));
    // Old handlers that found their token cancelled when let through.
    let old_cancelled = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (old, new, started, handled, old_cancelled) = (
            old.clone(),
            new.clone(),
            started.clone(),
            handled.clone(),
            old_cancelled.clone(),
        );
        service_fn(move |d: Delivery| {
            let (old, new, started, handled, old_cancelled) = (
                old.clone(),
                new.clone(),
                started.clone(),
                handled.clone(),
                old_cancelled.clone(),
            );
            async move {
                let body = String::from_utf8_lossy(d.body()).into_owned();
                started.fetch_add(1, Ordering::SeqCst);
                let is_old = body.starts_with("old");
                let gate = if is_old { old } else { new };
                // Ignores its token while it waits (abandon_after is long
                // here): what a late outcome does is the question.
                gate.acquire().await.expect("open").forget();
                if is_old && d.token().is_cancelled() {
                    old_cancelled.fetch_add(1, Ordering::SeqCst);
                }
                handled.lock().unwrap().push(body);
                Ok::<(), BoxError>(())
            }
        })
    };
    let name = format!("acemq-test-{q}");
    let app = App::new(config)
        .connection_name(name.clone())
        .consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts");

    for i in 0..4 {
        broker
            .publish(&q, format!("old-{i}").as_bytes(), FieldTable::default())
            .await;
    }
    assert!(
        eventually(SECS(10), || async { started.load(Ordering::SeqCst) == 4 }).await,
        "the old consumer's four handlers run"
    );
    assert_eq!(channels_of(&name).await, Some(1), "one consumer channel");

    // The broker cancels the consumer; its channel stays open while its
    // handlers run, and acemq consumes the queue again on a new one.
    broker.delete(std::slice::from_ref(&q)).await;
    assert!(
        eventually(SECS(15), || async {
            broker_consumers(&q).await == Some(1) && health.is_ready()
        })
        .await,
        "consumed again"
    );
    assert_eq!(
        channels_of(&name).await,
        Some(2),
        "the old channel is still open beside the new one"
    );
    for i in 0..4 {
        broker
            .publish(&q, format!("new-{i}").as_bytes(), FieldTable::default())
            .await;
    }
    assert!(
        eventually(SECS(10), || async { started.load(Ordering::SeqCst) == 8 }).await,
        "the new consumer's four handlers run beside the old ones"
    );

    // The old handlers finish, cancelled: their outcomes (tags 1–4) are
    // dropped. The new consumer's deliveries carry tags 1–4 too, on their
    // channel.
    old.add_permits(4);
    assert!(
        eventually(SECS(10), || async { channels_of(&name).await == Some(1) }).await,
        "the old generation's handlers ended and it closed its channel"
    );
    assert_eq!(
        old_cancelled.load(Ordering::SeqCst),
        4,
        "the old handlers were cancelled: their deliveries were the broker's again"
    );
    // Waited for: a quorum queue's counts in `list_queues` lag on 4.0 (it
    // said 0 unacknowledged for deliveries its consumer had just received).
    // The new handlers are still held, so 4 is reached only if no stale
    // tag settled their deliveries.
    assert!(
        eventually(SECS(10), || async {
            queue_counts(&q).await == Some((0, 4))
        })
        .await,
        "the new consumer's four deliveries are still unacknowledged: no stale tag settled them \
         ({:?})",
        queue_counts(&q).await
    );

    new.add_permits(4);
    assert!(
        eventually(SECS(10), || async { handled.lock().unwrap().len() == 8 }).await,
        "the new handlers finish"
    );
    running.drain().await.expect("a clean drain");
    let mut news: Vec<String> = handled
        .lock()
        .unwrap()
        .iter()
        .filter(|b| b.starts_with("new"))
        .cloned()
        .collect();
    news.sort();
    assert_eq!(
        news,
        ["new-0", "new-1", "new-2", "new-3"],
        "each handled once"
    );
    assert_eq!(broker.ready(&q).await, Some(0));
    // A quorum queue's counts in `list_queues` lag a little on 4.0.
    assert!(
        eventually(SECS(10), || async {
            queue_counts(&q).await == Some((0, 0))
        })
        .await,
        "all settled: {:?}",
        queue_counts(&q).await
    );
    let closed: Vec<_> = logs
        .acemq_at_least(tracing::Level::WARN)
        .into_iter()
        .filter(|(_, _, t)| t.contains("closed this queue's channel"))
        .collect();
    assert!(
        closed.is_empty(),
        "no channel closed by a settle: {closed:#?}"
    );
}

async fn broker_consumers(q: &str) -> Option<u32> {
    Broker::new().await.consumers(q).await
}

// current_thread: the runner's tasks log to this thread's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_classic_queue_deleted_under_running_handlers_their_outcomes_never_settle_on_the_new_consumer(
) {
    old_handlers_never_settle_on_the_new_consumer(QueueType::Classic).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_quorum_queue_deleted_under_running_handlers_their_outcomes_never_settle_on_the_new_consumer(
) {
    old_handlers_never_settle_on_the_new_consumer(QueueType::Quorum).await;
}

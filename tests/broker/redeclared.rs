//! A queue's dead-letter queue or rung that was deleted and that acemq
//! declares again says so: a WARN naming it (the messages it held are gone).

use std::time::Duration;

use acemq::config::{QueueConfig, RetriesConfig};
use acemq::{App, BoxError, Config, Delivery};
use tower::service_fn;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::{eventually, topology_queues, unique, Broker, CapturedLogs, QueueCleanup};

// current_thread: the runner's tasks log to this thread's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_deleted_dead_letter_queue_and_rung_declared_again_are_named_in_a_warn() {
    let logs = CapturedLogs::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
    let q = unique("redeclared");
    let mut queue = QueueConfig::new(&q);
    queue.dead_letter = true;
    let mut retries = RetriesConfig::new(3, Duration::from_millis(200), Duration::from_millis(400));
    retries.broker_wait_threshold = Duration::from_millis(200);
    queue.retries = Some(retries);
    let config = Config::new([queue]);
    let queues = topology_queues(&config);
    let _cleanup = QueueCleanup::new(queues.clone());
    let dlq = format!("{q}.dlq");
    let rung = queues
        .iter()
        .find(|n| n.contains(".retry."))
        .expect("a rung")
        .clone();
    let mut broker = Broker::new().await;
    let running = App::new(config)
        .consume(
            &q,
            service_fn(|_: Delivery| async { Ok::<(), BoxError>(()) }),
        )
        .start()
        .await
        .expect("starts");
    let health = running.health();
    assert!(
        logs.acemq_at_least(tracing::Level::WARN)
            .iter()
            .all(|(_, _, text)| !text.contains("declared again")),
        "nothing was missing at start"
    );

    // An operator deletes the dead-letter queue and a rung, then the work
    // queue (the broker cancels its consumer: acemq declares them again).
    broker.delete(&[dlq.clone(), rung.clone(), q.clone()]).await;
    let named = |name: &str| {
        logs.acemq_at_least(tracing::Level::WARN)
            .iter()
            .any(|(_, _, text)| {
                text.contains("declared again") && text.contains(&format!("queue=\"{name}\""))
            })
    };
    let every = || [&dlq, &rung, &q].iter().all(|n| named(n));
    assert!(
        eventually(Duration::from_secs(15), || async {
            health.is_ready() && every()
        })
        .await,
        "a WARN names each queue declared again: {:#?}",
        logs.acemq_at_least(tracing::Level::WARN)
    );
    let noise: Vec<_> = logs
        .acemq_at_least(tracing::Level::WARN)
        .into_iter()
        .filter(|(_, _, text)| text.contains("connection error"))
        .collect();
    assert!(
        noise.is_empty(),
        "the look for a missing queue is no connection error: {noise:#?}"
    );
    for name in [&dlq, &rung] {
        assert!(broker.ready(name).await.is_some(), "{name} is back");
    }
    running.drain().await.expect("clean drain");
}

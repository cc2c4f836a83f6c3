//! Batch consumption against the real broker: each delivery of a batch
//! keeps its own outcome and is settled exactly once (checked with the
//! broker's counts), a partial batch runs after `max_wait`, a drain hands
//! back the batches not started and waits for the running one, and
//! `prefetch` is checked against `max_size × concurrency`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::batch::Batch;
use acemq::config::{QueueConfig, RetriesConfig};
use acemq::{App, BoxError, Config, Reject, StartError};

use crate::support::{
    all_queues, eventually, message_headers, queue_counts, unique, Broker, QueueCleanup,
};

/// One call of the batch handler: the bodies with their attempt and
/// `redelivered` flag, and when it began.
#[derive(Clone, Debug)]
struct Call {
    at: Instant,
    members: Vec<(String, u32, bool)>,
}

type Calls = Arc<Mutex<Vec<Call>>>;

fn record(calls: &Calls, batch: &Batch) {
    let members = batch
        .iter()
        .map(|d| {
            (
                String::from_utf8_lossy(d.body()).into_owned(),
                d.attempt(),
                d.redelivered(),
            )
        })
        .collect();
    calls.lock().unwrap().push(Call {
        at: Instant::now(),
        members,
    });
}

fn calls_of(calls: &Calls) -> Vec<Call> {
    calls.lock().unwrap().clone()
}

fn batch_queue(q: &str, prefetch: u16, concurrency: usize) -> QueueConfig {
    let mut queue = QueueConfig::new(q);
    queue.prefetch = prefetch;
    queue.concurrency = concurrency;
    queue.dead_letter = true;
    queue
}

async fn publish_bodies(broker: &mut Broker, q: &str, bodies: &[&str]) {
    let bodies: Vec<Vec<u8>> = bodies.iter().map(|b| b.as_bytes().to_vec()).collect();
    broker
        .publish_many(q, &bodies, lapin::BasicProperties::default())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_mixed_outcomes_settles_each_delivery_exactly_once_and_retries_the_transient_one_as_a_batch_of_one(
) {
    let q = unique("batch-mixed");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let mut queue = batch_queue(&q, 20, 1);
    // A transient failure waits 200 ms in process, then tries again.
    let mut retries = RetriesConfig::new(3, Duration::from_millis(200), Duration::from_millis(200));
    retries.broker_wait_threshold = Duration::from_secs(10);
    queue.retries = Some(retries);
    let config = Config::new([queue]);
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let handler = tower::service_fn(move |batch: Batch| {
        record(&seen, &batch);
        async move {
            let outcomes: Vec<Result<(), BoxError>> = batch
                .iter()
                .map(|d| match (&d.body()[..], d.attempt()) {
                    (b"bad", _) => Err(Reject::new("bad row").into()),
                    (b"flaky", 1) => Err("the database blinked".into()),
                    _ => Ok(()),
                })
                .collect();
            Ok::<_, BoxError>(outcomes)
        }
    });
    let running = App::new(config)
        .consume_batch(&q, 10, Duration::from_millis(300), handler)
        .start()
        .await
        .expect("starts");

    let mut bodies: Vec<String> = (0..8).map(|i| format!("ok-{i}")).collect();
    bodies.insert(3, "bad".into());
    bodies.insert(6, "flaky".into());
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    publish_bodies(&mut broker, &q, &refs).await;

    let dlq = format!("{q}.dlq");
    assert!(
        eventually(Duration::from_secs(15), || async {
            queue_counts(&q).await == Some((0, 0)) && queue_counts(&dlq).await == Some((1, 0))
        })
        .await,
        "the queue is empty and settled, one message in the DLQ: {:?} / {:?}; calls {:?}",
        queue_counts(&q).await,
        queue_counts(&dlq).await,
        calls_of(&calls)
    );
    let report = running.drain().await.expect("a clean drain");
    assert_eq!(report.handed_back(), 0, "{report:?}");

    let calls = calls_of(&calls);
    // First attempts: every message once, in batches; then the flaky one
    // alone, at attempt 2.
    let mut first: BTreeMap<String, usize> = BTreeMap::new();
    for c in &calls {
        for (body, attempt, redelivered) in &c.members {
            assert!(!redelivered, "no redelivery: {calls:?}");
            if *attempt == 1 {
                *first.entry(body.clone()).or_default() += 1;
            }
        }
    }
    assert_eq!(first.len(), 10, "every message handled: {calls:?}");
    assert!(
        first.values().all(|n| *n == 1),
        "each message in exactly one batch: {first:?}"
    );
    assert!(
        calls.iter().any(|c| c.members.len() > 1),
        "messages were handled in batches: {calls:?}"
    );
    let retried: Vec<&Call> = calls
        .iter()
        .filter(|c| c.members.iter().any(|(_, attempt, _)| *attempt > 1))
        .collect();
    assert_eq!(retried.len(), 1, "one retry: {calls:?}");
    assert_eq!(
        retried[0].members,
        vec![("flaky".to_owned(), 2, false)],
        "the transient failure is retried alone: {calls:?}"
    );

    let msg = broker
        .get_within(&dlq, Duration::from_secs(5))
        .await
        .expect("the rejected message is in the DLQ");
    assert_eq!(msg.data, b"bad");
    let h = message_headers(&msg.properties);
    assert_eq!(
        h.get("x-acemq-reason").and_then(|v| v.as_str()),
        Some("rejected"),
        "{h:?}"
    );
    let error = h.get("x-acemq-error").and_then(|v| v.as_str());
    assert!(
        error.is_some_and(|e| e.contains("bad row")),
        "the reason's text: {error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_batch_runs_once_max_wait_has_passed() {
    let q = unique("batch-wait");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let config = Config::new([batch_queue(&q, 100, 2)]);
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let handler = tower::service_fn(move |batch: Batch| {
        record(&seen, &batch);
        async { Ok::<_, BoxError>(()) }
    });
    let app = App::new(config).consume_batch(&q, 50, Duration::from_millis(400), handler);
    let health = app.health();
    let running = app.start().await.expect("starts");

    let published = Instant::now();
    publish_bodies(&mut broker, &q, &["a", "b", "c"]).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            calls_of(&calls)
                .iter()
                .map(|c| c.members.len())
                .sum::<usize>()
                == 3
        })
        .await,
        "the three messages are handled without a full batch: {:?}",
        calls_of(&calls)
    );
    let calls = calls_of(&calls);
    let first = calls[0].at.duration_since(published);
    assert!(
        first >= Duration::from_millis(300),
        "the batch waited for more (max_wait 400 ms): called after {first:?}"
    );
    assert!(
        first < Duration::from_secs(5),
        "the batch did not wait past max_wait: called after {first:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            queue_counts(&q).await == Some((0, 0))
        })
        .await,
        "every message settled: {:?}",
        queue_counts(&q).await
    );
    running.drain().await.expect("a clean drain");
    let snapshot = health.snapshot().queues[0].clone();
    assert_eq!(snapshot.handled, 3, "{snapshot:?}");
    assert!(
        snapshot.settle_frames < 3,
        "the batch's acknowledgements coalesce (a `multiple` ack): {snapshot:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_for_the_running_batch_and_hands_back_the_batches_not_started() {
    const MESSAGES: usize = 20;
    let q = unique("batch-drain");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let mut config = Config::new([batch_queue(&q, MESSAGES as u16, 1)]);
    config.shutdown_timeout = Duration::from_secs(30);
    let calls: Calls = Arc::default();
    let finished = Arc::new(Mutex::new(0usize));
    let (seen, done) = (calls.clone(), finished.clone());
    let handler = tower::service_fn(move |batch: Batch| {
        record(&seen, &batch);
        let done = done.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            *done.lock().unwrap() += batch.len();
            Ok::<_, BoxError>(())
        }
    });
    let app = App::new(config).consume_batch(&q, 5, Duration::from_millis(200), handler);
    let health = app.health();
    let running = app.start().await.expect("starts");

    let bodies: Vec<String> = (0..MESSAGES).map(|i| format!("m-{i}")).collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    publish_bodies(&mut broker, &q, &refs).await;
    assert!(
        broker.wait_ready(&q, 0, Duration::from_secs(10)).await,
        "the broker sent all {MESSAGES} ahead (prefetch {MESSAGES})"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            !calls_of(&calls).is_empty()
        })
        .await,
        "a batch is running"
    );
    let in_flight = health.snapshot().queues[0].in_flight;
    assert_eq!(
        in_flight, 5,
        "in flight counts the running batch's deliveries"
    );

    let report = running.drain().await.expect("a clean drain");
    let calls = calls_of(&calls);
    assert_eq!(
        calls.len(),
        1,
        "no batch started after the drain: {calls:?}"
    );
    assert_eq!(calls[0].members.len(), 5);
    assert_eq!(*finished.lock().unwrap(), 5, "the running batch finished");
    assert_eq!(report.finished(), 5, "{report:?}");
    assert_eq!(report.handed_back(), MESSAGES - 5, "{report:?}");
    assert!(
        broker
            .wait_ready(&q, (MESSAGES - 5) as u32, Duration::from_secs(5))
            .await,
        "the batches not started are back on the queue: {:?}",
        queue_counts(&q).await
    );
    assert_eq!(
        queue_counts(&q).await,
        Some(((MESSAGES - 5) as u64, 0)),
        "the running batch was acknowledged"
    );
}

#[tokio::test]
async fn a_prefetch_below_max_size_times_concurrency_is_rejected_naming_the_field_and_the_fix() {
    let config = Config::new([batch_queue("batch-invalid", 10, 2)]);
    let handler = tower::service_fn(|_batch: Batch| async { Ok::<_, BoxError>(()) });
    let err = App::new(config)
        .consume_batch("batch-invalid", 10, Duration::from_millis(100), handler)
        .start()
        .await
        .expect_err("prefetch 10 cannot feed 2 batches of 10");
    assert!(matches!(err, StartError::Config(_)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("queues[0].prefetch"), "{message}");
    assert!(message.contains("at least 20"), "{message}");
}

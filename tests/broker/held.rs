//! Held until claimed, against the real broker: deliveries waiting in the
//! user's outer layers (tower's `RateLimit` behind a `Buffer`) are held, not
//! in flight — they take no concurrency permit, are handed back by the
//! drain at once, and are never reported as abandoned handlers.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::config::QueueConfig;
use acemq::drain::DeadlineKind;
use acemq::{App, BoxError, Config, Delivery, Health, QueueStack, Running};
use tower::buffer::BufferLayer;
use tower::limit::RateLimitLayer;

use crate::support::{all_queues, eventually, unique, Broker};

const MESSAGES: usize = 20;

/// What the handler saw: the bodies it started and finished, and how many
/// run now.
#[derive(Default)]
struct Seen {
    started: Mutex<Vec<String>>,
    finished: Mutex<Vec<String>>,
    running: AtomicUsize,
}

impl Seen {
    fn started(&self) -> usize {
        self.started.lock().unwrap().len()
    }
    fn finished(&self) -> Vec<String> {
        self.finished.lock().unwrap().clone()
    }
}

/// An app on `q` (prefetch 20, concurrency 8) whose outer layers let one
/// delivery through per `period` — the documented way to rate-limit.
async fn rate_limited(
    q: &str,
    period: Duration,
    work: Duration,
    seen: Arc<Seen>,
) -> (Running, Health) {
    let mut queue = QueueConfig::new(q);
    queue.prefetch = MESSAGES as u16;
    queue.concurrency = 8;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = Duration::from_secs(30);
    config.abandon_after = Duration::from_secs(5);
    let stack = QueueStack::new()
        .outer(BufferLayer::new(64))
        .outer(RateLimitLayer::new(1, period));
    let handler = tower::service_fn(move |d: Delivery| {
        let seen = seen.clone();
        async move {
            let body = String::from_utf8_lossy(d.body()).into_owned();
            seen.started.lock().unwrap().push(body.clone());
            seen.running.fetch_add(1, Ordering::SeqCst);
            let stopped = tokio::select! {
                () = tokio::time::sleep(work) => false,
                () = d.token().cancelled() => true,
            };
            seen.running.fetch_sub(1, Ordering::SeqCst);
            if stopped {
                return Err::<(), BoxError>("stopped by the drain".into());
            }
            seen.finished.lock().unwrap().push(body);
            Ok(())
        }
    });
    let app = App::new(config).consume_with(q, stack, handler);
    let health = app.health();
    let running = app.start().await.expect("starts");
    (running, health)
}

async fn publish_all(broker: &mut Broker, q: &str) {
    let bodies: Vec<Vec<u8>> = (0..MESSAGES)
        .map(|i| format!("m-{i}").into_bytes())
        .collect();
    broker
        .publish_many(q, &bodies, lapin::BasicProperties::default())
        .await;
}

fn in_flight(health: &Health) -> usize {
    health.snapshot().queues[0].in_flight
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_waiting_in_an_outer_rate_limit_are_held_not_in_flight_and_the_drain_hands_them_back_at_once(
) {
    let q = unique("held-ratelimit");
    let mut broker = Broker::new().await;
    let seen = Arc::new(Seen::default());
    // One start every 400 ms, each handler 100 ms: at most one runs.
    let (running, health) = rate_limited(
        &q,
        Duration::from_millis(400),
        Duration::from_millis(100),
        seen.clone(),
    )
    .await;
    publish_all(&mut broker, &q).await;
    assert!(
        broker.wait_ready(&q, 0, Duration::from_secs(10)).await,
        "the broker sent all {MESSAGES} ahead (prefetch {MESSAGES})"
    );
    assert!(
        eventually(Duration::from_secs(10), || async { seen.started() >= 3 }).await,
        "handlers start at the rate limit's pace"
    );
    // Concurrency 8, but the rate limit lets one run at a time: the rest
    // wait in the Buffer, held. The in-flight count shows running handlers.
    for _ in 0..10 {
        let n = in_flight(&health);
        assert!(
            n <= 1,
            "{n} in flight while at most one handler runs (the rest wait in the outer Buffer, held)"
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
    }

    let started_before = seen.started();
    let report = running.drain().await.expect("a clean drain");
    let started_after = seen.started();
    // The one running (and at most one the Buffer's worker passed on before
    // the hand-back reached it) finish; nothing waiting is waited for.
    assert!(
        started_after <= started_before + 2,
        "the drain waited for held deliveries to pass the rate limit: {started_before} handlers had started before it, {started_after} after"
    );
    let finished = seen.finished();
    let distinct: BTreeSet<&String> = finished.iter().collect();
    assert_eq!(distinct.len(), finished.len(), "no delivery handled twice");
    assert_eq!(
        finished.len() + report.handed_back(),
        MESSAGES,
        "each delivery handled or handed back, exactly once: {report:?}"
    );
    assert!(
        broker
            .wait_ready(
                &q,
                (MESSAGES - finished.len()) as u32,
                Duration::from_secs(5)
            )
            .await,
        "every unhandled message is back on the queue: {:?} ready, {} handled",
        broker.ready(&q).await,
        finished.len()
    );
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_reports_only_running_handlers_and_never_calls_held_deliveries_abandoned() {
    let q = unique("held-hurry");
    let mut broker = Broker::new().await;
    let seen = Arc::new(Seen::default());
    // One start every 1.5 s; each handler runs until the drain's deadline
    // cancels it (it listens).
    let (running, health) = rate_limited(
        &q,
        Duration::from_millis(1500),
        Duration::from_secs(60),
        seen.clone(),
    )
    .await;
    publish_all(&mut broker, &q).await;
    assert!(
        eventually(Duration::from_secs(10), || async { seen.started() >= 2 }).await,
        "two handlers started"
    );
    let started = seen.started();
    assert_eq!(in_flight(&health), started, "in flight = handlers running");

    let timeout = running
        .drain_with(async {})
        .await
        .expect_err("a second signal with handlers running");
    assert_eq!(timeout.kind, DeadlineKind::SecondSignal);
    assert_eq!(
        timeout.in_flight,
        vec![(q.clone(), started)],
        "only the running handlers are in flight: {timeout}"
    );
    assert_eq!(timeout.abandoned, 0, "nothing abandoned: {timeout}");
    assert_eq!(
        seen.started(),
        started,
        "no held delivery reached the handler"
    );
    assert!(seen.finished().is_empty());
    assert!(
        broker
            .wait_ready(&q, MESSAGES as u32, Duration::from_secs(5))
            .await,
        "every message is back on the queue: {:?} ready",
        broker.ready(&q).await
    );
    broker.delete(&all_queues(&q)).await;
}

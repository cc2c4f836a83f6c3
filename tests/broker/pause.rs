//! An operator pause, by queue name: readiness stays on (a paused instance
//! is healthy), and a pause longer than `pause_hand_back_after` gives the
//! held work back to the broker — the consumer is cancelled, so other
//! instances take it and the broker's `consumer_timeout` is never reached —
//! until resume consumes again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::config::QueueConfig;
use acemq::{App, BoxError, Config, Delivery};
use lapin::types::FieldTable;

use crate::support::{all_queues, eventually, queue_counts, unique, Broker, QueueCleanup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_pause_hands_the_held_work_back_and_cancels_the_consumer_until_resume() {
    let q = unique("pause-handback");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let mut queue = QueueConfig::new(q.clone());
    queue.prefetch = 10;
    queue.concurrency = 2;
    let mut config = Config::new([queue]);
    config.pause_hand_back_after = Duration::from_secs(1);
    let app = App::new(config).consume(
        &q,
        tower::service_fn(move |_d: Delivery| {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                Ok::<(), BoxError>(())
            }
        }),
    );
    let health = app.health();
    let running = app.start().await.expect("starts");
    health.pause(&q).expect("the queue is consumed here");
    assert!(health.is_paused(&q).unwrap());
    for _ in 0..5 {
        broker.publish(&q, b"order", FieldTable::default()).await;
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            health.snapshot().queues[0].held > 0
        })
        .await,
        "deliveries are held at the gate: {:?}",
        health.snapshot()
    );
    assert!(health.is_ready(), "a paused instance stays ready");
    assert!(health.snapshot().queues[0].paused);
    // Past the bound: all five back in the broker, no consumer on the queue.
    let t0 = Instant::now();
    let mut back = false;
    while t0.elapsed() < Duration::from_secs(10) {
        if queue_counts(&q).await == Some((5, 0)) && broker.consumers(&q).await == Some(0) {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        back,
        "after pause_hand_back_after the work is back in the broker and the consumer cancelled: {:?} (ready, unacked), {:?} consumers",
        queue_counts(&q).await,
        broker.consumers(&q).await
    );
    assert_eq!(
        handled.load(Ordering::SeqCst),
        0,
        "nothing was handled while paused"
    );
    assert_eq!(health.snapshot().queues[0].held, 0);
    assert!(health.is_ready(), "still ready while parked");

    health.resume(&q).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            handled.load(Ordering::SeqCst) == 5
        })
        .await,
        "resume consumes again: {} handled",
        handled.load(Ordering::SeqCst)
    );
    running.drain().await.expect("a clean drain");
    broker.delete(&all_queues(&q)).await;
}

/// The `acemq_handler_duration` summary's `_sum` and `_count` for `queue`
/// in a Prometheus rendering.
fn duration_sum_and_count(text: &str, queue: &str) -> (f64, u64) {
    let value = |suffix: &str| {
        let prefix = format!("acemq_handler_duration_{suffix}{{queue=\"{queue}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{prefix} in:\n{text}"))
            .trim()
            .to_owned()
    };
    (
        value("sum").parse().expect("a number"),
        value("count").parse().expect("a number"),
    )
}

#[test]
fn the_handler_duration_leaves_out_the_time_a_delivery_was_held_at_the_paused_gate() {
    // A recorder of this test's own: the runner's tasks run on this
    // current-thread runtime, inside `with_local_recorder`.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let render = recorder.handle();
    let q = unique("pause-duration");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    const HELD: Duration = Duration::from_millis(1200);
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(async {
                let mut broker = Broker::new().await;
                let app = App::new(Config::new([QueueConfig::new(q.clone())])).consume(
                    &q,
                    tower::service_fn(|_d: Delivery| async { Ok::<(), BoxError>(()) }),
                );
                let health = app.health();
                let running = app.start().await.expect("starts");
                health.pause(&q).expect("the queue is consumed here");
                broker.publish(&q, b"order", FieldTable::default()).await;
                assert!(
                    eventually(Duration::from_secs(5), || async {
                        health.snapshot().queues[0].held == 1
                    })
                    .await,
                    "the delivery is held at the gate: {:?}",
                    health.snapshot()
                );
                tokio::time::sleep(HELD).await;
                health.resume(&q).unwrap();
                assert!(
                    eventually(Duration::from_secs(5), || async {
                        health.snapshot().queues[0].handled == 1
                    })
                    .await,
                    "handled once resumed: {:?}",
                    health.snapshot()
                );
                running.drain().await.expect("a clean drain");
            });
    });
    let (sum, count) = duration_sum_and_count(&render.render(), &q);
    assert_eq!(count, 1, "one delivery timed");
    assert!(
        sum < HELD.as_secs_f64() / 4.0,
        "a fast handler held {HELD:?} at the gate is timed from its release: {sum} s"
    );
}

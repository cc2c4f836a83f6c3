use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::Delivery;
use lapin::types::FieldTable;
use tower::ServiceBuilder;

use crate::support::{
    all_queues, eventually, plain_config, start_consuming, unique, Broker, QueueCleanup,
};

#[tokio::test]
async fn a_delivery_goes_through_a_service_builder_stack_and_is_acknowledged() {
    let q = unique("roundtrip");
    let mut broker = Broker::new().await;
    let config = plain_config(&q);
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let handler = ServiceBuilder::new()
        .concurrency_limit(4)
        .service_fn(move |d: Delivery| {
            let s = s.clone();
            async move {
                assert_eq!(&d.body()[..], b"hello");
                s.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(())
            }
        });
    let running = start_consuming(config, &q, handler).await;
    for _ in 0..5 {
        broker.publish(&q, b"hello", FieldTable::default()).await;
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            seen.load(Ordering::SeqCst) == 5
        })
        .await
    );
    let report = running.drain().await.expect("clean drain");
    assert_eq!(report.handed_back(), 0);
    assert!(
        broker.wait_ready(&q, 0, Duration::from_secs(5)).await,
        "every delivery acknowledged"
    );
    broker.delete(&all_queues(&q)).await;
}

/// 1,000 deliveries waiting, prefetch 100 × 8 handlers: with coalescing on
/// (the default, runs of `min(50, prefetch / 2)`) they are settled in a few
/// dozen frames — never more than 50 to a frame, and not one per lull of the
/// loop — and with `ack_batch: 0` in exactly one frame each. The count is
/// the health snapshot's `settle_frames` (also `acemq.settle.frames`).
#[tokio::test]
async fn acknowledgements_coalesce_into_runs_and_ack_batch_0_sends_one_frame_per_delivery() {
    const N: usize = 1_000;
    for (ack_batch, expect) in [("", "coalesced"), ("    ack_batch: 0\n", "one each")] {
        let q = unique("coalesce");
        // Deleted however the test ends.
        let _cleanup = QueueCleanup::new(all_queues(&q));
        let mut broker = Broker::new().await;
        let yaml =
            format!("queues:\n  - name: {q}\n    prefetch: 100\n    concurrency: 8\n{ack_batch}");
        let config = acemq::Config::from_yaml_str(&yaml).expect("config");
        // Declared as the app declares it, and filled before it starts: a
        // backed-up queue, every prefetch window full.
        acemq::topology::Topology::from_config(&config)
            .declare(&broker.conn)
            .await
            .expect("declare");
        let bodies = vec![b"x".to_vec(); N];
        broker
            .publish_many(&q, &bodies, lapin::BasicProperties::default())
            .await;
        let handler = tower::service_fn(|_d: Delivery| async { Ok::<_, std::io::Error>(()) });
        let running = start_consuming(config, &q, handler).await;
        let health = running.health();
        assert!(
            eventually(Duration::from_secs(20), || async {
                health.snapshot().queues[0].handled == N
            })
            .await,
            "all {N} handled"
        );
        running.drain().await.expect("clean drain");
        assert!(
            broker.wait_ready(&q, 0, Duration::from_secs(5)).await,
            "every delivery acknowledged"
        );
        let frames = health.snapshot().queues[0].settle_frames;
        println!("{expect}: {N} deliveries in {frames} settle frames");
        if ack_batch.is_empty() {
            assert!(
                (N / 50..=N / 10).contains(&frames),
                "{N} deliveries settled in {frames} frames: expected between {} (runs of 50) and {}",
                N / 50,
                N / 10
            );
        } else {
            assert_eq!(frames, N, "ack_batch 0: one frame per delivery");
        }
    }
}

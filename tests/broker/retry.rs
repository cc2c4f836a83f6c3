//! Retries against the broker: in process below the threshold, on a rung
//! above it, in process again when the rung is missing, and at volume.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::{BoxError, Delivery};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use tower::service_fn;

use crate::support::{
    eventually, retry_config, start_consuming, start_on_ladder, topology_queues, unique, Broker,
    TestHandler,
};

const MS: fn(u64) -> Duration = Duration::from_millis;

/// What the handler saw of one call.
#[derive(Clone, Debug)]
struct Call {
    attempt: u32,
    delivery_tag: u64,
    attempt_header: Option<i64>,
    has_x_death: bool,
    at: Instant,
}

/// A handler that records each call and fails while `attempt <= fail_until`.
fn fails_until(fail_until: u32, calls: Arc<Mutex<Vec<Call>>>) -> impl TestHandler {
    service_fn(move |d: Delivery| {
        let calls = calls.clone();
        async move {
            calls.lock().unwrap().push(Call {
                attempt: d.attempt(),
                delivery_tag: d.delivery_tag(),
                attempt_header: d.headers().get("x-acemq-attempt").and_then(|v| v.as_i64()),
                has_x_death: d.headers().get("x-death").is_some(),
                at: Instant::now(),
            });
            if d.attempt() <= fail_until {
                return Err::<(), BoxError>(format!("attempt {} fails", d.attempt()).into());
            }
            Ok(())
        }
    })
}

#[tokio::test]
async fn a_handler_failing_twice_waits_in_process_then_on_the_rung_and_succeeds_at_attempt_3() {
    let q = unique("retry.twice");
    let mut broker = Broker::new().await;
    // After attempt 1: 200ms in process; after attempt 2: 400ms on the rung.
    let rung = format!("{q}.retry.400ms");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (running, all) = start_on_ladder(&q, fails_until(2, calls.clone())).await;
    let health = running.health();

    broker.publish(&q, b"order", FieldTable::default()).await;
    // Two trips through the stack: attempts 1-2 (ending on the rung), then 3.
    assert!(
        eventually(Duration::from_secs(10), || async {
            health.snapshot().queues[0].handled == 2
        })
        .await,
        "the delivery was handled: {:?}",
        calls.lock().unwrap()
    );
    let snap = &health.snapshot().queues[0];
    assert_eq!(
        (snap.handled, snap.completed, snap.retried),
        (2, 1, 1),
        "handled counts the rung hop, completed only the one success"
    );
    // `/queues` serialises this snapshot.
    let json = serde_json::to_value(snap).expect("a snapshot is JSON");
    assert_eq!(
        (&json["handled"], &json["completed"]),
        (&2.into(), &1.into()),
        "{json}"
    );
    let snapshot = health.snapshot();
    let report = running.drain().await.expect("clean drain");

    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        [1, 2, 3],
        "{calls:?}"
    );
    // Attempt 2 ran in this process on the same delivery, 200ms later.
    assert_eq!(calls[1].delivery_tag, calls[0].delivery_tag);
    assert!(!calls[1].has_x_death && calls[1].attempt_header.is_none());
    assert!(calls[1].at - calls[0].at >= MS(200), "{calls:?}");
    // Attempt 3 is a new delivery that came back through the 400ms rung.
    assert_ne!(calls[2].delivery_tag, calls[1].delivery_tag);
    assert!(
        calls[2].has_x_death,
        "came back by dead-lettering: {calls:?}"
    );
    assert_eq!(calls[2].attempt_header, Some(3));
    assert!(calls[2].at - calls[1].at >= MS(400), "{calls:?}");
    // One delivery went to a rung; the final one was acknowledged.
    assert_eq!(snapshot.queues[0].retried, 1, "{snapshot:?}");
    assert_eq!(snapshot.queues[0].dead_lettered, 0, "{snapshot:?}");
    assert_eq!(report.handed_back(), 0);
    for name in [&q, &rung, &format!("{q}.dlq")] {
        assert_eq!(broker.ready(name).await, Some(0), "{name} ends empty");
    }
    broker.delete(&all).await;
}

#[tokio::test]
async fn with_its_rung_deleted_a_retry_waits_in_process_instead_and_succeeds() {
    let q = unique("retry.norung");
    let mut broker = Broker::new().await;
    let rung = format!("{q}.retry.400ms");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (running, all) = start_on_ladder(&q, fails_until(2, calls.clone())).await;
    broker.delete(std::slice::from_ref(&rung)).await;
    assert_eq!(broker.ready(&rung).await, None, "the rung is gone");

    broker.publish(&q, b"order", FieldTable::default()).await;
    let health = running.health();
    assert!(
        eventually(Duration::from_secs(10), || async {
            health.snapshot().queues[0].handled == 1
        })
        .await,
        "the delivery was handled: {:?}",
        calls.lock().unwrap()
    );
    let snapshot = health.snapshot();
    running.drain().await.expect("clean drain");

    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        [1, 2, 3],
        "{calls:?}"
    );
    // Every attempt ran on the one delivery: no hop through the broker.
    assert!(
        calls
            .iter()
            .all(|c| c.delivery_tag == calls[0].delivery_tag && !c.has_x_death),
        "{calls:?}"
    );
    assert!(
        calls[2].at - calls[1].at >= MS(400),
        "waited the rung's delay: {calls:?}"
    );
    assert_eq!(snapshot.queues[0].retried, 0, "nothing went to a rung");
    assert_eq!(snapshot.queues[0].dead_lettered, 0);
    assert!(snapshot.ready, "{snapshot:?}");
    assert_eq!(broker.ready(&q).await, Some(0), "acknowledged");
    assert_eq!(broker.ready(&format!("{q}.dlq")).await, Some(0));
    assert_eq!(
        broker.ready(&rung).await,
        None,
        "the rung was not re-created"
    );
    broker.delete(&all).await;
}

#[tokio::test]
async fn a_thousand_deliveries_that_fail_once_are_all_handled_at_attempt_2_each_settled_once() {
    const N: usize = 1000;
    let q = unique("retry.volume");
    let mut broker = Broker::new().await;
    // Every wait is in process (20 ms, threshold 10 s): no rung is used.
    let mut config = retry_config(
        &q,
        3,
        MS(20),
        Duration::from_secs(10),
        Duration::from_secs(1),
    );
    config.queues[0].prefetch = 50;
    config.queues[0].concurrency = 8;
    let all = topology_queues(&config);
    assert_eq!(all.len(), 2, "no rungs: {all:?}");

    let first = Arc::new(AtomicUsize::new(0));
    let redelivered = Arc::new(AtomicUsize::new(0));
    let other = Arc::new(AtomicUsize::new(0));
    let second: Arc<Mutex<HashMap<Vec<u8>, usize>>> = Arc::default();
    let handler = {
        let (first, redelivered, other, second) = (
            first.clone(),
            redelivered.clone(),
            other.clone(),
            second.clone(),
        );
        service_fn(move |d: Delivery| {
            let (first, redelivered, other, second) = (
                first.clone(),
                redelivered.clone(),
                other.clone(),
                second.clone(),
            );
            async move {
                if d.redelivered() {
                    redelivered.fetch_add(1, Ordering::SeqCst);
                }
                match d.attempt() {
                    1 => {
                        first.fetch_add(1, Ordering::SeqCst);
                        Err::<(), BoxError>("the first attempt always fails".into())
                    }
                    2 => {
                        *second.lock().unwrap().entry(d.body().to_vec()).or_default() += 1;
                        Ok(())
                    }
                    _ => {
                        other.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }
                }
            }
        })
    };
    let running = start_consuming(config, &q, handler).await;
    let health = running.health();

    let bodies: Vec<Vec<u8>> = (0..N).map(|i| format!("m{i}").into_bytes()).collect();
    broker
        .publish_many(&q, &bodies, BasicProperties::default())
        .await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            health.snapshot().queues[0].handled == N
        })
        .await,
        "all handled: {:?}",
        health.snapshot()
    );
    // The consumer's channel is still open (a second settle of a tag would
    // have closed it with 406), and nothing is left in the queue.
    let snapshot = health.snapshot();
    assert!(snapshot.ready, "{snapshot:?}");
    assert!(snapshot.queues[0].consuming, "{snapshot:?}");
    assert_eq!(snapshot.queues[0].in_flight, 0, "{snapshot:?}");
    assert!(broker.wait_ready(&q, 0, Duration::from_secs(5)).await);
    assert_eq!(broker.consumers(&q).await, Some(1), "consumer alive");

    let report = running.drain().await.expect("clean drain");
    assert_eq!(report.handed_back(), 0);
    // Anything left unacknowledged would be back in the queue now.
    assert_eq!(broker.ready(&q).await, Some(0), "nothing left unacked");
    assert_eq!(broker.ready(&format!("{q}.dlq")).await, Some(0));

    assert_eq!(first.load(Ordering::SeqCst), N);
    assert_eq!(other.load(Ordering::SeqCst), 0, "no attempt beyond 2");
    assert_eq!(redelivered.load(Ordering::SeqCst), 0, "no redelivery");
    {
        let second = second.lock().unwrap();
        assert_eq!(second.len(), N, "every message reached attempt 2");
        assert!(second.values().all(|&n| n == 1), "each exactly once");
    }
    broker.delete(&all).await;
}

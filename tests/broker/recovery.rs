//! A queue deleted while it is consumed: the broker cancels the consumer
//! (and a publish to it is unroutable). The runner must declare the queue's
//! topology again and consume it within seconds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::config::QueueConfig;
use acemq::{App, BoxError, Config, Delivery};
use lapin::types::FieldTable;
use tower::service_fn;

use crate::support::{eventually, unique, Broker, QueueCleanup};

const SECS: fn(u64) -> Duration = Duration::from_secs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_while_consumed_is_declared_again_and_consumed_within_seconds() {
    let q = unique("recover-deleted");
    let dlq = format!("{q}.dlq");
    let _cleanup = QueueCleanup::new(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    let handled = Arc::new(AtomicUsize::new(0));
    let handler = {
        let handled = handled.clone();
        service_fn(move |_d: Delivery| {
            let handled = handled.clone();
            async move {
                handled.fetch_add(1, Ordering::SeqCst);
                Ok::<(), BoxError>(())
            }
        })
    };
    let mut queue = QueueConfig::new(&q);
    queue.dead_letter = true;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    let app = App::new(config)
        .connection_name(format!("acemq-test-{q}"))
        .consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts");
    broker.publish(&q, b"before", FieldTable::default()).await;
    assert!(
        eventually(SECS(10), || async { handled.load(Ordering::SeqCst) == 1 }).await,
        "handled before the queue is deleted"
    );

    broker.delete(std::slice::from_ref(&q)).await;
    let t0 = Instant::now();
    let mut recovered = false;
    while t0.elapsed() < SECS(15) {
        if broker.consumers(&q).await == Some(1) && health.is_ready() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "queue deleted: after {:?}, consumers on {q}: {:?}, ready: {}, {:?}",
        t0.elapsed(),
        broker.consumers(&q).await,
        health.is_ready(),
        health.snapshot()
    );
    assert!(
        recovered,
        "{q} was not declared again and consumed within 15 s of its deletion \
         (consumers: {:?}, ready: {})",
        broker.consumers(&q).await,
        health.is_ready()
    );
    broker.publish(&q, b"after", FieldTable::default()).await;
    assert!(
        eventually(SECS(10), || async { handled.load(Ordering::SeqCst) == 2 }).await,
        "a message published after the recovery is handled"
    );
    running.drain().await.expect("a clean drain");
    assert_eq!(broker.ready(&q).await, Some(0), "all settled");
    broker.delete(&[q.clone(), dlq]).await;
}

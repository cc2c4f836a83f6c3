use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::Delivery;
use lapin::types::FieldTable;
use tower::ServiceBuilder;

use crate::support::{all_queues, eventually, plain_config, start_consuming, unique, Broker};

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

//! Confirming against the real broker: a failure storm under one handler
//! slot, its rung copies' confirms outstanding while the next handlers run,
//! drained half-way (docs/architecture.md, "Held until claimed").

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::{BoxError, Config, Delivery};
use lapin::BasicProperties;

use crate::support::{eventually, start_consuming, topology_queues, unique, Broker, QueueCleanup};

/// One queue, one handler slot, every retry on the 30 s rung.
fn storm_config(q: &str) -> Config {
    let yaml = format!(
        "shutdown_timeout: 20\n\
         queues:\n  \
           - name: {q}\n    \
             prefetch: 100\n    \
             concurrency: 1\n    \
             dead_letter: true\n    \
             retries: {{ max_attempts: 3, initial_delay: 30, max_delay: 30, broker_wait_threshold: 1 }}\n"
    );
    Config::from_yaml_str(&yaml).expect("storm config")
}

/// Takes every message of `queue` (acked), as the bodies read as numbers.
async fn take_all(broker: &mut Broker, queue: &str) -> Vec<usize> {
    let mut out = Vec::new();
    while let Some(m) = broker.get(queue).await {
        let body = std::str::from_utf8(&m.delivery.data).expect("utf-8 body");
        out.push(body.parse().expect("a number"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_during_a_failure_storm_leaves_every_message_once_on_its_rung_or_back_in_its_queue()
{
    const N: usize = 400;
    let q = unique("confirming-storm");
    let config = storm_config(&q);
    let queues = topology_queues(&config);
    let rung = queues
        .iter()
        .find(|name| name.contains(".retry."))
        .expect("a rung")
        .clone();
    let _cleanup = QueueCleanup::new(queues);
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let calls = calls.clone();
        tower::service_fn(move |_d: Delivery| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), BoxError>("the failure storm".into()) }
        })
    };
    let running = start_consuming(config, &q, handler).await;
    let health = running.health();
    let mut broker = Broker::new().await;
    let bodies: Vec<Vec<u8>> = (0..N).map(|i| i.to_string().into_bytes()).collect();
    broker
        .publish_many(
            &q,
            &bodies,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await;

    // The storm is under way, then the drain begins in the middle of it.
    assert!(
        eventually(Duration::from_secs(20), || {
            let calls = calls.clone();
            async move { calls.load(Ordering::SeqCst) >= N / 4 }
        })
        .await,
        "a quarter of the storm was handled within 20 s"
    );
    let report = tokio::time::timeout(Duration::from_secs(30), running.drain())
        .await
        .expect("the drain ends")
        .expect("a clean drain: nothing settled twice, no channel lost");
    assert_eq!(report.lost(), 0, "{report:?}");
    let retried = health.snapshot().queues[0].retried;

    // Each delivery is either on its rung (its original acknowledged once
    // its copy was confirmed) or back in its queue (handed back, or never
    // delivered), once.
    let on_rung = take_all(&mut broker, &rung).await;
    let back = N - on_rung.len();
    assert!(
        broker
            .wait_ready(&q, back as u32, Duration::from_secs(10))
            .await,
        "{back} message(s) back in the queue (ready: {:?})",
        broker.ready(&q).await
    );
    let in_queue = take_all(&mut broker, &q).await;
    let rung_set: BTreeSet<usize> = on_rung.iter().copied().collect();
    let queue_set: BTreeSet<usize> = in_queue.iter().copied().collect();
    assert_eq!(rung_set.len(), on_rung.len(), "a copy published twice");
    assert_eq!(queue_set.len(), in_queue.len(), "a message back twice");
    assert!(
        rung_set.is_disjoint(&queue_set),
        "a message both copied to its rung and back in its queue"
    );
    let all: BTreeSet<usize> = rung_set.union(&queue_set).copied().collect();
    assert_eq!(all, (0..N).collect(), "every message is somewhere, once");
    assert_eq!(
        retried,
        on_rung.len(),
        "every copy on the rung was counted retried once its confirm came"
    );
    assert!(
        !on_rung.is_empty(),
        "the storm sent copies before the drain"
    );
}

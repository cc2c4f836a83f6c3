//! Kill tests: the `outbox` example's relay and consumer, each killed with
//! SIGKILL at its worst moment, then restarted.

use std::time::Duration;

use crate::support::{unique, wait_until, Broker, ExampleProcess, TestDb};

const BOUND: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_between_publish_and_mark_publishes_again_with_the_same_id_and_the_inbox_does_the_work_once(
) {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("kill-relay");
    broker.declare(&q).await;
    broker.own(&format!("{q}.shipped")); // declared by the example's consumer
    let ids = db.enqueue(&q, 1).await;

    // 1. The relay publishes (confirmed), then pauses before marking: killed there.
    let relay = ExampleProcess::spawn(
        &db,
        &["--no-http", "--no-consumer", "--queue", &q],
        &[("ACEMQ_EXAMPLE_PAUSE_AFTER_PUBLISH", "1")],
    );
    let line = relay.wait_line("published ", BOUND).await;
    assert_eq!(line, format!("published {}", ids[0]));
    relay.kill().await;
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'pending'")
            .await,
        1,
        "killed before the mark: the row is still pending"
    );
    wait_until("the confirmed copy in the queue", BOUND, || async {
        broker.ready(&q).await == 1
    })
    .await;

    // 2. Restarted, the relay publishes the row again and marks it.
    let relay = ExampleProcess::spawn(&db, &["--no-http", "--no-consumer", "--queue", &q], &[]);
    wait_until("the row marked sent after the restart", BOUND, || async {
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await
            == 1
    })
    .await;
    let status = relay.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "{status:?}");
    assert_eq!(broker.ready(&q).await, 2, "published twice");

    // 3. The consumer behind the inbox: two deliveries, one shipment.
    let consumer = ExampleProcess::spawn(&db, &["--no-http", "--no-relay", "--queue", &q], &[]);
    wait_until("both copies consumed", BOUND, || async {
        consumer.count("shipped ") + consumer.count("duplicate") == 2
    })
    .await;
    let shipped = consumer.count("shipped ");
    let duplicates = consumer.count("duplicate");
    let status = consumer.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "{status:?}");
    eprintln!(
        "relay kill: 2 copies of message {} in the queue; consumer shipped {shipped}, skipped {duplicates} duplicate(s)",
        ids[0]
    );
    assert_eq!((shipped, duplicates), (1, 1));
    assert_eq!(db.count("SELECT count(*) FROM shipments").await, 1);
    assert_eq!(broker.ready(&q).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_after_its_work_committed_and_before_the_ack_gets_the_redelivery_and_skips_it(
) {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("kill-consumer");
    broker.declare(&q).await;
    broker.own(&format!("{q}.shipped")); // declared by the example's consumer
    broker
        .publish(&q, br#"{"id":"o-7","item":"lamp"}"#, "order-o-7-created")
        .await;

    let consumer = ExampleProcess::spawn(
        &db,
        &["--no-http", "--no-relay", "--queue", &q],
        &[("ACEMQ_EXAMPLE_PAUSE_AFTER_COMMIT", "1")],
    );
    consumer.wait_line("committed", BOUND).await;
    consumer.kill().await;
    assert_eq!(db.count("SELECT count(*) FROM shipments").await, 1);
    wait_until("the unacked delivery back in the queue", BOUND, || async {
        broker.ready(&q).await == 1
    })
    .await;

    let consumer = ExampleProcess::spawn(&db, &["--no-http", "--no-relay", "--queue", &q], &[]);
    consumer.wait_line("duplicate", BOUND).await;
    let status = consumer.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "{status:?}");
    eprintln!("consumer kill: redelivered once, skipped as a duplicate; shipments: 1");
    assert_eq!(
        db.count("SELECT count(*) FROM shipments").await,
        1,
        "work done once"
    );
    assert_eq!(broker.ready(&q).await, 0, "the redelivery was acknowledged");
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox WHERE message_id = 'order-o-7-shipped'")
            .await,
        1,
        "the follow-up committed once, with the work"
    );
}

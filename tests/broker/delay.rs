//! Delayed publishing through TTL bucket queues: the message reaches its
//! exchange with its own routing key, no earlier than its delay.

use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::delay::{bucket_queue, BUCKET_HEADER};
use acemq::topology::Topology;
use acemq::{Properties, PublishError, Publisher};
use lapin::options::{ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions};
use lapin::types::FieldTable;
use lapin::ExchangeKind;

use crate::support::{self, unique, Broker, QueueCleanup};

async fn publisher() -> (Arc<lapin::Connection>, Publisher) {
    let conn = Arc::new(support::connect().await);
    let publisher = Publisher::new(conn.clone(), Topology::default())
        .await
        .expect("a publisher");
    (conn, publisher)
}

async fn topic_exchange(broker: &Broker, name: &str) {
    broker
        .ch
        .exchange_declare(
            name.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("declare the test's exchange");
}

async fn delete_exchange(broker: &Broker, name: &str) {
    let ch = broker.conn.create_channel().await.expect("channel");
    let _ = ch
        .exchange_delete(name.into(), ExchangeDeleteOptions::default())
        .await;
}

#[tokio::test]
async fn a_delayed_message_reaches_its_exchange_with_its_own_routing_key_no_earlier_than_its_delay()
{
    let mut broker = Broker::new().await;
    let exchange = unique("delay-x");
    let queue = unique("delay-target");
    let bucket = bucket_queue(&exchange, Duration::from_secs(2));
    let _cleanup = QueueCleanup::new(vec![queue.clone(), bucket.clone()]);
    topic_exchange(&broker, &exchange).await;
    broker
        .declare(&queue, FieldTable::default())
        .await
        .expect("declare the target queue");
    broker
        .ch
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "orders.*".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");

    let (_conn, publisher) = publisher().await;
    let mut properties = Properties::default();
    properties.message_id = Some("reminder-1".to_owned());
    let sent = Instant::now();
    // 1.5 s rounds up to the 2 s bucket.
    publisher
        .publish_delayed(
            &exchange,
            "orders.reminder",
            b"remind me",
            properties,
            Duration::from_millis(1500),
        )
        .await
        .expect("the bucket accepts the message");
    assert_eq!(
        broker.ready(&queue).await,
        Some(0),
        "nothing reaches the target before the delay"
    );
    assert_eq!(broker.ready(&bucket).await, Some(1), "the bucket holds it");

    let m = broker
        .get_within(&queue, Duration::from_secs(15))
        .await
        .expect("the message arrives after its bucket's TTL");
    let waited = sent.elapsed();
    assert!(
        waited >= Duration::from_millis(1500),
        "arrived after {waited:?}, before its delay"
    );
    assert_eq!(m.delivery.routing_key.as_str(), "orders.reminder");
    assert_eq!(m.delivery.exchange.as_str(), exchange);
    assert_eq!(m.delivery.data, b"remind me");
    assert_eq!(
        m.delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str()),
        Some("reminder-1")
    );
    let headers = support::message_headers(&m.delivery.properties);
    assert_eq!(
        headers.get(BUCKET_HEADER).and_then(|v| v.as_str()),
        Some(bucket.as_str()),
        "the bucket header stays on the message"
    );
    assert_eq!(broker.ready(&bucket).await, Some(0));

    broker.delete(&[queue.clone(), bucket.clone()]).await;
    delete_exchange(&broker, &exchange).await;
}

#[tokio::test]
async fn a_delayed_publish_to_the_default_exchange_reaches_the_queue_named_by_its_routing_key() {
    let mut broker = Broker::new().await;
    let queue = unique("delay-direct");
    // The default exchange's buckets are shared by name: a delay no other
    // test uses, and the bucket is deleted at the end.
    let bucket = bucket_queue("", Duration::from_millis(250));
    let _cleanup = QueueCleanup::new(vec![queue.clone(), bucket.clone()]);
    broker
        .declare(&queue, FieldTable::default())
        .await
        .expect("declare the target queue");
    let (_conn, publisher) = publisher().await;
    let sent = Instant::now();
    publisher
        .publish_delayed(
            "",
            &queue,
            b"soon",
            Properties::default(),
            Duration::from_millis(200),
        )
        .await
        .expect("published");
    let m = broker
        .get_within(&queue, Duration::from_secs(10))
        .await
        .expect("arrives");
    assert!(sent.elapsed() >= Duration::from_millis(200));
    assert_eq!(m.delivery.routing_key.as_str(), queue);
    assert_eq!(m.delivery.data, b"soon");
    broker.delete(&[queue.clone(), bucket.clone()]).await;
}

#[tokio::test]
async fn a_delayed_publish_to_a_missing_exchange_fails_at_once_and_declares_no_bucket() {
    let mut broker = Broker::new().await;
    let exchange = unique("delay-missing");
    let bucket = bucket_queue(&exchange, Duration::from_secs(5));
    let _cleanup = QueueCleanup::new(vec![bucket.clone()]);
    let (_conn, publisher) = publisher().await;
    let e = publisher
        .publish_delayed(
            &exchange,
            "k",
            b"x",
            Properties::default(),
            Duration::from_secs(3),
        )
        .await
        .expect_err("the exchange does not exist");
    let text = e.to_string();
    assert!(
        text.contains(&exchange) && text.contains("declare it"),
        "{text}"
    );
    assert_eq!(broker.ready(&bucket).await, None, "no bucket was declared");

    // A delay beyond the longest bucket and an expiration are refused too,
    // before anything is sent.
    let e = publisher
        .publish_delayed(
            "",
            "q",
            b"x",
            Properties::default(),
            Duration::from_secs(8 * 24 * 3600),
        )
        .await
        .expect_err("too long");
    assert!(e.to_string().contains("7 days"), "{e}");
    let mut with_expiration = Properties::default();
    with_expiration.expiration = Some("1000".to_owned());
    let e = publisher
        .publish_delayed("", "q", b"x", with_expiration, Duration::from_secs(1))
        .await
        .expect_err("expiration refused");
    assert!(matches!(e, PublishError::Transport { .. }), "{e:?}");
    assert!(e.to_string().contains("expiration"), "{e}");
}

#[tokio::test]
async fn a_bucket_deleted_after_first_use_is_declared_again_on_the_next_publish() {
    let mut broker = Broker::new().await;
    let exchange = unique("delay-redeclare");
    let queue = unique("delay-redeclare-target");
    let bucket = bucket_queue(&exchange, Duration::from_secs(1));
    let _cleanup = QueueCleanup::new(vec![queue.clone(), bucket.clone()]);
    topic_exchange(&broker, &exchange).await;
    broker
        .declare(&queue, FieldTable::default())
        .await
        .expect("declare");
    broker
        .ch
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");
    let (_conn, publisher) = publisher().await;
    let delay = Duration::from_millis(800);
    publisher
        .publish_delayed(&exchange, "a", b"1", Properties::default(), delay)
        .await
        .expect("first");
    broker
        .get_within(&queue, Duration::from_secs(10))
        .await
        .expect("first arrives");
    broker.delete(std::slice::from_ref(&bucket)).await;
    publisher
        .publish_delayed(&exchange, "b", b"2", Properties::default(), delay)
        .await
        .expect("the bucket is declared again");
    let m = broker
        .get_within(&queue, Duration::from_secs(10))
        .await
        .expect("second arrives");
    assert_eq!(m.delivery.data, b"2");
    broker.delete(&[queue.clone(), bucket.clone()]).await;
    delete_exchange(&broker, &exchange).await;
}

#[tokio::test]
async fn two_targets_with_the_same_delay_never_receive_each_others_messages_and_a_quorum_deployment_gets_quorum_buckets(
) {
    let mut broker = Broker::new().await;
    let (xa, xb) = (unique("delay-a"), unique("delay-b"));
    let (qa, qb) = (unique("delay-a-target"), unique("delay-b-target"));
    let delay = Duration::from_millis(500);
    let (ba, bb) = (bucket_queue(&xa, delay), bucket_queue(&xb, delay));
    let _cleanup = QueueCleanup::new(vec![qa.clone(), qb.clone(), ba.clone(), bb.clone()]);
    for (x, q) in [(&xa, &qa), (&xb, &qb)] {
        topic_exchange(&broker, x).await;
        broker
            .declare(q, FieldTable::default())
            .await
            .expect("declare");
        broker
            .ch
            .queue_bind(
                q.as_str().into(),
                x.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind");
    }
    // A topology with a quorum queue: the buckets are quorum queues.
    let mut config = support::plain_config(&unique("delay-quorum-marker"));
    config.queues[0].kind = acemq::config::QueueType::Quorum;
    let conn = Arc::new(support::connect().await);
    let publisher = Publisher::new(conn.clone(), Topology::from_config(&config))
        .await
        .expect("a publisher");
    for i in 0..5 {
        for x in [&xa, &xb] {
            let body = format!("{x}/{i}");
            publisher
                .publish_delayed(x, "k", body.as_bytes(), Properties::default(), delay)
                .await
                .expect("published");
        }
    }
    for (x, q) in [(&xa, &qa), (&xb, &qb)] {
        assert!(
            broker.wait_ready(q, 5, Duration::from_secs(15)).await,
            "five messages reach {q}"
        );
        for _ in 0..5 {
            let m = broker.get(q).await.expect("a message");
            let body = String::from_utf8(m.delivery.data).expect("utf-8");
            assert!(body.starts_with(&format!("{x}/")), "{body} reached {q}");
        }
    }
    let out = support::rabbitmqctl()
        .args(["list_queues", "-q", "--no-table-headers", "name", "type"])
        .output()
        .await
        .expect(support::RABBITMQCTL_RUNS);
    let listing = String::from_utf8_lossy(&out.stdout);
    for b in [&ba, &bb] {
        let line = listing
            .lines()
            .find(|l| l.split_whitespace().next() == Some(b.as_str()))
            .unwrap_or_else(|| panic!("{b} is listed:\n{listing}"));
        assert!(line.contains("quorum"), "{line}");
    }
    broker
        .delete(&[qa.clone(), qb.clone(), ba.clone(), bb.clone()])
        .await;
    delete_exchange(&broker, &xa).await;
    delete_exchange(&broker, &xb).await;
}

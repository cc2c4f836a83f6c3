//! `acemq dlq peek`: what it shows, and that every message is back in its
//! place afterwards.

use std::time::Duration;

use acemq::lapin::types::AMQPValue;
use acemq::lapin::BasicProperties;

use crate::support::{acemq, dead_lettered, ids, long_str, table, unique, Broker, Cleanup};

async fn peek_leaves_the_queue_as_it_was(queue_type: &str) {
    let q = unique(&format!("peek.{queue_type}"));
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![dlq.clone()]);
    let mut broker = Broker::new().await;
    broker
        .declare(&dlq, table(vec![("x-queue-type", long_str(queue_type))]))
        .await;
    let reasons = ["rejected", "max-attempts", "rejected", "panic", "rejected"];
    for (i, reason) in reasons.iter().enumerate() {
        let id = format!("m{}", i + 1);
        broker
            .publish(
                &dlq,
                format!("{{\"order\":{i}}}").as_bytes(),
                dead_lettered(&q, reason, 3, &id),
            )
            .await;
    }

    let peek = acemq(&["dlq", "peek", &q, "--limit", "2"]).await;
    assert_eq!(peek.code, Some(0), "{peek}");
    for part in [
        "#1 message id m1, dead-lettered 1m",
        "reason    rejected, after 3 attempts",
        "from      exchange \"shop\", routing key \"orders.m1\"",
        "error     boom: the order has no lines",
        "body      {\"order\":0} (11 bytes)",
        "#2 message id m2",
        "reason    max-attempts, after 3 attempts",
    ] {
        assert!(peek.stdout.contains(part), "{part:?} in\n{peek}");
    }
    assert!(!peek.stdout.contains("message id m3"), "--limit 2: {peek}");
    assert!(
        peek.stdout
            .contains(&format!("2 messages shown of 5 in {dlq}")),
        "{peek}"
    );

    // The first peek's messages are back (a quorum queue applies a closed
    // channel's returns a moment later).
    assert!(broker.wait_ready(&dlq, 5, Duration::from_secs(5)).await);
    // --reason filters; the dead-letter queue's own name works too.
    let rejected = acemq(&["dlq", "peek", &dlq, "--reason", "rejected", "--json"]).await;
    assert_eq!(rejected.code, Some(0), "{rejected}");
    let v = rejected.json();
    let shown: Vec<(&str, i64)> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["message_id"].as_str().unwrap(),
                m["position"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shown, [("m1", 1), ("m3", 3), ("m5", 5)], "{rejected}");
    assert_eq!(v["messages"][0]["attempts"], 3);
    assert_eq!(v["messages"][0]["origin"]["routing_key"], "orders.m1");
    assert_eq!(v["taken"], 5);

    // Every message is still there, in its order.
    assert!(broker.wait_ready(&dlq, 5, Duration::from_secs(5)).await);
    let left = broker.drain(&dlq).await;
    let got: Vec<String> = left
        .iter()
        .map(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        got,
        ["m1", "m2", "m3", "m4", "m5"],
        "{queue_type}: same messages, same order"
    );
    assert!(
        left.iter().all(|m| m.delivery.redelivered),
        "marked redelivered"
    );
}

#[tokio::test]
async fn peek_shows_reason_attempts_origin_and_id_and_leaves_a_classic_queue_as_it_was() {
    peek_leaves_the_queue_as_it_was("classic").await;
}

#[tokio::test]
async fn peek_leaves_a_quorum_queue_in_its_order_and_says_it_counted_a_delivery() {
    peek_leaves_the_queue_as_it_was("quorum").await;
    let q = unique("peek.count");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![dlq.clone()]);
    let mut broker = Broker::new().await;
    broker
        .declare(&dlq, table(vec![("x-queue-type", long_str("quorum"))]))
        .await;
    broker
        .publish(&dlq, b"x", dead_lettered(&q, "panic", 1, "only"))
        .await;
    // Each peek waits for the last one's give-back: a quorum queue applies a
    // closed channel's returns a moment later.
    for _ in 0..2 {
        assert!(broker.wait_ready(&dlq, 1, Duration::from_secs(5)).await);
        let peek = acemq(&["dlq", "peek", &q]).await;
        assert_eq!(peek.code, Some(0), "{peek}");
    }
    assert!(broker.wait_ready(&dlq, 1, Duration::from_secs(5)).await);
    let peek = acemq(&["dlq", "peek", &q, "--json"]).await;
    assert_eq!(
        peek.json()["max_delivery_count"],
        2,
        "each peek counts: {peek}"
    );
    assert!(broker.wait_ready(&dlq, 1, Duration::from_secs(5)).await);
    let text = acemq(&["dlq", "peek", &q]).await;
    assert!(text.stdout.contains("delivery count 3"), "{text}");
    assert!(
        text.stderr.contains("counts deliveries (a quorum queue)"),
        "{text}"
    );
    assert!(broker.wait_ready(&dlq, 1, Duration::from_secs(5)).await);
    assert_eq!(ids(&mut broker, &dlq).await, ["only"]);
}

#[tokio::test]
async fn a_peek_shows_a_message_the_broker_dead_lettered_by_its_x_death() {
    let q = unique("peek.xdeath");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&dlq, table(vec![])).await;
    // The broker's own dead-lettering: a TTL of 1 ms into the DLQ.
    broker
        .declare(
            &q,
            table(vec![
                ("x-message-ttl", AMQPValue::LongLongInt(1)),
                ("x-dead-letter-exchange", long_str("")),
                ("x-dead-letter-routing-key", long_str(&dlq)),
            ]),
        )
        .await;
    broker
        .publish(
            &q,
            b"\x00\x01binary\xff",
            BasicProperties::default().with_message_id("expired".into()),
        )
        .await;
    assert!(broker.wait_ready(&dlq, 1, Duration::from_secs(5)).await);
    let peek = acemq(&["dlq", "peek", &q]).await;
    assert_eq!(peek.code, Some(0), "{peek}");
    for part in [
        "reason    none (the broker dead-lettered it: expired)",
        &format!("from      exchange \"\", routing key \"{q}\""),
        "body      \\u{0}\\u{1}binary\\xff (9 bytes)",
    ] {
        assert!(peek.stdout.contains(part), "{part:?} in\n{peek}");
    }
    assert!(broker.wait_ready(&dlq, 1, Duration::from_secs(5)).await);
    let none = acemq(&["dlq", "peek", &q, "--reason", "none", "--json"]).await;
    assert_eq!(
        none.json()["messages"][0]["broker_reason"],
        "expired",
        "{none}"
    );
}

#[tokio::test]
async fn peeking_at_a_queue_that_is_not_there_exits_65() {
    let q = unique("peek.none");
    let peek = acemq(&["dlq", "peek", &q]).await;
    assert_eq!(peek.code, Some(65), "{peek}");
    assert!(
        peek.stderr
            .contains(&format!("there is no queue \"{q}.dlq\"")),
        "{peek}"
    );
}

#[tokio::test]
async fn a_forged_reason_reaches_the_terminal_escaped() {
    let q = unique("peek.forged");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&dlq, table(vec![])).await;
    // A publisher's own headers: acemq's reason, and an x-death whose
    // reason the broker never wrote.
    broker
        .publish(
            &dlq,
            b"{}",
            dead_lettered(&q, "\x1b[2J\nERROR forged line", 1, "m1"),
        )
        .await;
    let death = AMQPValue::FieldArray(
        vec![AMQPValue::FieldTable(table(vec![
            ("reason", long_str("\x1b]0;owned\x07\r\nERROR forged too")),
            ("queue", long_str(&q)),
            ("exchange", long_str("")),
        ]))]
        .into(),
    );
    broker
        .publish(
            &dlq,
            b"{}",
            BasicProperties::default()
                .with_message_id("m2".into())
                .with_headers(table(vec![("x-death", death)])),
        )
        .await;
    assert!(broker.wait_ready(&dlq, 2, Duration::from_secs(5)).await);

    let peek = acemq(&["dlq", "peek", &q]).await;
    assert_eq!(peek.code, Some(0), "{peek}");
    assert!(!peek.stdout.contains('\x1b'), "a raw ESC: {peek}");
    assert!(!peek.stdout.contains('\x07'), "a raw BEL: {peek}");
    assert!(!peek.stdout.contains('\r'), "a raw CR: {peek}");
    assert!(
        !peek.stdout.lines().any(|l| l.starts_with("ERROR forged")),
        "a forged line: {peek}"
    );
    for part in [
        "reason    \\u{1b}[2J\\nERROR forged line, after 1 attempt",
        "reason    none (the broker dead-lettered it: \\u{1b}]0;owned\\u{7}\\r\\nERROR forged too)",
    ] {
        assert!(peek.stdout.contains(part), "{part:?} in\n{peek}");
    }
}

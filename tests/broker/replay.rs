//! Replaying a dead-letter queue: what moves, what stays, and nothing lost
//! when the publish back fails.

use std::time::Duration;

use acemq::replay::{replay_dead_letters, ReplayError, ReplayOptions};
use acemq::Reason;
use lapin::types::{AMQPValue, FieldTable};

use crate::support::{addr, field_table, long_str, message_headers, unique, Broker, QueueCleanup};

/// The headers the dead-letter layer writes, for `reason`.
fn dead_lettered(q: &str, reason: &str) -> FieldTable {
    field_table(vec![
        ("x-acemq-reason", long_str(reason)),
        ("x-acemq-error", long_str("boom")),
        ("x-acemq-attempts", AMQPValue::LongLongInt(3)),
        ("x-acemq-attempt", AMQPValue::LongLongInt(3)),
        ("x-acemq-queue", long_str(q)),
        ("x-acemq-dead-lettered-at", AMQPValue::LongLongInt(1)),
        ("x-acemq-original-routing-key", long_str("orders.new.eu")),
        ("x-custom", long_str("kept")),
    ])
}

#[tokio::test]
async fn replay_moves_the_chosen_reason_back_with_the_attempt_reset_and_leaves_the_rest() {
    let q = unique("replay.moves");
    let dlq = format!("{q}.dlq");
    let _cleanup = QueueCleanup::new(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&q, FieldTable::default()).await.unwrap();
    broker.declare(&dlq, FieldTable::default()).await.unwrap();
    for (body, reason) in [("a", "rejected"), ("b", "max-attempts"), ("c", "rejected")] {
        broker
            .publish(&dlq, body.as_bytes(), dead_lettered(&q, reason))
            .await;
    }

    let only_rejected = replay_dead_letters(
        &addr(),
        &q,
        ReplayOptions::new().only_reason(Reason::Rejected),
    )
    .await
    .expect("replayed");
    assert_eq!(
        (only_rejected.moved, only_rejected.skipped),
        (2, 1),
        "{only_rejected}"
    );
    assert_eq!(only_rejected.moved_by_reason.get("rejected"), Some(&2));
    assert_eq!(broker.ready(&q).await, Some(2));
    assert_eq!(broker.ready(&dlq).await, Some(1), "the other reason stays");

    for body in [b"a", b"c"] {
        let m = broker.get(&q).await.expect("moved");
        assert_eq!(&m.delivery.data[..], body, "in order");
        let h = message_headers(&m.delivery.properties);
        for gone in [
            "x-acemq-reason",
            "x-acemq-attempt",
            "x-acemq-attempts",
            "x-acemq-error",
        ] {
            assert_eq!(
                h.get(gone),
                None,
                "{gone} stripped: the attempt count is reset"
            );
        }
        assert_eq!(h.get("x-custom").and_then(|v| v.as_str()), Some("kept"));
        assert_eq!(
            h.get("x-acemq-original-routing-key")
                .and_then(|v| v.as_str()),
            Some("orders.new.eu"),
            "where it came from is kept"
        );
    }

    let rest = replay_dead_letters(&addr(), &q, ReplayOptions::new())
        .await
        .expect("replayed");
    assert_eq!((rest.moved, rest.skipped), (1, 0), "{rest}");
    assert_eq!(broker.ready(&dlq).await, Some(0));
    assert_eq!(broker.ready(&q).await, Some(1));
}

#[tokio::test]
async fn a_replay_whose_publish_back_fails_stops_and_loses_nothing() {
    // No queue `q`: the publish back is unroutable.
    let q = unique("replay.noqueue");
    let dlq = format!("{q}.dlq");
    let _cleanup = QueueCleanup::new(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&dlq, FieldTable::default()).await.unwrap();
    for body in ["a", "b"] {
        broker
            .publish(&dlq, body.as_bytes(), dead_lettered(&q, "rejected"))
            .await;
    }
    let err = replay_dead_letters(&addr(), &q, ReplayOptions::new())
        .await
        .expect_err("nowhere to publish");
    assert!(matches!(err, ReplayError::Publish { .. }), "{err:?}");
    assert_eq!(err.report().map(|r| r.moved), Some(0));
    assert!(
        err.to_string().contains("still in the dead-letter queue"),
        "{err}"
    );
    assert!(
        broker.wait_ready(&dlq, 2, Duration::from_secs(5)).await,
        "both still in the dead-letter queue"
    );
    assert_eq!(
        &broker.get(&dlq).await.unwrap().delivery.data[..],
        b"a",
        "order kept"
    );
}

#[tokio::test]
async fn replaying_a_queue_without_a_dead_letter_queue_says_so() {
    let q = unique("replay.nodlq");
    let err = replay_dead_letters(&addr(), &q, ReplayOptions::new())
        .await
        .expect_err("no dlq");
    assert!(
        matches!(err, ReplayError::NoDeadLetterQueue { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains(&format!("{q}.dlq")), "{err}");
}

#[tokio::test]
async fn the_replay_command_moves_messages_and_prints_the_count() {
    let q = unique("replay.command");
    let dlq = format!("{q}.dlq");
    let _cleanup = QueueCleanup::new(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&q, FieldTable::default()).await.unwrap();
    broker.declare(&dlq, FieldTable::default()).await.unwrap();
    broker.publish(&dlq, b"a", dead_lettered(&q, "panic")).await;
    let out = tokio::process::Command::new(env!("CARGO"))
        .args([
            "run",
            "-q",
            "-p",
            "acemq",
            "--example",
            "replay",
            "--",
            &q,
            "--reason",
            "panic",
        ])
        .env("AMQP_ADDR", addr())
        .output()
        .await
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("moved 1 from {dlq} to {q}")),
        "{stdout}"
    );
    assert_eq!(broker.ready(&q).await, Some(1));
    let usage = tokio::process::Command::new(env!("CARGO"))
        .args([
            "run",
            "-q",
            "-p",
            "acemq",
            "--example",
            "replay",
            "--",
            &q,
            "--reason",
            "oops",
        ])
        .output()
        .await
        .expect("runs");
    assert_eq!(usage.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&usage.stderr).contains("not a reason"));
}

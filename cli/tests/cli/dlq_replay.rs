//! `acemq dlq replay`: what moves, what stays, and nothing lost.

use std::time::Duration;

use crate::support::{acemq, dead_lettered, ids, table, unique, Broker, Cleanup};

#[tokio::test]
async fn replay_moves_the_chosen_reason_back_with_the_attempt_reset_then_the_rest() {
    let q = unique("replay.moves");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&q, table(vec![])).await;
    broker.declare(&dlq, table(vec![])).await;
    for (id, reason) in [("a", "rejected"), ("b", "max-attempts"), ("c", "rejected")] {
        broker
            .publish(&dlq, id.as_bytes(), dead_lettered(&q, reason, 3, id))
            .await;
    }

    let rejected = acemq(&["dlq", "replay", &q, "--reason", "rejected"]).await;
    assert_eq!(rejected.code, Some(0), "{rejected}");
    assert!(
        rejected.stdout.contains(&format!(
            "moved 2 from {dlq} to {q} (rejected: 2); 1 left in {dlq} (other reasons)"
        )),
        "{rejected}"
    );
    assert!(
        broker.wait_ready(&dlq, 1, Duration::from_secs(5)).await,
        "the other reason stays"
    );
    let moved = broker.drain(&q).await;
    assert_eq!(moved.len(), 2);
    for (m, id) in moved.iter().zip(["a", "c"]) {
        assert_eq!(&m.delivery.data[..], id.as_bytes(), "in order");
        let h =
            acemq::convert::headers_from_table(m.delivery.properties.headers().as_ref().unwrap());
        for gone in [
            "x-acemq-reason",
            "x-acemq-attempt",
            "x-acemq-attempts",
            "x-acemq-error",
        ] {
            assert!(
                h.get(gone).is_none(),
                "{gone} stripped: the attempt count is reset"
            );
        }
        assert_eq!(h.get("x-custom").and_then(|v| v.as_str()), Some("kept"));
        let key = format!("orders.{id}");
        assert_eq!(
            h.get("x-acemq-original-routing-key")
                .and_then(|v| v.as_str()),
            Some(key.as_str()),
            "where it came from is kept"
        );
    }

    let rest = acemq(&["dlq", "replay", &q, "--json"]).await;
    assert_eq!(rest.code, Some(0), "{rest}");
    let v = rest.json();
    assert_eq!(
        (v["moved"].as_i64(), v["skipped"].as_i64()),
        (Some(1), Some(0)),
        "{rest}"
    );
    assert_eq!(
        broker.ready(&dlq).await,
        Some(0),
        "the dead-letter queue is empty"
    );
    assert_eq!(ids(&mut broker, &q).await, ["b"]);
}

#[tokio::test]
async fn replay_without_a_queue_to_move_back_to_exits_65_and_moves_nothing() {
    let q = unique("replay.noqueue");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&dlq, table(vec![])).await;
    for id in ["a", "b"] {
        broker
            .publish(&dlq, b"x", dead_lettered(&q, "rejected", 1, id))
            .await;
    }
    let run = acemq(&["dlq", "replay", &q]).await;
    assert_eq!(run.code, Some(65), "{run}");
    assert!(
        run.stderr.contains(&format!("there is no queue \"{q}\"")),
        "{run}"
    );
    assert!(broker.wait_ready(&dlq, 2, Duration::from_secs(5)).await);
    assert_eq!(
        ids(&mut broker, &dlq).await,
        ["a", "b"],
        "nothing lost, order kept"
    );

    let nodlq = unique("replay.nodlq");
    let _nodlq = Cleanup::queues(vec![nodlq.clone()]);
    broker.declare(&nodlq, table(vec![])).await;
    let run = acemq(&["dlq", "replay", &nodlq]).await;
    assert_eq!(run.code, Some(65), "{run}");
    assert!(run.stderr.contains(&format!("{nodlq}.dlq")), "{run}");
}

#[tokio::test]
async fn a_replay_killed_half_way_loses_nothing() {
    const N: usize = 3000;
    let q = unique("replay.killed");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&q, table(vec![])).await;
    broker.declare(&dlq, table(vec![])).await;
    for i in 0..N {
        let id = format!("{i:05}");
        broker
            .publish(&dlq, b"x", dead_lettered(&q, "rejected", 1, &id))
            .await;
    }
    let mut child = crate::support::command(&["dlq", "replay", &q])
        .spawn()
        .expect("runs");
    // Killed once it has moved some, and (most likely) not all.
    let end = std::time::Instant::now() + Duration::from_secs(30);
    let mut started = false;
    while !started && std::time::Instant::now() < end {
        started = broker.ready(&q).await.unwrap_or(0) > 10;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.start_kill().expect("SIGKILL");
    let _ = child.wait().await;
    assert!(started, "the replay moved messages");
    // The broker gives back what the killed replay held.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let back = ids(&mut broker, &q).await;
    let left = ids(&mut broker, &dlq).await;
    let mut all: Vec<String> = back.iter().chain(left.iter()).cloned().collect();
    all.sort();
    all.dedup();
    assert_eq!(
        all.len(),
        N,
        "every message is in one queue or the other ({} moved, {} left)",
        back.len(),
        left.len()
    );
    assert!(back.len() + left.len() <= N + 1, "at most one in both");
    eprintln!("killed after moving {} of {N}", back.len());
}

#[tokio::test]
async fn peek_marks_repeated_message_ids_and_replay_can_move_one_copy_of_each() {
    let q = unique("replay.repeats");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&q, table(vec![])).await;
    broker.declare(&dlq, table(vec![])).await;
    // b dead-lettered twice (a crash between the copy and the ack), a three times.
    for (n, id) in ["a", "b", "a", "b", "c", "a"].iter().enumerate() {
        broker
            .publish(
                &dlq,
                format!("{id}{n}").as_bytes(),
                dead_lettered(&q, "rejected", 1, id),
            )
            .await;
    }

    let peek = acemq(&["dlq", "peek", &q]).await;
    assert_eq!(peek.code, Some(0), "{peek}");
    for part in [
        "#3 message id a, repeat of #1,",
        "#4 message id b, repeat of #2,",
        "#6 message id a, repeat of #1,",
        "3 of them repeat the message id of an earlier one",
    ] {
        assert!(peek.stdout.contains(part), "{part:?} in\n{peek}");
    }
    assert!(!peek.stdout.contains("#1 message id a, repeat"), "{peek}");
    let json = acemq(&["dlq", "peek", &q, "--json"]).await;
    let v = json.json();
    let marks: Vec<Option<i64>> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["repeat_of"].as_i64())
        .collect();
    assert_eq!(
        marks,
        [None, None, Some(1), Some(2), None, Some(1)],
        "{json}"
    );
    assert_eq!(v["repeats"], 3);
    assert!(broker.wait_ready(&dlq, 6, Duration::from_secs(5)).await);

    let replay = acemq(&["dlq", "replay", &q, "--skip-repeated"]).await;
    assert_eq!(replay.code, Some(0), "{replay}");
    assert!(
        replay.stdout.contains(&format!(
            "moved 3 from {dlq} to {q} (rejected: 3); 3 repeated message ids left in {dlq}"
        )),
        "{replay}"
    );
    let moved: Vec<Vec<u8>> = broker
        .drain(&q)
        .await
        .iter()
        .map(|m| m.delivery.data.to_vec())
        .collect();
    assert_eq!(
        moved,
        [b"a0".to_vec(), b"b1".to_vec(), b"c4".to_vec()],
        "the first copy of each"
    );
    assert!(
        broker.wait_ready(&dlq, 3, Duration::from_secs(5)).await,
        "the repeats stay in the dead-letter queue"
    );
    let left: Vec<Vec<u8>> = broker
        .drain(&dlq)
        .await
        .iter()
        .map(|m| m.delivery.data.to_vec())
        .collect();
    assert_eq!(
        left,
        [b"a2".to_vec(), b"b3".to_vec(), b"a5".to_vec()],
        "in order"
    );
}

//! `acemq::settle` on a plain lapin consumer, against the real broker:
//! every delivery settled once with its own outcome (a second ack would be
//! a 406 closing the channel), a dropped ticket handed back, and nothing
//! sent — nothing lost — once the channel is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use acemq::config::AckBatch;
use acemq::lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
};
use acemq::lapin::types::{AMQPValue, FieldTable};
use acemq::lapin::{BasicProperties, Channel, Connection, Consumer};
use acemq::layers::{DeadLetterDecision, Reason};
use acemq::settle::{SettleReport, SettleStatus};
use acemq::{Decision, Settler};
use futures::StreamExt;

use crate::support::{
    connect, eventually, field_table, queue_counts, unique, Broker, QueueCleanup,
};

/// `q` with its own dead-letter exchange routing to `q.dlq` (declared too).
async fn declare_with_dlx(broker: &mut Broker, q: &str) -> String {
    let dlq = format!("{q}.dlq");
    broker
        .declare(&dlq, FieldTable::default())
        .await
        .expect("declare the dlq");
    broker
        .declare(
            q,
            field_table(vec![
                ("x-dead-letter-exchange", AMQPValue::LongString("".into())),
                (
                    "x-dead-letter-routing-key",
                    AMQPValue::LongString(dlq.as_str().into()),
                ),
            ]),
        )
        .await
        .expect("declare the queue");
    dlq
}

/// A consumer of `q` on a channel of its own, prefetch `prefetch`.
async fn consume(conn: &Connection, q: &str, prefetch: u16) -> (Channel, Consumer) {
    let channel = conn.create_channel().await.expect("channel");
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .expect("qos");
    let consumer = channel
        .basic_consume(
            q.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    (channel, consumer)
}

/// The next delivery, within 10 s, or fails the test.
async fn next(consumer: &mut Consumer) -> acemq::lapin::message::Delivery {
    tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("a delivery within 10 s")
        .expect("the stream goes on")
        .expect("a delivery, not an error")
}

fn reject() -> Decision {
    Decision::DeadLetter(DeadLetterDecision {
        reason: Reason::Rejected,
        error: "test".into(),
        attempts: 1,
        published: false,
    })
}

/// Waits (bounded) until the broker holds nothing of `q`, ready or unacked.
async fn assert_empty(q: &str) {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let counts = queue_counts(q).await;
        if counts == Some((0, 0)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{q} still holds (ready, unacked) = {counts:?}: a settle was lost"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Proves the channel survived every settle: an RPC on it is answered
/// after the settles (frames on a channel are in order), and a second ack
/// of a tag would have closed it with 406 before.
async fn assert_channel_open(channel: &Channel, q: &str) {
    let ok = channel
        .queue_declare(
            q.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    assert!(
        ok.is_ok() && channel.status().connected(),
        "the consumer's channel was closed (a double settle is a 406): {ok:?}"
    );
}

/// 500 messages: every tenth from 3 rejected (to the DLX), every tenth
/// from 7 handed back once then acknowledged, the rest acknowledged; each
/// settled from a task of its own after a short, varying delay (out of
/// order), through one settler with `ack_batch`.
async fn mixed_decisions(ack_batch: AckBatch, coalescing: bool) {
    const N: usize = 500;
    let q = unique("settle.mixed");
    let mut broker = Broker::new().await;
    let dlq = declare_with_dlx(&mut broker, &q).await;
    let _cleanup = QueueCleanup::new(vec![q.clone(), dlq.clone()]);
    let bodies: Vec<Vec<u8>> = (0..N).map(|i| i.to_string().into_bytes()).collect();
    broker
        .publish_many(&q, &bodies, BasicProperties::default())
        .await;

    let conn = connect().await;
    let (channel, mut consumer) = consume(&conn, &q, 100).await;
    let settler = Settler::new(channel.clone(), q.as_str(), ack_batch, 100);

    // index -> how often it was delivered (and whether redelivered then).
    let mut seen: BTreeMap<usize, Vec<bool>> = BTreeMap::new();
    let mut terminal = 0;
    let mut tasks = tokio::task::JoinSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while terminal < N {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {terminal} of {N} messages reached their fate within 60 s"
        );
        let raw = next(&mut consumer).await;
        let redelivered = raw.redelivered;
        let (delivery, ticket) = settler.track(raw);
        assert_eq!(delivery.queue(), q.as_str());
        let i: usize = std::str::from_utf8(delivery.body())
            .expect("utf-8")
            .parse()
            .expect("an index");
        seen.entry(i).or_default().push(redelivered);
        let decision = match i % 10 {
            3 => reject(),
            7 if !redelivered => Decision::HandBack,
            _ => Decision::Ack,
        };
        if decision != Decision::HandBack {
            terminal += 1;
        }
        let delay = Duration::from_micros(((i * 7919) % 3000) as u64);
        tasks.spawn(async move {
            tokio::time::sleep(delay).await;
            ticket.settle(decision)
        });
    }
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.expect("the task"), SettleStatus::Queued);
    }
    let report = settler.close().await;

    // The broker holds nothing unacked while the channel is still open, and
    // the channel is (a double ack would have closed it).
    assert_empty(&q).await;
    assert_channel_open(&channel, &q).await;

    let rejected: BTreeSet<usize> = (0..N).filter(|i| i % 10 == 3).collect();
    let handed_back = (0..N).filter(|i| i % 10 == 7).count() as u64;
    let mut expected = SettleReport::default();
    expected.tracked = N as u64 + handed_back;
    expected.acked = (N - rejected.len()) as u64;
    expected.requeued = handed_back;
    expected.rejected = rejected.len() as u64;
    expected.ack_frames = report.ack_frames;
    assert_eq!(report, expected, "the settler's report");
    if coalescing {
        assert!(
            report.ack_frames < report.acked,
            "acknowledgements were coalesced: {report:?}"
        );
    } else {
        assert_eq!(
            report.ack_frames, report.acked,
            "one ack per delivery: {report:?}"
        );
    }

    // Each message's fate as decided.
    assert_eq!(seen.len(), N, "every message was delivered");
    for (i, deliveries) in &seen {
        let want: &[bool] = if i % 10 == 7 {
            &[false, true]
        } else {
            &[false]
        };
        assert_eq!(
            deliveries.as_slice(),
            want,
            "message {i}: (redelivered) of each delivery"
        );
    }
    assert!(
        broker
            .wait_ready(&dlq, rejected.len() as u32, Duration::from_secs(10))
            .await,
        "the rejected messages are in {dlq}"
    );
    let mut in_dlq = BTreeSet::new();
    while let Some(m) = broker.get(&dlq).await {
        in_dlq.insert(
            std::str::from_utf8(&m.delivery.data)
                .expect("utf-8")
                .parse::<usize>()
                .expect("an index"),
        );
    }
    assert_eq!(
        in_dlq, rejected,
        "exactly the rejected messages were dead-lettered"
    );

    let _ = channel
        .basic_cancel(consumer.tag(), BasicCancelOptions::default())
        .await;
    let _ = channel.close(200, "OK".into()).await;
    let _ = conn.close(200, "OK".into()).await;
}

#[tokio::test]
async fn settle_five_hundred_mixed_decisions_coalesced_each_settled_once_as_decided() {
    mixed_decisions(AckBatch::default(), true).await;
}

#[tokio::test]
async fn settle_five_hundred_mixed_decisions_with_ack_batch_zero() {
    mixed_decisions(AckBatch::off(), false).await;
}

#[tokio::test]
async fn settle_a_ticket_dropped_unsettled_hands_its_delivery_back() {
    let q = unique("settle.dropped");
    let mut broker = Broker::new().await;
    broker
        .declare(&q, FieldTable::default())
        .await
        .expect("declare");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    broker
        .publish(&q, b"once more", FieldTable::default())
        .await;

    let conn = connect().await;
    let (channel, mut consumer) = consume(&conn, &q, 10).await;
    let settler = Settler::new(channel.clone(), q.as_str(), AckBatch::default(), 10);

    let first = next(&mut consumer).await;
    assert!(!first.redelivered);
    let (delivery, ticket) = settler.track(first);
    // A handler that never settles (it panicked, say): the ticket goes.
    drop(ticket);
    drop(delivery);

    let again = next(&mut consumer).await;
    assert!(again.redelivered, "the dropped ticket's delivery came back");
    assert_eq!(again.data, b"once more");
    let (_, ticket) = settler.track(again);
    assert_eq!(ticket.settle(Decision::Ack), SettleStatus::Queued);
    let report = settler.close().await;
    assert_eq!(
        (
            report.tracked,
            report.requeued,
            report.acked,
            report.not_sent
        ),
        (2, 1, 1, 0),
        "{report:?}"
    );
    assert_empty(&q).await;
    assert_channel_open(&channel, &q).await;
    let _ = channel.close(200, "OK".into()).await;
    let _ = conn.close(200, "OK".into()).await;
}

#[tokio::test]
async fn settle_after_the_channel_is_gone_sends_nothing_says_so_and_loses_nothing() {
    let q = unique("settle.lost");
    let mut broker = Broker::new().await;
    broker
        .declare(&q, FieldTable::default())
        .await
        .expect("declare");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    for body in [b"1", b"2", b"3"] {
        broker.publish(&q, body, FieldTable::default()).await;
    }

    let conn = connect().await;
    let (channel, mut consumer) = consume(&conn, &q, 10).await;
    // Held acks stay held: a long time bound and a long run.
    let settler = Settler::new(
        channel.clone(),
        q.as_str(),
        AckBatch::new(100, Duration::from_secs(60)),
        10,
    );
    let mut tickets = Vec::new();
    let mut deliveries = Vec::new();
    for _ in 0..3 {
        let (d, t) = settler.track(next(&mut consumer).await);
        deliveries.push(d);
        tickets.push(t);
    }
    let third = tickets.pop().expect("3");
    let second = tickets.pop().expect("2");
    let first = tickets.pop().expect("1");
    // Held above the undecided first: not sent yet.
    assert_eq!(second.settle(Decision::Ack), SettleStatus::Queued);

    // The broker closes the channel under the settler (404 on a passive
    // declare of a queue that does not exist).
    let missing = unique("settle.missing");
    let refused = channel
        .queue_declare(
            missing.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    assert!(refused.is_err(), "the passive declare is refused");
    assert!(
        eventually(Duration::from_secs(5), || async { settler.is_lost() }).await,
        "the settler knows its channel is gone"
    );
    assert!(
        deliveries.iter().all(|d| d.is_orphaned()),
        "the tracked deliveries' lifeline is lost"
    );

    assert_eq!(first.settle(Decision::Ack), SettleStatus::ChannelClosed);
    assert_eq!(third.settle(reject()), SettleStatus::ChannelClosed);
    let report = settler.close().await;
    assert_eq!(
        (
            report.tracked,
            report.acked,
            report.rejected,
            report.not_sent,
            report.unsettled
        ),
        (3, 0, 0, 3, 0),
        "nothing was sent, and the held ack is counted as not sent: {report:?}"
    );

    // Nothing lost: all three come back on a new channel.
    let (channel, mut consumer) = consume(&conn, &q, 10).await;
    let settler = Settler::new(channel.clone(), q.as_str(), AckBatch::default(), 10);
    let mut bodies = BTreeSet::new();
    for _ in 0..3 {
        let raw = next(&mut consumer).await;
        assert!(raw.redelivered, "redelivered after the channel was lost");
        bodies.insert(raw.data.clone());
        let (_, ticket) = settler.track(raw);
        assert_eq!(ticket.settle(Decision::Ack), SettleStatus::Queued);
    }
    assert_eq!(
        bodies,
        [b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]
            .into_iter()
            .collect()
    );
    let report = settler.close().await;
    assert_eq!((report.acked, report.not_sent), (3, 0), "{report:?}");
    assert_empty(&q).await;
    assert_channel_open(&channel, &q).await;
    let _ = channel.close(200, "OK".into()).await;
    let _ = conn.close(200, "OK".into()).await;
}

#[tokio::test]
async fn settle_an_ack_held_above_an_undecided_tag_goes_out_alone_after_the_time_bound() {
    let q = unique("settle.bound");
    let mut broker = Broker::new().await;
    broker
        .declare(&q, FieldTable::default())
        .await
        .expect("declare");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    for body in [b"1", b"2"] {
        broker.publish(&q, body, FieldTable::default()).await;
    }
    let conn = connect().await;
    let (channel, mut consumer) = consume(&conn, &q, 10).await;
    let settler = Settler::new(
        channel.clone(),
        q.as_str(),
        AckBatch::new(100, Duration::from_millis(50)),
        10,
    );
    let (_, first) = settler.track(next(&mut consumer).await);
    let (_, second) = settler.track(next(&mut consumer).await);
    assert_eq!(second.settle(Decision::Ack), SettleStatus::Queued);
    // The first is still undecided (a long handler): the second's ack
    // cannot be a multiple over it, and goes out alone once 50 ms passed.
    assert!(
        eventually(Duration::from_secs(10), || async {
            queue_counts(&q).await == Some((0, 1))
        })
        .await,
        "only the undecided delivery is left unacked: {:?}",
        queue_counts(&q).await
    );
    let report = settler.report();
    assert_eq!(
        (report.acked, report.ack_frames, report.unsettled),
        (1, 1, 1)
    );
    assert_eq!(first.settle(Decision::Ack), SettleStatus::Queued);
    let report = settler.close().await;
    assert_eq!(
        (report.acked, report.ack_frames, report.not_sent),
        (2, 2, 0)
    );
    assert_empty(&q).await;
    assert_channel_open(&channel, &q).await;
    let _ = channel.close(200, "OK".into()).await;
    let _ = conn.close(200, "OK".into()).await;
}

/// lapin 4.12's `basic_ack`, `basic_nack` and `basic_reject` put their
/// frame on the channel's outgoing queue at their first poll, not when the
/// future is made and not only when it completes: acemq's settle writer
/// (`settle::wire::Writer`) queues frames in the ledger's order by polling
/// each once as it is made, which is only right while lapin does this.
/// Three deliveries: an ack future made and dropped unpolled settles
/// nothing; an ack and a reject each polled once (with a no-op waker) and
/// dropped at once are both on the wire. After the channel closes, the
/// unpolled one's message is back in the queue; the acked one is gone; the
/// rejected one is in the dead-letter queue.
#[tokio::test]
async fn lapin_queues_a_settle_frame_at_its_first_poll_and_not_before() {
    let q = unique("settle-first-poll");
    let mut broker = Broker::new().await;
    let dlq = declare_with_dlx(&mut broker, &q).await;
    let _cleanup = QueueCleanup::new(vec![q.clone(), dlq.clone()]);
    for body in ["unpolled", "acked", "rejected"] {
        broker
            .publish(&q, body.as_bytes(), FieldTable::default())
            .await;
    }
    let conn = connect().await;
    let (channel, mut consumer) = consume(&conn, &q, 3).await;
    let mut tags = BTreeMap::new();
    for _ in 0..3 {
        let d = next(&mut consumer).await;
        tags.insert(
            String::from_utf8_lossy(&d.data).into_owned(),
            d.delivery_tag,
        );
    }
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    // Made, never polled, dropped.
    drop(channel.basic_ack(
        tags["unpolled"],
        acemq::lapin::options::BasicAckOptions { multiple: false },
    ));
    // Polled once each, dropped before they complete.
    let mut ack = Box::pin(channel.basic_ack(
        tags["acked"],
        acemq::lapin::options::BasicAckOptions { multiple: false },
    ));
    let _ = ack.as_mut().poll(&mut cx);
    drop(ack);
    let mut reject = Box::pin(channel.basic_reject(
        tags["rejected"],
        acemq::lapin::options::BasicRejectOptions { requeue: false },
    ));
    let _ = reject.as_mut().poll(&mut cx);
    drop(reject);
    // A round trip on the channel after them: the frames before it were
    // written and handled by the broker.
    channel
        .basic_cancel(
            consumer.tag().as_str().into(),
            BasicCancelOptions::default(),
        )
        .await
        .expect("cancel");
    channel.close(200, "OK".into()).await.expect("close");
    assert!(
        eventually(Duration::from_secs(10), || async {
            queue_counts(&q).await == Some((1, 0)) && queue_counts(&dlq).await == Some((1, 0))
        })
        .await,
        "{q}: the unpolled ack's message back (ready 1, unacked 0), the rejected one in {dlq}: {:?} / {:?}",
        queue_counts(&q).await,
        queue_counts(&dlq).await
    );
    let back = broker
        .get(&q)
        .await
        .expect("the message the unpolled ack left");
    assert_eq!(&back.delivery.data[..], b"unpolled");
    let dead = broker.get(&dlq).await.expect("the rejected message");
    assert_eq!(&dead.delivery.data[..], b"rejected");
}

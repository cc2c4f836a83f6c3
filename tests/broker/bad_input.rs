//! Messages the library did not write: malformed attempt headers, bodies
//! that are not UTF-8, and a large body.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::{BoxError, Delivery};
use bytes::Bytes;
use lapin::types::{AMQPValue, FieldTable};
use tower::service_fn;

use crate::support::{
    eventually, field_table, long_str, start_on_ladder, unique, Broker, TestHandler,
};

/// A handler that records each delivery's body and attempt, and succeeds.
fn recording(seen: Arc<Mutex<Vec<(Bytes, u32)>>>) -> impl TestHandler {
    service_fn(move |d: Delivery| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push((d.body().clone(), d.attempt()));
            Ok::<(), BoxError>(())
        }
    })
}

#[tokio::test]
async fn a_malformed_attempt_header_is_read_as_attempt_1_and_the_delivery_is_handled() {
    let q = unique("bad.attempt");
    let mut broker = Broker::new().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (running, all) = start_on_ladder(&q, recording(seen.clone())).await;

    let nested = field_table(vec![("attempt", AMQPValue::LongLongInt(3))]);
    let cases: Vec<(&str, AMQPValue, u32)> = vec![
        ("string abc", long_str("abc"), 1),
        ("string 3", long_str("3"), 1),
        ("minus five", AMQPValue::LongLongInt(-5), 1),
        ("zero", AMQPValue::ShortShortInt(0), 1),
        (
            "ten to the twelve",
            AMQPValue::LongLongInt(1_000_000_000_000),
            1,
        ),
        ("i64 max", AMQPValue::LongLongInt(i64::MAX), 1),
        ("nested table", AMQPValue::FieldTable(nested), 1),
        ("float", AMQPValue::Double(2.0), 1),
        ("bool", AMQPValue::Boolean(true), 1),
        ("void", AMQPValue::Void, 1),
        // Well-formed controls: the header is read when it is valid.
        ("valid 3 as i64", AMQPValue::LongLongInt(3), 3),
        ("valid 2 as u8", AMQPValue::ShortShortUInt(2), 2),
    ];
    let expected: BTreeMap<String, u32> = cases
        .iter()
        .map(|(name, _, attempt)| ((*name).to_owned(), *attempt))
        .collect();
    for (name, value, _) in cases {
        broker
            .publish(
                &q,
                name.as_bytes(),
                field_table(vec![("x-acemq-attempt", value)]),
            )
            .await;
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            seen.lock().unwrap().len() == expected.len()
        })
        .await,
        "every delivery handled: {:?}",
        seen.lock().unwrap()
    );
    let snapshot = running.health().snapshot();
    assert!(
        snapshot.ready && snapshot.queues[0].consuming,
        "{snapshot:?}"
    );
    running.drain().await.expect("clean drain");

    let got: BTreeMap<String, u32> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(body, attempt)| (String::from_utf8(body.to_vec()).unwrap(), *attempt))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(broker.ready(&q).await, Some(0), "all acknowledged");
    assert_eq!(broker.ready(&format!("{q}.dlq")).await, Some(0));
    broker.delete(&all).await;
}

#[tokio::test]
async fn a_body_that_is_not_utf8_is_delivered_intact() {
    let q = unique("bad.utf8");
    let mut broker = Broker::new().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (running, all) = start_on_ladder(&q, recording(seen.clone())).await;

    let body: Vec<u8> = vec![0xff, 0xfe, 0x00, 0xc3, 0x28, 0x80, 0xed, 0xa0, 0x80, 0x0a];
    assert!(std::str::from_utf8(&body).is_err());
    broker.publish(&q, &body, FieldTable::default()).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            seen.lock().unwrap().len() == 1
        })
        .await
    );
    running.drain().await.expect("clean drain");
    let (got, attempt) = seen.lock().unwrap()[0].clone();
    assert_eq!(&got[..], &body[..]);
    assert_eq!(attempt, 1);
    assert_eq!(broker.ready(&q).await, Some(0), "acknowledged");
    broker.delete(&all).await;
}

#[tokio::test]
async fn a_16_mib_body_round_trips_whole() {
    const LEN: usize = 16 * 1024 * 1024;
    let q = unique("bad.large");
    let mut broker = Broker::new().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (running, all) = start_on_ladder(&q, recording(seen.clone())).await;

    let body: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    broker.publish(&q, &body, FieldTable::default()).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            seen.lock().unwrap().len() == 1
        })
        .await,
        "the large delivery was handled"
    );
    running.drain().await.expect("clean drain");
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0].0.len(), LEN, "the handler saw the full length");
        assert!(seen[0].0[..] == body[..], "byte for byte");
    }
    assert_eq!(broker.ready(&q).await, Some(0), "acknowledged");
    broker.delete(&all).await;
}

/// A handler whose `poll_ready` fails once it has handled `ok` deliveries.
#[derive(Clone)]
struct FailsWhenReady {
    ok: usize,
    handled: Arc<Mutex<usize>>,
}

impl tower::Service<Delivery> for FailsWhenReady {
    type Response = ();
    type Error = BoxError;
    type Future = std::future::Ready<Result<(), BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        if *self.handled.lock().unwrap() >= self.ok {
            std::task::Poll::Ready(Err("the database pool is gone".into()))
        } else {
            std::task::Poll::Ready(Ok(()))
        }
    }

    fn call(&mut self, _: Delivery) -> Self::Future {
        *self.handled.lock().unwrap() += 1;
        std::future::ready(Ok(()))
    }
}

#[tokio::test]
async fn a_handler_service_that_fails_poll_ready_stops_its_queue_turns_readiness_off_and_loses_nothing(
) {
    let q = unique("bad.ready");
    let _cleanup = crate::support::QueueCleanup::new(vec![q.clone(), format!("{q}.dlq")]);
    let mut broker = Broker::new().await;
    let handled = Arc::new(Mutex::new(0));
    let running = crate::support::start_consuming(
        crate::support::plain_config(&q),
        &q,
        FailsWhenReady {
            ok: 3,
            handled: handled.clone(),
        },
    )
    .await;
    for _ in 0..10 {
        broker.publish(&q, b"order", FieldTable::default()).await;
    }
    let health = running.health();
    assert!(
        eventually(Duration::from_secs(10), || async { !health.is_ready() }).await,
        "readiness goes off when the service fails: {:?}",
        health.snapshot()
    );
    assert_eq!(
        *handled.lock().unwrap(),
        3,
        "nothing handled after the failure"
    );
    assert!(
        broker.wait_ready(&q, 7, Duration::from_secs(10)).await,
        "the 7 unhandled deliveries are back on the queue, not stuck unacknowledged"
    );
    running.drain().await.expect("a clean drain");
}

#[tokio::test]
async fn a_forged_delivery_count_on_a_classic_queue_is_not_believed_and_the_delivery_is_handled() {
    let q = unique("bad.count");
    let mut broker = Broker::new().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (running, all) = start_on_ladder(&q, recording(seen.clone())).await;
    for (name, count) in [
        ("x-delivery-count", 1_i64 << 62),
        ("x-acquired-count", 1 << 62),
    ] {
        broker
            .publish(
                &q,
                name.as_bytes(),
                field_table(vec![(name, AMQPValue::LongLongInt(count))]),
            )
            .await;
    }
    let handled = eventually(Duration::from_secs(10), || async {
        seen.lock().unwrap().len() == 2
    })
    .await;
    let in_dlq = broker.ready(&format!("{q}.dlq")).await;
    assert!(
        handled,
        "both handled, none dead-lettered unread: {:?}, {in_dlq:?} in the dlq",
        seen.lock().unwrap()
    );
    running.drain().await.expect("clean drain");
    assert_eq!(broker.ready(&format!("{q}.dlq")).await, Some(0));
    broker.delete(&all).await;
}

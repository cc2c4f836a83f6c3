//! Dead-lettering against the broker: exhausted retries, rejections, panics,
//! and a dead-letter queue deleted while running.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::{BoxError, Config, Delivery, Headers, Reject, Running};
use lapin::message::BasicGetMessage;
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use tower::service_fn;

use crate::support::{
    eventually, field_table, ladder_config, long_str, message_headers, now_ms, retry_config,
    start_consuming, topology_queues, unique, Broker, TestHandler,
};

const MS: fn(u64) -> Duration = Duration::from_millis;

fn str_header<'a>(h: &'a Headers, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.as_str())
}

fn int_header(h: &Headers, name: &str) -> Option<i64> {
    h.get(name).and_then(|v| v.as_i64())
}

/// A handler that counts its calls and does what `body` asks: `fail`,
/// `reject`, `panic`, anything else succeeds.
fn by_body(calls: Arc<AtomicUsize>, ok: Arc<AtomicUsize>) -> impl TestHandler {
    service_fn(move |d: Delivery| {
        let (calls, ok) = (calls.clone(), ok.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            match &d.body()[..] {
                b"fail" => Err::<(), BoxError>("the payment service is down".into()),
                b"reject" => Err(Reject::new("not an order: no items").into()),
                b"panic" => panic!("handler bug: index out of range"),
                b"long" => Err(Reject::new("é".repeat(3000)).into()),
                _ => {
                    ok.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            }
        }
    })
}

/// Three attempts in all, every wait in process (100 ms, then 200 ms).
fn three_attempts(q: &str) -> Config {
    retry_config(
        q,
        3,
        MS(100),
        Duration::from_secs(10),
        Duration::from_secs(1),
    )
}

/// Starts `config` consuming `q` with [`by_body`]. Returns the app, every
/// queue of its topology (to delete at the end), the dead-letter queue, and
/// the handler's `calls` and `ok` counters.
async fn start_by_body(
    q: &str,
    config: Config,
) -> (
    Running,
    Vec<String>,
    String,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
) {
    let all = topology_queues(&config);
    let dlq = format!("{q}.dlq");
    let (calls, ok) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let running = start_consuming(config, q, by_body(calls.clone(), ok.clone())).await;
    (running, all, dlq, calls, ok)
}

/// Waits (up to 10 s) for the dead-lettered copy in `dlq` and takes it.
async fn dead_lettered(broker: &mut Broker, dlq: &str) -> BasicGetMessage {
    broker
        .get_within(dlq, Duration::from_secs(10))
        .await
        .expect("dead-lettered")
}

#[tokio::test]
async fn a_delivery_that_exhausts_its_attempts_lands_in_the_dlq_with_the_reason_and_its_original_message(
) {
    let q = unique("dlq.exhausted");
    let mut broker = Broker::new().await;
    let (running, all, dlq, calls, _) = start_by_body(&q, three_attempts(&q)).await;

    let before = now_ms();
    let props = BasicProperties::default()
        .with_message_id("order-42".into())
        .with_content_type("application/json".into())
        .with_content_encoding("identity".into())
        .with_correlation_id("corr-1".into())
        .with_reply_to("replies".into())
        .with_timestamp(1_700_000_000)
        .with_type("order.created".into())
        .with_app_id("shop".into())
        .with_priority(3)
        .with_delivery_mode(2)
        .with_headers(field_table(vec![
            ("tenant", long_str("acme")),
            ("x-custom-number", AMQPValue::LongInt(7)),
        ]));
    broker.publish_props(&q, b"fail", props).await;
    let msg = dead_lettered(&mut broker, &dlq).await;
    let after = now_ms();
    running.drain().await.expect("clean drain");

    assert_eq!(calls.load(Ordering::SeqCst), 3, "three attempts");
    assert_eq!(msg.data, b"fail", "original body");
    assert_eq!(
        msg.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("order-42")
    );
    assert_eq!(
        msg.properties.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    let p = &msg.properties;
    let text = |v: &Option<lapin::types::ShortString>| v.as_ref().map(|s| s.as_str().to_owned());
    assert_eq!(text(p.content_encoding()).as_deref(), Some("identity"));
    assert_eq!(text(p.correlation_id()).as_deref(), Some("corr-1"));
    assert_eq!(text(p.reply_to()).as_deref(), Some("replies"));
    assert_eq!(text(p.kind()).as_deref(), Some("order.created"));
    assert_eq!(text(p.app_id()).as_deref(), Some("shop"));
    assert_eq!(*p.timestamp(), Some(1_700_000_000));
    assert_eq!(*p.priority(), Some(3));
    assert_eq!(*p.delivery_mode(), Some(2));
    let h = message_headers(&msg.properties);
    assert_eq!(
        str_header(&h, "x-acemq-reason"),
        Some("max-attempts"),
        "{h:?}"
    );
    assert_eq!(
        str_header(&h, "x-acemq-error"),
        Some("the payment service is down"),
        "{h:?}"
    );
    assert_eq!(int_header(&h, "x-acemq-attempts"), Some(3), "{h:?}");
    assert_eq!(str_header(&h, "x-acemq-queue"), Some(q.as_str()), "{h:?}");
    let at = int_header(&h, "x-acemq-dead-lettered-at").expect("a unix-ms integer");
    assert!(
        (before..=after).contains(&at),
        "dead-lettered at {at}, between {before} and {after}"
    );
    assert_eq!(str_header(&h, "tenant"), Some("acme"), "custom header kept");
    assert_eq!(
        int_header(&h, "x-custom-number"),
        Some(7),
        "custom header kept"
    );
    assert_eq!(
        broker.ready(&q).await,
        Some(0),
        "the original was acknowledged"
    );
    assert_eq!(broker.ready(&dlq).await, Some(0), "exactly one copy");
    broker.delete(&all).await;
}

#[tokio::test]
async fn a_rejected_delivery_goes_to_the_dlq_at_once_with_reason_rejected_and_one_attempt() {
    let q = unique("dlq.rejected");
    let mut broker = Broker::new().await;
    let (running, all, dlq, calls, _) = start_by_body(&q, three_attempts(&q)).await;

    broker.publish(&q, b"reject", FieldTable::default()).await;
    let msg = dead_lettered(&mut broker, &dlq).await;
    running.drain().await.expect("clean drain");

    // Had it been retried, the retries (100 ms, 200 ms) would have come first.
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(msg.data, b"reject");
    let h = message_headers(&msg.properties);
    assert_eq!(str_header(&h, "x-acemq-reason"), Some("rejected"), "{h:?}");
    assert_eq!(int_header(&h, "x-acemq-attempts"), Some(1), "{h:?}");
    assert_eq!(
        str_header(&h, "x-acemq-error"),
        Some("rejected: not an order: no items"),
        "{h:?}"
    );
    assert_eq!(broker.ready(&q).await, Some(0));
    broker.delete(&all).await;
}

#[tokio::test]
async fn a_panicking_handler_is_dead_lettered_with_reason_panic_and_the_next_delivery_is_handled() {
    let q = unique("dlq.panic");
    let mut broker = Broker::new().await;
    let (running, all, dlq, calls, ok) = start_by_body(&q, three_attempts(&q)).await;

    broker.publish(&q, b"panic", FieldTable::default()).await;
    let msg = dead_lettered(&mut broker, &dlq).await;
    let h = message_headers(&msg.properties);
    assert_eq!(str_header(&h, "x-acemq-reason"), Some("panic"), "{h:?}");
    assert_eq!(int_header(&h, "x-acemq-attempts"), Some(1), "{h:?}");
    assert_eq!(
        str_header(&h, "x-acemq-error"),
        Some("handler panicked: handler bug: index out of range"),
        "{h:?}"
    );

    broker.publish(&q, b"fine", FieldTable::default()).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            ok.load(Ordering::SeqCst) == 1
        })
        .await,
        "the consumer survived the panic and handled the next delivery"
    );
    let health = running.health().snapshot();
    assert!(health.ready && health.queues[0].consuming, "{health:?}");
    running.drain().await.expect("clean drain");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "a panic is not retried");
    assert_eq!(broker.ready(&q).await, Some(0));
    assert_eq!(broker.ready(&dlq).await, Some(0), "one copy only");
    broker.delete(&all).await;
}

#[tokio::test]
async fn with_the_dlq_deleted_while_running_the_next_dead_letter_declares_it_again_and_lands_there()
{
    let q = unique("dlq.deleted");
    let mut broker = Broker::new().await;
    let (running, all, dlq, calls, _) = start_by_body(&q, three_attempts(&q)).await;
    broker.delete(std::slice::from_ref(&dlq)).await;
    assert_eq!(broker.ready(&dlq).await, None, "the dlq is gone");

    broker.publish(&q, b"reject", FieldTable::default()).await;
    let msg = broker
        .get_within(&dlq, Duration::from_secs(10))
        .await
        .expect("dead-lettered into the re-declared dlq");
    let h = message_headers(&msg.properties);
    assert_eq!(str_header(&h, "x-acemq-reason"), Some("rejected"), "{h:?}");
    assert_eq!(str_header(&h, "x-acemq-queue"), Some(q.as_str()), "{h:?}");
    assert_eq!(msg.data, b"reject");
    let health = running.health().snapshot();
    assert!(health.ready, "{health:?}");
    running.drain().await.expect("clean drain");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(broker.ready(&q).await, Some(0));
    broker.delete(&all).await;
}

#[tokio::test]
async fn a_delivery_that_always_fails_climbs_every_rung_and_is_dead_lettered_after_attempt_4() {
    let q = unique("dlq.ladder");
    let mut broker = Broker::new().await;
    // 200ms in process, then the 400ms and 800ms rungs, then the dlq.
    let (running, all, dlq, calls, _) = start_by_body(&q, ladder_config(&q)).await;
    let props = BasicProperties::default()
        .with_message_id("order-7".into())
        .with_headers(field_table(vec![("tenant", long_str("acme"))]));
    broker.publish_props(&q, b"fail", props).await;
    let msg = dead_lettered(&mut broker, &dlq).await;
    // The copy is in the dlq once confirmed; the loop records the outcome
    // when it collects the handler, a moment later.
    let health = running.health();
    eventually(MS(5000), || async {
        health.snapshot().queues[0].dead_lettered == 1
    })
    .await;
    let snapshot = health.snapshot();
    running.drain().await.expect("clean drain");

    assert_eq!(calls.load(Ordering::SeqCst), 4, "four attempts");
    let h = message_headers(&msg.properties);
    assert_eq!(
        str_header(&h, "x-acemq-reason"),
        Some("max-attempts"),
        "{h:?}"
    );
    assert_eq!(int_header(&h, "x-acemq-attempts"), Some(4), "{h:?}");
    assert_eq!(str_header(&h, "x-acemq-queue"), Some(q.as_str()), "{h:?}");
    assert_eq!(
        str_header(&h, "tenant"),
        Some("acme"),
        "kept across the rungs"
    );
    assert_eq!(
        msg.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("order-7")
    );
    assert_eq!(msg.data, b"fail");
    assert_eq!(snapshot.queues[0].retried, 2, "two rung hops: {snapshot:?}");
    assert_eq!(snapshot.queues[0].dead_lettered, 1, "{snapshot:?}");
    for name in [
        q.clone(),
        dlq.clone(),
        format!("{q}.retry.400ms"),
        format!("{q}.retry.800ms"),
    ] {
        assert_eq!(broker.ready(&name).await, Some(0), "{name} ends empty");
    }
    broker.delete(&all).await;
}

#[tokio::test]
async fn a_long_error_is_cut_to_4_kib_on_a_character_boundary_in_x_acemq_error() {
    let q = unique("dlq.long-error");
    let mut broker = Broker::new().await;
    let (running, all, dlq, _, _) = start_by_body(&q, three_attempts(&q)).await;
    broker.publish(&q, b"long", FieldTable::default()).await;
    let msg = dead_lettered(&mut broker, &dlq).await;
    running.drain().await.expect("clean drain");
    let h = message_headers(&msg.properties);
    // 6,000 bytes of two-byte characters: cut, still valid UTF-8.
    let error = str_header(&h, "x-acemq-error").expect("a UTF-8 string");
    assert!(error.len() <= 4096, "{} bytes", error.len());
    assert!(
        error.len() > 4000,
        "cut near the limit: {} bytes",
        error.len()
    );
    assert!(
        error.starts_with("rejected: éé") && error.ends_with("é…"),
        "{error}"
    );
    assert_eq!(str_header(&h, "x-acemq-reason"), Some("rejected"));
    broker.delete(&all).await;
}

#[tokio::test]
async fn every_header_type_survives_dead_lettering_as_the_broker_delivers_it() {
    let q = unique("dlq.header-types");
    let control = format!("{q}.control");
    let mut broker = Broker::new().await;
    let (running, all, dlq, _, _) = start_by_body(&q, three_attempts(&q)).await;
    broker
        .declare(&control, FieldTable::default())
        .await
        .expect("control queue");

    use lapin::types::{ByteArray, DecimalValue, FieldArray};
    let nested = field_table(vec![
        ("inner", long_str("x")),
        ("n", AMQPValue::LongInt(-3)),
    ]);
    let headers = field_table(vec![
        ("h-bool", AMQPValue::Boolean(true)),
        ("h-i8", AMQPValue::ShortShortInt(-8)),
        ("h-i16", AMQPValue::ShortInt(-16)),
        ("h-i32", AMQPValue::LongInt(-32)),
        ("h-i64", AMQPValue::LongLongInt(-64)),
        ("h-u32", AMQPValue::LongUInt(32)),
        ("h-f32", AMQPValue::Float(1.5)),
        ("h-f64", AMQPValue::Double(2.25)),
        (
            "h-decimal",
            AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 12345,
            }),
        ),
        ("h-string", long_str("text ✓")),
        (
            "h-array",
            AMQPValue::FieldArray(FieldArray::from(vec![
                AMQPValue::LongInt(1),
                long_str("two"),
            ])),
        ),
        ("h-timestamp", AMQPValue::Timestamp(1_700_000_000)),
        ("h-table", AMQPValue::FieldTable(nested)),
        (
            "h-bytes",
            AMQPValue::ByteArray(ByteArray::from(vec![0u8, 255, 7])),
        ),
        ("h-void", AMQPValue::Void),
    ]);
    broker.publish(&control, b"reject", headers.clone()).await;
    broker.publish(&q, b"reject", headers).await;
    let reference = broker
        .get_within(&control, Duration::from_secs(10))
        .await
        .expect("control message");
    let msg = dead_lettered(&mut broker, &dlq).await;
    running.drain().await.expect("clean drain");

    let mut got = message_headers(&msg.properties);
    for added in [
        "x-acemq-reason",
        "x-acemq-error",
        "x-acemq-attempts",
        "x-acemq-queue",
        "x-acemq-dead-lettered-at",
        "x-acemq-original-exchange",
        "x-acemq-original-routing-key",
    ] {
        assert!(got.remove(added).is_some(), "{added} added");
    }
    let want = message_headers(&reference.properties);
    assert_eq!(want.len(), 15, "{want:?}");
    assert_eq!(
        got, want,
        "the dead-lettered copy keeps every header as it was"
    );
    broker.delete(&all).await;
    broker.delete(&[control]).await;
}

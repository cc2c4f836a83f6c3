//! The dead-letter layer, in memory.

mod common;

use std::future::{ready, Ready};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use acemq_layers::dead_letter::{
    ErrorReplies, ATTEMPTS_HEADER, DEAD_LETTERED_AT_HEADER, ERROR_HEADER, MAX_ERROR_LEN,
    QUEUE_HEADER, REASON_HEADER,
};
use acemq_layers::{
    BoxError, DeadLetterDecision, DeadLetterLayer, Decision, Delivery, HandlerPanic, Headers,
    Properties, Reason, Reject, RetryDecision, RetryLayer, RetryPolicy, RetryVia, Value,
    ATTEMPT_HEADER,
};
use common::{Counters, FakePublisher};
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

// ---------------------------------------------------------------- fakes

/// A handler that answers `result` every time.
fn answering(
    result: impl Fn() -> Result<Decision, BoxError> + Clone + Send + Sync + 'static,
) -> impl Service<
    Delivery,
    Response = Decision,
    Error = BoxError,
    Future = Ready<Result<Decision, BoxError>>,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_: Delivery| ready(result()))
}

fn delivery() -> Delivery {
    let mut headers = Headers::new();
    headers.insert("x-custom", "kept");
    headers.insert(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    let mut properties = Properties::default();
    properties.content_type = Some("application/json".into());
    properties.message_id = Some("m-1".into());
    Delivery::builder()
        .queue("orders")
        .body(r#"{"id":1}"#)
        .headers(headers)
        .properties(properties)
        .build()
}

fn unpublished(reason: Reason, error: &str, attempts: u32) -> Decision {
    Decision::DeadLetter(DeadLetterDecision {
        reason,
        error: error.into(),
        attempts,
        published: false,
    })
}

fn str_header<'a>(headers: &'a Headers, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string header {name}"))
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "current_thread")]
async fn a_dead_letter_decision_is_published_with_all_five_headers_and_the_original_ones() {
    let counters = Counters::default();
    let _metrics = metrics::set_default_local_recorder(&counters);
    let broker = FakePublisher::default();
    let svc = DeadLetterLayer::new(broker.clone()).layer(answering(|| {
        Ok(unpublished(Reason::MaxAttempts, "database unavailable", 5))
    }));
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;

    let decision = svc.oneshot(delivery()).await.unwrap();

    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert_eq!(
        decision,
        Decision::DeadLetter(DeadLetterDecision {
            reason: Reason::MaxAttempts,
            error: "database unavailable".into(),
            attempts: 5,
            published: true,
        })
    );
    let published = broker.published();
    assert_eq!(published.len(), 1);
    let copy = &published[0];
    assert_eq!(copy.queue, "orders.dlq");
    assert_eq!(&copy.body[..], br#"{"id":1}"#);
    assert_eq!(copy.properties, *delivery().properties());
    let h = &copy.headers;
    assert_eq!(str_header(h, REASON_HEADER), "max-attempts");
    assert_eq!(str_header(h, ERROR_HEADER), "database unavailable");
    assert_eq!(h.get(ATTEMPTS_HEADER), Some(&Value::I64(5)));
    assert_eq!(str_header(h, QUEUE_HEADER), "orders");
    let at = h
        .get(DEAD_LETTERED_AT_HEADER)
        .and_then(Value::as_i64)
        .unwrap();
    assert!(
        (before..=after).contains(&at),
        "{before} <= {at} <= {after}"
    );
    assert_eq!(str_header(h, "x-custom"), "kept");
    assert!(
        h.get("traceparent").is_some(),
        "the trace context travels with the copy"
    );
    // Where the message came from, added on this first hop.
    assert!(h
        .get(acemq_layers::headers::ORIGINAL_EXCHANGE_HEADER)
        .is_some());
    assert!(h
        .get(acemq_layers::headers::ORIGINAL_ROUTING_KEY_HEADER)
        .is_some());
    assert_eq!(h.len(), 9);
    assert_eq!(
        counters.get("acemq.dead_lettered{queue=orders,reason=max-attempts}"),
        1
    );
}

#[tokio::test(flavor = "current_thread")]
async fn an_error_with_no_retry_layer_below_is_classified_and_dead_lettered() {
    type MakeError = fn() -> BoxError;
    let cases: [(MakeError, Reason, &str); 3] = [
        (
            || Reject::new("not an order").into(),
            Reason::Rejected,
            "rejected: not an order",
        ),
        (
            || HandlerPanic::from_payload(&"oops").into(),
            Reason::Panic,
            "handler panicked: oops",
        ),
        (|| "timed out".into(), Reason::MaxAttempts, "timed out"),
    ];
    for (error, reason, text) in cases {
        let broker = FakePublisher::default();
        let svc = DeadLetterLayer::new(broker.clone()).layer(answering(move || Err(error())));
        let mut headers = Headers::new();
        headers.insert(ATTEMPT_HEADER, Value::I64(3));
        let d = Delivery::builder().queue("orders").headers(headers).build();

        let decision = svc.oneshot(d).await.unwrap();

        assert_eq!(
            decision,
            Decision::DeadLetter(DeadLetterDecision {
                reason,
                error: text.into(),
                attempts: 3,
                published: true,
            })
        );
        let h = &broker.published()[0].headers;
        assert_eq!(str_header(h, REASON_HEADER), reason.as_str());
        assert_eq!(h.get(ATTEMPTS_HEADER), Some(&Value::I64(3)));
        assert_eq!(
            h.get(ATTEMPT_HEADER),
            Some(&Value::I64(3)),
            "original headers kept"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_missing_dead_letter_queue_is_declared_again_and_the_publish_tried_once_more() {
    let broker = FakePublisher::default().with(|s| {
        s.missing.insert("orders.dlq".into());
    });
    let svc = DeadLetterLayer::new(broker.clone())
        .layer(answering(|| Ok(unpublished(Reason::Rejected, "bad", 1))));

    let Decision::DeadLetter(dl) = svc.oneshot(delivery()).await.unwrap() else {
        panic!("expected a dead-letter decision");
    };

    assert!(dl.published);
    assert_eq!(broker.redeclared(), ["orders.dlq"]);
    assert_eq!(broker.attempted(), ["orders.dlq", "orders.dlq"]);
    assert_eq!(
        str_header(&broker.published()[0].headers, REASON_HEADER),
        "rejected"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_dead_letter_queue_still_missing_after_redeclare_leaves_the_delivery_to_the_brokers_dlx()
{
    let broker = FakePublisher::default().with(|s| {
        s.unroutable.insert("orders.dlq".into());
    });
    let svc = DeadLetterLayer::new(broker.clone())
        .layer(answering(|| Ok(unpublished(Reason::Panic, "boom", 1))));

    let decision = svc.oneshot(delivery()).await.unwrap();

    assert_eq!(decision, unpublished(Reason::Panic, "boom", 1));
    assert_eq!(broker.redeclared(), ["orders.dlq"]);
    assert_eq!(
        broker.attempted().len(),
        2,
        "published once more, and no more"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_nacked_dead_letter_publish_is_left_to_the_brokers_dlx_without_a_redeclare() {
    let broker = FakePublisher::default().with(|s| {
        s.nacking.insert("orders.dlq".into());
    });
    let svc = DeadLetterLayer::new(broker.clone()).layer(answering(|| Err("down".into())));

    let decision = svc.oneshot(delivery()).await.unwrap();

    assert_eq!(decision, unpublished(Reason::MaxAttempts, "down", 1));
    assert!(broker.redeclared().is_empty());
    assert_eq!(broker.attempted(), ["orders.dlq"]);
}

#[tokio::test(flavor = "current_thread")]
async fn the_error_header_is_cut_to_4096_bytes() {
    // Two-byte characters, so a cut in the middle of one must step back.
    let long = "é".repeat(5000);
    for from_error in [true, false] {
        let broker = FakePublisher::default();
        let text = long.clone();
        let svc = DeadLetterLayer::new(broker.clone()).layer(answering(move || {
            if from_error {
                Err(text.clone().into())
            } else {
                Ok(unpublished(Reason::MaxAttempts, &text, 2))
            }
        }));

        let Decision::DeadLetter(dl) = svc.oneshot(delivery()).await.unwrap() else {
            panic!("expected a dead-letter decision");
        };

        let header = str_header(&broker.published()[0].headers, ERROR_HEADER).to_owned();
        assert!(header.len() <= MAX_ERROR_LEN, "{} bytes", header.len());
        assert!(header.len() > MAX_ERROR_LEN - 4, "{} bytes", header.len());
        assert!(header.ends_with('…'));
        assert!(header.starts_with("éé"));
        assert_eq!(dl.error, header);
    }
    assert_eq!(MAX_ERROR_LEN, 4096);
}

#[tokio::test(flavor = "current_thread")]
async fn other_decisions_pass_through_untouched() {
    let published_already = Decision::DeadLetter(DeadLetterDecision {
        reason: Reason::Timeout,
        error: "slow".into(),
        attempts: 1,
        published: true,
    });
    let retry = Decision::Retry(RetryDecision {
        attempt: 2,
        delay: Duration::from_secs(20),
        via: RetryVia::Rung("orders.retry.20s".into()),
    });
    for decision in [
        Decision::Ack,
        Decision::HandBack,
        Decision::Abandoned,
        retry,
        published_already,
    ] {
        let broker = FakePublisher::default();
        let expected = decision.clone();
        let svc =
            DeadLetterLayer::new(broker.clone()).layer(answering(move || Ok(decision.clone())));

        assert_eq!(svc.oneshot(delivery()).await.unwrap(), expected);
        assert!(broker.attempted().is_empty());
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_disabled_layer_passes_everything_through() {
    let broker = FakePublisher::default();
    let layer = DeadLetterLayer::new(broker.clone()).enabled(false);
    assert!(!layer.is_enabled());

    let svc = layer.layer(answering(|| Err("down".into())));
    let error = svc.oneshot(delivery()).await.unwrap_err();
    assert_eq!(error.to_string(), "down");

    let svc = layer.layer(answering(|| Ok(unpublished(Reason::Rejected, "bad", 1))));
    assert_eq!(
        svc.oneshot(delivery()).await.unwrap(),
        unpublished(Reason::Rejected, "bad", 1)
    );
    assert!(broker.attempted().is_empty());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn over_the_retry_layer_exhausted_attempts_reach_the_dead_letter_queue() {
    let broker = FakePublisher::default();
    let mut policy =
        RetryPolicy::exponential(3, Duration::from_millis(100), Duration::from_secs(1));
    policy.broker_wait_threshold = Duration::from_secs(10);
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(broker.clone()))
        .layer(RetryLayer::new(
            policy,
            broker.clone(),
            CancellationToken::new(),
        ))
        .service_fn(|d: Delivery| async move {
            Err::<Decision, BoxError>(format!("attempt {} failed", d.attempt()).into())
        });

    let decision = svc.oneshot(delivery()).await.unwrap();

    assert_eq!(
        decision,
        Decision::DeadLetter(DeadLetterDecision {
            reason: Reason::MaxAttempts,
            error: "attempt 3 failed".into(),
            attempts: 3,
            published: true,
        })
    );
    let published = broker.published();
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].queue, "orders.dlq");
    assert_eq!(
        published[0].headers.get(ATTEMPTS_HEADER),
        Some(&Value::I64(3))
    );
}

/// A request: `delivery()` with `reply_to` and, if `id`, a `correlation_id`.
fn request(reply_to: &str, id: Option<&str>) -> Delivery {
    let mut properties = delivery().properties().clone();
    properties.reply_to = Some(reply_to.into());
    properties.correlation_id = id.map(Into::into);
    Delivery::builder()
        .queue("orders")
        .body(r#"{"id":1}"#)
        .properties(properties)
        .build()
}

#[tokio::test(flavor = "current_thread")]
async fn a_dead_lettered_request_gets_one_error_reply_after_its_copy_is_in_the_dead_letter_queue() {
    let broker = FakePublisher::default();
    let svc = DeadLetterLayer::new(broker.clone())
        .replies(ErrorReplies::serving().error_text(true))
        .layer(answering(|| Err(Reject::new("not an order").into())));
    let decision = svc
        .oneshot(request("amq.rabbitmq.reply-to.abc", Some("c-7")))
        .await
        .unwrap();
    assert!(matches!(decision, Decision::DeadLetter(d) if d.published));
    assert_eq!(
        broker.attempted(),
        ["orders.dlq", "reply:amq.rabbitmq.reply-to.abc"],
        "the copy first, then the reply"
    );
    assert_eq!(
        broker.replies(),
        [(
            "amq.rabbitmq.reply-to.abc".to_owned(),
            "c-7".to_owned(),
            "rejected".to_owned(),
            "rejected: not an order".to_owned()
        )]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_delivery_without_reply_to_or_correlation_id_gets_no_reply_and_a_request_that_succeeds_none_either(
) {
    let broker = FakePublisher::default();
    let failing = DeadLetterLayer::new(broker.clone())
        .replies(ErrorReplies::serving().also_to(["replies"]))
        .layer(answering(|| {
            Ok(unpublished(Reason::MaxAttempts, "down", 3))
        }));
    failing.clone().oneshot(delivery()).await.unwrap();
    failing
        .clone()
        .oneshot(request("", Some("c-1")))
        .await
        .unwrap();
    failing.oneshot(request("replies", None)).await.unwrap();
    let succeeding = DeadLetterLayer::new(broker.clone())
        .replies(ErrorReplies::serving().also_to(["replies"]))
        .layer(answering(|| Ok(Decision::Ack)));
    succeeding
        .oneshot(request("replies", Some("c-2")))
        .await
        .unwrap();
    assert!(broker.replies().is_empty(), "{:?}", broker.replies());
    // The copies of the enabled layers only.
    assert_eq!(broker.attempted(), ["orders.dlq"; 3]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_disabled_layer_still_replies_to_a_dead_lettered_request_and_publishes_no_copy() {
    let broker = FakePublisher::default();
    let svc = DeadLetterLayer::new(broker.clone())
        .enabled(false)
        .replies(ErrorReplies::serving().also_to(["replies"]))
        .layer(answering(|| {
            Ok(unpublished(Reason::MaxAttempts, "down", 3))
        }));
    let decision = svc.oneshot(request("replies", Some("c-3"))).await.unwrap();
    assert_eq!(decision, unpublished(Reason::MaxAttempts, "down", 3));
    assert_eq!(broker.attempted(), ["reply:replies"]);
    assert_eq!(broker.replies()[0].2, "max-attempts");
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_gets_no_error_reply_from_a_queue_that_serves_none_nor_to_an_address_not_allowed()
{
    let broker = FakePublisher::default();
    let rejecting = || answering(|| Ok(unpublished(Reason::Rejected, "not an order", 1)));
    // The default: the queue serves no requests.
    for enabled in [true, false] {
        DeadLetterLayer::new(broker.clone())
            .enabled(enabled)
            .layer(rejecting())
            .oneshot(request("victim.queue", Some("c-1")))
            .await
            .unwrap();
        DeadLetterLayer::new(broker.clone())
            .enabled(enabled)
            .layer(rejecting())
            .oneshot(request("amq.rabbitmq.reply-to.abc", Some("c-2")))
            .await
            .unwrap();
    }
    // A queue that serves requests: not to an address it does not name.
    DeadLetterLayer::new(broker.clone())
        .replies(ErrorReplies::serving())
        .layer(rejecting())
        .oneshot(request("victim.queue", Some("c-3")))
        .await
        .unwrap();
    assert!(broker.replies().is_empty(), "{:?}", broker.replies());
    // The copies of the enabled layers only.
    assert_eq!(broker.attempted(), ["orders.dlq"; 3]);
}

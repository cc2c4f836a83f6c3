//! Classification by meaning, not shape; typed outcomes; the redelivery
//! bound; where a copy came from. In memory, on a paused clock.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_layers::dead_letter::REASON_HEADER;
use acemq_layers::headers::{
    DELIVERY_COUNT_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER,
};
use acemq_layers::{
    BoxError, CancelLayer, Class, Classify, DeadLetterLayer, Decision, DefaultClassifier, Delivery,
    Headers, Reason, RedeliveryLimitLayer, Reject, RetryLayer, RetryPolicy, RetryVia, Value,
    Verdict, ATTEMPT_HEADER,
};
use common::FakePublisher;
use tokio_util::sync::CancellationToken;
use tower::{ServiceBuilder, ServiceExt};

// ------------------------------------------------------ classification

#[derive(Debug, thiserror::Error)]
enum Transparent {
    #[error(transparent)]
    Invalid(#[from] Reject),
}

#[derive(Debug, thiserror::Error)]
enum Outer {
    #[error(transparent)]
    Inner(#[from] Transparent),
}

#[derive(Debug, thiserror::Error)]
#[error("could not handle the order")]
struct WithSource(#[source] Reject);

#[derive(Debug, thiserror::Error)]
#[error("database down")]
struct Down;

fn every_shape_of_a_reject() -> Vec<(&'static str, BoxError)> {
    let r = || Reject::new("not an order");
    vec![
        ("Reject into BoxError", r().into()),
        ("Box<Reject> (boxed twice)", Box::new(r()).into()),
        (
            "Box<Box<Reject>> (boxed three times)",
            Box::new(Box::new(r())).into(),
        ),
        ("a source() chain", WithSource(r()).into()),
        ("#[error(transparent)]", Transparent::from(r()).into()),
        (
            "two #[error(transparent)] wrappers",
            Outer::from(Transparent::from(r())).into(),
        ),
        ("anyhow::Error::new", anyhow::Error::new(r()).into()),
        ("anyhow!", anyhow::anyhow!(r()).into()),
        (
            "anyhow .context()",
            anyhow::Error::new(r()).context("while parsing").into(),
        ),
        (
            "anyhow .context() twice",
            anyhow::Error::new(r())
                .context("while parsing")
                .context("order 7")
                .into(),
        ),
        (
            "anyhow wrapping a transparent wrapper",
            anyhow::Error::new(Transparent::from(r()))
                .context("x")
                .into(),
        ),
        (
            "Result::context on a Reject",
            anyhow::Context::context(Err::<(), _>(r()), "while parsing")
                .unwrap_err()
                .into(),
        ),
    ]
}

#[test]
fn a_reject_is_permanent_in_every_shape_it_can_take() {
    for (shape, error) in every_shape_of_a_reject() {
        assert_eq!(
            DefaultClassifier.classify(&*error),
            Class::Permanent,
            "{shape}: {error}"
        );
        assert!(Reject::is_in(&*error), "{shape}");
    }
}

#[test]
fn errors_without_a_reject_stay_transient() {
    let plain: Vec<BoxError> = vec![
        Down.into(),
        anyhow::Error::new(Down)
            .context("rejected: looks like one")
            .into(),
        "rejected: only the text says so".into(),
        Box::new(Down).into(),
    ];
    for error in plain {
        assert_eq!(
            DefaultClassifier.classify(&*error),
            Class::Transient,
            "{error}"
        );
    }
}

async fn tower_elapsed() -> BoxError {
    let svc = ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .service_fn(|_: Delivery| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, BoxError>(())
        });
    svc.oneshot(Delivery::builder().build()).await.unwrap_err()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn tower_and_tokio_timeouts_are_classed_as_timeouts() {
    let tower = tower_elapsed().await;
    assert_eq!(DefaultClassifier.classify(&*tower), Class::Timeout);
    let tokio: BoxError =
        tokio::time::timeout(Duration::from_secs(1), std::future::pending::<()>())
            .await
            .unwrap_err()
            .into();
    assert_eq!(DefaultClassifier.classify(&*tokio), Class::Timeout);
    let wrapped: BoxError = anyhow::Error::new(
        tokio::time::timeout(Duration::from_millis(1), std::future::pending::<()>())
            .await
            .unwrap_err(),
    )
    .context("calling the warehouse")
    .into();
    assert_eq!(DefaultClassifier.classify(&*wrapped), Class::Timeout);
}

fn policy(max_attempts: u32) -> RetryPolicy {
    // Every wait in process: no rung needed.
    let mut p =
        RetryPolicy::exponential(max_attempts, Duration::from_secs(1), Duration::from_secs(4));
    p.broker_wait_threshold = Duration::from_secs(3600);
    p
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_tower_timeout_is_retried_then_dead_lettered_with_reason_timeout() {
    let broker = FakePublisher::default();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(broker.clone()))
        .layer(RetryLayer::new(
            policy(3),
            broker.clone(),
            CancellationToken::new(),
        ))
        .layer(CancelLayer::new(CancellationToken::new()))
        .timeout(Duration::from_secs(2))
        .service_fn(move |_: Delivery| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, BoxError>(())
            }
        });
    let decision = svc
        .oneshot(Delivery::builder().queue("q").build())
        .await
        .unwrap();
    let Decision::DeadLetter(d) = decision else {
        panic!("{decision:?}")
    };
    assert_eq!(
        (d.reason, d.attempts, d.published),
        (Reason::Timeout, 3, true)
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "retried like a transient failure"
    );
    let copy = &broker.published()[0];
    assert_eq!(copy.queue, "q.dlq");
    assert_eq!(
        copy.headers.get(REASON_HEADER).and_then(Value::as_str),
        Some("timeout")
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_anyhow_reject_with_context_dead_letters_at_once_as_rejected() {
    let broker = FakePublisher::default();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(broker.clone()))
        .layer(RetryLayer::new(
            policy(5),
            broker.clone(),
            CancellationToken::new(),
        ))
        .layer(CancelLayer::new(CancellationToken::new()))
        .service_fn(move |_: Delivery| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                let parsed: anyhow::Result<()> =
                    Err(anyhow::Error::new(Reject::new("not json")).context("order 7"));
                parsed
            }
        });
    let decision = svc
        .oneshot(Delivery::builder().queue("q").build())
        .await
        .unwrap();
    let Decision::DeadLetter(d) = decision else {
        panic!("{decision:?}")
    };
    assert_eq!((d.reason, d.attempts), (Reason::Rejected, 1));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "not retried");
    assert!(d.error.contains("not json"), "{}", d.error);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_ended_inbox_transaction_dead_letters_at_once_whatever_the_classifier_says() {
    let broker = FakePublisher::default();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(broker.clone()))
        .layer(
            RetryLayer::new(policy(5), broker.clone(), CancellationToken::new())
                // A classifier that retries everything: the reason still wins.
                .classifier(|_: &(dyn std::error::Error + 'static)| Class::Transient),
        )
        .layer(CancelLayer::new(CancellationToken::new()))
        .service_fn(move |_: Delivery| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                let ended = acemq_layers::inbox::TransactionEnded::new(Some(("q", "m-1")));
                Err::<(), BoxError>(Box::new(ended))
            }
        });
    let decision = svc
        .oneshot(Delivery::builder().queue("q").build())
        .await
        .unwrap();
    let Decision::DeadLetter(d) = decision else {
        panic!("{decision:?}")
    };
    assert_eq!(
        (d.reason, d.attempts, d.published),
        (Reason::TransactionEnded, 1, true)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "not retried");
    assert!(
        d.error.contains("ended the inbox's transaction"),
        "{}",
        d.error
    );
    assert_eq!(
        Reason::from_header(Reason::TransactionEnded.as_str()),
        Some(Reason::TransactionEnded)
    );
    assert_eq!(Reason::TransactionEnded.as_str(), "transaction-ended");
}

// ------------------------------------------------------ typed outcomes

async fn verdict_of(outcome: Verdict) -> (Decision, FakePublisher) {
    let broker = FakePublisher::default();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(broker.clone()))
        .layer(RetryLayer::new(
            policy(5),
            broker.clone(),
            CancellationToken::new(),
        ))
        .layer(CancelLayer::new(CancellationToken::new()))
        .service_fn(move |_: Delivery| {
            let outcome = outcome.clone();
            async move { Ok::<_, BoxError>(outcome) }
        });
    let decision = svc
        .oneshot(Delivery::builder().queue("q").build())
        .await
        .unwrap();
    (decision, broker)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_typed_outcome_is_carried_out_ack_requeue_and_dead_letter() {
    assert_eq!(verdict_of(Verdict::Ack).await.0, Decision::Ack);
    let (requeue, broker) = verdict_of(Verdict::Requeue).await;
    assert_eq!(requeue, Decision::HandBack, "handed back, not acked");
    assert!(broker.published().is_empty(), "no retry, no copy");
    let (dead, broker) = verdict_of(Verdict::dead_letter("duplicate order")).await;
    let Decision::DeadLetter(d) = dead else {
        panic!("{dead:?}")
    };
    assert_eq!((d.reason, d.published), (Reason::Rejected, true));
    assert_eq!(d.error, "duplicate order");
    assert_eq!(broker.published()[0].queue, "q.dlq");
}

// ------------------------------------------------------ redeliveries

fn redelivered(count: i64) -> Delivery {
    let mut headers = Headers::new();
    headers.insert(DELIVERY_COUNT_HEADER, Value::I64(count));
    headers.insert("x-custom", "kept");
    Delivery::builder()
        .queue("q")
        .exchange("shop")
        .routing_key("orders.eu")
        .headers(headers)
        .build()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_delivery_redelivered_past_the_bound_is_dead_lettered_without_calling_the_handler() {
    let broker = FakePublisher::default();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(broker.clone()))
        .layer(RedeliveryLimitLayer::new(3))
        .layer(RetryLayer::new(
            policy(5),
            broker.clone(),
            CancellationToken::new(),
        ))
        .layer(CancelLayer::new(CancellationToken::new()))
        .service_fn(move |_: Delivery| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(()) }
        });
    // At the bound: handled.
    let at = svc.clone().oneshot(redelivered(3)).await.unwrap();
    assert_eq!(at, Decision::Ack);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Past it: dead-lettered, the handler not called.
    let past = svc.oneshot(redelivered(4)).await.unwrap();
    let Decision::DeadLetter(d) = past else {
        panic!("{past:?}")
    };
    assert_eq!((d.reason, d.published), (Reason::Redelivered, true));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "handler not called");
    let copy = &broker.published()[0];
    assert_eq!(copy.queue, "q.dlq");
    assert_eq!(
        copy.headers.get(REASON_HEADER).and_then(Value::as_str),
        Some("redelivered")
    );
    assert_eq!(copy.headers.get(DELIVERY_COUNT_HEADER), None, "stripped");
    assert_eq!(
        copy.headers.get("x-custom").and_then(Value::as_str),
        Some("kept")
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_rung_copy_strips_the_delivery_count_and_keeps_where_the_message_came_from() {
    let broker = FakePublisher::default();
    let mut p = policy(3);
    p.broker_wait_threshold = Duration::from_secs(1); // every wait on a rung
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(broker.clone()))
        .layer(RetryLayer::new(p, broker.clone(), CancellationToken::new()))
        .layer(CancelLayer::new(CancellationToken::new()))
        .service_fn(|d: Delivery| async move {
            // The handler sees where the message came from on every attempt.
            assert_eq!(d.original_exchange(), "shop");
            assert_eq!(d.original_routing_key(), "orders.eu");
            Err::<(), BoxError>("down".into())
        });
    let first = svc.clone().oneshot(redelivered(2)).await.unwrap();
    let Decision::Retry(r) = first else {
        panic!("{first:?}")
    };
    assert_eq!(r.via, RetryVia::Rung("q.retry.1s".into()));
    let copy = broker.published().remove(0);
    assert_eq!(copy.headers.get(DELIVERY_COUNT_HEADER), None, "stripped");
    assert_eq!(
        copy.headers
            .get(ORIGINAL_EXCHANGE_HEADER)
            .and_then(Value::as_str),
        Some("shop")
    );
    assert_eq!(
        copy.headers
            .get(ORIGINAL_ROUTING_KEY_HEADER)
            .and_then(Value::as_str),
        Some("orders.eu")
    );
    // Attempt 2 comes back from the rung through the default exchange with
    // routing key `q`: the original is kept, not overwritten.
    let second = Delivery::builder()
        .queue("q")
        .exchange("")
        .routing_key("q")
        .headers(copy.headers.clone())
        .build();
    assert_eq!(second.attempt(), 2);
    assert_eq!(second.exchange(), "");
    assert_eq!(second.original_exchange(), "shop");
    assert_eq!(second.original_routing_key(), "orders.eu");
    let again = svc.oneshot(second).await.unwrap();
    assert!(matches!(again, Decision::Retry(_)), "{again:?}");
    let copy = broker.published().remove(1);
    assert_eq!(copy.headers.get(ATTEMPT_HEADER), Some(&Value::I64(3)));
    assert_eq!(
        copy.headers
            .get(ORIGINAL_ROUTING_KEY_HEADER)
            .and_then(Value::as_str),
        Some("orders.eu"),
        "kept after the first hop"
    );
}

#[test]
fn a_delivery_without_the_headers_reports_its_own_exchange_and_routing_key() {
    let d = Delivery::builder()
        .exchange("shop")
        .routing_key("orders.us")
        .build();
    assert_eq!(
        (d.original_exchange(), d.original_routing_key()),
        ("shop", "orders.us")
    );
}

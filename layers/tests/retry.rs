//! The retry layer, in memory, on a paused clock.

mod common;

use std::future::{ready, Ready};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_layers::{
    BoxError, DeadLetterDecision, Decision, Delivery, HandlerPanic, Headers, Reason, Reject,
    RetryDecision, RetryLayer, RetryPolicy, RetryVia, Value, ATTEMPT_HEADER,
};
use common::{Counters, FakePublisher};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service, ServiceExt};

// ---------------------------------------------------------------- fakes

/// The attempt number and time of every call of the handler.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<(u32, Instant)>>>);

impl Calls {
    fn attempts(&self) -> Vec<u32> {
        self.0.lock().unwrap().iter().map(|c| c.0).collect()
    }
    fn times(&self) -> Vec<Instant> {
        self.0.lock().unwrap().iter().map(|c| c.1).collect()
    }
}

/// A handler that records its calls and answers `script(attempt)`.
fn scripted<F>(
    calls: &Calls,
    script: F,
) -> impl Service<
    Delivery,
    Response = Decision,
    Error = BoxError,
    Future = Ready<Result<Decision, BoxError>>,
> + Clone
       + Send
       + 'static
where
    F: Fn(u32) -> Result<Decision, BoxError> + Clone + Send + Sync + 'static,
{
    let calls = calls.clone();
    tower::service_fn(move |d: Delivery| {
        calls.0.lock().unwrap().push((d.attempt(), Instant::now()));
        ready(script(d.attempt()))
    })
}

fn delivery() -> Delivery {
    let mut headers = Headers::new();
    headers.insert("x-custom", "kept");
    Delivery::builder()
        .queue("q")
        .body("payload")
        .headers(headers)
        .build()
}

fn policy(initial: Duration, threshold: Duration, max_attempts: u32) -> RetryPolicy {
    let mut p = RetryPolicy::exponential(max_attempts, initial, Duration::from_secs(3600));
    p.broker_wait_threshold = threshold;
    p
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn failure(msg: &str) -> Result<Decision, BoxError> {
    Err(msg.to_owned().into())
}

// ------------------------------------------------ metrics and warnings

/// A tracing subscriber that keeps the message of every warning.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        if *event.metadata().level() == tracing::Level::WARN {
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0.lock().unwrap().push(m.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_delivery_that_fails_twice_waits_200ms_here_then_goes_to_the_400ms_rung_as_attempt_3() {
    let calls = Calls::default();
    let broker = FakePublisher::default();
    let layer = RetryLayer::new(
        policy(ms(200), ms(400), 5),
        broker.clone(),
        CancellationToken::new(),
    );
    let svc = layer.layer(scripted(&calls, |n| {
        if n <= 2 {
            failure("database unavailable")
        } else {
            Ok(Decision::Ack)
        }
    }));

    let decision = svc.oneshot(delivery()).await.unwrap();

    assert_eq!(
        decision,
        Decision::Retry(RetryDecision {
            attempt: 3,
            delay: ms(400),
            via: RetryVia::Rung("q.retry.400ms".into()),
        })
    );
    assert_eq!(
        calls.attempts(),
        [1, 2],
        "the third attempt is the broker's"
    );
    let times = calls.times();
    assert_eq!(times[1] - times[0], ms(200), "one in-process wait of 200ms");
    let published = broker.published();
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].queue, "q.retry.400ms");
    assert_eq!(
        published[0].headers.get(ATTEMPT_HEADER),
        Some(&Value::I64(3))
    );
    assert_eq!(
        published[0].headers.get("x-custom"),
        Some(&Value::from("kept"))
    );
    assert_eq!(layer.waiting().count(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn exhausted_attempts_dead_letter_with_reason_max_attempts_and_the_last_error() {
    let calls = Calls::default();
    let broker = FakePublisher::default();
    let layer = RetryLayer::new(
        policy(ms(10), Duration::from_secs(60), 3),
        broker.clone(),
        CancellationToken::new(),
    );
    let svc = layer.layer(scripted(&calls, |n| failure(&format!("failure {n}"))));

    let decision = svc.oneshot(delivery()).await.unwrap();

    assert_eq!(
        decision,
        Decision::DeadLetter(DeadLetterDecision {
            reason: Reason::MaxAttempts,
            error: "failure 3".into(),
            attempts: 3,
            published: false,
        })
    );
    assert_eq!(calls.attempts(), [1, 2, 3]);
    let times = calls.times();
    assert_eq!((times[1] - times[0], times[2] - times[1]), (ms(10), ms(20)));
    assert!(broker.attempted().is_empty());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_delivery_arriving_at_its_last_attempt_is_dead_lettered_without_a_retry() {
    let calls = Calls::default();
    let mut headers = Headers::new();
    headers.insert(ATTEMPT_HEADER, Value::I64(4));
    let d = Delivery::builder().queue("q").headers(headers).build();
    let layer = RetryLayer::new(
        policy(ms(10), ms(20), 4),
        FakePublisher::default(),
        CancellationToken::new(),
    );
    let svc = layer.layer(scripted(&calls, |_| failure("still down")));

    let Decision::DeadLetter(dl) = svc.oneshot(d).await.unwrap() else {
        panic!("expected a dead-letter decision");
    };
    assert_eq!((dl.reason, dl.attempts), (Reason::MaxAttempts, 4));
    assert_eq!(calls.attempts(), [4]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_reject_is_dead_lettered_as_rejected_at_once_after_one_call() {
    let calls = Calls::default();
    let broker = FakePublisher::default();
    let layer = RetryLayer::new(
        policy(ms(10), ms(400), 5),
        broker.clone(),
        CancellationToken::new(),
    );
    let svc = layer.layer(scripted(&calls, |_| Err(Reject::new("bad body").into())));
    let start = Instant::now();

    let decision = svc.oneshot(delivery()).await.unwrap();

    assert_eq!(
        decision,
        Decision::DeadLetter(DeadLetterDecision {
            reason: Reason::Rejected,
            error: "rejected: bad body".into(),
            attempts: 1,
            published: false,
        })
    );
    assert_eq!(calls.attempts(), [1]);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(broker.attempted().is_empty());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_panic_is_dead_lettered_as_panic() {
    let calls = Calls::default();
    let layer = RetryLayer::new(
        policy(ms(10), ms(400), 5),
        FakePublisher::default(),
        CancellationToken::new(),
    );
    let svc = layer.layer(scripted(&calls, |_| {
        Err(HandlerPanic::from_payload(&"index out of bounds").into())
    }));

    let Decision::DeadLetter(dl) = svc.oneshot(delivery()).await.unwrap() else {
        panic!("expected a dead-letter decision");
    };
    assert_eq!(
        (dl.reason, dl.attempts, dl.published),
        (Reason::Panic, 1, false)
    );
    assert_eq!(dl.error, "handler panicked: index out of bounds");
    assert_eq!(calls.attempts(), [1]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_panic_is_retried_when_the_policy_retries_panics() {
    let calls = Calls::default();
    let mut p = policy(ms(10), ms(400), 5);
    p.retry_panics = true;
    let layer = RetryLayer::new(p, FakePublisher::default(), CancellationToken::new());
    let svc = layer.layer(scripted(&calls, |n| {
        if n == 1 {
            Err(HandlerPanic::from_payload(&"flaky").into())
        } else {
            Ok(Decision::Ack)
        }
    }));

    assert_eq!(svc.oneshot(delivery()).await.unwrap(), Decision::Ack);
    assert_eq!(calls.attempts(), [1, 2]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_custom_classifier_decides_what_is_permanent() {
    let calls = Calls::default();
    let layer = RetryLayer::new(
        policy(ms(10), ms(400), 5),
        FakePublisher::default(),
        CancellationToken::new(),
    )
    .classifier(|e: &(dyn std::error::Error + 'static)| {
        if e.to_string().contains("schema") {
            acemq_layers::Class::Permanent
        } else {
            acemq_layers::Class::Transient
        }
    });
    let svc = layer.layer(scripted(&calls, |_| failure("schema mismatch")));

    let Decision::DeadLetter(dl) = svc.oneshot(delivery()).await.unwrap() else {
        panic!("expected a dead-letter decision");
    };
    assert_eq!(dl.reason, Reason::Rejected);
    assert_eq!(calls.attempts(), [1]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_missing_rung_is_waited_out_here_counted_and_warned_about_once() {
    let counters = Counters::default();
    let _metrics = metrics::set_default_local_recorder(&counters);
    let warnings = Warnings::default();
    let _tracing = tracing::subscriber::set_default(warnings.clone());

    let calls = Calls::default();
    let broker = FakePublisher::default().unroutable("q.retry.400ms");
    let layer = RetryLayer::new(
        policy(ms(400), ms(400), 5),
        broker.clone(),
        CancellationToken::new(),
    );
    let svc = layer.layer(scripted(&calls, |n| {
        if n % 2 == 1 {
            failure("database unavailable")
        } else {
            Ok(Decision::Ack)
        }
    }));

    for _ in 0..2 {
        let start = Instant::now();
        assert_eq!(
            svc.clone().oneshot(delivery()).await.unwrap(),
            Decision::Ack
        );
        assert_eq!(start.elapsed(), ms(400), "waited here instead");
    }

    assert_eq!(
        calls.attempts(),
        [1, 2, 1, 2],
        "the inner service was called again"
    );
    assert_eq!(broker.attempted(), ["q.retry.400ms", "q.retry.400ms"]);
    assert_eq!(counters.get("acemq.retry.rung.missing{queue=q}"), 2);
    assert_eq!(
        counters.get("acemq.retry.scheduled{queue=q,where=process}"),
        2
    );
    assert_eq!(
        counters.get("acemq.retry.scheduled{queue=q,where=broker}"),
        0
    );
    let warned: Vec<String> = warnings.0.lock().unwrap().clone();
    assert_eq!(warned.len(), 1, "warned once per rung: {warned:?}");
    assert!(warned[0].contains("q.retry.400ms"), "{}", warned[0]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_broker_wait_is_counted_as_scheduled_in_the_broker() {
    let counters = Counters::default();
    let _metrics = metrics::set_default_local_recorder(&counters);
    let calls = Calls::default();
    let layer = RetryLayer::new(
        policy(ms(400), ms(400), 5),
        FakePublisher::default(),
        CancellationToken::new(),
    );
    let svc = layer.layer(scripted(&calls, |_| failure("down")));

    let decision = svc.oneshot(delivery()).await.unwrap();

    assert!(matches!(
        decision,
        Decision::Retry(RetryDecision { attempt: 2, .. })
    ));
    assert_eq!(
        counters.get("acemq.retry.scheduled{queue=q,where=broker}"),
        1
    );
    assert_eq!(counters.get("acemq.retry.rung.missing{queue=q}"), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_rung_publish_that_is_nacked_waits_here_instead_and_retries() {
    let calls = Calls::default();
    let broker = FakePublisher::default().nacking("q.retry.1s");
    let layer = RetryLayer::new(
        policy(Duration::from_secs(1), ms(400), 2),
        broker,
        CancellationToken::new(),
    );
    let svc = layer.layer(scripted(&calls, |n| {
        if n == 1 {
            failure("down")
        } else {
            Ok(Decision::Ack)
        }
    }));
    let start = Instant::now();

    assert_eq!(svc.oneshot(delivery()).await.unwrap(), Decision::Ack);
    assert_eq!(calls.attempts(), [1, 2], "retried here, not handed back");
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(1),
        "after the rung's delay"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_drain_during_an_in_process_wait_hands_the_delivery_back_at_once_when_there_is_no_rung() {
    let calls = Calls::default();
    let draining = CancellationToken::new();
    let broker = FakePublisher::default().unroutable("q.retry.10s");
    let layer = RetryLayer::new(
        policy(Duration::from_secs(10), Duration::from_secs(60), 5),
        broker.clone(),
        draining.clone(),
    );
    let waits = layer.waiting();
    let svc = layer.layer(scripted(&calls, |_| failure("down")));
    let drain = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let waiting = waits.count();
        draining.cancel();
        waiting
    });
    let start = Instant::now();

    let decision = svc.oneshot(delivery()).await.unwrap();

    assert_eq!(decision, Decision::HandBack);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(1),
        "stopped waiting when the drain began"
    );
    assert_eq!(
        drain.await.unwrap(),
        1,
        "the wait was counted while it lasted"
    );
    assert_eq!(layer.waiting().count(), 0);
    assert_eq!(calls.attempts(), [1]);
    assert_eq!(broker.attempted(), ["q.retry.10s"]);
    assert!(broker.published().is_empty());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_drain_during_an_in_process_wait_moves_the_retry_to_its_rung_when_one_exists() {
    let calls = Calls::default();
    let draining = CancellationToken::new();
    let broker = FakePublisher::default();
    let layer = RetryLayer::new(
        policy(Duration::from_secs(10), Duration::from_secs(60), 5),
        broker.clone(),
        draining.clone(),
    );
    let svc = layer.layer(scripted(&calls, |_| failure("down")));
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        draining.cancel();
    });
    let start = Instant::now();

    let decision = svc.oneshot(delivery()).await.unwrap();

    assert_eq!(
        decision,
        Decision::Retry(RetryDecision {
            attempt: 2,
            delay: Duration::from_secs(10),
            via: RetryVia::Rung("q.retry.10s".into()),
        })
    );
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    let published = broker.published();
    assert_eq!(published.len(), 1);
    assert_eq!(
        published[0].headers.get(ATTEMPT_HEADER),
        Some(&Value::I64(2))
    );
    assert_eq!(calls.attempts(), [1]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_drain_during_a_wait_that_fell_back_from_a_missing_rung_hands_back() {
    let calls = Calls::default();
    let draining = CancellationToken::new();
    let broker = FakePublisher::default().unroutable("q.retry.300s");
    let layer = RetryLayer::new(
        policy(Duration::from_secs(300), Duration::from_secs(10), 5),
        broker.clone(),
        draining.clone(),
    );
    let svc = layer.layer(scripted(&calls, |_| failure("down")));
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        draining.cancel();
    });
    let start = Instant::now();

    assert_eq!(svc.oneshot(delivery()).await.unwrap(), Decision::HandBack);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(2),
        "a five-minute wait does not hold the drain"
    );
    assert_eq!(
        broker.attempted(),
        ["q.retry.300s"],
        "the known-missing rung is not tried again"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_in_process_retry_starts_once_the_drain_has_begun() {
    let calls = Calls::default();
    let draining = CancellationToken::new();
    draining.cancel();
    let broker = FakePublisher::default().unroutable("q.retry.10ms");
    let layer = RetryLayer::new(policy(ms(10), Duration::from_secs(60), 5), broker, draining);
    let svc = layer.layer(scripted(&calls, |_| failure("down")));
    let start = Instant::now();

    assert_eq!(svc.oneshot(delivery()).await.unwrap(), Decision::HandBack);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(calls.attempts(), [1], "no second attempt in this process");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_broker_wait_still_goes_to_its_rung_while_draining() {
    let calls = Calls::default();
    let draining = CancellationToken::new();
    draining.cancel();
    let broker = FakePublisher::default();
    let layer = RetryLayer::new(
        policy(Duration::from_secs(20), Duration::from_secs(10), 5),
        broker.clone(),
        draining,
    );
    let svc = layer.layer(scripted(&calls, |_| failure("down")));

    let decision = svc.oneshot(delivery()).await.unwrap();

    assert_eq!(
        decision,
        Decision::Retry(RetryDecision {
            attempt: 2,
            delay: Duration::from_secs(20),
            via: RetryVia::Rung("q.retry.20s".into()),
        })
    );
    assert_eq!(broker.published()[0].queue, "q.retry.20s");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn hand_back_abandoned_and_ack_pass_through_untouched() {
    for decision in [Decision::HandBack, Decision::Abandoned, Decision::Ack] {
        let calls = Calls::default();
        let broker = FakePublisher::default();
        let layer = RetryLayer::new(
            policy(ms(10), ms(400), 5),
            broker.clone(),
            CancellationToken::new(),
        );
        let expected = decision.clone();
        let svc = layer.layer(scripted(&calls, move |_| Ok(decision.clone())));

        assert_eq!(svc.oneshot(delivery()).await.unwrap(), expected);
        assert_eq!(calls.attempts(), [1]);
        assert!(broker.attempted().is_empty());
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_the_future_during_a_wait_ends_the_wait_and_its_count() {
    let calls = Calls::default();
    let layer = RetryLayer::new(
        policy(Duration::from_secs(10), Duration::from_secs(60), 5),
        FakePublisher::default(),
        CancellationToken::new(),
    );
    let svc = layer.layer(scripted(&calls, |_| failure("down")));

    let result = tokio::time::timeout(Duration::from_secs(1), svc.oneshot(delivery())).await;

    assert!(result.is_err(), "still waiting when dropped");
    assert_eq!(layer.waiting().count(), 0);
    assert_eq!(calls.attempts(), [1]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn jittered_in_process_waits_stay_within_twenty_percent() {
    let calls = Calls::default();
    let mut p = policy(Duration::from_secs(1), Duration::from_secs(60), 2);
    p.jitter = true;
    let layer = RetryLayer::new(p, FakePublisher::default(), CancellationToken::new());
    let svc = layer.layer(scripted(&calls, |n| {
        if n == 1 {
            failure("down")
        } else {
            Ok(Decision::Ack)
        }
    }));

    for _ in 0..20 {
        let start = Instant::now();
        assert_eq!(
            svc.clone().oneshot(delivery()).await.unwrap(),
            Decision::Ack
        );
        let waited = start.elapsed();
        assert!(waited >= ms(800) && waited <= ms(1200), "{waited:?}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retry_waits_are_shared_by_every_service_of_one_layer() {
    let draining = CancellationToken::new();
    let layer = RetryLayer::new(
        policy(Duration::from_secs(5), Duration::from_secs(60), 5),
        FakePublisher::default(),
        draining.clone(),
    );
    let calls = Calls::default();
    let a = layer.layer(scripted(&calls, |_| failure("down")));
    let b = layer.layer(scripted(&calls, |_| failure("down")));
    let waits = a.waiting();
    let first = tokio::spawn(a.oneshot(delivery()));
    let second = tokio::spawn(b.oneshot(delivery()));

    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(layer.waiting().count(), 2);
    assert_eq!(waits.count(), 2);
    draining.cancel();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(waits.count(), 0);
}

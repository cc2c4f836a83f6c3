//! The in-memory harness of the exact stack `App` builds (`acemq::testing`),
//! and through it the places a user's layers go: outer layers see each
//! delivery's final outcome, inner layers each attempt; a queue's own
//! classifier and retry policy in code. No broker: time is paused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::layers::{Class, RetryPolicy};
use acemq::testing::{Fate, PublishMode, TestQueue};
use acemq::{BoxError, Config, Decision, Delivery, Outcome, QueueStack, Reason};
use tower::service_fn;
use tower::util::{MapRequestLayer, MapResponseLayer};

fn queue(yaml: &str) -> acemq::config::QueueConfig {
    Config::from_yaml_str(yaml).expect("valid config").queues[0].clone()
}

fn failing(
    times: u32,
) -> impl tower::Service<Delivery, Response = (), Error = BoxError, Future: Send> + Clone + Send {
    service_fn(move |d: Delivery| async move {
        if d.attempt() <= times {
            Err::<(), BoxError>(format!("attempt {} fails", d.attempt()).into())
        } else {
            Ok(())
        }
    })
}

const FIVE_ATTEMPTS: &str = "queues: [{ name: invoices, dead_letter: true,
    retries: { max_attempts: 5, initial_delay: 60, max_delay: 600, broker_wait_threshold: 120 } }]";

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_five_attempt_schedule_of_minutes_runs_under_a_paused_clock_and_reports_each_step() {
    let mut h = TestQueue::new(queue(FIVE_ATTEMPTS), failing(99));
    // Attempt 1 fails: 60 s is below the 120 s threshold, so it waits here.
    let r = h.deliver_body("invoice").await;
    // 60 s here, then 120 s is at the threshold: a rung.
    assert_eq!(
        r.attempts
            .iter()
            .map(|a| (a.attempt, a.at))
            .collect::<Vec<_>>(),
        vec![(1, Duration::ZERO), (2, Duration::from_secs(60))]
    );
    match &r.fate {
        Fate::RetriedOnRung {
            rung,
            attempt,
            delay,
            headers,
        } => {
            assert_eq!(rung, "invoices.retry.120s");
            assert_eq!(*attempt, 3);
            assert_eq!(*delay, Duration::from_secs(120));
            assert_eq!(
                headers.get("x-acemq-attempt").and_then(|v| v.as_i64()),
                Some(3)
            );
        }
        other => panic!("expected a rung hop, got {other:?}"),
    }
    // The copy comes back as attempt 5 (after the rungs): the last attempt.
    let mut d = h.delivery("invoice");
    d.set_attempt(5);
    let r = h.deliver(d).await;
    match &r.fate {
        Fate::DeadLettered {
            reason,
            error,
            headers,
        } => {
            assert_eq!(*reason, Reason::MaxAttempts);
            assert!(error.contains("attempt 5 fails"), "{error}");
            assert_eq!(
                headers.get("x-acemq-reason").and_then(|v| v.as_str()),
                Some("max-attempts")
            );
            assert_eq!(
                headers.get("x-acemq-queue").and_then(|v| v.as_str()),
                Some("invoices")
            );
        }
        other => panic!("expected a dead-letter, got {other:?}"),
    }
    assert_eq!(r.published.len(), 1);
    assert_eq!(r.published[0].queue, "invoices.dlq");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn outer_layers_see_the_final_outcome_once_and_inner_layers_see_every_attempt() {
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let (o, a) = (outcomes.clone(), attempts.clone());
    let stack = QueueStack::new()
        .outer(MapResponseLayer::new(move |out: Outcome| {
            o.lock().unwrap().push(out.decision().clone());
            out
        }))
        .inner(MapRequestLayer::new(move |d: Delivery| {
            a.lock().unwrap().push(d.attempt());
            d
        }));
    let q = queue(
        "queues: [{ name: audited, retries: { max_attempts: 3, initial_delay: 1, max_delay: 1 } }]",
    );
    let mut h = TestQueue::with_stack(q, stack, failing(2));
    let r = h.deliver_body("x").await;
    assert_eq!(r.fate, Fate::Acked);
    assert_eq!(
        *attempts.lock().unwrap(),
        vec![1, 2, 3],
        "inner: every attempt"
    );
    assert_eq!(
        *outcomes.lock().unwrap(),
        vec![Decision::Ack],
        "outer: once, the final outcome"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_queues_own_classifier_and_retry_policy_in_code_replace_the_defaults() {
    let stack = QueueStack::new()
        .classifier(|e: &(dyn std::error::Error + 'static)| {
            if e.to_string().contains("invalid") {
                Class::Permanent
            } else {
                Class::Transient
            }
        })
        .retry_policy(RetryPolicy::exponential(
            2,
            Duration::from_secs(1),
            Duration::from_secs(1),
        ));
    let q = queue("queues: [{ name: coded, dead_letter: true }]");
    let mut h = TestQueue::with_stack(
        q,
        stack,
        service_fn(|d: Delivery| async move {
            match &d.body()[..] {
                b"invalid" => Err::<(), BoxError>("invalid invoice".into()),
                _ => Err("database down".into()),
            }
        }),
    );
    let r = h.deliver_body("invalid").await;
    assert!(
        matches!(
            r.fate,
            Fate::DeadLettered {
                reason: Reason::Rejected,
                ..
            }
        ),
        "{:?}",
        r.fate
    );
    assert_eq!(r.attempts.len(), 1, "permanent: no retry");
    // The config has no retries; the policy in code gives two attempts.
    let r = h.deliver_body("other").await;
    assert_eq!(r.attempts.len(), 2, "{:?}", r.attempts);
    assert!(
        matches!(
            r.fate,
            Fate::DeadLettered {
                reason: Reason::MaxAttempts,
                ..
            }
        ),
        "{:?}",
        r.fate
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_outer_layer_that_fails_hands_the_delivery_back_instead_of_inventing_a_decision() {
    #[derive(Clone)]
    struct Refuses;
    impl<S> tower::Layer<S> for Refuses {
        type Service = tower::util::BoxCloneService<Delivery, Outcome, BoxError>;
        fn layer(&self, _inner: S) -> Self::Service {
            tower::util::BoxCloneService::new(service_fn(|_d: Delivery| async {
                Err::<Outcome, BoxError>("circuit open".into())
            }))
        }
    }
    let q = queue("queues: [{ name: guarded }]");
    let mut h = TestQueue::with_stack(q, QueueStack::new().outer(Refuses), failing(0));
    let r = h.deliver_body("x").await;
    assert_eq!(r.fate, Fate::HandedBack);
    assert!(r.attempts.is_empty(), "the handler was never reached");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_nacked_dead_letter_copy_is_rejected_to_the_queues_own_dead_letter_exchange() {
    let q = queue("queues: [{ name: nacked, dead_letter: true }]");
    let mut h = TestQueue::new(
        q,
        service_fn(|_d: Delivery| async { Err::<(), BoxError>(acemq::Reject::new("no").into()) }),
    );
    h.publisher().answer("nacked.dlq", PublishMode::Nack);
    let r = h.deliver_body("x").await;
    assert!(
        matches!(
            r.fate,
            Fate::RejectedToDlx {
                reason: Reason::Rejected,
                ..
            }
        ),
        "{:?}",
        r.fate
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn once_the_drain_began_a_failure_moves_to_its_rung_or_is_handed_back_never_waits_here() {
    let q = queue("queues: [{ name: draining, retries: { max_attempts: 3, initial_delay: 60, max_delay: 60, broker_wait_threshold: 60 } }]");
    // 60 s is at the threshold: straight to the rung, no wait.
    let mut h = TestQueue::new(q, failing(99));
    let r = h.deliver_body("x").await;
    assert!(matches!(r.fate, Fate::RetriedOnRung { .. }), "{:?}", r.fate);

    // Once the drain has begun, a failure is not retried here.
    let q = queue(
        "queues: [{ name: drained, retries: { max_attempts: 3, initial_delay: 1, max_delay: 1 } }]",
    );
    let mut h = TestQueue::new(q, failing(99));
    h.start_drain();
    let r = h.deliver_body("x").await;
    assert_eq!(r.fate, Fate::HandedBack, "no rung for 1 s: handed back");
    assert_eq!(r.attempts.len(), 1);
}

/// A handler whose first attempt fails and which is then never ready again
/// (its pool is gone): the retry cannot call it.
#[derive(Clone)]
struct GoneAfterFirstAttempt {
    calls: Arc<Mutex<u32>>,
}

impl tower::Service<Delivery> for GoneAfterFirstAttempt {
    type Response = ();
    type Error = BoxError;
    type Future = std::future::Ready<Result<(), BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(if *self.calls.lock().unwrap() == 0 {
            Ok(())
        } else {
            Err("the database pool is gone".into())
        })
    }

    fn call(&mut self, _: Delivery) -> Self::Future {
        *self.calls.lock().unwrap() += 1;
        std::future::ready(Err("attempt 1 fails".into()))
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_not_ready_for_its_retry_hands_the_delivery_back_with_or_without_outer_layers() {
    // Dead-letter off: the failed retry is an error below the claim, not a
    // dead-letter decision.
    let yaml = "queues: [{ name: gone, dead_letter: false,
        retries: { max_attempts: 3, initial_delay: 1, max_delay: 1 } }]";
    // Without outer layers a delivery goes from the pause gate straight to
    // the claim; with one it passes through it. The stack's failure below
    // the claim is the same decision either way: handed back, so the
    // broker redelivers it (not rejected, which would drop it).
    let calls = Arc::new(Mutex::new(0));
    let handler = GoneAfterFirstAttempt {
        calls: calls.clone(),
    };
    let mut direct = TestQueue::new(queue(yaml), handler.clone());
    let r = direct.deliver_body("x").await;
    assert_eq!(r.fate, Fate::HandedBack, "{r:?}");
    assert_eq!(*calls.lock().unwrap(), 1, "attempt 1 only");
    assert!(r.published.is_empty(), "nothing dead-lettered: {r:?}");

    let calls = Arc::new(Mutex::new(0));
    let handler = GoneAfterFirstAttempt {
        calls: calls.clone(),
    };
    let stack = QueueStack::new().outer(MapResponseLayer::new(|o: Outcome| o));
    let mut through = TestQueue::with_stack(queue(yaml), stack, handler);
    let r = through.deliver_body("x").await;
    assert_eq!(r.fate, Fate::HandedBack, "{r:?}");
    assert_eq!(*calls.lock().unwrap(), 1, "attempt 1 only");
    assert!(r.published.is_empty(), "nothing dead-lettered: {r:?}");
}

/// What a handler found in its delivery's extensions: the key of
/// `ordered_by_fn` and the body parsed by `ordered_by: { json: .. }`.
type Seen = Arc<Mutex<Vec<(Option<String>, Option<serde_json::Value>)>>>;

fn noting(
    seen: Seen,
) -> impl tower::Service<Delivery, Response = (), Error = BoxError, Future: Send> + Clone + Send {
    service_fn(move |d: Delivery| {
        let key = d
            .extensions()
            .get::<acemq::layers::partition::OrderingKey<String>>()
            .map(|k| k.0.clone());
        let body = d
            .extensions()
            .get::<acemq::config::JsonBody>()
            .map(|b| b.value().clone());
        seen.lock().unwrap().push((key, body));
        async { Ok::<_, BoxError>(()) }
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn ordering_by_a_function_of_the_body_hands_its_key_to_the_handler() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let stack = QueueStack::new().ordered_by_fn(|d: &Delivery| {
        let text = std::str::from_utf8(d.body()).ok()?;
        Some(text.split_once(':')?.0.to_owned())
    });
    let mut h = TestQueue::with_stack(
        queue("queues: [{ name: events }]"),
        stack,
        noting(seen.clone()),
    );
    assert_eq!(h.deliver_body("acct-7:deposit").await.fate, Fate::Acked);
    assert_eq!(h.deliver_body("no key").await.fate, Fate::Acked);
    assert_eq!(
        *seen.lock().unwrap(),
        [(Some("acct-7".to_owned()), None), (None, None)]
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn ordering_by_a_json_field_from_config_hands_the_parsed_body_to_the_handler() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let q = queue("queues: [{ name: orders, ordered_by: { json: /customer } }]");
    let mut h = TestQueue::new(q.clone(), noting(seen.clone()));
    let order = r#"{"id": "o-1", "customer": "ada"}"#;
    assert_eq!(h.deliver_body(order).await.fate, Fate::Acked);
    assert_eq!(h.deliver_body("not json").await.fate, Fate::Acked);
    let parsed: serde_json::Value = serde_json::from_str(order).unwrap();
    assert_eq!(*seen.lock().unwrap(), [(None, Some(parsed)), (None, None)]);
    // The code form takes the place of the config's.
    seen.lock().unwrap().clear();
    let stack = QueueStack::new().ordered_by_fn(|d: &Delivery| Some(d.body().len().to_string()));
    let mut h = TestQueue::with_stack(q, stack, noting(seen.clone()));
    h.deliver_body(order).await;
    assert_eq!(
        *seen.lock().unwrap(),
        [(Some(order.len().to_string()), None)]
    );
}

/// A writer the test's subscriber logs into.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// No other test of this file builds an inbox: the warning is once per
// process, and this test sees the first.
#[test]
fn an_inbox_that_handles_deliveries_without_a_key_says_so_once_when_built() {
    use acemq::layers::inbox::{InboxLayer, MemoryInbox, MissingId};
    use tower::Layer;

    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let handler = failing(0);
        let rejecting = InboxLayer::new(MemoryInbox::new()).missing_id(MissingId::Reject);
        let _ = rejecting.layer(handler.clone());
        assert!(log.0.lock().unwrap().is_empty(), "no warning with Reject");
        let handling = InboxLayer::new(MemoryInbox::new());
        let _ = handling.layer(handler.clone());
        let _ = handling.layer(handler);
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert_eq!(text.matches("MissingId::Handle").count(), 1, "{text}");
    assert!(text.contains("WARN") && text.contains("again"), "{text}");
}

/// Retries in the queue itself: the fate says so, nothing is published, and
/// a redelivery's attempt is read from the broker's `x-delivery-count`.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_in_the_queue_publishes_nothing_and_reads_the_attempt_from_the_delivery_count() {
    let config = Config::from_yaml_str(
        "queues: [{ name: q, type: quorum, dead_letter: true,
                    retries: { max_attempts: 3, initial_delay: 2s, max_delay: 6s, in_queue: true } }]",
    )
    .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let mut harness = TestQueue::new(
        config.queues[0].clone(),
        service_fn(move |d: Delivery| {
            s.lock().unwrap().push(d.attempt());
            async { Err::<(), BoxError>("down".into()) }
        }),
    );
    let report = harness.deliver_body("a").await;
    assert_eq!(
        report.fate,
        Fate::RetriedInQueue {
            attempt: 2,
            delay: Duration::from_secs(2)
        }
    );
    assert!(report.published.is_empty(), "{:?}", report.published);
    let report = harness
        .message("a")
        .header("x-delivery-count", 1i64)
        .deliver()
        .await;
    assert_eq!(
        report.fate,
        Fate::RetriedInQueue {
            attempt: 3,
            delay: Duration::from_secs(4)
        }
    );
    let report = harness
        .message("a")
        .header("x-delivery-count", 2i64)
        .deliver()
        .await;
    assert!(
        matches!(
            report.fate,
            Fate::DeadLettered {
                reason: Reason::MaxAttempts,
                ..
            }
        ),
        "{:?}",
        report.fate
    );
    assert_eq!(*seen.lock().unwrap(), [1, 2, 3]);
}

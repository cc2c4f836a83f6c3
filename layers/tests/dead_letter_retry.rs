//! `DeadLetterRetry` behaves exactly as the dead-letter, redelivery-limit
//! and retry layers stacked: every scenario runs through both, each with
//! its own fake broker, on a paused clock, and what the two did (the
//! decision, every publish and its headers, the replies, the handler's
//! attempts) must be the same.

mod common;

use std::future::{ready, Ready};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_layers::dead_letter::{ErrorReplies, DEAD_LETTERED_AT_HEADER};
use acemq_layers::headers::DELIVERY_COUNT_HEADER;
use acemq_layers::redelivery::ConsumerTimeoutStrikes;
use acemq_layers::{
    BoxError, Class, DeadLetterDecision, DeadLetterLayer, DeadLetterRetryLayer, Decision, Delivery,
    HandlerPanic, Headers, Properties, Reason, RedeliveryLimitLayer, Reject, RetryLayer,
    RetryPolicy, Value,
};
use common::FakePublisher;
use proptest::prelude::*;
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

/// What the handler answers, by attempt.
#[derive(Clone, Copy, Debug)]
enum Script {
    Ack,
    HandBack,
    /// The handler's own dead-letter decision, not yet published.
    DeadLetters,
    /// A transient failure for the first `n` attempts, then `Ack`.
    FailsThenAcks(u32),
    Permanent,
    Panics,
    /// A timeout (by the classifier below) every time.
    TimesOut,
}

impl Script {
    fn answer(self, attempt: u32) -> Result<Decision, BoxError> {
        match self {
            Script::Ack => Ok(Decision::Ack),
            Script::HandBack => Ok(Decision::HandBack),
            Script::DeadLetters => Ok(Decision::DeadLetter(DeadLetterDecision {
                reason: Reason::Rejected,
                error: "the handler said so".into(),
                attempts: attempt,
                published: false,
            })),
            Script::FailsThenAcks(n) if attempt <= n => Err("flaky".into()),
            Script::FailsThenAcks(_) => Ok(Decision::Ack),
            Script::Permanent => Err(Reject::new("not an order").into()),
            Script::Panics => Err(HandlerPanic::from_payload(&"index out of bounds").into()),
            Script::TimesOut => Err("deadline elapsed".into()),
        }
    }
}

/// How the delivery arrives.
#[derive(Clone, Copy, Debug)]
enum Arrival {
    First,
    RedeliveredUnderBound,
    RedeliveredOverBound,
    StruckOut,
}

/// How the fake broker treats the dead-letter queue and the rungs.
#[derive(Clone, Copy, Debug)]
enum Broker {
    Ok,
    DlqMissingUntilRedeclared,
    DlqUnroutable,
    DlqNacking,
    RungsUnroutable,
}

#[derive(Clone, Debug)]
struct Scenario {
    script: Script,
    arrival: Arrival,
    broker: Broker,
    request: bool,
    dead_letter: bool,
    /// Retries wait on rungs (else in process).
    rungs: bool,
    draining: bool,
    max_attempts: u32,
}

/// What one stack did.
#[derive(Debug, PartialEq)]
struct Observed {
    decision: String,
    attempts: Vec<u32>,
    attempted: Vec<String>,
    published: Vec<(String, Vec<(String, String)>)>,
    redeclared: Vec<String>,
    replies: Vec<(String, String, String, String)>,
}

fn classify(e: &(dyn std::error::Error + 'static)) -> Class {
    if e.to_string().contains("deadline") {
        Class::Timeout
    } else {
        acemq_layers::Classify::classify(&acemq_layers::DefaultClassifier, e)
    }
}

type Classifier = fn(&(dyn std::error::Error + 'static)) -> Class;

fn broker(s: &Scenario) -> FakePublisher {
    let p = FakePublisher::default();
    match s.broker {
        Broker::Ok => p,
        Broker::DlqMissingUntilRedeclared => p.with(|b| {
            b.missing.insert("q.dlq".into());
        }),
        Broker::DlqUnroutable => p.unroutable("q.dlq"),
        Broker::DlqNacking => p.nacking("q.dlq"),
        Broker::RungsUnroutable => p.with(|b| {
            for d in ["q.retry.1s", "q.retry.2s", "q.retry.4s", "q.retry.8s"] {
                b.unroutable.insert(d.into());
            }
        }),
    }
}

fn delivery(s: &Scenario) -> Delivery {
    let mut headers = Headers::new();
    headers.insert("x-custom", "kept");
    match s.arrival {
        Arrival::RedeliveredUnderBound => {
            headers.insert(DELIVERY_COUNT_HEADER, Value::I64(2));
        }
        Arrival::RedeliveredOverBound => {
            headers.insert(DELIVERY_COUNT_HEADER, Value::I64(4));
        }
        _ => {}
    }
    let mut properties = Properties::default();
    if s.request {
        properties.reply_to = Some("caller".into());
        properties.correlation_id = Some("c-1".into());
    }
    let mut d = Delivery::builder()
        .queue("q")
        .body("payload")
        .headers(headers)
        .properties(properties)
        .delivery_tag(7)
        .build();
    if let Arrival::StruckOut = s.arrival {
        d.extensions_mut().insert(ConsumerTimeoutStrikes::new(2, 2));
    }
    d
}

fn layers(
    s: &Scenario,
    publisher: &FakePublisher,
) -> (
    DeadLetterLayer<FakePublisher, Classifier>,
    RedeliveryLimitLayer,
    RetryLayer<FakePublisher, Classifier>,
) {
    let mut policy = RetryPolicy::exponential(
        s.max_attempts,
        Duration::from_secs(1),
        Duration::from_secs(8),
    );
    policy.broker_wait_threshold = if s.rungs {
        Duration::ZERO
    } else {
        Duration::from_secs(3600)
    };
    let draining = CancellationToken::new();
    if s.draining {
        draining.cancel();
    }
    (
        DeadLetterLayer::new(publisher.clone())
            .classifier(classify as Classifier)
            .enabled(s.dead_letter)
            .replies(ErrorReplies::serving().also_to(["caller"])),
        RedeliveryLimitLayer::new(3),
        RetryLayer::new(policy, publisher.clone(), draining).classifier(classify as Classifier),
    )
}

fn handler(
    script: Script,
    calls: &Arc<Mutex<Vec<u32>>>,
) -> impl Service<
    Delivery,
    Response = Decision,
    Error = BoxError,
    Future = Ready<Result<Decision, BoxError>>,
> + Clone
       + Send
       + 'static {
    let calls = calls.clone();
    tower::service_fn(move |d: Delivery| {
        calls.lock().unwrap().push(d.attempt());
        ready(script.answer(d.attempt()))
    })
}

async fn observe<S>(
    svc: S,
    s: &Scenario,
    publisher: &FakePublisher,
    calls: &Arc<Mutex<Vec<u32>>>,
) -> Observed
where
    S: Service<Delivery, Response = Decision, Error = BoxError>,
{
    let decision = svc.oneshot(delivery(s)).await;
    let published = publisher
        .published()
        .into_iter()
        .map(|p| {
            let headers = p
                .headers
                .iter()
                .filter(|(k, _)| *k != DEAD_LETTERED_AT_HEADER)
                .map(|(k, v)| {
                    let v = v.as_str().map_or_else(|| format!("{v:?}"), str::to_owned);
                    (k.to_string(), v)
                })
                .collect();
            (p.queue, headers)
        })
        .collect();
    Observed {
        decision: format!("{decision:?}"),
        attempts: calls.lock().unwrap().clone(),
        attempted: publisher.attempted(),
        published,
        redeclared: publisher.redeclared(),
        replies: publisher.replies(),
    }
}

fn run(s: &Scenario) -> (Observed, Observed) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let stacked = {
            let publisher = broker(s);
            let calls = Arc::default();
            let (dl, limit, retry) = layers(s, &publisher);
            let svc = ServiceBuilder::new()
                .layer(dl)
                .layer(limit)
                .layer(retry)
                .service(handler(s.script, &calls));
            observe(svc, s, &publisher, &calls).await
        };
        let folded = {
            let publisher = broker(s);
            let calls = Arc::default();
            let (dl, limit, retry) = layers(s, &publisher);
            let svc = DeadLetterRetryLayer::new(dl, limit, retry).layer(handler(s.script, &calls));
            observe(svc, s, &publisher, &calls).await
        };
        (stacked, folded)
    })
}

fn script() -> impl Strategy<Value = Script> {
    prop_oneof![
        Just(Script::Ack),
        Just(Script::HandBack),
        Just(Script::DeadLetters),
        (1u32..5).prop_map(Script::FailsThenAcks),
        Just(Script::Permanent),
        Just(Script::Panics),
        Just(Script::TimesOut),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        script(),
        prop_oneof![
            Just(Arrival::First),
            Just(Arrival::RedeliveredUnderBound),
            Just(Arrival::RedeliveredOverBound),
            Just(Arrival::StruckOut),
        ],
        prop_oneof![
            Just(Broker::Ok),
            Just(Broker::DlqMissingUntilRedeclared),
            Just(Broker::DlqUnroutable),
            Just(Broker::DlqNacking),
            Just(Broker::RungsUnroutable),
        ],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        1u32..5,
    )
        .prop_map(
            |(script, arrival, broker, request, dead_letter, rungs, draining, max_attempts)| {
                Scenario {
                    script,
                    arrival,
                    broker,
                    request,
                    dead_letter,
                    rungs,
                    draining,
                    max_attempts,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn folded_does_what_the_three_layers_stacked_do(s in scenario()) {
        let (stacked, folded) = run(&s);
        prop_assert_eq!(stacked, folded);
    }
}

/// One scenario of each kind, named, so a regression reads plainly (and
/// the comparison above is known to see something: these differ by kind).
#[test]
fn the_named_paths_agree_and_do_what_they_say() {
    let base = Scenario {
        script: Script::Ack,
        arrival: Arrival::First,
        broker: Broker::Ok,
        request: false,
        dead_letter: true,
        rungs: false,
        draining: false,
        max_attempts: 3,
    };
    let cases: Vec<(Scenario, &str)> = vec![
        (base.clone(), "Ok(Ack)"),
        (
            Scenario {
                script: Script::FailsThenAcks(2),
                ..base.clone()
            },
            "Ok(Ack)",
        ),
        (
            Scenario {
                script: Script::Permanent,
                ..base.clone()
            },
            "reason: Rejected",
        ),
        (
            Scenario {
                arrival: Arrival::RedeliveredOverBound,
                ..base.clone()
            },
            "reason: Redelivered",
        ),
        (
            Scenario {
                arrival: Arrival::StruckOut,
                ..base.clone()
            },
            "reason: ConsumerTimeout",
        ),
        (
            Scenario {
                script: Script::TimesOut,
                rungs: true,
                ..base.clone()
            },
            "Retry(",
        ),
    ];
    for (s, expect) in cases {
        let (stacked, folded) = run(&s);
        assert_eq!(stacked, folded, "{s:?}");
        assert!(
            folded.decision.contains(expect),
            "{s:?}: {}",
            folded.decision
        );
    }
    // The copy carries the reason and keeps the original's headers.
    let (_, folded) = run(&Scenario {
        script: Script::Permanent,
        ..base.clone()
    });
    let (queue, headers) = &folded.published[0];
    assert_eq!(queue, "q.dlq");
    assert!(
        headers.contains(&("x-custom".into(), "kept".into())),
        "{headers:?}"
    );
    assert!(
        headers.contains(&("x-acemq-reason".into(), "rejected".into())),
        "{headers:?}"
    );
    assert_eq!(
        folded.attempts,
        vec![1],
        "a permanent failure is not retried"
    );
    // Redelivered past the bound: the handler is not called.
    let (_, folded) = run(&Scenario {
        arrival: Arrival::RedeliveredOverBound,
        ..base
    });
    assert!(folded.attempts.is_empty(), "{:?}", folded.attempts);
}

//! The topology the runner declares: `Q`, `Q.dlq` and the rungs, with their
//! arguments, checked against the broker itself.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::config::{QueueConfig, QueueType, RetriesConfig};
use acemq::topology::TopologyError;
use acemq::{App, BoxError, Config, Delivery, StartError, Value};
use lapin::types::{AMQPValue, FieldTable};
use tower::service_fn;

use crate::support::{
    connection_listed, eventually, field_table, ladder_config, long_str, plain_config,
    start_consuming, start_on_ladder, topology_queues, unique, Broker, QueueCleanup, TestHandler,
};

const MS: fn(u64) -> Duration = Duration::from_millis;

/// The arguments of a classic `Q` with dead-lettering on.
fn main_args(q: &str) -> FieldTable {
    field_table(vec![
        ("x-dead-letter-exchange", long_str("")),
        ("x-dead-letter-routing-key", long_str(&format!("{q}.dlq"))),
    ])
}

/// The arguments of a classic rung of `q` with a TTL of `ttl_ms`.
fn rung_args(q: &str, ttl_ms: i64) -> FieldTable {
    field_table(vec![
        ("x-message-ttl", AMQPValue::LongLongInt(ttl_ms)),
        ("x-dead-letter-exchange", long_str("")),
        ("x-dead-letter-routing-key", long_str(q)),
    ])
}

/// What a recording handler saw of one delivery.
#[derive(Clone, Debug)]
struct Seen {
    body: Vec<u8>,
    attempt: u32,
    death_queue: Option<String>,
    at: Instant,
}

/// The queue named in the first `x-death` entry, when there is one.
fn death_queue(d: &Delivery) -> Option<String> {
    match d.headers().get("x-death")? {
        Value::Array(entries) => match entries.first()? {
            Value::Table(t) => t.get("queue")?.as_str().map(str::to_owned),
            _ => None,
        },
        _ => None,
    }
}

/// A handler that records every delivery and fails the first attempt of a
/// body equal to `fail_first`.
fn recorder(seen: Arc<Mutex<Vec<Seen>>>, fail_first: &'static [u8]) -> impl TestHandler {
    service_fn(move |d: Delivery| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(Seen {
                body: d.body().to_vec(),
                attempt: d.attempt(),
                death_queue: death_queue(&d),
                at: Instant::now(),
            });
            if &d.body()[..] == fail_first && d.attempt() == 1 {
                return Err::<(), BoxError>("the first attempt fails".into());
            }
            Ok(())
        }
    })
}

#[tokio::test]
async fn the_topology_declares_q_its_dlq_and_one_rung_per_broker_delay_with_the_designed_arguments()
{
    let q = unique("topology.args");
    let mut broker = Broker::new().await;
    // Delays 200ms (in process), 400ms and 800ms (rungs), 800ms again.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (running, all) = start_on_ladder(&q, recorder(seen.clone(), b"")).await;

    let dlq = format!("{q}.dlq");
    let rung400 = format!("{q}.retry.400ms");
    let rung800 = format!("{q}.retry.800ms");
    for name in [&q, &dlq, &rung400, &rung800] {
        assert_eq!(broker.ready(name).await, Some(0), "{name} exists, empty");
    }
    for absent in ["200ms", "1s", "800ms.dlq"] {
        let name = format!("{q}.retry.{absent}");
        assert_eq!(broker.ready(&name).await, None, "{name} is not declared");
    }
    assert_eq!(broker.consumers(&q).await, Some(1), "one consumer on {q}");

    // Declaring again with the designed arguments is accepted by the broker:
    // they are exactly the queues' arguments.
    broker
        .declare(&q, main_args(&q))
        .await
        .expect("Q is equivalent to DLX \"\" / Q.dlq");
    broker
        .declare(&dlq, FieldTable::default())
        .await
        .expect("Q.dlq has no arguments");
    broker
        .declare(&rung400, rung_args(&q, 400))
        .await
        .expect("rung 400ms: TTL 400, DLX \"\" back to Q");
    broker
        .declare(&rung800, rung_args(&q, 800))
        .await
        .expect("rung 800ms: TTL 800, DLX \"\" back to Q");

    // ... and different arguments are refused, so the check above has teeth.
    let refused = [
        (rung400.clone(), rung_args(&q, 401), "x-message-ttl"),
        (
            rung800.clone(),
            rung_args(&dlq, 800),
            "x-dead-letter-routing-key",
        ),
        (
            q.clone(),
            field_table(vec![
                ("x-dead-letter-exchange", long_str("amq.direct")),
                ("x-dead-letter-routing-key", long_str(&dlq)),
            ]),
            "x-dead-letter-exchange",
        ),
        (
            dlq.clone(),
            field_table(vec![("x-message-ttl", AMQPValue::LongLongInt(1000))]),
            "x-message-ttl",
        ),
    ];
    for (name, args, arg) in refused {
        let err = broker
            .declare(&name, args)
            .await
            .expect_err("a different argument is refused");
        let message = err.to_string();
        assert!(
            message.contains("PRECONDITION_FAILED") && message.contains(arg),
            "{name}: {message}"
        );
    }

    let report = running.drain().await.expect("clean drain");
    assert_eq!(report.handed_back(), 0);
    assert!(seen.lock().unwrap().is_empty(), "nothing was published");
    broker.delete(&all).await;
}

#[tokio::test]
async fn a_message_published_to_a_rung_comes_back_to_the_queue_after_the_rungs_ttl() {
    let q = unique("topology.rung");
    let mut broker = Broker::new().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (running, all) = start_on_ladder(&q, recorder(seen.clone(), b"")).await;
    let rung400 = format!("{q}.retry.400ms");
    let rung800 = format!("{q}.retry.800ms");

    let t0 = Instant::now();
    broker
        .publish(&rung400, b"via-400", FieldTable::default())
        .await;
    broker
        .publish(&rung800, b"via-800", FieldTable::default())
        .await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            seen.lock().unwrap().len() == 2
        })
        .await,
        "both messages came back to {q}: {:?}",
        seen.lock().unwrap()
    );

    let seen = seen.lock().unwrap().clone();
    let by_body = |b: &[u8]| seen.iter().find(|s| s.body == b).cloned().unwrap();
    let via400 = by_body(b"via-400");
    let via800 = by_body(b"via-800");
    assert!(
        via400.at - t0 >= MS(400),
        "held on the 400ms rung for its TTL: {:?}",
        via400.at - t0
    );
    assert!(
        via800.at - t0 >= MS(800),
        "held on the 800ms rung for its TTL: {:?}",
        via800.at - t0
    );
    assert_eq!(via400.death_queue.as_deref(), Some(rung400.as_str()));
    assert_eq!(via800.death_queue.as_deref(), Some(rung800.as_str()));
    assert_eq!(
        (via400.attempt, via800.attempt),
        (1, 1),
        "no attempt header"
    );

    running.drain().await.expect("clean drain");
    for name in [&q, &rung400, &rung800] {
        assert_eq!(broker.ready(name).await, Some(0), "{name} ends empty");
    }
    broker.delete(&all).await;
}

/// Starts `config` against a queue that already exists, expecting the
/// topology conflict, and checks the error and that nothing started.
async fn start_expecting_conflict(broker: &mut Broker, config: Config, q: &str, arg: &str) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let connection_name = format!("{q}.app");
    let err = App::new(config)
        .connection_name(connection_name.clone())
        .consume(q, recorder(calls.clone(), b""))
        .start()
        .await
        .expect_err("a conflicting queue fails the start");
    assert_eq!(err.exit_code(), 78, "EX_CONFIG: {err}");
    let message = err.to_string();
    match err {
        StartError::Topology(TopologyError::Conflict {
            queue, argument, ..
        }) => {
            assert_eq!(queue, q);
            assert_eq!(argument, arg, "{message}");
        }
        other => panic!("expected a topology conflict, got {other:?}"),
    }
    assert!(message.contains(q), "names the queue: {message}");
    assert!(message.contains(arg), "names the argument: {message}");
    assert!(
        message.contains(&format!("rabbitmqctl delete_queue {q}"))
            && message.contains("change the config"),
        "says what to do: {message}"
    );
    // No consumer started, and the existing queue kept its message.
    assert_eq!(broker.consumers(q).await, Some(0), "no consumer on {q}");
    assert_eq!(broker.ready(q).await, Some(1), "{q} untouched");
    assert!(calls.lock().unwrap().is_empty());
    // The runner's connection does not outlive the failed start.
    assert!(
        eventually(Duration::from_secs(10), || async {
            !connection_listed(&connection_name).await
        })
        .await,
        "the connection {connection_name:?} was closed"
    );
}

#[tokio::test]
async fn a_preexisting_queue_with_a_message_ttl_fails_the_start_naming_the_queue_and_x_message_ttl()
{
    let q = unique("topology.conflict-ttl");
    let mut broker = Broker::new().await;
    broker
        .declare(
            &q,
            field_table(vec![("x-message-ttl", AMQPValue::LongLongInt(100_000))]),
        )
        .await
        .expect("declare the existing queue");
    broker
        .publish(&q, b"already here", FieldTable::default())
        .await;
    let config = plain_config(&q);
    let all = topology_queues(&config);

    start_expecting_conflict(&mut broker, config, &q, "x-message-ttl").await;
    broker.delete(&all).await;
}

#[tokio::test]
async fn a_preexisting_queue_without_dead_letter_arguments_fails_a_dead_letter_start_naming_x_dead_letter_exchange(
) {
    let q = unique("topology.conflict-dlx");
    let mut broker = Broker::new().await;
    broker
        .declare(&q, FieldTable::default())
        .await
        .expect("declare the existing queue");
    broker
        .publish(&q, b"already here", FieldTable::default())
        .await;
    let config = ladder_config(&q);
    let all = topology_queues(&config);

    start_expecting_conflict(&mut broker, config, &q, "x-dead-letter-exchange").await;
    broker.delete(&all).await;
}

#[tokio::test]
async fn a_quorum_queue_round_trips_and_its_rung_and_dlq_are_quorum_with_at_least_once_dead_lettering(
) {
    let q = unique("topology.quorum");
    let mut broker = Broker::new().await;
    let mut qc = QueueConfig::new(q.clone());
    qc.kind = QueueType::Quorum;
    qc.dead_letter = true;
    // One retry, 400 ms on the rung.
    let mut retries = RetriesConfig::new(2, MS(400), MS(400));
    retries.broker_wait_threshold = MS(400);
    qc.retries = Some(retries);
    let mut config = Config::default();
    config.queues.push(qc);
    let all = topology_queues(&config);
    // Deleted however the test ends.
    let _cleanup = QueueCleanup::new(all.clone());
    let rung = format!("{q}.retry.400ms");
    let dlq = format!("{q}.dlq");
    assert_eq!(all, [q.clone(), dlq.clone(), rung.clone()]);

    let seen = Arc::new(Mutex::new(Vec::new()));
    let running = start_consuming(config, &q, recorder(seen.clone(), b"retry me")).await;

    let quorum = || ("x-queue-type", long_str("quorum"));
    // The rung: quorum, TTL, back to Q, at-least-once with reject-publish.
    let at_least_once = |strategy: &str| {
        field_table(vec![
            quorum(),
            ("x-message-ttl", AMQPValue::LongLongInt(400)),
            ("x-dead-letter-exchange", long_str("")),
            ("x-dead-letter-routing-key", long_str(&q)),
            ("x-dead-letter-strategy", long_str(strategy)),
            ("x-overflow", long_str("reject-publish")),
        ])
    };
    broker
        .declare(&rung, at_least_once("at-least-once"))
        .await
        .expect("the rung is quorum with at-least-once dead-lettering");
    let err = broker
        .declare(&rung, at_least_once("at-most-once"))
        .await
        .expect_err("another strategy is refused");
    assert!(err.to_string().contains("x-dead-letter-strategy"), "{err}");
    // The dead-letter queue's delivery limit is high: nothing loops on it.
    let limit = |n| ("x-delivery-limit", AMQPValue::LongLongInt(n));
    broker
        .declare(&dlq, field_table(vec![quorum(), limit(10_000)]))
        .await
        .expect("the dlq is quorum with a delivery limit of 10000");
    // Q's is above max_redeliveries (50), so acemq's bound fires first.
    let mut main = main_args(&q);
    main.insert("x-queue-type".into(), long_str("quorum"));
    main.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(60));
    broker
        .declare(&q, main)
        .await
        .expect("Q is quorum with DLX and a delivery limit of 60");

    broker.publish(&q, b"plain", FieldTable::default()).await;
    broker.publish(&q, b"retry me", FieldTable::default()).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            seen.lock().unwrap().len() == 3
        })
        .await,
        "plain once, retry me twice: {:?}",
        seen.lock().unwrap()
    );
    let report = running.drain().await.expect("clean drain");
    assert_eq!(report.handed_back(), 0);

    let seen = seen.lock().unwrap().clone();
    let plain: Vec<_> = seen.iter().filter(|s| s.body == b"plain").collect();
    assert_eq!(plain.len(), 1);
    assert_eq!(plain[0].attempt, 1);
    let retried: Vec<_> = seen.iter().filter(|s| s.body == b"retry me").collect();
    assert_eq!(
        retried.iter().map(|s| s.attempt).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(
        retried[1].death_queue.as_deref(),
        Some(rung.as_str()),
        "attempt 2 came back through the quorum rung"
    );
    assert!(retried[1].at - retried[0].at >= MS(400));
    for name in [&q, &rung, &dlq] {
        assert_eq!(broker.ready(name).await, Some(0), "{name} ends empty");
    }
    broker.delete(&all).await;
}

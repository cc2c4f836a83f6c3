//! Exchanges, bindings, passed-through arguments, passive and declare-only
//! queues, where a retried message came from, the redelivery bound, and the
//! connect errors a new user meets — against the real broker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::config::{
    ArgValue, BindingConfig, ExchangeConfig, ExchangeKind, QueueConfig, QueueType,
};
use acemq::connection::{connect as acemq_connect, ConnectError};
use acemq::layers::dead_letter::REASON_HEADER;
use acemq::layers::headers::DELIVERY_COUNT_HEADER;
use acemq::topology::TopologyError;
use acemq::{App, BoxError, Config, Delivery, StartError, Value, Verdict};
use lapin::options::{BasicPublishOptions, ExchangeDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use tower::service_fn;

use crate::support::{
    addr, eventually, field_table, long_str, message_headers, retry_config, start_consuming,
    topology_queues, unique, Broker, QueueCleanup,
};

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Deletes its exchanges when dropped, also when the test failed half-way.
struct ExchangeCleanup(Vec<String>);

impl Drop for ExchangeCleanup {
    fn drop(&mut self) {
        let exchanges = std::mem::take(&mut self.0);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the cleanup");
            rt.block_on(async {
                let broker = Broker::new().await;
                let ch = broker.conn.create_channel().await.expect("channel");
                for x in exchanges {
                    let _ = ch
                        .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
                        .await;
                }
            });
        })
        .join();
    }
}

/// What a handler saw of one delivery.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    attempt: u32,
    exchange: String,
    routing_key: String,
    original_exchange: String,
    original_routing_key: String,
}

fn seen(d: &Delivery) -> Seen {
    Seen {
        attempt: d.attempt(),
        exchange: d.exchange().to_owned(),
        routing_key: d.routing_key().to_owned(),
        original_exchange: d.original_exchange().to_owned(),
        original_routing_key: d.original_routing_key().to_owned(),
    }
}

/// Records every delivery; fails attempt 1 when `fail_first`.
fn recorder(
    log: Arc<Mutex<Vec<Seen>>>,
    fail_first: bool,
) -> impl tower::Service<
    Delivery,
    Response = (),
    Error = BoxError,
    Future = impl std::future::Future<Output = Result<(), BoxError>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    service_fn(move |d: Delivery| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(seen(&d));
            if fail_first && d.attempt() == 1 {
                return Err::<(), BoxError>("the warehouse is down".into());
            }
            Ok(())
        }
    })
}

async fn publish_to(broker: &mut Broker, exchange: &str, key: &str, props: BasicProperties) {
    broker
        .ch
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            b"{}",
            props,
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
}

fn topic_config(exchange: &str, q: &str, key: &str) -> Config {
    let mut queue = QueueConfig::new(q);
    queue.bindings = vec![BindingConfig::new(exchange, [key])];
    let mut config = Config::new([queue]);
    config.exchanges = vec![ExchangeConfig::new(exchange, ExchangeKind::Topic)];
    config
}

#[tokio::test]
async fn a_topic_exchange_from_config_routes_matching_keys_into_the_bound_queue() {
    let q = unique("routing.topic");
    let x = unique("routing.topic-x");
    let _cleanup = (
        QueueCleanup::new(vec![q.clone()]),
        ExchangeCleanup(vec![x.clone()]),
    );
    let mut broker = Broker::new().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let running = start_consuming(
        topic_config(&x, &q, "orders.*.eu"),
        &q,
        recorder(log.clone(), false),
    )
    .await;
    publish_to(&mut broker, &x, "orders.new.us", BasicProperties::default()).await;
    publish_to(&mut broker, &x, "orders.new.eu", BasicProperties::default()).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            !log.lock().unwrap().is_empty()
        })
        .await,
        "the matching message arrives"
    );
    running.drain().await.expect("clean drain");
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 1, "only the matching key was routed: {log:?}");
    assert_eq!(
        (log[0].exchange.as_str(), log[0].routing_key.as_str()),
        (x.as_str(), "orders.new.eu")
    );
}

#[tokio::test]
async fn a_retried_message_from_an_exchange_keeps_its_exchange_and_routing_key_at_attempt_2() {
    let q = unique("routing.retry");
    let x = unique("routing.retry-x");
    // Two attempts, the wait on a 400 ms rung.
    let mut config = retry_config(&q, 2, MS(400), MS(400), MS(400));
    config.queues[0].bindings = vec![BindingConfig::new(&x, ["orders.#"])];
    config.exchanges = vec![ExchangeConfig::new(&x, ExchangeKind::Topic)];
    let _cleanup = (
        QueueCleanup::new(topology_queues(&config)),
        ExchangeCleanup(vec![x.clone()]),
    );
    let mut broker = Broker::new().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let running = start_consuming(config, &q, recorder(log.clone(), true)).await;
    publish_to(&mut broker, &x, "orders.new.eu", BasicProperties::default()).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            log.lock().unwrap().len() == 2
        })
        .await,
        "attempt 2 arrives from the rung: {:?}",
        log.lock().unwrap()
    );
    running.drain().await.expect("clean drain");
    let log = log.lock().unwrap().clone();
    let (first, second) = (&log[0], &log[1]);
    assert_eq!((first.attempt, second.attempt), (1, 2));
    assert_eq!(first.original_routing_key, "orders.new.eu");
    // The copy came back through the default exchange with routing key Q...
    assert_eq!(
        (second.exchange.as_str(), second.routing_key.as_str()),
        ("", q.as_str())
    );
    // ...and still says where the message came from.
    assert_eq!(second.original_exchange, x);
    assert_eq!(second.original_routing_key, "orders.new.eu");
}

#[tokio::test]
async fn provenance_a_publisher_sends_is_not_believed_on_the_first_attempt_nor_after_the_rung() {
    let q = unique("routing.forged");
    let x = unique("routing.forged-x");
    let mut config = retry_config(&q, 2, MS(400), MS(400), MS(400));
    config.queues[0].bindings = vec![BindingConfig::new(&x, ["orders.#"])];
    config.exchanges = vec![ExchangeConfig::new(&x, ExchangeKind::Topic)];
    let _cleanup = (
        QueueCleanup::new(topology_queues(&config)),
        ExchangeCleanup(vec![x.clone()]),
    );
    let mut broker = Broker::new().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let running = start_consuming(config, &q, recorder(log.clone(), true)).await;
    let forged = || {
        BasicProperties::default().with_headers(field_table(vec![
            ("x-acemq-original-exchange", long_str("payments")),
            ("x-acemq-original-routing-key", long_str("refund.approved")),
        ]))
    };
    // Through the bound exchange, then straight to the queue through the
    // default exchange (as a rung's copy comes, but with no rung's x-death).
    publish_to(&mut broker, &x, "orders.new.eu", forged()).await;
    publish_to(&mut broker, "", &q, forged()).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            log.lock().unwrap().len() == 4
        })
        .await,
        "both messages' attempt 2 arrive from the rung: {:?}",
        log.lock().unwrap()
    );
    running.drain().await.expect("clean drain");
    let log = log.lock().unwrap().clone();
    // Each attempt's provenance, sorted: on both attempts of both messages,
    // where the message really came from.
    let originals = |attempt: u32| {
        let mut seen: Vec<(String, String)> = log
            .iter()
            .filter(|s| s.attempt == attempt)
            .map(|s| (s.original_exchange.clone(), s.original_routing_key.clone()))
            .collect();
        seen.sort();
        seen
    };
    let truth = vec![
        (String::new(), q.clone()),
        (x.clone(), "orders.new.eu".to_owned()),
    ];
    assert_eq!(originals(1), truth, "{log:?}");
    assert_eq!(originals(2), truth, "{log:?}");
}

/// Whether `queue` holds `n` ready messages within 10 s.
async fn holds_within(broker: &mut Broker, queue: &str, n: u32) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if broker.ready(queue).await == Some(n) {
            return true;
        }
        tokio::time::sleep(MS(50)).await;
    }
    false
}

#[tokio::test]
async fn a_replayed_dead_letter_keeps_its_provenance_and_a_broker_expired_one_does_not() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let q = unique("routing.replayed");
    let x = unique("routing.replayed-x");
    let mut config = retry_config(&q, 1, MS(400), MS(400), MS(400));
    config.queues[0].bindings = vec![BindingConfig::new(&x, ["orders.#"])];
    config.exchanges = vec![ExchangeConfig::new(&x, ExchangeKind::Topic)];
    let _cleanup = (
        QueueCleanup::new(topology_queues(&config)),
        ExchangeCleanup(vec![x.clone()]),
    );
    let dlq = format!("{q}.dlq");
    let mut broker = Broker::new().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let reject = Arc::new(AtomicBool::new(true));
    let handler = {
        let (log, reject) = (log.clone(), reject.clone());
        service_fn(move |d: Delivery| {
            log.lock().unwrap().push(seen(&d));
            let reject = reject.load(Ordering::SeqCst);
            async move {
                Ok::<_, BoxError>(if reject {
                    Verdict::dead_letter("not yet")
                } else {
                    Verdict::Ack
                })
            }
        })
    };
    // 1. Rejected on its first attempt: acemq's dead-letter copy, with the
    //    provenance the consumer saw.
    let running = start_consuming(config.clone(), &q, handler.clone()).await;
    publish_to(&mut broker, &x, "orders.new.eu", BasicProperties::default()).await;
    assert!(holds_within(&mut broker, &dlq, 1).await, "dead-lettered");
    running.drain().await.expect("clean drain");
    // 2. A publisher's message with forged provenance, expired by the
    //    broker into the DLQ with no consumer running.
    let forged = BasicProperties::default()
        .with_expiration("1".into())
        .with_headers(field_table(vec![
            ("x-acemq-original-exchange", long_str("payments")),
            ("x-acemq-original-routing-key", long_str("refund.approved")),
        ]));
    publish_to(&mut broker, "", &q, forged).await;
    assert!(
        holds_within(&mut broker, &dlq, 2).await,
        "expired into the DLQ"
    );
    // 3. Replayed to a consumer that now accepts both.
    reject.store(false, Ordering::SeqCst);
    log.lock().unwrap().clear();
    let running = start_consuming(config, &q, handler).await;
    let report = acemq::replay::replay_dead_letters(&addr(), &q, Default::default())
        .await
        .expect("replayed");
    assert_eq!(report.moved, 2, "{report}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            log.lock().unwrap().len() == 2
        })
        .await,
        "both replayed copies handled: {:?}",
        log.lock().unwrap()
    );
    running.drain().await.expect("clean drain");
    let mut originals: Vec<(String, String)> = log
        .lock()
        .unwrap()
        .iter()
        .map(|s| (s.original_exchange.clone(), s.original_routing_key.clone()))
        .collect();
    originals.sort();
    assert_eq!(
        originals,
        [
            (String::new(), q.clone()),
            (x.clone(), "orders.new.eu".to_owned())
        ]
    );
}

#[tokio::test]
async fn queue_arguments_in_config_pass_through_so_an_existing_queue_with_them_is_accepted() {
    let q = unique("routing.args");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    let mut broker = Broker::new().await;
    // Declared elsewhere first, with 32-bit integers.
    broker
        .declare(
            &q,
            field_table(vec![
                ("x-max-length", AMQPValue::LongInt(1000)),
                ("x-single-active-consumer", AMQPValue::Boolean(true)),
                ("x-max-priority", AMQPValue::ShortShortUInt(5)),
            ]),
        )
        .await
        .expect("pre-declared");
    // Without the arguments the config conflicts, as before: exit 78.
    let err = App::new(Config::new([QueueConfig::new(&q)]))
        .consume(&q, recorder(Arc::default(), false))
        .start()
        .await
        .expect_err("a conflict without the arguments");
    assert!(
        matches!(err, StartError::Topology(TopologyError::Conflict { .. })),
        "{err}"
    );
    assert_eq!(err.exit_code(), 78);
    // With them (as YAML writes them), it starts and consumes.
    let config = Config::from_yaml_str(&format!(
        "queues:\n  - name: {q}\n    arguments: {{ x-max-length: 1000, x-single-active-consumer: true, x-max-priority: 5 }}\n"
    ))
    .unwrap();
    assert_eq!(
        config.queues[0].arguments["x-max-length"],
        ArgValue::Int(1000)
    );
    let log = Arc::new(Mutex::new(Vec::new()));
    let running = start_consuming(config, &q, recorder(log.clone(), false)).await;
    broker.publish(&q, b"{}", FieldTable::default()).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            log.lock().unwrap().len() == 1
        })
        .await,
        "consumed"
    );
    running.drain().await.expect("clean drain");
}

#[tokio::test]
async fn a_passive_queue_that_does_not_exist_fails_the_start_naming_it_and_declares_nothing() {
    let q = unique("routing.passive-missing");
    let _cleanup = QueueCleanup::new(vec![q.clone(), format!("{q}.dlq")]);
    let mut broker = Broker::new().await;
    let mut queue = QueueConfig::new(&q);
    queue.passive = true;
    queue.dead_letter = true;
    let err = App::new(Config::new([queue]))
        .consume(&q, recorder(Arc::default(), false))
        .start()
        .await
        .expect_err("missing");
    let StartError::Topology(TopologyError::Missing { queue, .. }) = &err else {
        panic!("expected Missing, got {err:?}");
    };
    assert_eq!(queue, &q);
    let message = err.to_string();
    assert!(
        message.contains("does not exist") && message.contains("passive"),
        "{message}"
    );
    assert_eq!(broker.ready(&q).await, None, "not declared");
    assert_eq!(
        broker.ready(&format!("{q}.dlq")).await,
        None,
        "not declared"
    );
}

#[tokio::test]
async fn a_passive_queue_declared_elsewhere_with_other_arguments_is_consumed_as_it_is() {
    let q = unique("routing.passive");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    let mut broker = Broker::new().await;
    broker
        .declare(
            &q,
            field_table(vec![("x-max-length", AMQPValue::LongInt(7))]),
        )
        .await
        .expect("pre-declared");
    let mut queue = QueueConfig::new(&q);
    queue.passive = true;
    let log = Arc::new(Mutex::new(Vec::new()));
    let running = start_consuming(Config::new([queue]), &q, recorder(log.clone(), false)).await;
    broker.publish(&q, b"{}", FieldTable::default()).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            log.lock().unwrap().len() == 1
        })
        .await,
        "consumed"
    );
    running.drain().await.expect("clean drain");
}

#[tokio::test]
async fn a_queue_with_consume_false_is_declared_and_bound_but_not_consumed_and_takes_no_handler() {
    let consumed = unique("routing.consumed");
    let audit = unique("routing.audit");
    let x = unique("routing.fanout-x");
    let hx = unique("routing.headers-x");
    let _cleanup = (
        QueueCleanup::new(vec![consumed.clone(), audit.clone()]),
        ExchangeCleanup(vec![x.clone(), hx.clone()]),
    );
    let mut broker = Broker::new().await;
    let config = Config::from_yaml_str(&format!(
        "exchanges:\n  - {{ name: {x}, type: fanout }}\n  - {{ name: {hx}, type: headers, durable: false }}\n\
         queues:\n  - name: {consumed}\n    bindings: [{{ exchange: {x} }}]\n\
         \x20 - name: {audit}\n    consume: false\n    bindings:\n      - {{ exchange: {x} }}\n      - {{ exchange: {hx}, arguments: {{ x-match: all, region: eu }} }}\n"
    ))
    .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    // Only the consumed queue gets a handler; the audit queue takes none.
    let running = start_consuming(config.clone(), &consumed, recorder(log.clone(), false)).await;
    publish_to(&mut broker, &x, "", BasicProperties::default()).await;
    let region = |r: &str| {
        BasicProperties::default().with_headers(field_table(vec![("region", long_str(r))]))
    };
    publish_to(&mut broker, &hx, "", region("eu")).await;
    publish_to(&mut broker, &hx, "", region("us")).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            log.lock().unwrap().len() == 1
        })
        .await,
        "the fanout reached the consumed queue"
    );
    assert!(
        broker.wait_ready(&audit, 2, Duration::from_secs(5)).await,
        "the audit queue holds the fanout copy and the region=eu message, not region=us"
    );
    assert_eq!(
        broker.consumers(&audit).await,
        Some(0),
        "nothing consumes it"
    );
    running.drain().await.expect("clean drain");
    // A handler for it is a config error naming the field.
    let err = App::new(config)
        .consume(&consumed, recorder(Arc::default(), false))
        .consume(&audit, recorder(Arc::default(), false))
        .start()
        .await
        .expect_err("a handler for a declare-only queue");
    let StartError::Config(e) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(e.field(), Some("queues[1].consume"));
    assert_eq!(err.exit_code(), 78);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_message_redelivered_past_max_redeliveries_is_dead_lettered_as_redelivered_without_its_delivery_count(
) {
    let q = unique("routing.redelivered");
    let mut queue = QueueConfig::new(&q);
    queue.kind = QueueType::Quorum;
    queue.dead_letter = true;
    queue.max_redeliveries = 2;
    let config = Config::new([queue]);
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let mut broker = Broker::new().await;
    let calls = Arc::new(Mutex::new(Vec::<Option<i64>>::new()));
    let seen = calls.clone();
    // A handler that hands every delivery straight back, as a process that
    // crashes on it would.
    let handler = service_fn(move |d: Delivery| {
        let count = d
            .headers()
            .get(DELIVERY_COUNT_HEADER)
            .and_then(Value::as_i64);
        seen.lock().unwrap().push(count);
        async { Ok::<_, BoxError>(Verdict::Requeue) }
    });
    let running = start_consuming(config, &q, handler).await;
    broker.publish(&q, b"poison", FieldTable::default()).await;
    let dlq = format!("{q}.dlq");
    let copy = broker
        .get_within(&dlq, Duration::from_secs(10))
        .await
        .expect("dead-lettered");
    running.drain().await.expect("clean drain");
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [None, Some(1), Some(2)],
        "called up to the bound, not past it"
    );
    let headers = message_headers(&copy.properties);
    assert_eq!(
        headers.get(REASON_HEADER).and_then(Value::as_str),
        Some("redelivered")
    );
    // The copy left without the stale count (3); the quorum dead-letter
    // queue counts its own deliveries from 0.
    assert_eq!(
        headers
            .get(DELIVERY_COUNT_HEADER)
            .and_then(Value::as_i64)
            .unwrap_or(0),
        0,
        "stripped from the copy: {headers:?}"
    );
    assert_eq!(broker.ready(&q).await, Some(0), "nothing left in the queue");
}

/// The default bound (`max_redeliveries` 50) is acemq's to enforce: a
/// quorum queue acemq declares must not dead-letter the message earlier by a
/// bound of the broker's own. On RabbitMQ 3.10 a quorum queue has no
/// delivery limit unless one is set; RabbitMQ 4.0 gives every quorum queue a
/// default `delivery-limit` of 20, which would dead-letter the message after
/// 20 returns, through the queue's own dead-letter arguments, without
/// acemq's reason headers: acemq declares its quorum queues with an
/// `x-delivery-limit` above `max_redeliveries` (60 here), and the handler's
/// `Verdict::Requeue` goes out as a `basic.reject`, which every version
/// counts. Runs on both brokers (scripts/rabbitmq4-suite.sh broker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_message_requeued_past_twenty_times_is_dead_lettered_by_acemq_at_its_default_bound_of_fifty(
) {
    let q = unique("routing.redelivered50");
    let mut queue = QueueConfig::new(&q);
    queue.kind = QueueType::Quorum;
    queue.dead_letter = true;
    assert_eq!(queue.max_redeliveries, 50, "the default bound");
    let config = Config::new([queue]);
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let mut broker = Broker::new().await;
    let calls = Arc::new(Mutex::new(Vec::<Option<i64>>::new()));
    let seen = calls.clone();
    let handler = service_fn(move |d: Delivery| {
        let count = d
            .headers()
            .get(DELIVERY_COUNT_HEADER)
            .and_then(Value::as_i64);
        seen.lock().unwrap().push(count);
        async { Ok::<_, BoxError>(Verdict::Requeue) }
    });
    let running = start_consuming(config, &q, handler).await;
    broker.publish(&q, b"poison", FieldTable::default()).await;
    let dlq = format!("{q}.dlq");
    let copy = broker
        .get_within(&dlq, Duration::from_secs(30))
        .await
        .expect("dead-lettered");
    running.drain().await.expect("clean drain");
    let calls = calls.lock().unwrap().clone();
    let headers = message_headers(&copy.properties);
    // The broker's own dead-lettering says why in the first x-death entry.
    let death_reason = match headers.get("x-death") {
        Some(Value::Array(entries)) => match entries.first() {
            Some(Value::Table(t)) => t.get("reason").and_then(Value::as_str).map(str::to_owned),
            _ => None,
        },
        _ => None,
    };
    assert_eq!(
        headers.get(REASON_HEADER).and_then(Value::as_str),
        Some("redelivered"),
        "dead-lettered by acemq after {} calls (last x-delivery-count {:?}), not by the broker \
         (x-death reason {death_reason:?})",
        calls.len(),
        calls.last().copied().flatten()
    );
    assert_eq!(calls.len(), 51, "called up to the bound, not past it");
    assert_eq!(calls.last().copied().flatten(), Some(50));
    assert_eq!(broker.ready(&q).await, Some(0), "nothing left in the queue");
}

// ------------------------------------------------------ connect errors

#[tokio::test]
async fn a_wrong_password_is_recognised_by_its_reply_code_as_auth() {
    let bad = addr().replacen("guest:guest", "guest:not-the-password", 1);
    let err = acemq_connect(&bad, "acemq-test-auth", Duration::from_secs(5))
        .await
        .expect_err("refused");
    assert!(matches!(err, ConnectError::Auth { .. }), "{err:?}");
    assert!(!err.to_string().contains("not-the-password"), "{err}");
}

#[tokio::test]
async fn a_missing_vhost_says_which_and_how_to_create_it() {
    let vhost = unique("vhost");
    // The broker of AMQP_ADDR, with the missing vhost in place of its own.
    let mut url = url::Url::parse(&addr()).expect("AMQP_ADDR is a URL");
    url.set_path(&format!("/{vhost}"));
    let url = url.to_string();
    let err = acemq_connect(&url, "acemq-test-vhost", Duration::from_secs(5))
        .await
        .expect_err("no such vhost");
    let ConnectError::Vhost { vhost: named, .. } = &err else {
        panic!("expected Vhost, got {err:?}");
    };
    assert_eq!(named, &vhost);
    let message = err.to_string();
    assert!(
        message.contains(&format!("rabbitmqctl add_vhost {vhost}")),
        "{message}"
    );
    assert!(!message.contains("is RabbitMQ running"), "{message}");
}

#[tokio::test]
async fn something_that_is_not_rabbitmq_on_the_port_is_said_in_a_sentence() {
    // A server that answers the AMQP header like an HTTP server would.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 8];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                .await;
        }
    });
    let url = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    let err = acemq_connect(&url, "acemq-test-http", Duration::from_secs(5))
        .await
        .expect_err("not AMQP");
    let message = err.to_string();
    assert!(matches!(err, ConnectError::NotAmqp { .. }), "{err:?}");
    assert!(message.contains("not RabbitMQ"), "{message}");
    assert!(!message.contains("ParserErrors"), "{message}");
}

#[tokio::test]
async fn an_address_without_a_scheme_is_a_config_error_exiting_78() {
    for bad in [
        "guest:guest@127.0.0.1:5672",
        "127.0.0.1:5672",
        "http://127.0.0.1:5672",
    ] {
        let q = unique("routing.noscheme");
        let err = App::new(Config::new([QueueConfig::new(&q)]))
            .amqp_addr(bad)
            .consume(&q, recorder(Arc::default(), false))
            .start()
            .await
            .expect_err("bad address");
        assert!(
            matches!(err, StartError::Config(_)),
            "{bad}: checked before connecting, a config error: {err:?}"
        );
        assert_eq!(err.exit_code(), 78, "{bad}: {err}");
        assert!(err.to_string().contains("amqp://"), "{bad}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_queue_deleted_while_consumed_comes_back_bound_to_its_exchange() {
    let q = unique("routing.rebind");
    let x = unique("routing.rebind-x");
    let _cleanup = (
        QueueCleanup::new(vec![q.clone()]),
        ExchangeCleanup(vec![x.clone()]),
    );
    let mut broker = Broker::new().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let running = start_consuming(
        topic_config(&x, &q, "orders.#"),
        &q,
        recorder(log.clone(), false),
    )
    .await;
    broker.delete(std::slice::from_ref(&q)).await;
    let mut back = false;
    for _ in 0..400 {
        if broker.consumers(&q).await == Some(1) {
            back = true;
            break;
        }
        tokio::time::sleep(MS(50)).await;
    }
    assert!(back, "declared again and consumed within 20 s");
    publish_to(&mut broker, &x, "orders.new", BasicProperties::default()).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            log.lock().unwrap().len() == 1
        })
        .await,
        "routed through the exchange again: the binding came back with the queue"
    );
    running.drain().await.expect("clean drain");
}

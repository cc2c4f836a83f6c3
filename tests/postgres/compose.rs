//! The inbox with the runner and the broker: a handler that enqueues a
//! follow-up on the inbox's transaction, a handler that ends the inbox's
//! transaction itself, duplicates in the health snapshot and `/queues`, and
//! a circuit breaker's trip behind the inbox.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::inbox::{PgInbox, PgTransaction};
use acemq::layers::inbox::InboxLayer;
use acemq::outbox::{OutboxMessage, RelayConfig};
use acemq::{App, BoxError, Config, Delivery, Reject, Running};
use lapin::options::BasicGetOptions;
use lapin::types::AMQPValue;
use tower::ServiceBuilder;

use crate::support::{addr, unique, wait_until, Broker, TestDb};

const BOUND: Duration = Duration::from_secs(30);

/// A config of `yaml` whose queues (and their `.dlq`) the guard deletes.
fn config(broker: &Broker, yaml: &str) -> Config {
    let config = Config::from_yaml_str(yaml).expect("a valid config");
    for d in acemq::topology::Topology::from_config(&config).decls() {
        broker.own(&d.name);
    }
    config
}

async fn start<H>(config: Config, queue: &str, handler: H, outbox: Option<&TestDb>) -> Running
where
    H: tower::Service<Delivery> + Clone + Send + 'static,
    H::Error: Into<BoxError>,
    H::Future: Send + 'static,
    H::Response: acemq::IntoVerdict + Send + 'static,
{
    let mut app = App::new(config)
        .amqp_addr(addr())
        .connection_name("acemq-test-postgres-compose");
    if let Some(db) = outbox {
        let mut relay = RelayConfig::default();
        relay.poll_interval = Duration::from_millis(50);
        app = app.outbox(db.pool.clone(), relay);
    }
    app.consume(queue, handler).start().await.expect("starts")
}

/// The `x-acemq-reason` of the first message in `queue`, waited for.
async fn dead_letter_reason(broker: &Broker, queue: &str) -> String {
    let channel = broker.conn.create_channel().await.expect("channel");
    let t0 = std::time::Instant::now();
    loop {
        if let Some(m) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            let headers = m.delivery.properties.headers().clone().unwrap_or_default();
            return match headers.inner().get("x-acemq-reason") {
                Some(AMQPValue::LongString(s)) => s.to_string(),
                other => format!("{other:?}"),
            };
        }
        assert!(
            t0.elapsed() < BOUND,
            "nothing dead-lettered to {queue} within {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ships the order in the body and enqueues its follow-up to
/// `<queue>.shipped` on the inbox's transaction; a body `fail` fails after
/// both writes.
async fn ship_and_follow_up(d: Delivery) -> Result<(), BoxError> {
    let tx = PgTransaction::of(&d)?;
    let order = String::from_utf8_lossy(d.body()).into_owned();
    let id = d.properties().message_id.clone().unwrap_or_default();
    let client = tx.client().await;
    client
        .execute(
            "INSERT INTO shipments (order_id, message_id) VALUES ($1, $2)",
            &[&order, &id],
        )
        .await?;
    let follow_up = OutboxMessage::to_queue(format!("{}.shipped", d.queue()), order.clone())
        .message_id(format!("{order}-shipped"));
    client.enqueue(&follow_up).await?;
    if order == "fail" {
        return Err(Reject::new("failed after the work and the enqueue").into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_enqueued_on_the_inbox_transaction_is_published_only_when_the_handler_commits()
{
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("follow-up");
    let shipped = format!("{q}.shipped");
    let config = config(
        &broker,
        &format!("queues:\n  - name: {q}\n    dead_letter: true\n  - name: {shipped}\n    consume: false\n"),
    );
    let handler = ServiceBuilder::new()
        .layer(InboxLayer::new(PgInbox::new(db.pool.clone())))
        .service_fn(ship_and_follow_up);
    let running = start(config, &q, handler, Some(&db)).await;
    broker.publish(&q, b"fail", "m-fail").await;
    broker.publish(&q, b"o-1", "m-1").await;

    assert_eq!(
        dead_letter_reason(&broker, &format!("{q}.dlq")).await,
        "rejected"
    );
    wait_until("the follow-up published by the relay", BOUND, || async {
        broker.ready(&shipped).await == 1
    })
    .await;
    wait_until("the follow-up's row marked sent", BOUND, || async {
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await
            == 1
    })
    .await;
    running.drain().await.expect("clean drain");

    assert_eq!(
        broker.take_all(&shipped).await,
        vec!["o-1-shipped".to_owned()]
    );
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox").await,
        1,
        "no row of the failed handler"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM shipments WHERE order_id = 'o-1'")
            .await,
        1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM shipments").await,
        1,
        "no work of the failed handler"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_inbox WHERE message_id = 'm-1'")
            .await,
        1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_inbox").await,
        1,
        "no mark of the failed handler"
    );
}

/// Runs a handler that writes, sends `statement` on the inbox's
/// transaction, and writes again; returns the dead-letter reason and the
/// database.
async fn a_handler_that_sends(statement: &'static str) -> (String, TestDb) {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("ends-its-transaction");
    let config = config(
        &broker,
        &format!("queues:\n  - name: {q}\n    dead_letter: true\n"),
    );
    let handler = ServiceBuilder::new()
        .layer(InboxLayer::new(PgInbox::new(db.pool.clone())))
        .service_fn(move |d: Delivery| async move {
            let tx = PgTransaction::of(&d)?;
            let client = tx.client().await;
            let insert = "INSERT INTO shipments (order_id, message_id) VALUES ($1, 'm-1')";
            client.execute(insert, &[&"before"]).await?;
            client.batch_execute(statement).await?;
            client.execute(insert, &[&"after"]).await?;
            Ok::<_, BoxError>(())
        });
    let running = start(config, &q, handler, None).await;
    broker.publish(&q, b"o-1", "m-1").await;
    let reason = dead_letter_reason(&broker, &format!("{q}.dlq")).await;
    running.drain().await.expect("clean drain");
    (reason, db)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_rolls_back_the_inbox_transaction_is_dead_lettered_and_leaves_no_mark() {
    let (reason, db) = a_handler_that_sends("ROLLBACK").await;
    assert_eq!(reason, "transaction-ended");
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_inbox").await,
        0,
        "no mark"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM shipments WHERE order_id = 'before'")
            .await,
        0,
        "rolled back with the mark"
    );
    // What ran after the ROLLBACK ran outside any transaction: it stays.
    assert_eq!(
        db.count("SELECT count(*) FROM shipments WHERE order_id = 'after'")
            .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_commits_mid_way_is_dead_lettered_and_its_early_mark_removed() {
    let (reason, db) = a_handler_that_sends("COMMIT").await;
    assert_eq!(reason, "transaction-ended");
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_inbox").await,
        0,
        "the mark committed early is removed: a replay is handled, not skipped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_ended_without_a_message_id_is_found_too() {
    use tower::ServiceExt;
    let db = TestDb::create().await;
    let svc = ServiceBuilder::new()
        .layer(InboxLayer::new(PgInbox::new(db.pool.clone())))
        .service_fn(|d: Delivery| async move {
            PgTransaction::of(&d)?
                .client()
                .await
                .batch_execute("ROLLBACK")
                .await?;
            Ok::<_, BoxError>(())
        });
    let d = Delivery::builder().queue("q").body("x").build();
    let err = svc
        .oneshot(d)
        .await
        .expect_err("the ended transaction is an error");
    assert!(
        acemq::layers::inbox::TransactionEnded::is_in(&*err),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_shows_in_the_health_snapshot_and_in_queues() {
    use tower::ServiceExt;
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("duplicates");
    let config = config(&broker, &format!("queues:\n  - name: {q}\n"));
    let handler = ServiceBuilder::new()
        .layer(InboxLayer::new(PgInbox::new(db.pool.clone())))
        .service_fn(ship_and_follow_up);
    let running = start(config, &q, handler, None).await;
    broker.publish(&q, b"o-1", "m-1").await;
    broker.publish(&q, b"o-1", "m-1").await;
    let health = running.health();
    wait_until("the duplicate counted", BOUND, || async {
        health.snapshot().queues[0].inbox_duplicates == 1
    })
    .await;
    let response = acemq::admin::router(health.clone())
        .oneshot(
            axum::http::Request::get("/queues")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let queues: serde_json::Value = serde_json::from_slice(&body).unwrap();
    running.drain().await.expect("clean drain");
    assert_eq!(queues[0]["name"], q.as_str());
    assert_eq!(queues[0]["inbox_duplicates"], 1, "{queues}");
    assert_eq!(db.count("SELECT count(*) FROM shipments").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_swallows_a_failed_statement_and_returns_ok_is_not_acknowledged_as_handled()
{
    use acemq::layers::inbox::InboxOutcome;
    use tower::ServiceExt;
    let db = TestDb::create().await;
    let svc = ServiceBuilder::new()
        .layer(InboxLayer::new(PgInbox::new(db.pool.clone())))
        .service_fn(|d: Delivery| async move {
            let tx = PgTransaction::of(&d)?;
            let client = tx.client().await;
            client
                .execute(
                    "INSERT INTO shipments (order_id, message_id) VALUES ('o-1', 'm-1')",
                    &[],
                )
                .await?;
            // The error is dropped: the transaction is aborted all the same.
            let _ = client.execute("SELECT 1/0", &[]).await;
            Ok::<_, BoxError>(())
        });
    let mut props = acemq::layers::Properties::default();
    props.message_id = Some("m-1".to_owned());
    let d = Delivery::builder().queue("q").properties(props).build();
    let outcome = svc.oneshot(d).await;
    assert!(
        !matches!(outcome, Ok(InboxOutcome::Handled(()))),
        "nothing was committed, yet the delivery was reported handled"
    );
    let err = outcome.expect_err("the commit fails");
    assert!(
        !acemq::layers::inbox::TransactionEnded::is_in(&*err),
        "an aborted transaction is retried, not dead-lettered: {err}"
    );
    assert_eq!(db.count("SELECT count(*) FROM shipments").await, 0);
    assert_eq!(db.count("SELECT count(*) FROM acemq_inbox").await, 0);
}

/// Ships the order in the body in the inbox's transaction, then fails
/// (rolling the shipment and the mark back together) while `down` is set.
async fn ship_unless_down(d: Delivery, down: Arc<AtomicBool>) -> Result<(), BoxError> {
    let tx = PgTransaction::of(&d)?;
    let order = String::from_utf8_lossy(d.body()).into_owned();
    let id = d.properties().message_id.clone().unwrap_or_default();
    tx.client()
        .await
        .execute(
            "INSERT INTO shipments (order_id, message_id) VALUES ($1, $2)",
            &[&order, &id],
        )
        .await?;
    if down.load(Ordering::SeqCst) {
        return Err("the carrier is down (after the write)".into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_breaker_trip_behind_the_inbox_loses_nothing_and_records_each_orders_work_once() {
    use acemq::layers::Circuit;
    const N: u32 = 10;
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("inbox-breaker");
    // The cool-down is longer than pause_hand_back_after: the held orders
    // go back to the broker and come again after the trip.
    let config = config(
        &broker,
        &format!(
            "pause_hand_back_after: 1s
queues:
  - name: {q}
    prefetch: {N}
    concurrency: 2
    dead_letter: true
    retries: {{ max_attempts: 10, initial_delay: 300ms, max_delay: 300ms, broker_wait_threshold: 300ms }}
    circuit_breaker: {{ failure_ratio: 0.5, minimum_calls: 2, window: 30s, cool_down: 2s, max_cool_down: 4s }}
"
        ),
    );
    let down = Arc::new(AtomicBool::new(true));
    let d = down.clone();
    let handler = ServiceBuilder::new()
        .layer(InboxLayer::new(PgInbox::new(db.pool.clone())))
        .service_fn(move |delivery: Delivery| ship_unless_down(delivery, d.clone()));
    let running = start(config, &q, handler, None).await;
    let health = running.health();
    for i in 0..N {
        broker
            .publish(&q, format!("o-{i}").as_bytes(), &format!("m-{i}"))
            .await;
    }
    wait_until("the circuit open", BOUND, || async {
        health.circuit(&q).unwrap() == Circuit::Open
    })
    .await;
    wait_until("every order back in the queue", BOUND, || async {
        broker.ready(&q).await == N
    })
    .await;
    assert_eq!(db.count("SELECT count(*) FROM shipments").await, 0);
    assert_eq!(db.count("SELECT count(*) FROM acemq_inbox").await, 0);
    let handed_back = health.snapshot().queues[0].handed_back;

    down.store(false, Ordering::SeqCst);
    wait_until(
        "every order shipped and the circuit closed",
        BOUND,
        || async {
            db.count("SELECT count(DISTINCT order_id) FROM shipments")
                .await
                == i64::from(N)
                && health.circuit(&q).unwrap() == Circuit::Closed
        },
    )
    .await;
    running.drain().await.expect("clean drain");
    eprintln!(
        "--- inbox breaker: {handed_back} handed back at the trip; {} shipments, {} inbox marks",
        db.count("SELECT count(*) FROM shipments").await,
        db.count("SELECT count(*) FROM acemq_inbox").await
    );
    assert_eq!(
        db.count("SELECT count(*) FROM shipments").await,
        i64::from(N),
        "each order's work recorded exactly once"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_inbox").await,
        i64::from(N)
    );
    assert_eq!(broker.ready(&q).await, 0, "nothing left in the queue");
    assert_eq!(
        broker.ready(&format!("{q}.dlq")).await,
        0,
        "nothing dead-lettered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_committed_during_the_drain_is_published_before_the_drain_ends() {
    let db = TestDb::create().await;
    let broker = Broker::new().await;
    let q = unique("drain-follow-up");
    let shipped = format!("{q}.shipped");
    let config = config(
        &broker,
        &format!("queues:\n  - name: {q}\n  - name: {shipped}\n    consume: false\n"),
    );
    // The handler starts before the drain and commits its follow-up after
    // the drain has begun.
    let started = Arc::new(tokio::sync::Semaphore::new(0));
    let go = Arc::new(tokio::sync::Semaphore::new(0));
    let handler = ServiceBuilder::new()
        .layer(InboxLayer::new(PgInbox::new(db.pool.clone())))
        .service_fn({
            let (started, go) = (started.clone(), go.clone());
            move |d: Delivery| {
                let (started, go) = (started.clone(), go.clone());
                async move {
                    started.add_permits(1);
                    go.acquire().await.expect("open").forget();
                    ship_and_follow_up(d).await
                }
            }
        });
    let running = start(config, &q, handler, Some(&db)).await;
    let health = running.health();
    broker.publish(&q, b"o-7", "m-7").await;
    tokio::time::timeout(BOUND, started.acquire())
        .await
        .expect("the handler starts")
        .expect("open")
        .forget();
    let drain = tokio::spawn(running.drain());
    wait_until("the drain has begun", BOUND, || async {
        health.snapshot().draining
    })
    .await;
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox").await,
        0,
        "nothing committed yet"
    );
    go.add_permits(1);
    tokio::time::timeout(BOUND, drain)
        .await
        .expect("the drain ends")
        .expect("joined")
        .expect("clean drain");

    // Published and marked by the time the drain returned: no wait here.
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_outbox WHERE status = 'sent'")
            .await,
        1,
        "the row committed during the drain is sent"
    );
    assert_eq!(
        broker.take_all(&shipped).await,
        vec!["o-7-shipped".to_owned()]
    );
}

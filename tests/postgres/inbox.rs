//! The inbox's PostgreSQL store in process: the mark and the work commit
//! together.

use acemq::inbox::{PgInbox, PgTransaction};
use acemq::layers::inbox::{InboxLayer, InboxOutcome};
use acemq::layers::Properties;
use acemq::{BoxError, Delivery};
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::support::TestDb;

fn delivery(queue: &str, id: &str, body: &str) -> Delivery {
    let mut props = Properties::default();
    props.message_id = Some(id.to_owned());
    Delivery::builder()
        .queue(queue)
        .body(body.to_owned())
        .properties(props)
        .build()
}

/// Ships the order named by the body, in the inbox's transaction; fails
/// after the write when the body is "fail".
async fn ship(d: Delivery) -> Result<(), BoxError> {
    let tx = PgTransaction::of(&d)?;
    let id = d.properties().message_id.clone().unwrap_or_default();
    tx.client()
        .await
        .execute(
            "INSERT INTO shipments (order_id, message_id) VALUES ($1, $2)",
            &[&String::from_utf8_lossy(d.body()).into_owned(), &id],
        )
        .await?;
    if &d.body()[..] == b"fail" {
        return Err("failed after the write".into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_message_twice_does_the_work_once_and_the_same_id_on_another_queue_again() {
    let db = TestDb::create().await;
    let mut svc = ServiceBuilder::new()
        .layer(InboxLayer::new(PgInbox::new(db.pool.clone())))
        .service_fn(ship);
    let a = svc
        .ready()
        .await
        .unwrap()
        .call(delivery("q1", "m1", "o-1"))
        .await;
    let b = svc
        .ready()
        .await
        .unwrap()
        .call(delivery("q1", "m1", "o-1"))
        .await;
    let c = svc
        .ready()
        .await
        .unwrap()
        .call(delivery("q2", "m1", "o-1"))
        .await;
    assert_eq!(a.unwrap(), InboxOutcome::Handled(()));
    assert_eq!(b.unwrap(), InboxOutcome::Duplicate);
    assert_eq!(c.unwrap(), InboxOutcome::Handled(()));
    assert_eq!(db.count("SELECT count(*) FROM shipments").await, 2);
    assert_eq!(db.count("SELECT count(*) FROM acemq_inbox").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_handler_rolls_back_its_work_and_the_mark_together() {
    let db = TestDb::create().await;
    let svc = ServiceBuilder::new()
        .layer(InboxLayer::new(PgInbox::new(db.pool.clone())))
        .service_fn(ship);
    let err = svc
        .clone()
        .oneshot(delivery("q", "m1", "fail"))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "failed after the write");
    // The rollback runs on a spawned task: wait for the connection to come back.
    crate::support::wait_until(
        "the rolled-back connection back in the pool",
        std::time::Duration::from_secs(10),
        || async { db.pool.status().available == db.pool.status().size },
    )
    .await;
    assert_eq!(db.count("SELECT count(*) FROM shipments").await, 0);
    assert_eq!(db.count("SELECT count(*) FROM acemq_inbox").await, 0);
    let again = svc.oneshot(delivery("q", "m1", "o-1")).await.unwrap();
    assert_eq!(again, InboxOutcome::Handled(()));
    assert_eq!(db.count("SELECT count(*) FROM shipments").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deliveries_of_one_id_do_the_work_once() {
    let db = TestDb::create().await;
    let svc = ServiceBuilder::new()
        .layer(InboxLayer::new(PgInbox::new(db.pool.clone())))
        .service_fn(ship);
    let outcomes = futures::future::join_all(
        (0..8).map(|_| svc.clone().oneshot(delivery("q", "same", "o-1"))),
    )
    .await;
    let handled = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(InboxOutcome::Handled(()))))
        .count();
    let duplicates = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(InboxOutcome::Duplicate)))
        .count();
    assert_eq!((handled, duplicates), (1, 7), "{outcomes:?}");
    assert_eq!(db.count("SELECT count(*) FROM shipments").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_deletes_old_marks_only() {
    let db = TestDb::create().await;
    let store = PgInbox::new(db.pool.clone());
    let svc = ServiceBuilder::new()
        .layer(InboxLayer::new(store.clone()))
        .service_fn(ship);
    svc.clone()
        .oneshot(delivery("q", "old", "o-1"))
        .await
        .unwrap();
    svc.oneshot(delivery("q", "new", "o-2")).await.unwrap();
    db.pool
        .get()
        .await
        .unwrap()
        .execute(
            "UPDATE acemq_inbox SET processed_at = now() - interval '2 days' WHERE message_id = 'old'",
            &[],
        )
        .await
        .unwrap();
    let n = store
        .expire(std::time::Duration::from_secs(24 * 3600))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        db.count("SELECT count(*) FROM acemq_inbox WHERE message_id = 'new'")
            .await,
        1
    );
}

/// `ship`, written against the transaction of either inbox.
async fn ship_on_either(d: Delivery) -> Result<(), BoxError> {
    let tx = acemq::inbox::InboxTransaction::of(&d)?;
    let order = String::from_utf8_lossy(d.body()).into_owned();
    let id = d.properties().message_id.clone().unwrap_or_default();
    tx.execute(
        "INSERT INTO shipments (order_id, message_id) VALUES ($1, $2)",
        &[&order, &id],
    )
    .await?;
    tx.enqueue(&acemq::outbox::OutboxMessage::to_queue(
        "shipped",
        order.clone(),
    ))
    .await?;
    if order == "fail" {
        return Err("failed after the writes".into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_on_the_transaction_of_either_inbox_writes_through_postgres_under_pg_inbox() {
    let db = TestDb::create().await;
    let mut svc = ServiceBuilder::new()
        .layer(InboxLayer::new(PgInbox::new(db.pool.clone())))
        .service_fn(ship_on_either);
    let mut outcomes = Vec::new();
    for (id, body) in [("m1", "o-1"), ("m1", "o-1"), ("m2", "fail")] {
        let r = svc
            .ready()
            .await
            .unwrap()
            .call(delivery("q", id, body))
            .await;
        outcomes.push(r.ok());
    }
    assert_eq!(
        outcomes,
        [
            Some(InboxOutcome::Handled(())),
            Some(InboxOutcome::Duplicate),
            None
        ]
    );
    assert_eq!(db.count("SELECT count(*) FROM shipments").await, 1);
    assert_eq!(db.count("SELECT count(*) FROM acemq_outbox").await, 1);
}

//! `outbox::migrate` on every start: the second run on a migrated database
//! applies nothing and sends nothing to the connection — no "already exists,
//! skipping" NOTICE for tokio-postgres to log at INFO.

use std::sync::{Arc, Mutex};

use acemq::outbox;
use futures::StreamExt;
use tokio_postgres::AsyncMessage;

use crate::support::{admin, pg_base};

/// A database of the test's own, empty (not migrated); dropped with the
/// guard.
struct EmptyDb {
    name: String,
}

impl EmptyDb {
    async fn create() -> EmptyDb {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("acemq_test_migrate_{}_{nanos}", std::process::id());
        admin()
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the test database");
        EmptyDb { name }
    }
}

impl Drop for EmptyDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let _ = admin()
                    .await
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await;
            });
        })
        .join();
    }
}

/// A client on `db` whose connection records every notice the server sends
/// instead of logging it.
async fn client_counting_notices(
    db: &EmptyDb,
) -> (tokio_postgres::Client, Arc<Mutex<Vec<String>>>) {
    let settings = format!("{} dbname={}", pg_base(), db.name);
    let (client, mut conn) = tokio_postgres::connect(&settings, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    let notices: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = notices.clone();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notice(n) = message {
                seen.lock()
                    .unwrap()
                    .push(format!("{}: {}", n.severity(), n.message()));
            }
        }
    });
    (client, notices)
}

#[tokio::test]
async fn migrate_a_second_time_applies_nothing_and_sends_no_notice() {
    let db = EmptyDb::create().await;
    let (client, notices) = client_counting_notices(&db).await;

    // The counter sees a notice when there is one.
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS probe (x int); CREATE TABLE IF NOT EXISTS probe (x int)",
        )
        .await
        .expect("probe");
    assert_eq!(
        notices.lock().unwrap().len(),
        1,
        "the probe's second CREATE sends one notice: {:?}",
        notices.lock().unwrap()
    );
    notices.lock().unwrap().clear();
    let level = || async {
        client
            .query_one("SHOW client_min_messages", &[])
            .await
            .expect("show")
            .get::<_, String>(0)
    };
    let before = level().await;

    assert_eq!(outbox::migrate(&client).await.expect("migrate"), 2);
    assert_eq!(outbox::migrate(&client).await.expect("migrate again"), 0);
    assert_eq!(outbox::migrate(&client).await.expect("and again"), 0);
    assert!(
        notices.lock().unwrap().is_empty(),
        "migrate sent notices: {:?}",
        notices.lock().unwrap()
    );

    // The quiet setting ends with migrate's transaction.
    assert_eq!(level().await, before);
}

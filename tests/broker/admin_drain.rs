//! The admin server beside the drain, as `examples/axum_side_by_side.rs`
//! runs it: the application's own routes stop first; the admin router,
//! served by `acemq::admin::serve` until `health.drained()`, answers through
//! the drain — `/readyz` 503, pause 409 — and stops once the drain has
//! ended.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::Delivery;
use lapin::types::FieldTable;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::{
    all_queues, eventually, plain_config, start_consuming, unique, Broker, QueueCleanup,
    ShopProcess,
};

/// The admin token of the routes under test.
const TOKEN: &str = "admin-drain-test-token-42";

/// One HTTP/1.0 request with [`TOKEN`]: `Some((status, body))`, or `None`
/// when nothing accepts the connection.
async fn request(addr: SocketAddr, method: &str, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: test\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

async fn readyz(addr: SocketAddr) -> Option<(u16, Value)> {
    let (status, body) = request(addr, "GET", "/readyz").await?;
    Some((
        status,
        serde_json::from_str(&body).expect("/readyz is JSON"),
    ))
}

#[tokio::test]
async fn the_admin_routes_answer_503_through_the_drain_after_the_own_routes_stopped_and_stop_when_it_has_ended(
) {
    let q = unique("admin-drain");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    // The handler runs until the test lets it finish.
    let started = Arc::new(AtomicUsize::new(0));
    let finish = Arc::new(tokio::sync::Semaphore::new(0));
    let handler = {
        let (started, finish) = (started.clone(), finish.clone());
        tower::service_fn(move |_d: Delivery| {
            let (started, finish) = (started.clone(), finish.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                let _permit = finish.acquire().await.expect("open");
                Ok::<_, acemq::BoxError>(())
            }
        })
    };
    let running = start_consuming(plain_config(&q), &q, handler).await;
    let health = running.health();

    // The admin routes on their own address, until the drain has ended.
    let admin_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let admin_addr = admin_listener.local_addr().expect("addr");
    let admin_router = acemq::admin::AdminRouter::new(health.clone())
        .token(acemq::admin::AdminToken::new(TOKEN).expect("a valid token"))
        .build();
    let admin = tokio::spawn(acemq::admin::serve(
        admin_listener,
        admin_router,
        health.drained(),
    ));
    // The application's own routes, until the stop.
    let own_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let own_addr = own_listener.local_addr().expect("addr");
    let (stop_own, own_stopped) = tokio::sync::oneshot::channel::<()>();
    let own = tokio::spawn(
        axum::serve(
            own_listener,
            axum::Router::new().route("/orders", axum::routing::get(|| async { "orders" })),
        )
        .with_graceful_shutdown(async move {
            let _ = own_stopped.await;
        })
        .into_future(),
    );
    assert_eq!(
        request(own_addr, "GET", "/orders").await.map(|r| r.0),
        Some(200)
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            readyz(admin_addr).await.map(|r| r.0) == Some(200)
        })
        .await,
        "ready before the stop"
    );

    broker.publish(&q, b"slow", FieldTable::default()).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            started.load(Ordering::SeqCst) == 1
        })
        .await,
        "the handler is running"
    );

    // The stop: readiness off, the own routes stop, then the drain.
    running.stop_readiness();
    stop_own.send(()).expect("the own server listens");
    tokio::time::timeout(Duration::from_secs(5), own)
        .await
        .expect("the own routes stop at once")
        .expect("no panic")
        .expect("served");
    assert_eq!(
        request(own_addr, "GET", "/orders").await,
        None,
        "the own routes are closed"
    );
    let drain = tokio::spawn(running.drain());

    // Through the drain: the handler still runs, the admin routes answer.
    for _ in 0..3 {
        let (status, snap) = readyz(admin_addr)
            .await
            .expect("/readyz answers during the drain");
        assert_eq!(status, 503, "{snap}");
        assert_eq!(snap["draining"], json!(true), "{snap}");
        assert_eq!(snap["queues"][0]["in_flight"], json!(1), "{snap}");
        let (status, body) = request(admin_addr, "POST", &format!("/queues/{q}/pause"))
            .await
            .expect("pause answers during the drain");
        assert_eq!(status, 409, "{body}");
    }
    assert!(!health.is_drained());
    assert!(!drain.is_finished() && !admin.is_finished());

    // The handler ends; so does the drain, then the admin server.
    finish.add_permits(1);
    let report = tokio::time::timeout(Duration::from_secs(15), drain)
        .await
        .expect("the drain ends")
        .expect("no panic")
        .expect("a clean drain");
    assert_eq!(report.finished(), 1);
    assert!(health.is_drained());
    tokio::time::timeout(Duration::from_secs(5), admin)
        .await
        .expect("the admin server stops once the drain has ended")
        .expect("no panic")
        .expect("served");
    assert_eq!(
        readyz(admin_addr).await,
        None,
        "the admin routes are closed"
    );
    // `drained` resolves at once for a late caller too.
    tokio::time::timeout(Duration::from_secs(1), health.drained())
        .await
        .expect("already drained");
}

/// The shop (`--http`): SIGTERM with an order in flight; `/readyz` answers
/// 503 while the drain waits for it, and the admin routes stop after the
/// drain, before the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_answers_503_through_its_drain_and_stops_its_admin_routes_after_it() {
    let q = unique("shop-admin-drain");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let yaml = format!("shutdown_timeout: 15\nqueues:\n  - name: {q}\n");
    let mut shop = ShopProcess::spawn(&q, &yaml, &[]);
    shop.wait_ready().await;
    broker
        .publish(
            &q,
            br#"{"id":"o-slow","work_ms":4000}"#,
            FieldTable::default(),
        )
        .await;
    shop.wait_in_flight(1).await;

    shop.signal("-TERM");
    let during = std::sync::Mutex::new(None);
    let seen = eventually(Duration::from_secs(5), || async {
        match shop.readyz().await {
            Some((503, snap)) if snap["draining"] == json!(true) => {
                *during.lock().unwrap() = Some(snap);
                true
            }
            _ => false,
        }
    })
    .await;
    assert!(
        seen,
        "/readyz never answered 503 draining; stderr:\n{}",
        shop.stderr()
    );
    let snap = during.into_inner().unwrap().expect("a snapshot");
    assert_eq!(
        snap["queues"][0]["in_flight"],
        json!(1),
        "answered while the drain waits for the order: {snap}"
    );

    let status = shop.exit_within(Duration::from_secs(25)).await;
    let stderr = shop.stderr();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    let drained = stderr
        .find("every handler finished")
        .unwrap_or_else(|| panic!("no drain report; stderr:\n{stderr}"));
    let stopped = stderr
        .find("the admin routes stopped")
        .unwrap_or_else(|| panic!("the admin routes never stopped; stderr:\n{stderr}"));
    assert!(
        drained < stopped,
        "the admin routes stop after the drain; stderr:\n{stderr}"
    );
}

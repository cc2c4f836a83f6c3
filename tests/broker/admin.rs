//! The admin router (feature `axum`) over a real `App`: pause through the
//! HTTP route holds a published message, resume hands it to the handler.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::Delivery;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use lapin::types::FieldTable;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::{eventually, plain_config, start_consuming, topology_queues, unique, Broker};

/// The admin token of the routes under test.
const TOKEN: &str = "admin-broker-test-token-7";

async fn call(router: &axum::Router, method: &str, uri: &str) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .expect("request");
    let resp = router.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{method} {uri}: not JSON ({e}): {body:?}"));
    (status, value)
}

#[tokio::test]
async fn a_pause_through_the_admin_route_holds_a_message_until_the_resume_route() {
    let q = unique("admin");
    let mut broker = Broker::new().await;
    let config = plain_config(&q);
    let all = topology_queues(&config);
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let handler = tower::service_fn(move |_d: Delivery| {
        let h = h.clone();
        async move {
            h.fetch_add(1, Ordering::SeqCst);
            Ok::<_, acemq::BoxError>(())
        }
    });
    let running = start_consuming(config, &q, handler).await;
    let admin = acemq::admin::AdminRouter::new(running.health())
        .token(acemq::admin::AdminToken::new(TOKEN).expect("a valid token"))
        .build();
    let route = format!("/queues/{q}");

    let (status, snap) = call(&admin, "POST", &format!("{route}/pause")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(snap["name"], json!(q));
    assert_eq!(snap["paused"], json!(true));

    broker.publish(&q, b"held", FieldTable::default()).await;
    let held = eventually(Duration::from_secs(10), || async {
        call(&admin, "GET", &route).await.1["held"] == json!(1)
    })
    .await;
    assert!(
        held,
        "the delivery waits at the gate: {}",
        call(&admin, "GET", &route).await.1
    );
    assert_eq!(
        handled.load(Ordering::SeqCst),
        0,
        "not handled while paused"
    );

    let (status, ready) = call(&admin, "GET", "/readyz").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a paused instance stays ready: {ready}"
    );
    assert_eq!(ready["queues"][0]["paused"], json!(true));

    let (status, snap) = call(&admin, "POST", &format!("{route}/resume")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(snap["paused"], json!(false));
    let done = eventually(Duration::from_secs(10), || async {
        let snap = call(&admin, "GET", &route).await.1;
        snap["handled"] == json!(1) && snap["held"] == json!(0)
    })
    .await;
    assert!(
        done,
        "handled after the resume: {}",
        call(&admin, "GET", &route).await.1
    );
    assert_eq!(handled.load(Ordering::SeqCst), 1);

    let (status, err) = call(&admin, "POST", "/queues/not-here/pause").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(err["queue"], json!("not-here"));
    assert_eq!(err["queues"], json!([q]));

    let report = running.drain().await.expect("clean drain");
    assert_eq!(report.handed_back(), 0);
    assert!(
        broker.wait_ready(&q, 0, Duration::from_secs(5)).await,
        "the message was acknowledged"
    );
    broker.delete(&all).await;
}

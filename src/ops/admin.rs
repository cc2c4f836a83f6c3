//! An admin router for axum: liveness, readiness, per-queue snapshots, pause
//! and resume (feature `axum`).
//!
//! The router is an ordinary `axum::Router` over a [`Health`] handle, so it
//! can be called like any tower service — here before anything connected:
//!
//! ```
//! use axum::body::Body;
//! use axum::http::{Request, StatusCode};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let admin = acemq::admin::router(acemq::Health::new());
//!
//! let live = admin.clone().oneshot(Request::get("/healthz").body(Body::empty())?).await?;
//! assert_eq!(live.status(), StatusCode::OK);
//!
//! // Not connected yet: not ready, and the body says why.
//! let ready = admin.clone().oneshot(Request::get("/readyz").body(Body::empty())?).await?;
//! assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
//! let body = axum::body::to_bytes(ready.into_body(), 64 * 1024).await?;
//! let snapshot: serde_json::Value = serde_json::from_slice(&body)?;
//! assert_eq!(snapshot["connected"], false);
//!
//! // No queue has started here, so pausing one is a 404 naming it.
//! let pause = Request::post("/queues/shop.orders/pause").body(Body::empty())?;
//! assert_eq!(admin.oneshot(pause).await?.status(), StatusCode::NOT_FOUND);
//! # Ok(())
//! # }
//! ```
//!
//! Served beside an [`App`](crate::App), on an address of its own, through
//! the drain and stopped once it has ended
//! ([`Health::drained`](crate::Health::drained)):
//!
//! ```no_run
//! use acemq::{App, Config, Delivery};
//! use tower::service_fn;
//!
//! # async fn run() -> std::process::ExitCode {
//! let config = Config::from_path("examples/shop.yaml").expect("valid config");
//! let app = App::new(config).consume(
//!     "shop.orders",
//!     service_fn(|_d: Delivery| async { Ok::<_, acemq::BoxError>(()) }),
//! );
//! let health = app.health();
//! let admin = axum::Router::new().nest("/admin", acemq::admin::router(health.clone()));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
//! let server = tokio::spawn(async move {
//!     axum::serve(listener, admin).with_graceful_shutdown(health.drained()).await
//! });
//! let code = app.run().await;
//! let _ = server.await;
//! code
//! # }
//! ```
//!
//! Then `curl -X POST localhost:8080/admin/queues/shop.orders/pause`.
//!
//! # Routes
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` | `200 ok` while the process lives (liveness) |
//! | `GET /readyz` | `200` when ready, else `503`; the body is the [`HealthSnapshot`] as JSON |
//! | `GET /queues` | every queue's [`QueueSnapshot`], as a JSON array in config order |
//! | `GET /queues/{name}` | that queue's snapshot |
//! | `POST /queues/{name}/pause` | pauses it; the body is its new snapshot (`"paused": true`); `409` once the drain has begun |
//! | `POST /queues/{name}/resume` | resumes it (and closes an open or half-open circuit: an override until the breaker trips again); the body is its new snapshot |
//! | `GET /metrics` | only with [`router_with_metrics`]: what your render closure returns |
//!
//! Once the drain has begun, pause and resume are a `409` saying so (with
//! the queue's snapshot): the gates then only hand back.
//!
//! A queue name is one path segment, percent-decoded (`a%2Fb` is `a/b`).
//! A queue the process does not consume is a `404` with a JSON body naming
//! it and the queues there are:
//! `{"error": "no queue named \"x\" is consumed here", "queue": "x", "queues": ["shop.orders"]}`.
//!
//! # Readiness and pause
//!
//! A pause leaves readiness as it was: a paused instance is healthy, and its
//! admin routes must stay reachable behind the load balancer that reads
//! `/readyz`. The snapshot says `"paused": true`, and `held` counts the
//! deliveries waiting at the gate. A pause longer than the config's
//! `pause_hand_back_after` (30 s by default) hands those back to the broker
//! and cancels the queue's consumer, so other instances take the work:
//! `held` falls to 0 (the work is back in the broker), still
//! `"paused": true` and still ready, until
//! `POST …/resume` consumes the queue again. Wire `/readyz` to a readiness probe and
//! `/healthz` to a liveness probe, never the other way round: a draining
//! instance is not ready but alive, finishing the work the drain waits for.
//!
//! # Through the drain
//!
//! Serve the admin router on its own address and stop it with
//! `with_graceful_shutdown(health.drained())`: it answers through the whole
//! drain — `/readyz` `503` from the drain's first step, so the orchestrator
//! sees a draining instance rather than a closed port; `/queues` shows what
//! is still in flight; pause and resume `409` — and stops once the drain
//! has ended. Your own routes (a separate server) stop before the drain,
//! after readiness flips ([`Running::stop_readiness`](crate::Running::stop_readiness)):
//!
//! 1. a stop signal: readiness off;
//! 2. your routes: axum's graceful shutdown finishes the requests in
//!    progress and takes no new ones;
//! 3. the drain (the admin routes answer on);
//! 4. the drain has ended: the admin server stops.
//!
//! `examples/axum_side_by_side.rs` runs exactly this on one
//! [`Signals`](crate::Signals). Nesting the admin router in your own
//! server instead ties the two together: stopping it before the drain
//! closes `/readyz` with it.
//!
//! # Before start
//!
//! The queues join the [`Health`] handle when [`App::start`](crate::App::start)
//! has opened them: until then `/readyz` is `503`, `/queues` is `[]` and a
//! queue route is `404`. Serve the router before start if you like; it
//! answers as soon as the consumers exist.

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

use crate::app::health::{Health, HealthSnapshot, QueueSnapshot, UnknownQueue};

/// The admin routes over `health` (see the [module docs](crate::admin)).
///
/// ```
/// // The routes answer from the handle alone: no broker needed to build them.
/// let app: axum::Router = acemq::admin::router(acemq::Health::new());
/// # let _ = app;
/// ```
///
/// Serving it beside your own routes: the [module docs](crate::admin) and
/// `examples/axum_side_by_side.rs`.
pub fn router(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/queues", get(queues))
        .route("/queues/{name}", get(queue))
        .route("/queues/{name}/pause", post(pause))
        .route("/queues/{name}/resume", post(resume))
        .with_state(health)
}

/// [`router`] and `GET /metrics`, answering `render()` as
/// `text/plain; version=0.0.4; charset=utf-8` (Prometheus' text format).
///
/// Before each render the handle's gauges (`acemq.ready`, `acemq.inflight`,
/// `acemq.held`) are set from the current state
/// ([`Health::record_metrics`]), so a scrape never reads stale gauges.
///
/// ```no_run
/// # fn demo(health: acemq::Health) {
/// let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
///     .install_recorder()
///     .expect("no other recorder");
/// let admin = acemq::admin::router_with_metrics(health, move || prometheus.render());
/// # }
/// ```
pub fn router_with_metrics<F>(health: Health, render: F) -> Router
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    let h = health.clone();
    router(health).route(
        "/metrics",
        get(move || {
            h.record_metrics();
            let body = render();
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    body,
                )
            }
        }),
    )
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(health): State<Health>) -> (StatusCode, Json<HealthSnapshot>) {
    let snap = health.snapshot();
    let code = if snap.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(snap))
}

async fn queues(State(health): State<Health>) -> Json<Vec<QueueSnapshot>> {
    Json(health.snapshot().queues)
}

async fn queue(State(health): State<Health>, Path(name): Path<String>) -> Response {
    snapshot_of(&health, &name)
}

async fn pause(State(health): State<Health>, Path(name): Path<String>) -> Response {
    if let Some(refused) = draining(&health, &name, "pause") {
        return refused;
    }
    match health.pause(&name) {
        Ok(()) => snapshot_of(&health, &name),
        Err(e) => not_found(&health, e),
    }
}

async fn resume(State(health): State<Health>, Path(name): Path<String>) -> Response {
    if let Some(refused) = draining(&health, &name, "resume") {
        return refused;
    }
    match health.resume(&name) {
        Ok(()) => snapshot_of(&health, &name),
        Err(e) => not_found(&health, e),
    }
}

/// The body of a 409 for a pause or resume once the drain has begun.
#[derive(Serialize)]
struct Draining {
    error: String,
    queue: String,
    snapshot: QueueSnapshot,
}

/// A 409 when the drain has begun (the gates then only hand back), after the
/// 404 for an unknown queue.
fn draining(health: &Health, name: &str, what: &str) -> Option<Response> {
    if !health.is_draining() {
        return None;
    }
    let snap = health.snapshot();
    let Some(q) = snap.queues.into_iter().find(|q| q.name == name) else {
        return Some(not_found(health, UnknownQueue(name.to_owned())));
    };
    let body = Draining {
        error: format!(
            "the drain has begun: {what} no longer applies; queue {name:?} takes nothing new and hands back what it held"
        ),
        queue: name.to_owned(),
        snapshot: q,
    };
    Some((StatusCode::CONFLICT, Json(body)).into_response())
}

/// `name`'s snapshot, or the 404.
fn snapshot_of(health: &Health, name: &str) -> Response {
    match health
        .snapshot()
        .queues
        .into_iter()
        .find(|q| q.name == name)
    {
        Some(q) => Json(q).into_response(),
        None => not_found(health, UnknownQueue(name.to_owned())),
    }
}

/// The body of a 404 for a queue not consumed here.
#[derive(Serialize)]
struct NotFound {
    error: String,
    queue: String,
    queues: Vec<String>,
}

fn not_found(health: &Health, e: UnknownQueue) -> Response {
    let body = NotFound {
        error: e.to_string(),
        queues: health.queue_names(),
        queue: e.0,
    };
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    //! The routes over a `Health` built in the crate: the queue entries are
    //! added as the runner adds them, and where readiness is on, two
    //! connections to the test broker are put in its cells as the
    //! supervisor puts them (readiness reads lapin's status of each). The
    //! broker test (`tests/broker/admin.rs`) runs them over a real `App`.

    use std::sync::Arc;
    use std::time::Duration;

    use acemq_layers::PauseHandle;
    use axum::body::Body;
    use axum::http::Request;
    use serde_json::{json, Value};
    use tower::ServiceExt;

    use super::*;
    use crate::connection::ConnectionRole;
    use crate::consumer::QueueStats;

    fn health_with(queues: &[&str]) -> (Health, Vec<PauseHandle>) {
        let health = Health::new();
        let gates = queues
            .iter()
            .map(|q| {
                let gate = PauseHandle::new();
                health.add_queue(q, gate.clone(), Arc::new(QueueStats::default()));
                gate
            })
            .collect();
        (health, gates)
    }

    /// Both of `health`'s connections open (to the test broker), as the
    /// supervisor would put them in their cells: readiness reads them.
    async fn open_both(health: &Health) -> Vec<Arc<lapin::Connection>> {
        let addr = crate::connection::amqp_addr_from_env();
        let mut open = Vec::new();
        for role in [ConnectionRole::Consumer, ConnectionRole::Publisher] {
            let c = crate::connection::connect(&addr, "admin-test", Duration::from_secs(5))
                .await
                .expect("the test broker");
            let c = Arc::new(c);
            health.live(role).set(Some(c.clone()));
            open.push(c);
        }
        open
    }

    async fn call(router: &Router, method: &str, uri: &str) -> (StatusCode, String) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .expect("request");
        let resp = router.clone().oneshot(req).await.expect("infallible");
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, String::from_utf8(body.to_vec()).expect("utf-8"))
    }

    fn parse(body: &str) -> Value {
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
    }

    #[tokio::test]
    async fn healthz_is_200_even_when_nothing_is_connected() {
        let (health, _) = health_with(&[]);
        let (status, body) = call(&router(health), "GET", "/healthz").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "ok");
    }

    #[tokio::test]
    async fn readyz_is_503_with_the_snapshot_until_both_connections_are_open() {
        let (health, _) = health_with(&["q"]);
        let app = router(health.clone());
        let (status, body) = call(&app, "GET", "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(parse(&body)["ready"], json!(false));

        let _open = open_both(&health).await;
        let (status, body) = call(&app, "GET", "/readyz").await;
        assert_eq!(status, StatusCode::OK);
        let snap = parse(&body);
        assert_eq!(snap["ready"], json!(true));
        assert_eq!(snap["queues"][0]["name"], json!("q"));

        health.set_draining();
        let (status, body) = call(&app, "GET", "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(parse(&body)["draining"], json!(true));
    }

    #[tokio::test]
    async fn queues_show_the_circuit_and_an_operators_resume_closes_it() {
        use acemq_layers::{BoxError, BreakerPolicy, CircuitBreaker, Decision, Delivery};
        let (health, gates) = health_with(&["a", "b"]);
        let app = router(health.clone());
        let (_, body) = call(&app, "GET", "/queues").await;
        assert_eq!(parse(&body)[1]["circuit"], json!("closed"));

        // One failed attempt trips a breaker that needs one call.
        let mut policy = BreakerPolicy::default();
        policy.minimum_calls = 1;
        let failing = tower::service_fn(|_d: Delivery| async {
            Err::<Decision, BoxError>("database unavailable".into())
        });
        let breaker = CircuitBreaker::new(failing, gates[1].clone(), policy);
        let attempt = breaker
            .oneshot(Delivery::builder().queue("b").build())
            .await;
        assert!(attempt.is_err());

        let (_, body) = call(&app, "GET", "/queues").await;
        let all = parse(&body);
        assert_eq!(all[0]["circuit"], json!("closed"));
        assert_eq!(all[1]["circuit"], json!("open"));
        assert_eq!(
            all[1]["paused"],
            json!(false),
            "open is not an operator's pause"
        );

        let (status, body) = call(&app, "POST", "/queues/b/resume").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            parse(&body)["circuit"],
            json!("closed"),
            "the operator overrides"
        );
    }

    #[tokio::test]
    async fn pause_and_resume_answer_the_new_snapshot_and_leave_readiness_alone() {
        let (health, gates) = health_with(&["a", "b"]);
        let _open = open_both(&health).await;
        let app = router(health.clone());

        let (status, body) = call(&app, "POST", "/queues/b/pause").await;
        assert_eq!(status, StatusCode::OK);
        let snap = parse(&body);
        assert_eq!(snap["name"], json!("b"));
        assert_eq!(snap["paused"], json!(true));
        assert!(gates[1].is_paused() && !gates[0].is_paused());

        let (status, body) = call(&app, "GET", "/readyz").await;
        assert_eq!(status, StatusCode::OK, "a paused instance stays ready");
        assert_eq!(parse(&body)["queues"][1]["paused"], json!(true));

        let (status, body) = call(&app, "GET", "/queues").await;
        assert_eq!(status, StatusCode::OK);
        let all = parse(&body);
        assert_eq!(all[0]["name"], json!("a"));
        assert_eq!(all[0]["paused"], json!(false));
        assert_eq!(all[1]["paused"], json!(true));

        let (status, body) = call(&app, "POST", "/queues/b/resume").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(parse(&body)["paused"], json!(false));
        assert!(!gates[1].is_paused());

        let (status, body) = call(&app, "GET", "/queues/b").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(parse(&body)["paused"], json!(false));
    }

    #[tokio::test]
    async fn an_unknown_queue_is_a_404_naming_it_and_the_queues_there_are() {
        let (health, gates) = health_with(&["a"]);
        let app = router(health);
        for (method, uri) in [
            ("GET", "/queues/nope"),
            ("POST", "/queues/nope/pause"),
            ("POST", "/queues/nope/resume"),
        ] {
            let (status, body) = call(&app, method, uri).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{method} {uri}");
            let err = parse(&body);
            assert_eq!(err["queue"], json!("nope"), "{method} {uri}");
            assert_eq!(err["queues"], json!(["a"]), "{method} {uri}");
            assert!(
                err["error"].as_str().unwrap().contains("\"nope\""),
                "{method} {uri}: {body}"
            );
        }
        assert!(!gates[0].is_paused());
    }

    #[tokio::test]
    async fn a_queue_name_in_the_path_is_percent_decoded() {
        let (health, gates) = health_with(&["odd/name"]);
        let (status, body) = call(&router(health), "POST", "/queues/odd%2Fname/pause").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(parse(&body)["name"], json!("odd/name"));
        assert!(gates[0].is_paused());
    }

    #[tokio::test]
    async fn nested_under_a_prefix_beside_other_routes_every_route_answers_there() {
        let (health, gates) = health_with(&["a"]);
        let app = Router::new()
            .route("/orders", post(|| async { "taken" }))
            .nest("/admin", router(health));
        assert_eq!(call(&app, "GET", "/admin/healthz").await.0, StatusCode::OK);
        assert_eq!(
            call(&app, "GET", "/admin/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let (status, body) = call(&app, "POST", "/admin/queues/a/pause").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(gates[0].is_paused());
        assert_eq!(call(&app, "POST", "/orders").await.1, "taken");
        assert_eq!(call(&app, "GET", "/healthz").await.0, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn pause_and_resume_during_the_drain_are_a_409_saying_so_and_change_nothing() {
        let (health, gates) = health_with(&["a"]);
        let app = router(health.clone());
        health.set_draining();
        for route in ["/queues/a/pause", "/queues/a/resume"] {
            let (status, body) = call(&app, "POST", route).await;
            assert_eq!(status, StatusCode::CONFLICT, "{route}");
            let err = parse(&body);
            assert!(
                err["error"].as_str().unwrap().contains("drain has begun"),
                "{route}: {body}"
            );
            assert_eq!(err["snapshot"]["name"], json!("a"), "{route}");
        }
        assert!(!gates[0].is_paused());
        let (status, _) = call(&app, "POST", "/queues/nope/pause").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "unknown is still a 404");
        assert_eq!(call(&app, "GET", "/queues/a").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn a_get_on_pause_is_405_so_a_crawler_cannot_pause_a_queue() {
        let (health, gates) = health_with(&["a"]);
        let (status, _) = call(&router(health), "GET", "/queues/a/pause").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert!(!gates[0].is_paused());
    }

    #[tokio::test]
    async fn metrics_renders_what_the_closure_returns_with_prometheus_content_type() {
        let (health, _) = health_with(&["a"]);
        let app = router_with_metrics(health, || "acemq_ready 0\n".to_owned());
        let req = Request::builder()
            .uri("/metrics")
            .body(Body::empty())
            .expect("request");
        let resp = app.clone().oneshot(req).await.expect("infallible");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "text/plain; version=0.0.4; charset=utf-8"
        );
        let (_, body) = call(&app, "GET", "/metrics").await;
        assert_eq!(body, "acemq_ready 0\n");
        let (status, _) = call(&app, "GET", "/healthz").await;
        assert_eq!(status, StatusCode::OK, "the other routes are there too");
    }
}

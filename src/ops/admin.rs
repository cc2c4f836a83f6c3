//! An admin router for axum: liveness, readiness, per-queue snapshots, pause
//! and resume (feature `axum`).
//!
//! [`AdminRouter`] builds an ordinary `axum::Router` over a [`Health`]
//! handle, so it can be called like any tower service — here before
//! anything connected:
//!
//! ```
//! use acemq::admin::{AdminRouter, AdminToken};
//! use axum::body::Body;
//! use axum::http::{Request, StatusCode};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let token = AdminToken::new("3f9c2a7e5b1d4c8a9e6f0b2d")?;
//! let admin = AdminRouter::new(acemq::Health::new()).token(token).build();
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
//! // A control route without the token: 401, before any queue is looked up.
//! let pause = Request::post("/queues/shop.orders/pause").body(Body::empty())?;
//! assert_eq!(admin.clone().oneshot(pause).await?.status(), StatusCode::UNAUTHORIZED);
//!
//! // With it: no queue has started here, so pausing one is a 404 naming it.
//! let pause = Request::post("/queues/shop.orders/pause")
//!     .header("authorization", "Bearer 3f9c2a7e5b1d4c8a9e6f0b2d")
//!     .body(Body::empty())?;
//! assert_eq!(admin.oneshot(pause).await?.status(), StatusCode::NOT_FOUND);
//! # Ok(())
//! # }
//! ```
//!
//! Served beside an [`App`](crate::App), on an address of its own, by
//! [`serve`] (timeouts and a connection cap), through the drain and stopped
//! once the app has stopped ([`Health::drained`](crate::Health::drained),
//! which also resolves when start-up fails); `main` returns `run`'s code:
//!
//! ```no_run
//! use acemq::admin::{AdminRouter, AdminToken};
//! use acemq::{App, Config, Delivery};
//! use tower::service_fn;
//!
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     let config = Config::from_path("examples/shop.yaml").expect("valid config");
//!     let app = App::new(config).consume(
//!         "shop.orders",
//!         service_fn(|_d: Delivery| async { Ok::<_, acemq::BoxError>(()) }),
//!     );
//!     let health = app.health();
//!     // ACEMQ_ADMIN_TOKEN: pause and resume need it; unset, they answer 403.
//!     let token = AdminToken::from_env().expect("ACEMQ_ADMIN_TOKEN");
//!     let admin = AdminRouter::new(health.clone()).token_opt(token).build();
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
//!     let server = tokio::spawn(acemq::admin::serve(listener, admin, health.drained()));
//!     let code = app.run().await;
//!     let _ = server.await;
//!     code
//! }
//! ```
//!
//! Then
//! `curl -X POST -H "Authorization: Bearer $ACEMQ_ADMIN_TOKEN" localhost:8080/queues/shop.orders/pause`.
//! `examples/admin_beside_app.rs` is this program.
//!
//! # The token
//!
//! Pause, resume and every route that changes state need
//! `Authorization: Bearer <token>`, the token given to
//! [`AdminRouter::token`] (a program's `main` reads `ACEMQ_ADMIN_TOKEN`
//! through [`AdminToken::from_env`]; the router never reads the
//! environment). It is checked first, in constant time: with no token
//! configured the answer is `403` saying how to enable the routes; a
//! missing or wrong one is `401` with `WWW-Authenticate: Bearer`, also for
//! a queue that is not there. A browser cannot send the header cross-site
//! without the token, so a page an operator visits cannot pause a queue.
//! Each call is logged (target `acemq::ops::admin`) with the route, the
//! queue and the peer's address, when the server put it in the request as
//! `ConnectInfo<SocketAddr>` ([`serve`] does); a resume over an open
//! circuit says so at WARN. The read-only routes answer anyone and show no
//! user name or password.
//!
//! # Nesting it in your own server
//!
//! axum's `serve` sets no timer, so hyper's header-read timeout never fires
//! there and a stranger can hold connections open for ever. Serve the
//! admin routes with [`serve`] or [`Server`]; if they must share your
//! server, give it the same bounds: hyper's `http1::Builder` with
//! `.timer(TokioTimer::new())` and `.header_read_timeout(..)`, a cap on
//! connections, an idle bound, and `into_make_service_with_connect_info::<SocketAddr>()`
//! so that the control routes' log lines name the peer.
//!
//! # Routes
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` | `200 ok` while the process lives (liveness) |
//! | `GET /readyz` | `200` when ready, else `503`; the body is the [`HealthSnapshot`] as JSON |
//! | `GET /queues` | every queue's [`QueueSnapshot`], as a JSON array in config order: `handled` counts every trip through the handler (a rung hop and a dead letter included), `completed` only the deliveries acknowledged as done |
//! | `GET /queues/{name}` | that queue's snapshot |
//! | `POST /queues/{name}/pause` | token; pauses it; the body is its new snapshot (`"paused": true`); `409` once the drain has begun |
//! | `POST /queues/{name}/resume` | token; resumes it (and closes an open or half-open circuit: an override until the breaker trips again); the body is its new snapshot |
//! | `GET /metrics` | only with [`AdminRouter::metrics`]: what your render closure returns |
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
//! `health.drained()` (the shutdown future of [`serve`]): it answers through the whole
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

mod auth;
#[cfg(feature = "console")]
mod console;
mod serve;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, Extensions, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use tracing::{info, warn};

pub use auth::{AdminToken, BadToken, FromEnvError, MIN_TOKEN_LEN, TOKEN_ENV};
#[cfg(feature = "console")]
pub use console::ConsoleConfig;
pub use serve::{serve, Server};

use crate::app::health::{Health, HealthSnapshot, QueueSnapshot, UnknownQueue};

/// What `/metrics` answers: the text a Prometheus recorder renders.
type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The builder of the admin routes over a [`Health`] handle.
///
/// The read-only routes answer anyone; the control routes (pause, resume)
/// need the [`token`](Self::token), and answer `403` without one configured.
/// The builder reads nothing from the environment: a program's `main` does,
/// through [`AdminToken::from_env`] (tests run in parallel, each with a
/// token of its own). Further parts of the admin surface join it as
/// methods of their own.
///
/// ```
/// use acemq::admin::{AdminRouter, AdminToken};
///
/// let token = AdminToken::new("3f9c2a7e5b1d4c8a9e6f0b2d").unwrap();
/// let admin: axum::Router = AdminRouter::new(acemq::Health::new())
///     .token(token)
///     .metrics(|| "acemq_ready 0\n".to_owned())
///     .build();
/// # let _ = admin;
/// ```
#[derive(Clone)]
pub struct AdminRouter {
    health: Health,
    token: Option<AdminToken>,
    metrics: Option<Render>,
    #[cfg(feature = "console")]
    console: Option<ConsoleConfig>,
}

impl std::fmt::Debug for AdminRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminRouter")
            .field("health", &self.health)
            .field("token", &self.token)
            .field("metrics", &self.metrics.is_some())
            .finish_non_exhaustive()
    }
}

impl AdminRouter {
    /// The routes over `health`, with no token yet (control routes `403`).
    pub fn new(health: Health) -> Self {
        Self {
            health,
            token: None,
            metrics: None,
            #[cfg(feature = "console")]
            console: None,
        }
    }

    /// The token the control routes need, as `Authorization: Bearer <token>`.
    pub fn token(mut self, token: AdminToken) -> Self {
        self.token = Some(token);
        self
    }

    /// [`token`](Self::token) when `token` is `Some` (what
    /// [`AdminToken::from_env`] returns); `None` leaves the control routes off.
    pub fn token_opt(mut self, token: Option<AdminToken>) -> Self {
        self.token = token;
        self
    }

    /// Adds `GET /metrics`, answering `render()` as
    /// `text/plain; version=0.0.4; charset=utf-8` (Prometheus' text format).
    ///
    /// Before each render the handle's gauges (`acemq.ready`,
    /// `acemq.inflight`, `acemq.held`) are set from the current state
    /// ([`Health::record_metrics`]), so a scrape never reads stale gauges.
    pub fn metrics<F>(mut self, render: F) -> Self
    where
        F: Fn() -> String + Send + Sync + 'static,
    {
        self.metrics = Some(Arc::new(render));
        self
    }

    /// Adds the operator's console under `/console/` (feature `console`;
    /// see [`ConsoleConfig`]): pages behind the [`token`](Self::token),
    /// which a login form exchanges for a session cookie.
    #[cfg(feature = "console")]
    pub fn console(mut self, console: ConsoleConfig) -> Self {
        self.console = Some(console);
        self
    }

    /// The `axum::Router`.
    pub fn build(self) -> Router {
        let admin = Admin {
            health: self.health,
            token: self.token,
        };
        // Every route that changes state sits behind the token check,
        // which runs before anything else reads the request.
        let control = Router::new()
            .route("/queues/{name}/pause", post(pause))
            .route("/queues/{name}/resume", post(resume))
            .route_layer(axum::middleware::from_fn_with_state(admin.clone(), guard));
        let mut router = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/queues", get(queues))
            .route("/queues/{name}", get(queue))
            .merge(control);
        if let Some(render) = self.metrics {
            let health = admin.health.clone();
            router = router.route(
                "/metrics",
                get(move || {
                    health.record_metrics();
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
            );
        }
        #[cfg(feature = "console")]
        if let Some(console) = self.console {
            let pages = console::routes(admin.health.clone(), admin.token.clone(), console);
            return router.with_state(admin).merge(pages);
        }
        router.with_state(admin)
    }
}

/// The admin routes over `health`, with no token: the read-only routes
/// answer, pause and resume are a `403` saying how to turn them on
/// ([`AdminRouter`] with a [`token`](AdminRouter::token)).
///
/// ```
/// // The routes answer from the handle alone: no broker needed to build them.
/// let app: axum::Router = acemq::admin::router(acemq::Health::new());
/// # let _ = app;
/// ```
pub fn router(health: Health) -> Router {
    AdminRouter::new(health).build()
}

/// [`router`] and `GET /metrics` ([`AdminRouter::metrics`]), with no token.
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
    AdminRouter::new(health).metrics(render).build()
}

/// The routes' state.
#[derive(Clone)]
struct Admin {
    health: Health,
    token: Option<AdminToken>,
}

/// The peer's address, when the server put it in the request
/// ([`serve`] does; so does axum's `into_make_service_with_connect_info`).
fn peer(ext: &Extensions) -> String {
    ext.get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_owned(), |c| c.0.to_string())
}

/// The token check in front of the control routes; a refusal is logged
/// with the route and the peer.
async fn guard(State(admin): State<Admin>, req: Request, next: Next) -> Response {
    match auth::check(admin.token.as_ref(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            warn!(
                route = ?req.uri().path(),
                peer = %peer(req.extensions()),
                "admin: control route refused: {}",
                refusal.as_str()
            );
            refusal.into_response()
        }
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(admin): State<Admin>) -> (StatusCode, Json<HealthSnapshot>) {
    let snap = admin.health.snapshot();
    let code = if snap.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(snap))
}

async fn queues(State(admin): State<Admin>) -> Json<Vec<QueueSnapshot>> {
    Json(admin.health.snapshot().queues)
}

async fn queue(State(admin): State<Admin>, Path(name): Path<String>) -> Response {
    snapshot_of(&admin.health, &name)
}

async fn pause(State(admin): State<Admin>, Path(name): Path<String>, ext: Extensions) -> Response {
    let health = &admin.health;
    let peer = peer(&ext);
    if let Some(refused) = draining(health, &name, "pause") {
        info!(route = "pause", queue = ?name, %peer, "admin: pause refused: the drain has begun");
        return refused;
    }
    match health.pause(&name) {
        Ok(()) => {
            info!(route = "pause", queue = ?name, %peer, "admin: queue paused by an operator");
            snapshot_of(health, &name)
        }
        Err(e) => {
            info!(route = "pause", queue = ?name, %peer, "admin: pause of a queue not consumed here");
            not_found(health, e)
        }
    }
}

async fn resume(State(admin): State<Admin>, Path(name): Path<String>, ext: Extensions) -> Response {
    let health = &admin.health;
    let peer = peer(&ext);
    if let Some(refused) = draining(health, &name, "resume") {
        info!(route = "resume", queue = ?name, %peer, "admin: resume refused: the drain has begun");
        return refused;
    }
    let circuit = health.circuit(&name).map(|c| c.as_str());
    match health.resume(&name) {
        Ok(()) => {
            match circuit {
                Ok(circuit @ ("open" | "half_open")) => warn!(
                    route = "resume",
                    queue = ?name,
                    %peer,
                    circuit,
                    "admin: queue resumed by an operator, overriding its {circuit} circuit: \
                     closed until the breaker trips again"
                ),
                _ => {
                    info!(route = "resume", queue = ?name, %peer, "admin: queue resumed by an operator")
                }
            }
            snapshot_of(health, &name)
        }
        Err(e) => {
            info!(route = "resume", queue = ?name, %peer, "admin: resume of a queue not consumed here");
            not_found(health, e)
        }
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

    const TOKEN: &str = "test-admin-token-0123456789";

    /// The routes over `health` with [`TOKEN`].
    fn router(health: Health) -> Router {
        AdminRouter::new(health)
            .token(AdminToken::new(TOKEN).expect("a valid token"))
            .build()
    }

    /// `method uri` with [`TOKEN`] as its bearer token.
    async fn call(router: &Router, method: &str, uri: &str) -> (StatusCode, String) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .expect("request");
        send(router, req).await
    }

    async fn send(router: &Router, req: Request<Body>) -> (StatusCode, String) {
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
        let (status, _) = call(&app, "POST", "/queues/a/pause").await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "no token: control routes off"
        );
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

    /// A POST to `uri` with `auth` as its `Authorization` header (none when
    /// `None`).
    async fn post_with(router: &Router, uri: &str, auth: Option<&str>) -> Response {
        let mut req = Request::post(uri);
        if let Some(auth) = auth {
            req = req.header(header::AUTHORIZATION, auth);
        }
        router
            .clone()
            .oneshot(req.body(Body::empty()).expect("request"))
            .await
            .expect("infallible")
    }

    #[tokio::test]
    async fn without_a_token_configured_control_routes_are_403_saying_how_to_enable_them() {
        let (health, gates) = health_with(&["a"]);
        for app in [
            super::router(health.clone()),
            AdminRouter::new(health.clone()).token_opt(None).build(),
        ] {
            for uri in ["/queues/a/pause", "/queues/a/resume", "/queues/nope/pause"] {
                let resp = post_with(&app, uri, Some(&format!("Bearer {TOKEN}"))).await;
                assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{uri}");
                let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
                    .await
                    .unwrap();
                let err = parse(std::str::from_utf8(&body).unwrap());
                let text = err["error"].as_str().unwrap();
                assert!(
                    text.contains("ACEMQ_ADMIN_TOKEN") && text.contains("AdminRouter::token"),
                    "{text}"
                );
            }
            assert_eq!(call(&app, "GET", "/queues/a").await.0, StatusCode::OK);
        }
        assert!(!gates[0].is_paused());
    }

    #[tokio::test]
    async fn a_missing_or_wrong_token_is_401_before_the_queue_is_looked_up() {
        let (health, gates) = health_with(&["a"]);
        let app = router(health);
        let cases = [
            (None, "Bearer realm=\"acemq-admin\""),
            (
                Some("Basic YWRtaW46YWRtaW4="),
                "Bearer realm=\"acemq-admin\"",
            ),
            (
                Some("Bearer test-admin-token-012345678X"),
                "Bearer realm=\"acemq-admin\", error=\"invalid_token\"",
            ),
        ];
        for (auth, challenge) in cases {
            for uri in ["/queues/a/pause", "/queues/a/resume", "/queues/nope/pause"] {
                let resp = post_with(&app, uri, auth).await;
                assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{uri} {auth:?}");
                assert_eq!(resp.headers()[header::WWW_AUTHENTICATE], challenge);
                let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
                    .await
                    .unwrap();
                assert!(
                    !String::from_utf8_lossy(&body).contains("queues"),
                    "a refusal names no queue: {body:?}"
                );
            }
        }
        assert!(!gates[0].is_paused());
        assert_eq!(
            call(&app, "POST", "/queues/a/pause").await.0,
            StatusCode::OK
        );
        assert!(gates[0].is_paused());
    }

    #[tokio::test]
    async fn a_cross_site_text_plain_post_cannot_pause_a_queue() {
        let (health, gates) = health_with(&["a"]);
        let app = router(health);
        // What a page on another site can send without a preflight: a
        // "simple" POST, text/plain, with cookies but no Authorization.
        let req = Request::post("/queues/a/pause")
            .header(header::ORIGIN, "https://evil.example")
            .header(header::HOST, "attacker.example")
            .header(header::CONTENT_TYPE, "text/plain")
            .header(header::COOKIE, "session=1")
            .body(Body::from("x"))
            .unwrap();
        let (status, _) = send(&app, req).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(!gates[0].is_paused());
    }

    #[tokio::test]
    async fn read_only_routes_need_no_token_and_readyz_shows_no_user_name() {
        let (health, _) = health_with(&["a"]);
        let app = router(health.clone());
        for uri in ["/healthz", "/queues", "/queues/a"] {
            let req = Request::get(uri).body(Body::empty()).unwrap();
            assert_eq!(send(&app, req).await.0, StatusCode::OK, "{uri}");
        }
        // The broker's address is shown, its user name is not.
        health.set_broker(
            ConnectionRole::Consumer,
            Some("amqp://alice:***@rabbit:5672/%2f".to_owned()),
        );
        let req = Request::get("/readyz").body(Body::empty()).unwrap();
        let (status, body) = send(&app, req).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(parse(&body)["broker"], json!("amqp://rabbit:5672/%2f"));
        assert!(!body.contains("alice"), "{body}");
    }
}

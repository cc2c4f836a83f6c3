//! One tower service that handles an order, served side by side by an axum
//! route (`POST /orders`) and by the acemq consumer of `shop.orders` — the
//! same handler type, with the acemq layers around it on the queue side.
//!
//! Run with:
//!
//! ```text
//! cargo run --example axum_side_by_side -- [--http 127.0.0.1:3000] [--admin 127.0.0.1:3001] [--config examples/shop.yaml] [--log-format text|json]
//! curl -X POST localhost:3000/orders -H 'content-type: application/json' -d '{"id":"web-1","work_ms":300}'
//! curl -X POST -H "Authorization: Bearer $ACEMQ_ADMIN_TOKEN" localhost:3001/queues/shop.orders/pause   # the queue side holds, HTTP goes on
//! curl localhost:3001/queues/shop.orders                 # "paused": true, "held": …
//! curl -X POST -H "Authorization: Bearer $ACEMQ_ADMIN_TOKEN" localhost:3001/queues/shop.orders/resume
//! ```
//!
//! Two servers: the application's own routes on `--http`, and acemq's admin
//! routes (`acemq::admin::AdminRouter` served by `acemq::admin::serve`, feature `axum`: `/healthz`, `/readyz`,
//! `/queues`, pause and resume with `ACEMQ_ADMIN_TOKEN`'s token) on `--admin`, where the probes and the
//! operator go. Each stops at its own moment.
//!
//! One signal root, `acemq::app::Signals` (SIGTERM, SIGINT, SIGHUP and
//! SIGQUIT), installed before start so that a signal during start-up ends it
//! at once. At the first signal the stop order is:
//!
//! 1. readiness off (`/readyz` answers 503 from here on);
//! 2. the background publisher stops;
//! 3. the application's routes stop: axum's graceful shutdown of `--http`
//!    finishes the requests in progress (bounded) and takes no new ones;
//! 4. the consumers drain — the admin server still answers, `/readyz` 503,
//!    pause and resume 409;
//! 5. once the drain has ended (`Health::drained`), the admin server stops.
//!
//! A second signal during the stop skips the drain straight to
//! cancellation.
//!
//! `--log-format json` writes the log lines (stderr) as one JSON object per
//! line; `text` is the default.

#[path = "common/logging.rs"]
mod logging;

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use acemq::layers::Escaped;
use acemq::{App, Config, Delivery, Reject};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use futures::future::BoxFuture;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};
use tracing::{info, warn};

const USAGE: &str =
    "usage: axum_side_by_side [--http ADDR] [--admin ADDR] [--config FILE] [--log-format text|json]";
const QUEUE: &str = "shop.orders";
/// How long axum may take to finish its requests after readiness went off.
const HTTP_GRACE: Duration = Duration::from_secs(5);
/// How long the admin server may take to finish its requests once the drain
/// has ended.
const ADMIN_GRACE: Duration = Duration::from_secs(2);

/// An order, whichever door it came in by.
#[derive(Debug, Deserialize)]
struct Order {
    id: String,
    #[serde(default)]
    work_ms: u64,
}

/// The one handler: a tower service over `(Order, Cancellation)`.
#[derive(Clone, Debug, Default)]
struct OrderService {
    handled: Arc<AtomicU64>,
}

impl Service<(Order, acemq::Cancellation)> for OrderService {
    type Response = ();
    type Error = acemq::BoxError;
    type Future = BoxFuture<'static, Result<(), acemq::BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, (order, token): (Order, acemq::Cancellation)) -> Self::Future {
        let handled = self.handled.clone();
        Box::pin(async move {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(order.work_ms)) => {}
                () = token.cancelled() => return Err("cancelled".into()),
            }
            handled.fetch_add(1, Ordering::Relaxed);
            info!(order = %Escaped(&order.id), "order handled");
            Ok(())
        })
    }
}

async fn post_order(
    State(svc): State<OrderService>,
    Json(order): Json<Order>,
) -> (StatusCode, String) {
    let id = order.id.clone();
    // HTTP requests are not cancelled by the drain: axum's graceful shutdown
    // waits for them (bounded by HTTP_GRACE).
    match svc.oneshot((order, acemq::Cancellation::never())).await {
        Ok(()) => (StatusCode::OK, format!("order {id} handled\n")),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("order {id} failed: {e}\n"),
        ),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let (log_format, args) = match logging::take_log_format(std::env::args().skip(1).collect()) {
        Ok(taken) => taken,
        Err(e) => {
            eprintln!("axum_side_by_side: {e}; {USAGE}");
            return ExitCode::from(acemq::app::EXIT_CONFIG);
        }
    };
    let mut http: SocketAddr = ([127, 0, 0, 1], 3000).into();
    let mut admin: SocketAddr = ([127, 0, 0, 1], 3001).into();
    let mut config_path = "examples/shop.yaml".to_owned();
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--http", Some(v)) => {
                http = v
                    .parse()
                    .expect("--http takes an address such as 127.0.0.1:3000")
            }
            ("--admin", Some(v)) => {
                admin = v
                    .parse()
                    .expect("--admin takes an address such as 127.0.0.1:3001")
            }
            ("--config", Some(v)) => config_path = v,
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(acemq::app::EXIT_CONFIG);
            }
        }
    }
    logging::init(log_format, acemq::log::DEFAULT_FILTER, std::io::stderr);
    let config = match Config::from_path(&config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("axum_side_by_side: {e}");
            return ExitCode::from(acemq::app::EXIT_CONFIG);
        }
    };

    let orders = OrderService::default();
    // The queue side: the same service, fed from deliveries.
    let consumer_side = {
        let orders = orders.clone();
        tower::service_fn(move |d: Delivery| {
            let orders = orders.clone();
            async move {
                let order: Order = serde_json::from_slice(d.body())
                    .map_err(|e| Reject::new(format!("not an order: {e}")))?;
                orders.oneshot((order, d.token().clone())).await
            }
        })
    };
    // One signal root, installed before start: a signal during start-up
    // ends it at once. The handlers only push; the stop runs below, on
    // main's task.
    let mut signals = acemq::app::Signals::install();
    let running = match App::new(config)
        .connection_name("acemq-axum-side-by-side")
        .consume(QUEUE, consumer_side)
        .start_until(signals.stop())
        .await
    {
        Ok(r) => r,
        Err(e) => return acemq::app::start_failed(&e),
    };

    // The HTTP side: POST /orders runs the same service, stopped before the
    // drain by its own token.
    let http_stop = CancellationToken::new();
    let orders_router = Router::new()
        .route("/orders", post(post_order))
        .with_state(orders.clone());
    // acemq's admin router on its own address: readiness (which follows the
    // drain), the queues' snapshots, pause and resume. It stops when the
    // drain has ended.
    let health = running.health();
    let admin_token = match acemq::admin::AdminToken::from_env() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("axum_side_by_side: {e}");
            return ExitCode::from(acemq::app::EXIT_CONFIG);
        }
    };
    let admin_router = acemq::admin::AdminRouter::new(health.clone())
        .token_opt(admin_token)
        .build();
    let (listener, admin_listener) = match (
        tokio::net::TcpListener::bind(http).await,
        tokio::net::TcpListener::bind(admin).await,
    ) {
        (Ok(l), Ok(a)) => (l, a),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("axum_side_by_side: cannot bind {http} and {admin}: {e}");
            return ExitCode::from(acemq::app::EXIT_CONFIG);
        }
    };
    info!(%http, %admin, "serving POST /orders on http, /healthz /readyz /queues on admin");
    let server = tokio::spawn(
        axum::serve(listener, orders_router)
            .with_graceful_shutdown(http_stop.clone().cancelled_owned())
            .into_future(),
    );
    let admin_server = tokio::spawn(acemq::admin::serve(
        admin_listener,
        admin_router,
        health.drained(),
    ));

    // A publisher outside any handler: one order a second until the stop.
    let publisher_stop = CancellationToken::new();
    let publisher = {
        let (p, stop) = (running.publisher(), publisher_stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                n += 1;
                let body = format!(r#"{{"id":"bg-{n}","work_ms":200}}"#);
                if let Err(e) = p
                    .publish("", QUEUE, body.as_bytes(), acemq::Properties::default())
                    .await
                {
                    warn!(error = %e, "background publish failed");
                }
            }
            info!(published = n, "background publisher stopped");
        })
    };

    let signal = signals.stop().await;
    info!(signal, "stop: readiness off");
    running.stop_readiness();
    publisher_stop.cancel();
    let _ = publisher.await;
    // The application's routes first; the admin routes answer on.
    http_stop.cancel();
    match tokio::time::timeout(HTTP_GRACE, server).await {
        Ok(_) => info!("the order routes finished their requests and stopped"),
        Err(_) => warn!(
            "the order routes did not finish within {HTTP_GRACE:?}; draining the consumers anyway"
        ),
    }
    // A second signal (during the steps above too: it waits in `signals`)
    // skips the drain straight to cancellation and abandon.
    let hurry = async move {
        let signal = signals.stop().await;
        warn!(
            signal,
            "second stop signal: skipping to cancellation and abandon"
        );
    };
    let result = running.drain_with(hurry).await;
    // The drain has ended: the admin server is stopping.
    match tokio::time::timeout(ADMIN_GRACE, admin_server).await {
        Ok(_) => info!("the admin routes stopped"),
        Err(_) => warn!("the admin routes did not stop within {ADMIN_GRACE:?}"),
    }
    info!(
        handled = orders.handled.load(Ordering::Relaxed),
        "orders handled in all"
    );
    acemq::app::finish(result)
}

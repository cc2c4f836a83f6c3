//! One tower service that handles an order, served side by side by an axum
//! route (`POST /orders`) and by the acemq consumer of `shop.orders` — the
//! same handler type, with the acemq layers around it on the queue side.
//!
//! Run with:
//!
//! ```text
//! cargo run --example axum_side_by_side -- [--http 127.0.0.1:3000] [--config examples/shop.yaml]
//! curl -X POST localhost:3000/orders -H 'content-type: application/json' -d '{"id":"web-1","work_ms":300}'
//! ```
//!
//! One signal root; on SIGTERM or Ctrl-C the stop order is: readiness off →
//! the background publisher stops → axum's graceful shutdown (bounded) →
//! the consumers drain → the connection closes. A second signal during the
//! drain skips straight to cancellation.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use acemq::{App, Config, Delivery, Reject};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::future::BoxFuture;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

const QUEUE: &str = "shop.orders";
/// How long axum may take to finish its requests after readiness went off.
const HTTP_GRACE: Duration = Duration::from_secs(5);

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
            info!(order = %order.id, "order handled");
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
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| {
            EnvFilter::new("info,acemq::consumer=warn,lapin::returned_messages=off")
        }))
        .with_writer(std::io::stderr)
        .init();
    let mut http: SocketAddr = ([127, 0, 0, 1], 3000).into();
    let mut config_path = "examples/shop.yaml".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--http", Some(v)) => {
                http = v
                    .parse()
                    .expect("--http takes an address such as 127.0.0.1:3000")
            }
            ("--config", Some(v)) => config_path = v,
            _ => {
                eprintln!("usage: axum_side_by_side [--http ADDR] [--config FILE]");
                return ExitCode::from(acemq::app::EXIT_CONFIG);
            }
        }
    }
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
    let running = match App::new(config)
        .connection_name("acemq-axum-side-by-side")
        .consume(QUEUE, consumer_side)
        .start()
        .await
    {
        Ok(r) => r,
        Err(e) => return acemq::app::start_failed(&e),
    };

    // One signal root. The listener only pushes; the stop runs below, on main's task.
    let stop = CancellationToken::new();
    let hurry = CancellationToken::new();
    {
        let (stop, hurry) = (stop.clone(), hurry.clone());
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            for _ in 0..2 {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                if stop.is_cancelled() {
                    hurry.cancel();
                } else {
                    stop.cancel();
                }
            }
        });
    }

    // The HTTP side: POST /orders runs the same service; /readyz follows the drain.
    let health = running.health();
    let http_stop = CancellationToken::new();
    let router = Router::new()
        .route("/orders", post(post_order))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let snap = health.snapshot();
                async move {
                    (
                        if snap.ready {
                            StatusCode::OK
                        } else {
                            StatusCode::SERVICE_UNAVAILABLE
                        },
                        Json(snap),
                    )
                }
            }),
        )
        .with_state(orders.clone());
    let listener = match tokio::net::TcpListener::bind(http).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("axum_side_by_side: cannot bind {http}: {e}");
            return ExitCode::from(acemq::app::EXIT_CONFIG);
        }
    };
    info!(%http, "serving POST /orders, /healthz, /readyz");
    let server = tokio::spawn(
        axum::serve(listener, router)
            .with_graceful_shutdown(http_stop.clone().cancelled_owned())
            .into_future(),
    );

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

    stop.cancelled().await;
    info!("stop: readiness off");
    running.stop_readiness();
    publisher_stop.cancel();
    let _ = publisher.await;
    http_stop.cancel();
    match tokio::time::timeout(HTTP_GRACE, server).await {
        Ok(_) => info!("axum finished its requests"),
        Err(_) => warn!("axum did not finish within {HTTP_GRACE:?}; draining the consumers anyway"),
    }
    let result = running.drain_with(hurry.cancelled_owned()).await;
    info!(
        handled = orders.handled.load(Ordering::Relaxed),
        "orders handled in all"
    );
    acemq::app::finish(result)
}

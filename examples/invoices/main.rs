//! A consumer built from acemq's own extension points only: an
//! `invoices` queue fed through a topic exchange, with your
//! own layers outside the acemq stack (an audit of every final outcome) and
//! around the handler (a timeout per attempt), a follow-up publish from the
//! handler through the publisher handle taken before start, the admin router
//! (health, readiness, per-queue pause and resume, metrics) and in-memory
//! tests of the exact stack under a paused clock (`tests/invoices.rs`).
//! No `OnceLock`, no copy of the stack, no lapin import, no hand-written
//! admin routes.
//!
//! Run with:
//!
//! ```sh
//! cargo run --example invoices -- --http 127.0.0.1:8081   # [--no-seed] [--log-format text|json]
//! # publish one: an invoice goes to the `billing` exchange with key invoices.eu
//! curl -s localhost:8081/queues                  # snapshots
//! curl -s -XPOST -H "Authorization: Bearer $ACEMQ_ADMIN_TOKEN" localhost:8081/queues/billing.invoices/pause
//! curl -s -XPOST -H "Authorization: Bearer $ACEMQ_ADMIN_TOKEN" localhost:8081/queues/billing.invoices/resume
//! ```
//!
//! `--log-format json` writes the log lines (stderr) as one JSON object per
//! line; `text` is the default.

#[path = "handler.rs"]
mod handler;
#[path = "../common/logging.rs"]
mod logging;

use std::net::SocketAddr;
use std::process::ExitCode;

use acemq::{App, Config};
use tracing::info;

const USAGE: &str = "usage: invoices [--http ADDR] [--no-seed] [--log-format text|json]";

#[tokio::main]
async fn main() -> ExitCode {
    let (log_format, args) = match logging::take_log_format(std::env::args().skip(1).collect()) {
        Ok(taken) => taken,
        Err(e) => {
            eprintln!("invoices: {e}; {USAGE}");
            return ExitCode::from(64);
        }
    };
    let mut args = args.into_iter();
    let mut http: Option<SocketAddr> = None;
    let mut seed = true;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--http" => http = args.next().and_then(|v| v.parse().ok()),
            "--no-seed" => seed = false,
            other => {
                eprintln!("invoices: unknown argument {other:?}; {USAGE}");
                return ExitCode::from(64);
            }
        }
    }
    logging::init(log_format, acemq::log::DEFAULT_FILTER, std::io::stderr);
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .ok();
    let config = match Config::from_yaml_str(handler::CONFIG) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("invoices: {e}");
            return ExitCode::from(acemq::app::EXIT_CONFIG);
        }
    };
    let app = App::new(config).connection_name(format!("acemq-invoices:{}", std::process::id()));
    // A handle before start, cloned into the handler.
    let publisher = app.publisher();
    let stack = handler::stack();
    let app = app.consume_with(
        "billing.invoices",
        stack,
        handler::Invoices::new(publisher.clone()),
    );
    let health = app.health();
    let mut signals = acemq::app::Signals::install();
    let running = match app.start_until(signals.stop()).await {
        Ok(r) => r,
        Err(e) => return acemq::app::start_failed(&e),
    };
    // The admin routes answer through the drain (`/readyz` 503) and stop
    // once it has ended.
    let mut admin = None;
    if let Some(addr) = http {
        let render = move || prometheus.as_ref().map(|p| p.render()).unwrap_or_default();
        let token = match acemq::admin::AdminToken::from_env() {
            Ok(t) => t,
            Err(e) => {
                eprintln!("invoices: {e}");
                return ExitCode::from(acemq::app::EXIT_CONFIG);
            }
        };
        let router = acemq::admin::AdminRouter::new(health.clone())
            .token_opt(token)
            .metrics(render)
            .build();
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                info!(%addr, "admin routes: /healthz /readyz /queues /metrics");
                admin = Some(tokio::spawn(acemq::admin::serve(
                    listener,
                    router,
                    health.drained(),
                )));
            }
            Err(e) => tracing::warn!(%addr, error = %e, "could not bind the HTTP address"),
        }
    }
    if seed {
        for (key, body) in [
            ("invoices.eu", r#"{"id":"inv-1","amount":120}"#),
            ("invoices.us", r#"{"id":"inv-2","amount":-5}"#),
            ("invoices.eu", "not json"),
        ] {
            let mut props = acemq::Properties::default();
            props.content_type = Some("application/json".to_owned());
            if let Err(e) = publisher
                .publish("billing", key, body.as_bytes(), props)
                .await
            {
                tracing::warn!(error = %e, "could not publish a demo invoice");
            }
        }
        info!("published three demo invoices to the billing exchange");
    }
    let code = running.run_with(signals).await;
    if let Some(admin) = admin {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), admin).await;
    }
    code
}

//! The outbox and the inbox together: an order service whose HTTP handler
//! (axum) writes an order row and its `order.created` message in one
//! PostgreSQL transaction, a relay that publishes committed messages with
//! confirms, and a consumer of `order.created` behind the inbox layer that
//! records a shipment once per message, however often it is delivered.
//!
//! Run with:
//!
//! ```text
//! cargo run --example outbox --features postgres -- [--http ADDR] [--queue NAME] [--no-http] [--no-relay] [--no-consumer] [--log-format text|json]
//! curl -XPOST localhost:8080/orders -H 'content-type: application/json' -d '{"id":"o-1","item":"book"}'
//! ```
//!
//! `DATABASE_URL` names the database (default
//! `host=127.0.0.1 user=postgres dbname=acemq_outbox_example`; it is created
//! if missing), `AMQP_ADDR` the broker. The queue (default `shop.order-created`)
//! is declared by the consumer; orders are published to it through the
//! default exchange, with AMQP type `order.created` and message id
//! `order-<id>-created`. `--no-http`, `--no-relay` and `--no-consumer` run
//! parts alone (the process tests run each part in its own process).
//!
//! The consumer's handler records a shipment, and enqueues an
//! `order.shipped` message to `<queue>.shipped` (declared by the consumer,
//! not consumed here) on the inbox's transaction: the work, the inbox's mark
//! and the follow-up commit together or not at all.
//!
//! The relay runs by hand here, beside the `App` (a relay-only process, and a
//! test hook in its publisher); a service gives it to the runner with
//! `App::outbox(pool, RelayConfig::default())`, which starts it once the
//! topology is declared and stops it before the consumers drain.
//!
//! It runs until a stop signal (`acemq::app::Signals`: SIGTERM, SIGINT,
//! SIGHUP or SIGQUIT, installed before the consumer starts, so a signal
//! during its start-up ends it at once), then stops HTTP, the relay and the
//! consumer, in that order; a second signal skips the consumer's drain
//! straight to cancellation. Log lines go to stderr, as one JSON object per
//! line with `--log-format json` (`text` is the default).
//!
//! Status lines on stdout, for scripts: `ready`, `shipped <order> <message id>`,
//! `duplicate`. Two test hooks pause forever at the worst
//! moment, to be killed there: `ACEMQ_EXAMPLE_PAUSE_AFTER_PUBLISH=1` after
//! the relay's first confirmed publish and before the row is marked sent
//! (prints `published <message id>`), and `ACEMQ_EXAMPLE_PAUSE_AFTER_COMMIT=1`
//! after the consumer committed its work and before the ack (prints
//! `committed`).

#[path = "common/logging.rs"]
mod logging;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use acemq::inbox::{PgInbox, PgTransaction};
use acemq::layers::inbox::{InboxLayer, InboxOutcome};
use acemq::layers::Escaped;
use acemq::outbox::{
    self, Outbox, OutboxMessage, OutboxPublish, OutboxRecord, Relay, StandalonePublisher,
};
use acemq::{App, BoxError, Config, Delivery, Reject};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use deadpool_postgres::Pool;
use serde::{Deserialize, Serialize};
use tower::ServiceBuilder;
use tracing::{error, info, warn};

const USAGE: &str = "usage: outbox [--http ADDR] [--queue NAME] [--no-http] [--no-relay] [--no-consumer] [--log-format text|json]";
const DEFAULT_DB: &str = "host=127.0.0.1 user=postgres dbname=acemq_outbox_example";

#[derive(Debug, Deserialize, Serialize)]
struct Order {
    id: String,
    item: String,
}

struct Args {
    log_format: logging::LogFormat,
    http: Option<SocketAddr>,
    queue: String,
    relay: bool,
    consumer: bool,
}

fn args() -> Result<Args, String> {
    let (log_format, rest) = logging::take_log_format(std::env::args().skip(1).collect())?;
    let mut a = Args {
        log_format,
        http: Some(SocketAddr::from(([127, 0, 0, 1], 8080))),
        queue: "shop.order-created".to_owned(),
        relay: true,
        consumer: true,
    };
    let mut it = rest.into_iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--http" => {
                let v = it
                    .next()
                    .ok_or("--http needs an address, e.g. 127.0.0.1:8080")?;
                a.http = Some(v.parse().map_err(|e| format!("--http {v}: {e}"))?);
            }
            "--queue" => a.queue = it.next().ok_or("--queue needs a name")?,
            "--no-http" => a.http = None,
            "--no-relay" => a.relay = false,
            "--no-consumer" => a.consumer = false,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

fn hook(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

/// Creates the database if missing, then the outbox/inbox tables and ours.
async fn prepare_database(settings: &str) -> Result<Pool, BoxError> {
    let config: tokio_postgres::Config = settings.parse()?;
    if let Some(db) = config.get_dbname() {
        let mut admin = config.clone();
        admin.dbname("postgres");
        let (client, conn) = admin.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        let exists = client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
            .await?
            .is_some();
        if !exists {
            let quoted = db.replace('"', "\"\"");
            // Another process may create it at the same moment.
            if let Err(e) = client
                .batch_execute(&format!("CREATE DATABASE \"{quoted}\""))
                .await
            {
                info!("CREATE DATABASE {db}: {e}");
            }
        }
    }
    let pool = outbox::pool(settings, 16)?;
    let client = pool.get().await?;
    outbox::migrate(&client).await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS orders (
                 id text PRIMARY KEY, item text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
             CREATE TABLE IF NOT EXISTS shipments (
                 id bigserial PRIMARY KEY, order_id text NOT NULL, message_id text NOT NULL);",
        )
        .await?;
    Ok(pool)
}

#[derive(Clone)]
struct Http {
    pool: Pool,
    queue: String,
}

/// POST /orders: the order row and its message in one transaction.
async fn create_order(
    State(http): State<Http>,
    Json(order): Json<Order>,
) -> Result<(StatusCode, Json<serde_json::Value>), (StatusCode, String)> {
    let fail = |e: &dyn std::fmt::Display| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let mut client = http.pool.get().await.map_err(|e| fail(&e))?;
    let tx = client.transaction().await.map_err(|e| fail(&e))?;
    let inserted = tx
        .execute(
            "INSERT INTO orders (id, item) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&order.id, &order.item],
        )
        .await
        .map_err(|e| fail(&e))?;
    if inserted == 0 {
        return Err((StatusCode::CONFLICT, format!("order {} exists", order.id)));
    }
    let body = serde_json::to_vec(&order).map_err(|e| fail(&e))?;
    let message = OutboxMessage::to_queue(http.queue.as_str(), body)
        .kind("order.created")
        .content_type("application/json")
        .message_id(format!("order-{}-created", order.id));
    let message_id = Outbox::enqueue(&tx, &message).await.map_err(|e| fail(&e))?;
    tx.commit().await.map_err(|e| fail(&e))?;
    info!(order = %Escaped(&order.id), message_id = %Escaped(&message_id), "order created");
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "id": order.id, "message_id": message_id })),
    ))
}

/// The relay's publisher, with the test hook that pauses after a publish.
struct Hooked {
    inner: StandalonePublisher,
    pause: bool,
}

impl OutboxPublish for Hooked {
    async fn publish(&self, record: &OutboxRecord) -> Result<(), acemq::layers::PublishError> {
        let result = self.inner.publish(record).await;
        if self.pause && result.is_ok() {
            println!("published {}", record.message_id());
            std::future::pending::<()>().await;
        }
        result
    }
}

/// The consumer's own work, in the inbox's transaction, committed together
/// with the inbox's mark: a shipment row, and an `order.shipped` message to
/// `<queue>.shipped` through the outbox (the relay publishes it once the
/// transaction commits, and never if it rolls back).
async fn ship(delivery: Delivery) -> Result<(), BoxError> {
    let order: Order = serde_json::from_slice(delivery.body())
        .map_err(|e| Reject::new(format!("not an order: {e}")))?;
    let message_id = delivery.properties().message_id.clone().unwrap_or_default();
    let tx = PgTransaction::of(&delivery)?;
    let client = tx.client().await;
    client
        .execute(
            "INSERT INTO shipments (order_id, message_id) VALUES ($1, $2)",
            &[&order.id, &message_id],
        )
        .await?;
    let shipped =
        OutboxMessage::to_queue(format!("{}.shipped", delivery.queue()), order.id.clone())
            .kind("order.shipped")
            .message_id(format!("order-{}-shipped", order.id));
    client.enqueue(&shipped).await?;
    println!("shipped {} {}", Escaped(&order.id), Escaped(&message_id));
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("outbox: {e}; {USAGE}");
            return ExitCode::from(acemq::app::EXIT_CONFIG);
        }
    };
    logging::init(args.log_format, acemq::log::DEFAULT_FILTER, std::io::stderr);
    let settings = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DB.to_owned());
    let pool = match prepare_database(&settings).await {
        Ok(p) => p,
        Err(e) => {
            error!("database not usable: {e}");
            return ExitCode::from(acemq::app::EXIT_UNAVAILABLE);
        }
    };
    let amqp = acemq::connection::amqp_addr_from_env();
    // Inbox marks are kept a week, checked hourly.
    let _expiry = args.consumer.then(|| {
        PgInbox::new(pool.clone()).spawn_expiry(
            Duration::from_secs(3600),
            Duration::from_secs(7 * 24 * 3600),
        )
    });

    // Before the consumer starts: a stop signal during its start-up ends it
    // at once.
    let mut signals = acemq::app::Signals::install();
    // The consumer first: it declares the queue the relay publishes to.
    let running = if args.consumer {
        // `<queue>.shipped` receives the follow-ups; nothing consumes it here.
        let yaml = format!(
            "queues:\n  - name: {q}\n    concurrency: 4\n  - name: {q}.shipped\n    consume: false\n",
            q = args.queue
        );
        let config = Config::from_yaml_str(&yaml).expect("a valid config");
        let pause = hook("ACEMQ_EXAMPLE_PAUSE_AFTER_COMMIT");
        let handler = ServiceBuilder::new()
            .and_then(move |outcome: InboxOutcome<()>| async move {
                if pause {
                    println!("committed");
                    std::future::pending::<()>().await;
                }
                Ok::<_, BoxError>(outcome)
            })
            .layer(InboxLayer::new(PgInbox::new(pool.clone())))
            .service_fn(ship);
        let handler = ServiceBuilder::new()
            .map_future(|f| async move {
                let r: Result<InboxOutcome<()>, BoxError> = f.await;
                if let Ok(InboxOutcome::Duplicate) = &r {
                    println!("duplicate");
                }
                r
            })
            .service(handler);
        match App::new(config)
            .amqp_addr(amqp.clone())
            .connection_name("acemq-outbox-example")
            .consume(&args.queue, handler)
            .start_until(signals.stop())
            .await
        {
            Ok(r) => Some(r),
            Err(e) => return acemq::app::start_failed(&e),
        }
    } else {
        None
    };
    let relay = args.relay.then(|| {
        let publisher = Hooked {
            inner: StandalonePublisher::new(amqp.clone(), "acemq-outbox-example-relay"),
            pause: hook("ACEMQ_EXAMPLE_PAUSE_AFTER_PUBLISH"),
        };
        Relay::new(pool.clone(), publisher).spawn()
    });
    let stop_http = tokio_util::sync::CancellationToken::new();
    let server = match args.http {
        Some(addr) => {
            let app = Router::new()
                .route("/orders", post(create_order))
                .route("/healthz", get(|| async { "ok" }))
                .with_state(Http {
                    pool: pool.clone(),
                    queue: args.queue.clone(),
                });
            let listener = match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(e) => {
                    error!("cannot listen on {addr}: {e}");
                    return ExitCode::from(acemq::app::EXIT_UNAVAILABLE);
                }
            };
            info!(%addr, "HTTP: POST /orders");
            let stop = stop_http.clone();
            Some(tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move { stop.cancelled().await })
                    .await
            }))
        }
        None => None,
    };
    println!("ready");

    let signal = signals.stop().await;
    info!(signal, "stopping: HTTP, then the relay, then the consumers");
    if let Some(r) = &running {
        r.stop_readiness();
    }
    stop_http.cancel();
    if let Some(server) = server {
        let _ = server.await;
    }
    if let Some(relay) = relay {
        let stats = relay.stop().await;
        info!(
            published = stats.published,
            failed = stats.failed,
            "relay stopped"
        );
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
    match running {
        Some(r) => acemq::app::finish(r.drain_with(hurry).await),
        None => ExitCode::SUCCESS,
    }
}

//! The shop: acemq's main example. A consumer of `shop.orders` whose demo
//! batch walks every path — success, an in-process retry, a rung hop, a
//! permanent rejection, a panic, an exhausted order, and one order published
//! with a 2 s delay (`Publisher::publish_delayed`) — then consumes until
//! SIGTERM or SIGINT and drains.
//!
//! Run with:
//!
//! ```text
//! cargo run --example shop -- [--config FILE] [--no-seed | --seed demo|customers|outage] [--http ADDR] [--queue NAME] [--log-format text|json]
//! ```
//!
//! With no `--queue`, the shop consumes every queue its config names (except
//! those with `consume: false`), all with the same handler and one drain
//! deadline. `--queue NAME` (it may repeat) consumes only the queues named
//! (the config file must name each; its other queues are declared, not
//! consumed). The demo batch is seeded into the first
//! queue consumed.
//!
//! `--seed NAME` picks another batch to seed instead (`seeds.rs`):
//! `customers`, 40 orders of 4 customers (field `customer` and header `x-customer`, 50 ms of
//! work each), for `examples/shop.ordered.yaml`'s per-key ordering;
//! `outage`, 20 orders that fail until 3 s after they were published
//! (`fail_until_ms`), for `examples/shop.breaker.yaml`'s circuit breaker.
//! `--no-seed` publishes nothing.
//!
//! `--http ADDR` serves acemq's admin router there (`/healthz`, `/readyz`,
//! `/queues`, pause and resume, `/metrics`) through `acemq::admin::serve`
//! (a header-read timeout, an idle bound, a connection cap). Pause and
//! resume need `ACEMQ_ADMIN_TOKEN`'s token as `Authorization: Bearer`
//! (unset, they answer 403; a token shorter than 16 characters exits 78):
//!
//! ```text
//! export ACEMQ_ADMIN_TOKEN=$(openssl rand -hex 32)
//! cargo run --example shop -- --http 127.0.0.1:8080 &
//! curl -X POST -H "Authorization: Bearer $ACEMQ_ADMIN_TOKEN" 127.0.0.1:8080/queues/shop.orders/pause
//! ```
//!
//! The same address serves the operator's console at `/console/` (log in
//! with that token): the queues with pause and resume, the dead letters of
//! every queue with `dead_letter: true` by reason and error, each message,
//! replay and purge.
//!
//! It answers through the drain —
//! `/readyz` is 503 from the drain's first step — and stops once the drain
//! has ended (`Health::drained`), so a probe never finds the port closed
//! while handlers are still finishing.
//!
//! `--log-format json` writes the log lines as one JSON object per line (for
//! a log collector); `text`, the default, as people read them. Both go to
//! stderr, filtered by `RUST_LOG` (default [`acemq::log::DEFAULT_FILTER`],
//! `info,lapin=off`).
//!
//! The connection is named `acemq-shop@HOST:PID`, so an operator can tell
//! instances apart in `rabbitmqctl list_connections client_properties`.
//!
//! `AMQP_ADDR` selects the broker (default `amqp://guest:guest@127.0.0.1:5672/%2f`).
//! An order is a JSON body:
//! `{"id": "o-1", "work_ms": 0, "ignore_cancel": false, "fail_attempts": 0, "fail": "permanent" | "panic", "fail_until_ms": 0, "reject_until_ms": 0}`
//! (`fail_until_ms`: every attempt fails, transiently, until that time in
//! milliseconds since the Unix epoch; `reject_until_ms`: every attempt is
//! rejected, so the order is dead-lettered as `rejected`, until that time,
//! and handled after it, as when it is replayed then).
//! Exit codes: 0 clean stop, 75 drain deadline expired, 78 bad config,
//! 69 broker unreachable.
//!
//! The handler is in `handler.rs`, tested in memory under a paused clock by
//! `tests/shop.rs`.

#[path = "handler.rs"]
mod handler;
#[path = "../common/logging.rs"]
mod logging;
#[path = "seeds.rs"]
mod seeds;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use acemq::{App, Config};
use handler::Stats;
use seeds::Seed;
use tracing::{info, warn};

/// How often the Prometheus recorder's upkeep runs (histograms drained, so
/// memory stays flat when `/metrics` is never scraped).
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// How long the admin server may take to finish its requests once the
/// drain has ended.
const ADMIN_GRACE: Duration = Duration::from_secs(2);

const USAGE: &str =
    "usage: shop [--config FILE] [--no-seed | --seed demo|customers|outage] [--http ADDR] [--queue NAME]... [--log-format text|json]";

/// The demo batch's delayed order and its delay.
const DELAYED_ORDER: &str = "o-delayed";
const DEMO_DELAY: Duration = Duration::from_secs(2);

struct Args {
    log_format: logging::LogFormat,
    config: String,
    /// The queues named by `--queue`; empty: every queue the config consumes.
    queues: Vec<String>,
    /// The batch to publish at start; `None` with `--no-seed`.
    seed: Option<Seed>,
    http: Option<SocketAddr>,
}

fn parse_args() -> Result<Args, String> {
    let (log_format, rest) = logging::take_log_format(std::env::args().skip(1).collect())
        .map_err(|e| format!("{e}; {USAGE}"))?;
    let mut args = Args {
        log_format,
        config: "examples/shop.yaml".to_owned(),
        queues: Vec::new(),
        seed: Some(Seed::Demo),
        http: None,
    };
    let mut it = rest.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" => args.config = it.next().ok_or("--config needs a file")?,
            "--no-seed" => args.seed = None,
            "--seed" => {
                let name = it
                    .next()
                    .ok_or("--seed needs a batch: demo, customers or outage")?;
                args.seed = Some(Seed::parse(&name)?);
            }
            "--queue" => args
                .queues
                .push(it.next().ok_or("--queue needs a queue name")?),
            "--http" => {
                let v = it
                    .next()
                    .ok_or("--http needs an address such as 127.0.0.1:8080")?;
                args.http = Some(v.parse().map_err(|e| format!("--http {v}: {e}"))?);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    Ok(args)
}

/// The panic hook: one log line per panic (Rust's default hook writes
/// several lines to stderr, and `PanicHookInfo`'s `Display` has a newline
/// between the location and the message).
fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let payload = info.payload();
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic payload that is not a string)");
    let location = info.location().map(ToString::to_string).unwrap_or_default();
    tracing::error!(%location, "panicked: {}", message.replace('\n', " "));
}

/// `acemq-shop@HOST:PID`: unique per process.
fn connection_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("acemq-shop@{host}:{}", std::process::id())
}

/// Publishes the batch `seed` to `queue` (the demo batch with its delayed
/// order).
/// Where the seed batch is published.
struct SeedRoute {
    exchange: String,
    /// Routing keys, used in turn.
    keys: Vec<String>,
    /// Publish the demo's delayed order too.
    delayed: bool,
}

async fn publish_seed(publisher: &acemq::Publisher, seed: Seed, route: &SeedRoute) {
    let (exchange, keys) = (route.exchange.as_str(), &route.keys);
    let batch = seed.orders();
    let n = batch.len();
    let queue = if exchange.is_empty() {
        keys[0].as_str()
    } else {
        exchange
    };
    for (i, order) in batch.into_iter().enumerate() {
        let key = &keys[i % keys.len()];
        let mut props = acemq::Properties::default();
        props.message_id = Some(order.id.clone());
        props.content_type = Some("application/json".to_owned());
        if let Err(e) = publisher
            .publish_with_headers(exchange, key, &order.body, props, &order.headers)
            .await
        {
            warn!(order = %order.id, error = %e, "could not publish a {} order", seed.name());
        }
    }
    if seed == Seed::Demo && route.delayed {
        // One more order, published with a 2 s delay: it waits in the
        // bucket queue `acemq.delay.2s` (no plugin) and reaches the queue
        // through the default exchange after 2 s.
        let mut props = acemq::Properties::default();
        props.message_id = Some(DELAYED_ORDER.to_owned());
        props.content_type = Some("application/json".to_owned());
        let body = format!(r#"{{"id":"{DELAYED_ORDER}"}}"#);
        match publisher
            .publish_delayed(exchange, &keys[0], body.as_bytes(), props, DEMO_DELAY)
            .await
        {
            Ok(()) => {
                info!(order = DELAYED_ORDER, delay = ?DEMO_DELAY, "published a delayed demo order")
            }
            Err(e) => {
                warn!(order = DELAYED_ORDER, error = %e, "could not publish the delayed demo order")
            }
        }
    }
    info!(orders = n, %queue, "published the {} batch", seed.name());
}

/// The admin token from `ACEMQ_ADMIN_TOKEN` (`None` when unset: pause and
/// resume then answer 403), or exit 78 when it is set to one that cannot
/// serve.
fn admin_token() -> Result<Option<acemq::admin::AdminToken>, ExitCode> {
    match acemq::admin::AdminToken::from_env() {
        Ok(Some(t)) => {
            info!("admin control routes (pause, resume) on: ACEMQ_ADMIN_TOKEN is set");
            Ok(Some(t))
        }
        Ok(None) => {
            info!(
                "admin control routes (pause, resume) off: set ACEMQ_ADMIN_TOKEN to turn them on"
            );
            Ok(None)
        }
        Err(e) => {
            eprintln!("shop: {e}");
            Err(ExitCode::from(acemq::app::EXIT_CONFIG))
        }
    }
}

/// The stack that std gives a thread spawned without a size, lapin's
/// `lapin-io-loop` among them, unless `RUST_MIN_STACK` says otherwise:
/// 64 MiB of address space (touched only as deep as a parse goes). The
/// published amq-protocol parses a message's headers recursively with no
/// depth limit, on that thread; at 64 MiB a release build parses any table
/// a 128 KiB frame can hold and a debug build 5,237 levels (SECURITY.md).
/// This workspace patches the parser (vendor/), so the shop is safe without
/// it; a service that depends on acemq from crates.io is not.
const LAPIN_IO_STACK: &str = "67108864";

fn main() -> ExitCode {
    // Before any thread starts: std reads RUST_MIN_STACK once, at the first
    // spawn without a size.
    if std::env::var_os("RUST_MIN_STACK").is_none() {
        std::env::set_var("RUST_MIN_STACK", LAPIN_IO_STACK);
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(shop())
}

async fn shop() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("shop: {e}");
            return ExitCode::from(acemq::app::EXIT_CONFIG);
        }
    };
    logging::init(args.log_format, acemq::log::DEFAULT_FILTER, std::io::stderr);
    // A handler's panic is caught and dead-lettered by acemq; log it as one line.
    std::panic::set_hook(Box::new(log_panic));
    let config = match Config::from_path(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("shop: {e}");
            return ExitCode::from(acemq::app::EXIT_CONFIG);
        }
    };
    let admin_token = match admin_token() {
        Ok(t) => t,
        Err(code) => return code,
    };
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .ok();
    if let Some(handle) = prometheus.clone() {
        // `install_recorder` leaves upkeep to the caller: without it the
        // histograms grow with every message until the next scrape.
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(METRICS_UPKEEP);
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        });
    }

    // Every queue the config consumes, unless `--queue` names some: then
    // the others are only declared.
    let mut config = config;
    if !args.queues.is_empty() {
        for q in &mut config.queues {
            q.consume &= args.queues.contains(&q.name);
        }
    }
    let queues: Vec<String> = if args.queues.is_empty() {
        config
            .queues
            .iter()
            .filter(|q| q.consume)
            .map(|q| q.name.clone())
            .collect()
    } else {
        args.queues.clone()
    };
    // The console reads the dead-letter queues from the broker the app
    // connects to (AMQP_ADDR, else the config's addresses, else the default).
    let console = acemq::admin::ConsoleConfig::new(
        &config,
        acemq::connection::resolve_addresses(None, &config.addresses).join(","),
    );
    // Where the demo batch goes: the first queue consumed, through the
    // default exchange; a super stream through its exchange, the orders
    // spread over its partitions' routing keys. A stream takes no delayed
    // order: it would reach it by dead-lettering from the delay bucket,
    // which RabbitMQ 3.10.8 drops.
    let seed_route = queues.first().and_then(|q| config.queue(q)).map(|q| {
        let keys = if q.is_super_stream() {
            q.stream_partitions()
                .into_iter()
                .map(|(_, key)| key)
                .collect()
        } else {
            vec![q.name.clone()]
        };
        let exchange = if q.is_super_stream() {
            q.name.clone()
        } else {
            String::new()
        };
        SeedRoute {
            exchange,
            keys,
            delayed: !q.is_stream(),
        }
    });
    let stats = Arc::new(Stats::default());
    let mut app = App::new(config).connection_name(connection_name());
    for queue in &queues {
        app = app.consume(queue, handler::orders(stats.clone()));
    }
    let health = app.health();
    // Before connecting: a SIGTERM during start-up is a clean stop too.
    let mut signals = acemq::app::Signals::install();
    let running = match app.start_until(signals.stop()).await {
        Ok(r) => r,
        Err(e) => return acemq::app::start_failed(&e),
    };

    // acemq's admin router: /healthz, /readyz, /queues, pause and resume,
    // and /metrics rendered by the Prometheus recorder. It answers through
    // the drain (`/readyz` 503) and stops when the drain has ended.
    let mut admin = None;
    if let Some(addr) = args.http {
        let router = acemq::admin::AdminRouter::new(health.clone())
            .token_opt(admin_token)
            .metrics(move || prometheus.as_ref().map(|p| p.render()).unwrap_or_default())
            .console(console)
            .build();
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                info!(%addr, "serving /healthz, /readyz, /metrics, /queues (POST /queues/{{name}}/pause, /resume) and the console at /console/");
                admin = Some(tokio::spawn(acemq::admin::serve(
                    listener,
                    router,
                    health.drained(),
                )));
            }
            Err(e) => {
                warn!(%addr, error = %e, "could not bind the HTTP address; continuing without it")
            }
        }
    }

    if let (Some(seed), Some(route)) = (args.seed, &seed_route) {
        publish_seed(&running.publisher(), seed, route).await;
    }

    let status_health = health.clone();
    let status_stats = stats.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        tick.tick().await;
        loop {
            tick.tick().await;
            let snap = status_health.snapshot();
            let (mut handled, mut retried, mut dead, mut in_flight, mut held) = (0, 0, 0, 0, 0);
            for q in &snap.queues {
                handled += q.handled;
                retried += q.retried;
                dead += q.dead_lettered;
                in_flight += q.in_flight;
                held += q.held;
            }
            info!(
                "status: handled {handled} (ok {}, failed attempts {}), retried via rung {retried}, dead-lettered {dead}, in flight {in_flight}, held {held}, ready {}",
                status_stats.ok.load(Ordering::Relaxed),
                status_stats.failed.load(Ordering::Relaxed),
                snap.ready
            );
        }
    });

    let code = running.run_with(signals).await;
    if let Some(admin) = admin {
        // Its requests in progress end first (a scrape, a probe).
        match tokio::time::timeout(ADMIN_GRACE, admin).await {
            Ok(_) => info!("the admin routes stopped"),
            Err(_) => {
                warn!("the admin routes did not stop within {ADMIN_GRACE:?} after the drain")
            }
        }
    }
    code
}

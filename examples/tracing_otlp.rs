//! OpenTelemetry traces of acemq's deliveries, printed to stdout: one trace
//! per message from the publish through every retry to the dead-letter
//! queue (feature `opentelemetry`).
//!
//! Run with:
//!
//! ```text
//! cargo run --example tracing_otlp --features opentelemetry -- [--log-format text|json]
//! ```
//!
//! It declares `acemq.example.otel` (with `.dlq` and a 400ms rung),
//! publishes two orders inside a `checkout` span through acemq's publisher
//! (which injects `traceparent`), handles one and fails the other three
//! times — an in-process retry, a rung hop, then the dead-letter queue — and
//! prints every span as the stdout exporter sees it, then deletes its queues.
//! A stop signal (`acemq::app::Signals`: SIGTERM, SIGINT, SIGHUP or SIGQUIT)
//! stops it early, during start-up too; a second one skips the drain
//! straight to cancellation.
//!
//! Spans go to stdout, log lines to stderr: as one JSON object per line with
//! `--log-format json` (`text` is the default), through the same registry as
//! the OpenTelemetry layer.
//!
//! For a collector, swap `opentelemetry_stdout::SpanExporter` for the
//! `opentelemetry-otlp` crate's exporter; nothing else changes.
//! `AMQP_ADDR` selects the broker (default `amqp://guest:guest@127.0.0.1:5672/%2f`).

// This example closes its channels and connections as your own code
// would; acemq's own closes wait at most a second (clippy.toml).
#![allow(clippy::disallowed_methods)]

#[path = "common/logging.rs"]
mod logging;

use std::process::ExitCode;
use std::time::Duration;

use acemq::config::{QueueConfig, RetriesConfig};
use acemq::layers::Properties;
use acemq::{App, BoxError, Config, Delivery};
use opentelemetry::propagation::TextMapCompositePropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tower::service_fn;
use tracing::{info, warn, Instrument};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

const USAGE: &str = "usage: tracing_otlp [--log-format text|json]";
const QUEUE: &str = "acemq.example.otel";

async fn handle(delivery: Delivery) -> Result<(), BoxError> {
    if delivery.body().as_ref() == b"fail" {
        return Err(format!("order fails (attempt {})", delivery.attempt()).into());
    }
    info!(attempt = delivery.attempt(), "order handled");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let log_format = match logging::take_log_format(std::env::args().skip(1).collect()) {
        Ok((format, rest)) => match rest.first() {
            None => format,
            Some(other) => {
                eprintln!("tracing_otlp: unknown argument {other:?}; {USAGE}");
                return ExitCode::from(64);
            }
        },
        Err(e) => {
            eprintln!("tracing_otlp: {e}; {USAGE}");
            return ExitCode::from(64);
        }
    };
    // Spans go to OpenTelemetry (stdout here); log lines to stderr.
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]));
    tracing_subscriber::registry()
        .with(logging::env_filter(acemq::log::DEFAULT_FILTER))
        .with(logging::layer(log_format, std::io::stderr))
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("tracing_otlp")))
        .init();

    let mut queue = QueueConfig::new(QUEUE);
    queue.dead_letter = true;
    let mut retries = RetriesConfig::new(3, Duration::from_millis(200), Duration::from_millis(400));
    retries.broker_wait_threshold = Duration::from_millis(400);
    queue.retries = Some(retries);
    let mut config = Config::new([queue]);
    config.shutdown_timeout = Duration::from_secs(10);
    let queues: Vec<String> = acemq::topology::Topology::from_config(&config)
        .decls()
        .iter()
        .map(|d| d.name.clone())
        .collect();
    // Before start: a stop signal during start-up ends it at once.
    let mut signals = acemq::app::Signals::install();
    let running = match App::new(config)
        .consume(QUEUE, service_fn(handle))
        .start_until(signals.stop())
        .await
    {
        Ok(r) => r,
        Err(e) => {
            let code = acemq::app::start_failed(&e);
            if matches!(e, acemq::StartError::Stopped { .. }) {
                // Stopped after the topology may have been declared.
                delete(&queues).await;
            }
            return code;
        }
    };
    let health = running.health();
    let publisher = running.publisher();
    let checkout = tracing::info_span!("checkout", otel.kind = "producer");
    let published = async {
        for body in [&b"ok"[..], b"fail"] {
            let mut props = Properties::default();
            props.message_id = Some("order-1".to_owned());
            publisher.publish("", QUEUE, body, props).await?;
        }
        Ok::<(), acemq::layers::PublishError>(())
    }
    .instrument(checkout)
    .await;
    if let Err(e) = published {
        eprintln!("tracing_otlp: could not publish: {e}");
        return ExitCode::from(acemq::app::EXIT_UNAVAILABLE);
    }
    // Three trips through the stack: the good order, then the failing one
    // twice (attempts 1–2, then attempt 3 off the rung, dead-lettered).
    let done = async {
        while health
            .snapshot()
            .queues
            .iter()
            .map(|q| q.handled)
            .sum::<usize>()
            < 3
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        () = done => {}
        signal = signals.stop() => info!(signal, "stop signal received; draining"),
    }
    // A second signal skips the drain straight to cancellation and abandon.
    let hurry = async move {
        let signal = signals.stop().await;
        warn!(
            signal,
            "second stop signal: skipping to cancellation and abandon"
        );
    };
    let code = acemq::app::finish(running.drain_with(hurry).await);
    if let Err(e) = provider.shutdown() {
        eprintln!("tracing_otlp: flushing the spans failed: {e}");
    }
    delete(&queues).await;
    code
}

/// Deletes the example's queues (it leaves nothing behind).
async fn delete(queues: &[String]) {
    let addr = acemq::connection::amqp_addr_from_env();
    let Ok(conn) = lapin::Connection::connect(&addr, lapin::ConnectionProperties::default()).await
    else {
        return;
    };
    if let Ok(ch) = conn.create_channel().await {
        for q in queues {
            let _ = ch
                .queue_delete(
                    q.as_str().into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await;
        }
        let _ = ch.close(200, "OK".into()).await;
    }
    let _ = conn.close(200, "OK".into()).await;
}

//! Bring your own consumer: a plain lapin consumer (`basic_consume` on a
//! queue it declares) that runs each delivery through acemq's layers —
//! dead-letter with the reason, retry in process and on rung queues,
//! cancellation — and settles it through an [`acemq::Settler`]: each
//! delivery settled once, acknowledgements coalesced, exactly as `App`'s
//! consumer loop does it. No `lapin` dependency of its own: everything goes
//! through `acemq::lapin`.
//!
//! Run with:
//!
//! ```text
//! cargo run --example own_consumer -- [--queue NAME] [--no-seed] [--log-format text|json]
//! ```
//!
//! It declares `NAME` (default `own.orders`), `NAME.dlq` and the rungs
//! `NAME.retry.1s` and `NAME.retry.2s`, publishes a small demo batch (unless
//! `--no-seed`), consumes until a stop signal (SIGTERM, SIGINT, SIGHUP or
//! SIGQUIT, through `acemq::app::Signals`, as `App` does), then stops in
//! order: `basic.cancel`; what the broker had already sent is handed back;
//! the handlers still running finish (cancelled after 10 s or at a second
//! signal, abandoned 5 s later); the settler sends what it holds; the
//! channel and the connections close. A signal during start-up ends it at
//! once. A body `fail` fails once (retried), `reject` is
//! dead-lettered at once with reason `rejected`, `slow` takes 3 s;
//! anything else is acknowledged.
//!
//! `AMQP_ADDR` selects the broker (default `amqp://guest:guest@127.0.0.1:5672/%2f`).
//! Log lines go to stdout, as one JSON object per line with `--log-format
//! json` (`text` is the default).

// This example closes its channels and connections as your own code
// would; acemq's own closes wait at most a second (clippy.toml).
#![allow(clippy::disallowed_methods)]

#[path = "common/logging.rs"]
mod logging;

use std::sync::Arc;
use std::time::Duration;

use acemq::config::{AckBatch, QueueConfig, RetriesConfig};
use acemq::lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use acemq::lapin::types::FieldTable;
use acemq::lapin::{Channel, Connection, ConnectionProperties, Consumer};
use acemq::layers::{CancelLayer, DeadLetterDecision, DeadLetterLayer, RetryLayer, RetryPolicy};
use acemq::topology::Topology;
use acemq::{BoxError, Config, Decision, Delivery, Properties, Publisher, Reason, Reject, Settler};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::{ServiceBuilder, ServiceExt};
use tracing::{info, warn};

const USAGE: &str = "usage: own_consumer [--queue NAME] [--no-seed] [--log-format text|json]";
const PREFETCH: u16 = 32;
const CONCURRENCY: usize = 8;
/// How long the handlers still running at the stop may take before they
/// are cancelled.
const GRACE: Duration = Duration::from_secs(10);
/// How long a cancelled handler may go on before the cancel layer
/// abandons it (acemq's default `abandon_after`).
const ABANDON_AFTER: Duration = CancelLayer::DEFAULT_ABANDON_AFTER;

/// The handler: plain async code; the layers decide what its result means.
async fn handle(delivery: Delivery) -> Result<(), BoxError> {
    match &delivery.body()[..] {
        b"fail" if delivery.attempt() == 1 => {
            Err("a transient failure on the first attempt".into())
        }
        b"reject" => Err(Reject::new("this order can never be handled").into()),
        b"slow" => {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(3)) => Ok(()),
                () = delivery.token().cancelled() => Err("cancelled at the stop".into()),
            }
        }
        _ => Ok(()),
    }
}

/// What start-up opened: the connections, the publisher, the retry policy,
/// and the channel consuming the queue with its settler.
struct Started {
    conn: Connection,
    publishing: Arc<Connection>,
    publisher: Publisher,
    policy: RetryPolicy,
    channel: Channel,
    consumer: Consumer,
    settler: Settler,
}

/// Declares the queue (with its dead-letter queue and rungs), connects,
/// seeds the demo batch and starts consuming.
async fn start(queue: &str, seed: bool) -> Result<Started, BoxError> {
    // The queue, its dead-letter queue and its rungs, declared from a
    // config as App would (Topology is public); retries wait 0.5 s here,
    // then 1 s and 2 s on rungs.
    let mut q = QueueConfig::new(queue);
    q.dead_letter = true;
    let mut retries = RetriesConfig::new(4, Duration::from_millis(500), Duration::from_secs(2));
    retries.broker_wait_threshold = Duration::from_secs(1);
    q.retries = Some(retries);
    let policy = q.policy();
    let topology = Topology::from_config(&Config::new([q]));

    let addr = acemq::connection::amqp_addr_from_env();
    // Consuming and publishing on separate connections (a resource alarm
    // blocks publishing connections, acknowledgements included).
    let conn = Connection::connect(
        &addr,
        ConnectionProperties::default().with_connection_name("acemq-own-consumer".into()),
    )
    .await?;
    let publishing = Arc::new(
        Connection::connect(
            &addr,
            ConnectionProperties::default()
                .with_connection_name("acemq-own-consumer-publish".into()),
        )
        .await?,
    );
    topology.declare(&conn).await?;
    let publisher = Publisher::new(publishing.clone(), topology).await?;
    if seed {
        for body in ["ok", "fail", "reject", "slow", "ok"] {
            publisher
                .publish("", queue, body.as_bytes(), Properties::default())
                .await?;
        }
    }

    // Your consumer, your channel; the settler settles its deliveries.
    let channel = conn.create_channel().await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let consumer = channel
        .basic_consume(
            queue.into(),
            "acemq-own-consumer".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let settler = Settler::new(channel.clone(), queue, AckBatch::default(), PREFETCH);
    Ok(Started {
        conn,
        publishing,
        publisher,
        policy,
        channel,
        consumer,
        settler,
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (log_format, args) = logging::take_log_format(std::env::args().skip(1).collect())
        .map_err(|e| format!("{e}; {USAGE}"))?;
    let mut queue = "own.orders".to_owned();
    let mut seed = true;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--queue" => queue = args.next().ok_or(USAGE)?,
            "--no-seed" => seed = false,
            _ => return Err(USAGE.into()),
        }
    }
    logging::init(log_format, acemq::log::DEFAULT_FILTER, std::io::stdout);

    // Before connecting: a stop signal during start-up ends it at once, and
    // one during the stop hurries it.
    let mut signals = acemq::app::Signals::install();
    let Started {
        conn,
        publishing,
        publisher,
        policy,
        channel,
        mut consumer,
        settler,
    } = tokio::select! {
        started = start(&queue, seed) => started?,
        signal = signals.stop() => {
            info!(signal, "stop signal during start-up: nothing consumed; exiting");
            return Ok(());
        }
    };

    // acemq's layers around the handler, as App stacks them (dead-letter,
    // retry, cancellation): the stack answers a `Decision`.
    let draining = CancellationToken::new();
    let cancel = CancellationToken::new();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(publisher.clone()))
        .layer(RetryLayer::new(policy, publisher.clone(), draining.clone()))
        .layer(CancelLayer::new(cancel.clone()).abandon_after(ABANDON_AFTER))
        .service_fn(handle);
    info!(%queue, "consuming; SIGTERM or Ctrl-C stops");

    let slots = Arc::new(Semaphore::new(CONCURRENCY));
    let mut handlers = JoinSet::new();
    loop {
        let slot = tokio::select! {
            signal = signals.stop() => {
                info!(signal, "stop signal received");
                break;
            }
            slot = slots.clone().acquire_owned() => slot?,
        };
        let raw = tokio::select! {
            signal = signals.stop() => {
                info!(signal, "stop signal received");
                break;
            }
            next = consumer.next() => match next {
                Some(Ok(raw)) => raw,
                Some(Err(e)) => {
                    warn!(error = %e, "the consumer's channel is gone; the broker requeued what was not settled");
                    break;
                }
                None => {
                    warn!("the broker cancelled the consumer");
                    break;
                }
            },
        };
        // In arrival order, before the handler's task.
        let (delivery, ticket) = settler.track(raw);
        let call = stack.clone().oneshot(delivery);
        handlers.spawn(async move {
            let decision = call.await.unwrap_or_else(|e| {
                // As App's loop: a stack that fails is a rejection.
                Decision::DeadLetter(DeadLetterDecision {
                    reason: Reason::Rejected,
                    error: e.to_string(),
                    attempts: 0,
                    published: false,
                })
            });
            drop(slot);
            info!(outcome = decision.outcome(), "handled");
            ticket.settle(decision);
        });
        // Finished handlers' tasks, so the set stays small.
        while handlers.try_join_next().is_some() {}
    }

    // The stop, in order. 1. No more deliveries; what the broker had sent
    // ahead still comes out of the stream (then `None`): hand it back, by
    // dropping its ticket.
    info!("stopping: cancelling the consumer");
    let mut handed_back = 0;
    if channel
        .basic_cancel(consumer.tag(), BasicCancelOptions::default())
        .await
        .is_ok()
    {
        while let Ok(Some(Ok(raw))) =
            tokio::time::timeout(Duration::from_secs(5), consumer.next()).await
        {
            drop(settler.track(raw));
            handed_back += 1;
        }
    }
    // 2. In-process retry waits stop (they move to their rung or go back),
    // and the handlers still running finish within the grace period (a
    // second stop signal ends it at once); then they are cancelled, and
    // abandoned if they ignore it.
    draining.cancel();
    let finished = tokio::select! {
        finished = tokio::time::timeout(GRACE, async {
            while handlers.join_next().await.is_some() {}
        }) => finished.is_ok(),
        signal = signals.stop() => {
            warn!(signal, "second stop signal: skipping the rest of the grace period");
            false
        }
    };
    if !finished {
        warn!(
            running = handlers.len(),
            "handlers still running at the end of the grace period: cancelling them"
        );
        cancel.cancel();
        while handlers.join_next().await.is_some() {}
    }
    // 3. Everything the settler holds goes out, before the channel closes.
    let report = settler.close().await;
    info!(
        handed_back,
        acked = report.acked,
        ack_frames = report.ack_frames,
        requeued = report.requeued,
        rejected = report.rejected,
        not_sent = report.not_sent,
        "settled"
    );
    // 4. The channel, then the connections.
    let _ = channel.close(200, "OK".into()).await;
    let _ = publishing.close(200, "OK".into()).await;
    let _ = conn.close(200, "OK".into()).await;
    info!("stopped");
    Ok(())
}

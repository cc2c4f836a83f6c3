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
//! cargo run --example own_consumer -- [--queue NAME] [--no-seed]
//! ```
//!
//! It declares `NAME` (default `own.orders`), `NAME.dlq` and the rungs
//! `NAME.retry.1s` and `NAME.retry.2s`, publishes a small demo batch (unless
//! `--no-seed`), consumes until SIGTERM or Ctrl-C, then stops in order:
//! `basic.cancel`; what the broker had already sent is handed back; the
//! handlers still running finish (cancelled after 10 s, abandoned 5 s
//! later); the settler sends what it holds; the channel and the
//! connections close. A body `fail` fails once (retried), `reject` is
//! dead-lettered at once with reason `rejected`, `slow` takes 3 s;
//! anything else is acknowledged.
//!
//! `AMQP_ADDR` selects the broker (default `amqp://guest:guest@127.0.0.1:5672/%2f`).

use std::sync::Arc;
use std::time::Duration;

use acemq::config::{AckBatch, QueueConfig, RetriesConfig};
use acemq::lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use acemq::lapin::types::FieldTable;
use acemq::lapin::{Connection, ConnectionProperties};
use acemq::layers::{CancelLayer, DeadLetterDecision, DeadLetterLayer, RetryLayer};
use acemq::topology::Topology;
use acemq::{BoxError, Config, Decision, Delivery, Properties, Publisher, Reason, Reject, Settler};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::{ServiceBuilder, ServiceExt};
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

const USAGE: &str = "usage: own_consumer [--queue NAME] [--no-seed]";
const PREFETCH: u16 = 32;
const CONCURRENCY: usize = 8;
/// How long the handlers still running at the stop may take before they
/// are cancelled.
const GRACE: Duration = Duration::from_secs(10);
/// How long a cancelled handler may go on before the cancel layer
/// abandons it (acemq's default `abandon_after`).
const ABANDON_AFTER: Duration = Duration::from_secs(5);

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

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let mut queue = "own.orders".to_owned();
    let mut seed = true;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--queue" => queue = args.next().ok_or(USAGE)?,
            "--no-seed" => seed = false,
            _ => return Err(USAGE.into()),
        }
    }

    // The queue, its dead-letter queue and its rungs, declared from a
    // config as App would (Topology is public); retries wait 0.5 s here,
    // then 1 s and 2 s on rungs.
    let mut q = QueueConfig::new(queue.clone());
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
                .publish("", &queue, body.as_bytes(), Properties::default())
                .await?;
        }
    }

    // acemq's layers around the handler, as App stacks them (dead-letter,
    // retry, cancellation): the stack answers a `Decision`.
    let draining = CancellationToken::new();
    let cancel = CancellationToken::new();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(publisher.clone()))
        .layer(RetryLayer::new(policy, publisher.clone(), draining.clone()))
        .layer(CancelLayer::new(cancel.clone()).abandon_after(ABANDON_AFTER))
        .service_fn(handle);

    // Your consumer, your channel; the settler settles its deliveries.
    let channel = conn.create_channel().await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "acemq-own-consumer".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let settler = Settler::new(
        channel.clone(),
        queue.as_str(),
        AckBatch::default(),
        PREFETCH,
    );
    info!(%queue, "consuming; SIGTERM or Ctrl-C stops");

    let stop = stop_signal();
    tokio::pin!(stop);
    let slots = Arc::new(Semaphore::new(CONCURRENCY));
    let mut handlers = JoinSet::new();
    loop {
        let slot = tokio::select! {
            () = &mut stop => break,
            slot = slots.clone().acquire_owned() => slot?,
        };
        let raw = tokio::select! {
            () = &mut stop => break,
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
    // and the handlers still running finish within the grace period; then
    // they are cancelled, and abandoned if they ignore it.
    draining.cancel();
    let finished = tokio::time::timeout(GRACE, async {
        while handlers.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        warn!(
            running = handlers.len(),
            "handlers still running after the grace period: cancelling them"
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

/// Resolves at the first SIGTERM or Ctrl-C (SIGINT).
async fn stop_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

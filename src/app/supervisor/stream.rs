//! A stream's runner: it connects to the stream plugin, reads each
//! partition's stored offset, subscribes, and runs the generation's loop;
//! after a loss it connects and subscribes again from the stored offsets,
//! and after the stream was deleted it declares it again first.

use std::sync::Arc;
use std::time::Instant;

use tracing::{info, warn};

use super::shared::{sleep_or_stop, Shared};
use crate::app::generation::{Source, StreamSource};
use crate::backoff::{Backoff, BACKOFF_MAX};
use crate::config::{Config, QueueConfig, StreamOffset};
use crate::connection::{ConnectionRole, CLOSE_BOUND};
use crate::consumer::{End, Partition, INITIAL_CREDIT};
use crate::stream::{OffsetSpec, StreamClient, StreamOptions};

/// The stream plugin's address and credentials for `config`: the host,
/// user, password and virtual host of the first AMQP address, the port
/// (and host, if set) of `streams`.
pub(crate) fn stream_options(
    config: &Config,
    addresses: &[String],
    name: &str,
) -> Result<StreamOptions, String> {
    StreamOptions::from_config(config, addresses, name)
}

/// Where a partition with nothing stored starts.
fn fallback(q: &QueueConfig) -> OffsetSpec {
    match q.offset.unwrap_or_default() {
        StreamOffset::First => OffsetSpec::First,
        StreamOffset::Last => OffsetSpec::Last,
        StreamOffset::Next => OffsetSpec::Next,
        StreamOffset::Timestamp(ms) => OffsetSpec::Timestamp(ms),
    }
}

/// One stream's runner: runs its generations until the drain.
pub(crate) async fn run_stream(shared: Arc<Shared>, index: usize) {
    let q = &shared.config.queues[index];
    let parts = &shared.queues[index];
    let mut backoff = Backoff::new();
    let mut redeclare = false;
    loop {
        if shared.intake.is_cancelled() {
            return;
        }
        let started = Instant::now();
        let opened = tokio::select! {
            () = shared.intake.cancelled() => return,
            o = open(&shared, q, redeclare) => o,
        };
        let source = match opened {
            Ok(s) => s,
            Err(e) => {
                parts
                    .stats
                    .down
                    .store(true, std::sync::atomic::Ordering::Release);
                redeclare = e.contains("does not exist");
                let delay = backoff.next_delay();
                warn!(queue = %q.name, "could not consume the stream: {e}; next attempt in {delay:.1?} (readiness is off)");
                if !sleep_or_stop(&shared, delay).await {
                    return;
                }
                continue;
            }
        };
        let client = source.client.clone();
        let tag = format!("{}-{}", shared.name, q.name);
        let (join, ended) = match shared.install_source(index, Source::Stream(source), None, tag) {
            Ok(Some(g)) => g,
            Ok(None) => {
                let _ = tokio::time::timeout(CLOSE_BOUND, client.close()).await;
                return;
            }
            Err(panic) => {
                warn!(queue = %q.name, "building the handler stack panicked ({panic}); the stream is consumed again after a backoff");
                let _ = tokio::time::timeout(CLOSE_BOUND, client.close()).await;
                if !sleep_or_stop(&shared, backoff.next_delay()).await {
                    return;
                }
                continue;
            }
        };
        info!(queue = %q.name, "consuming the stream");
        let why = ended.await.ok();
        let _ = join.await;
        if started.elapsed() > BACKOFF_MAX * 3 {
            backoff.reset();
        }
        redeclare = false;
        match why {
            None | Some(End::Drained) if shared.intake.is_cancelled() => return,
            Some(End::StreamGone(why)) => {
                redeclare = true;
                info!(queue = %q.name, "the stream went away ({why}): declaring it again");
            }
            Some(End::StreamLost(why)) => {
                info!(queue = %q.name, "the stream connection was lost ({why}): connecting again");
            }
            _ => {}
        }
        parts
            .stats
            .down
            .store(true, std::sync::atomic::Ordering::Release);
        metrics::counter!("acemq.consumer.recoveries", "queue" => q.name.clone(), "cause" => "stream-lost").increment(1);
        if !sleep_or_stop(&shared, backoff.next_delay()).await {
            return;
        }
    }
}

/// Connects, reads each partition's stored offset and subscribes.
async fn open(shared: &Shared, q: &QueueConfig, redeclare: bool) -> Result<StreamSource, String> {
    if redeclare {
        declare_again(shared, q).await?;
    }
    let opts = stream_options(&shared.config, &shared.addresses, &shared.name)?;
    let (client, events) = StreamClient::connect(&opts)
        .await
        .map_err(|e| e.to_string())?;
    match subscribe_all(&client, q).await {
        Ok(partitions) => Ok(StreamSource {
            client,
            events,
            partitions,
            fallback: fallback(q),
        }),
        Err(e) => {
            let _ = tokio::time::timeout(CLOSE_BOUND, client.close()).await;
            Err(e)
        }
    }
}

async fn subscribe_all(client: &StreamClient, q: &QueueConfig) -> Result<Vec<Partition>, String> {
    let name = q.stream_consumer_name();
    let single = q.stream_single_active();
    let mut partitions = Vec::new();
    for (i, (stream, _)) in q.stream_partitions().into_iter().enumerate() {
        let id =
            u8::try_from(i).map_err(|_| "more than 256 partitions in one consumer".to_owned())?;
        let stored = client
            .query_offset(name, &stream)
            .await
            .map_err(|e| format!("{stream}: reading the stored offset of {name:?}: {e}"))?;
        skipped_by_retention(client, q, &stream, stored).await;
        let spec = stored.map_or_else(|| fallback(q), |o| OffsetSpec::Offset(o + 1));
        let mut props = vec![("name".to_owned(), name.to_owned())];
        if single {
            props.push(("single-active-consumer".to_owned(), "true".to_owned()));
            if q.is_super_stream() {
                props.push(("super-stream".to_owned(), q.name.clone()));
            }
        }
        client
            .subscribe(id, &stream, spec, INITIAL_CREDIT, &props)
            .await
            .map_err(|e| format!("{stream}: subscribing: {e}"))?;
        info!(queue = %q.name, stream = %stream, consumer = name, stored = ?stored, "subscribed");
        partitions.push(Partition { stream, stored });
    }
    Ok(partitions)
}

/// Logs and counts what retention removed past the stored offset, where
/// the broker tells what the stream still holds (RabbitMQ 3.11 and later).
async fn skipped_by_retention(
    client: &StreamClient,
    q: &QueueConfig,
    stream: &str,
    stored: Option<u64>,
) {
    let Some(stored) = stored else { return };
    let Ok(Some(stats)) = client.stream_stats(stream).await else {
        return;
    };
    let Some(first) = stats.first_offset.and_then(|f| u64::try_from(f).ok()) else {
        return;
    };
    if first > stored + 1 {
        let skipped = first - stored - 1;
        warn!(queue = %q.name, stream, consumer = q.stream_consumer_name(), from = stored + 1, to = first - 1, skipped, "retention removed messages this consumer had not read: offsets {}..={} are skipped", stored + 1, first - 1);
        metrics::counter!("acemq.stream.skipped", "queue" => q.name.clone()).increment(skipped);
    }
}

/// Declares the stream (each partition) again over AMQP.
async fn declare_again(shared: &Shared, q: &QueueConfig) -> Result<(), String> {
    let Some(conn) = shared.live(ConnectionRole::Consumer).current() else {
        return Err("no AMQP connection to declare the stream again on".to_owned());
    };
    for (stream, _) in q.stream_partitions() {
        shared
            .topology
            .declare_for_queue(&conn, &stream)
            .await
            .map_err(|e| format!("declaring {stream} again: {e}"))?;
    }
    Ok(())
}

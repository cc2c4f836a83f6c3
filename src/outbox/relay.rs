//! The relay: a background task that publishes committed outbox rows.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::batch;
use super::publish::OutboxPublish;
use super::stats::{RelayStats, Stats};
use crate::amqp::backoff::Backoff;

/// The relay's settings. Every field has a default, stated on it.
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RelayConfig {
    /// Rows claimed and published per batch. Default 200.
    pub batch_size: usize,
    /// How long to wait before looking again when the table had fewer
    /// pending rows than a batch. Default 100 ms.
    pub poll_interval: Duration,
    /// The first wait after a failed batch (broker or database down);
    /// doubled on each failure in a row up to `retry_max`, with full jitter
    /// (each wait drawn from zero to that bound), as reconnects do. Default
    /// 200 ms.
    pub retry_initial: Duration,
    /// The cap on that wait. Default 10 s.
    pub retry_max: Duration,
    /// How long a batch may wait for its confirms; past it, the batch's
    /// rows stay pending. Default 30 s.
    pub publish_timeout: Duration,
    /// How long sent rows are kept before cleanup deletes them. Default 7 days.
    pub retention: Duration,
    /// How often cleanup runs. Default 1 minute.
    pub cleanup_interval: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch_size: 200,
            poll_interval: Duration::from_millis(100),
            retry_initial: Duration::from_millis(200),
            retry_max: Duration::from_secs(10),
            publish_timeout: Duration::from_secs(30),
            retention: Duration::from_secs(7 * 24 * 3600),
            cleanup_interval: Duration::from_secs(60),
        }
    }
}

/// Publishes committed outbox rows with confirms and marks them; see the
/// [module docs](super).
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
pub struct Relay<P> {
    pool: Pool,
    publisher: P,
    config: RelayConfig,
}

impl<P> fmt::Debug for Relay<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<P: OutboxPublish> Relay<P> {
    /// A relay reading the outbox through `pool` and publishing through
    /// `publisher`, with [`RelayConfig::default`].
    pub fn new(pool: Pool, publisher: P) -> Self {
        Relay {
            pool,
            publisher,
            config: RelayConfig::default(),
        }
    }

    /// Replaces the settings.
    pub fn config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    /// Starts the relay on the current tokio runtime.
    ///
    /// Start it after the topology is declared (a publish to an exchange
    /// that does not exist yet closes the channel), and stop it with
    /// [`RelayHandle::stop`] before the consumers drain.
    pub fn spawn(self) -> RelayHandle {
        let stop = CancellationToken::new();
        let stats = Arc::new(Stats::default());
        let task = tokio::spawn(run(self, stop.clone(), stats.clone()));
        RelayHandle {
            stop,
            stats,
            task: Some(task),
        }
    }
}

/// The running relay. Dropping it stops the relay at its next step without
/// waiting; [`stop`](Self::stop) waits.
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
#[must_use = "dropping the handle stops the relay"]
pub struct RelayHandle {
    stop: CancellationToken,
    stats: Arc<Stats>,
    task: Option<JoinHandle<()>>,
}

impl fmt::Debug for RelayHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayHandle")
            .field("stats", &self.stats())
            .field("stopping", &self.stop.is_cancelled())
            .finish()
    }
}

impl RelayHandle {
    /// The relay's counters so far.
    pub fn stats(&self) -> RelayStats {
        RelayStats {
            published: self.stats.published.load(Ordering::Relaxed),
            failed: self.stats.failed.load(Ordering::Relaxed),
            failed_batches: self.stats.failed_batches.load(Ordering::Relaxed),
            cleaned: self.stats.cleaned.load(Ordering::Relaxed),
        }
    }

    /// Stops the relay: no new batch is claimed; the batch in hand is
    /// published and marked (bounded by `publish_timeout`), or, if it
    /// fails, its rows stay pending for the next start. Resolves when the
    /// relay task has ended; returns the final counters.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future before it resolves still stops the relay (the
    /// signal is sent at the first poll); only the wait is lost.
    pub async fn stop(mut self) -> RelayStats {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            if let Err(e) = task.await {
                if e.is_panic() {
                    warn!("the outbox relay task panicked; its rows stay pending");
                }
            }
        }
        let stats = self.stats();
        info!(
            published = stats.published,
            failed = stats.failed,
            "outbox relay stopped"
        );
        stats
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn run<P: OutboxPublish>(relay: Relay<P>, stop: CancellationToken, stats: Arc<Stats>) {
    let Relay {
        pool,
        publisher,
        config,
    } = relay;
    let limit = i64::try_from(config.batch_size.max(1)).unwrap_or(i64::MAX);
    let mut backoff = Backoff::between(config.retry_initial, config.retry_max);
    let mut next_cleanup = Instant::now();
    debug!(batch_size = config.batch_size, "outbox relay started");
    while !stop.is_cancelled() {
        if Instant::now() >= next_cleanup {
            next_cleanup = Instant::now() + config.cleanup_interval;
            match batch::cleanup(&pool, config.retention).await {
                Ok(n) => {
                    stats.cleaned.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => warn!("outbox cleanup failed, trying again later: {e}"),
            }
        }
        let wait = match batch::run(&pool, &publisher, limit, config.publish_timeout, &stats).await
        {
            Ok(b) if b.transport_errors == 0 => {
                backoff.reset();
                if b.claimed as i64 >= limit {
                    continue;
                }
                config.poll_interval
            }
            Ok(b) => {
                stats.failed_batches.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("acemq.outbox.transport_errors")
                    .increment(b.transport_errors as u64);
                let wait = backoff.next_delay();
                warn!(
                    rows = b.transport_errors,
                    retry_in = ?wait,
                    "outbox publish failed, the rows stay pending: {}",
                    b.first_error.unwrap_or_default()
                );
                wait
            }
            Err(e) => {
                stats.failed_batches.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("acemq.outbox.database_errors").increment(1);
                let wait = backoff.next_delay();
                warn!(retry_in = ?wait, "outbox relay batch failed, the rows stay pending: {e}");
                wait
            }
        };
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

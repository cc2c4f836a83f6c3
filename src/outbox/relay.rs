//! The relay: a background task that publishes committed outbox rows.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::batch;
use super::error::OutboxError;
use super::publish::OutboxPublish;
use super::stats::{RelayStats, Stats};
use crate::backoff::Backoff;

/// The relay's settings. Every field has a default, stated on it.
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RelayConfig {
    /// Rows claimed and published per batch. Default 200.
    ///
    /// Up to three batches are in flight at once: while one publishes, the
    /// one before marks its rows and commits and the one after has claimed
    /// its rows. Publishing is one batch at a time, and a batch publishes
    /// only once the batch two before it has ended, so at most two batches
    /// are published and not yet marked: a relay killed mid-way publishes
    /// up to two batches a second time on its next start (same message ids).
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

/// One setter per field, for code outside this crate (the struct is
/// `#[non_exhaustive]`, so it cannot be written as a literal there):
///
/// ```
/// use std::time::Duration;
/// use acemq::outbox::RelayConfig;
///
/// let relay = RelayConfig::new()
///     .batch_size(500)
///     .poll_interval(Duration::from_millis(50))
///     .retention(Duration::from_secs(24 * 3600));
/// assert_eq!(relay.batch_size, 500);
/// assert_eq!(relay.publish_timeout, Duration::from_secs(30)); // the default
/// ```
impl RelayConfig {
    /// Every field at its default.
    pub fn new() -> Self {
        RelayConfig::default()
    }

    /// `batch_size`: rows claimed and published per batch.
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = rows;
        self
    }

    /// `poll_interval`: the wait after a short batch.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// `retry_initial` and `retry_max`: the first and the longest wait
    /// after a failed batch.
    pub fn retry(mut self, initial: Duration, max: Duration) -> Self {
        self.retry_initial = initial;
        self.retry_max = max;
        self
    }

    /// `publish_timeout`: how long a batch waits
    /// for its confirms.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// `retention`: how long sent rows are kept.
    pub fn retention(mut self, keep: Duration) -> Self {
        self.retention = keep;
        self
    }

    /// `cleanup_interval`: how often cleanup runs.
    pub fn cleanup_interval(mut self, every: Duration) -> Self {
        self.cleanup_interval = every;
        self
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
        let finish = CancellationToken::new();
        let stats = Arc::new(Stats::default());
        let signals = Signals {
            stop: stop.clone(),
            finish: finish.clone(),
        };
        let task = tokio::spawn(run(self, signals, stats.clone()));
        RelayHandle {
            stop,
            finish,
            stats,
            task: Some(task),
        }
    }
}

/// The running relay. Dropping it stops the relay at its next step without
/// waiting; `stop` waits.
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
#[must_use = "dropping the handle stops the relay"]
pub struct RelayHandle {
    stop: CancellationToken,
    finish: CancellationToken,
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
            in_flight: self.stats.in_flight.load(Ordering::Relaxed),
        }
    }

    /// Stops the relay: no new batch is claimed; the batch publishing is
    /// finished and marked (bounded by `publish_timeout`), or, if it fails,
    /// its rows stay pending for the next start; a batch claimed and not yet
    /// publishing releases its rows unpublished. Resolves when the relay
    /// task has ended; returns the final counters.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future before it resolves still stops the relay (the
    /// signal is sent at the first poll); only the wait is lost.
    pub async fn stop(self) -> RelayStats {
        self.stop.cancel();
        self.end().await
    }

    /// Publishes every row committed before this call, then stops: batches
    /// are claimed one after another, without the poll interval, until a
    /// claim that began after the call finds less than a full batch and
    /// every batch has been published and marked (a failed batch is tried
    /// again after its backoff). Resolves when the relay task has ended;
    /// returns the final counters. `App`'s drain calls it once the handlers
    /// have finished, within the drain's deadline.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future before it resolves stops the relay as
    /// [`stop`](Self::stop) does: rows not yet published stay pending for
    /// the next start.
    pub async fn finish(self) -> RelayStats {
        self.finish.cancel();
        self.end().await
    }

    /// Waits for the relay task, then logs and returns the counters.
    async fn end(mut self) -> RelayStats {
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

/// Batches in flight at once: while one publishes, the one before marks
/// its rows and commits and the one after has claimed its rows. Publishing
/// is one batch at a time, and a batch publishes only once the batch two
/// before it has ended: at most two batches are published and not yet
/// marked — what a relay killed mid-way publishes a second time.
const PIPELINE: usize = 3;

/// What ends the relay: `stop` at its next step, `finish` once every row
/// committed before it is published.
struct Signals {
    stop: CancellationToken,
    finish: CancellationToken,
}

async fn run<P: OutboxPublish>(relay: Relay<P>, signals: Signals, stats: Arc<Stats>) {
    let Signals { stop, finish } = signals;
    let Relay {
        pool,
        publisher,
        config,
    } = relay;
    let limit = i64::try_from(config.batch_size.max(1)).unwrap_or(i64::MAX);
    let mut backoff = Backoff::between(config.retry_initial, config.retry_max);
    debug!(batch_size = config.batch_size, "outbox relay started");
    let mut running = FuturesUnordered::new();
    // The claim of the batch started last, while it is under way: the next
    // batch claims after it, so that it skips the rows this one locked.
    let mut claiming: Option<oneshot::Receiver<usize>> = None;
    // The signal that the batch started last has finished publishing.
    let mut last_published: Option<oneshot::Receiver<()>> = None;
    // The signals that the batches started last and before it have ended
    // (at most two, the older first).
    let mut ends: VecDeque<oneshot::Receiver<()>> = VecDeque::with_capacity(2);
    let mut next_claim = Instant::now();
    let mut next_cleanup = Instant::now();
    let mut cleanup: Option<BoxFuture<'_, Result<u64, OutboxError>>> = None;
    // Finishing: the claim under way began after `finish`; and one such
    // claim found less than a full batch, with no batch failing since.
    let mut finishing = false;
    let mut claim_after_finish = false;
    let mut drained = false;
    loop {
        if !finishing && finish.is_cancelled() {
            finishing = true;
            cleanup = None;
            next_claim = Instant::now();
        }
        if finishing && drained && running.is_empty() {
            break;
        }
        let stopping = stop.is_cancelled();
        if stopping {
            // What cleanup was doing is done again next time.
            cleanup = None;
            if running.is_empty() {
                break;
            }
        }
        let now = Instant::now();
        if !stopping && !finishing && cleanup.is_none() && now >= next_cleanup {
            next_cleanup = now + config.cleanup_interval;
            cleanup = Some(Box::pin(batch::cleanup(&pool, config.retention)));
        }
        let done = stopping || (finishing && drained);
        if !done && claiming.is_none() && running.len() < PIPELINE && now >= next_claim {
            let (claimed, claimed_rx) = oneshot::channel();
            let (published, published_rx) = oneshot::channel();
            let (ended, ended_rx) = oneshot::channel();
            let two_back = if ends.len() == 2 {
                ends.pop_front()
            } else {
                None
            };
            ends.push_back(ended_rx);
            let turn = batch::Turn {
                claimed,
                after: last_published.replace(published_rx),
                two_back,
                published,
                ended,
            };
            running.push(batch::run(
                &pool,
                &publisher,
                limit,
                config.publish_timeout,
                &stats,
                &stop,
                turn,
            ));
            claiming = Some(claimed_rx);
            claim_after_finish = finishing;
            continue;
        }
        // The next claim's time counts only while a batch may start.
        let wake = if claiming.is_none() && running.len() < PIPELINE {
            next_claim.min(next_cleanup)
        } else {
            next_cleanup
        };
        tokio::select! {
            Some(result) = running.next(), if !running.is_empty() => {
                if let Some(wait) = settle(result, &mut backoff, &stats) {
                    next_claim = next_claim.max(Instant::now() + wait);
                    // Its rows are pending again: claim them once more.
                    drained = false;
                }
            }
            claimed = async { claiming.as_mut().expect("guarded").await }, if claiming.is_some() => {
                claiming = None;
                // A full batch: the next one may claim at once. Fewer rows
                // (or none, or a failed claim): look again after the poll
                // interval (a failure's backoff comes with its result).
                let short = matches!(claimed, Ok(n) if (n as i64) < limit);
                if claim_after_finish && short {
                    drained = true;
                } else if !matches!(claimed, Ok(n) if n as i64 >= limit) {
                    next_claim = next_claim.max(Instant::now() + config.poll_interval);
                }
            }
            done = async { cleanup.as_mut().expect("guarded").await }, if cleanup.is_some() => {
                cleanup = None;
                match done {
                    Ok(n) => {
                        stats.cleaned.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) => warn!("outbox cleanup failed, trying again later: {e}"),
                }
            }
            () = tokio::time::sleep_until(wake), if !stopping => {}
            () = stop.cancelled(), if !stopping => {}
            () = finish.cancelled(), if !finishing => {}
        }
    }
}

/// Accounts for a finished batch; the wait before the next claim when it
/// failed (the backoff's next step).
fn settle(
    result: Result<batch::Batch, OutboxError>,
    backoff: &mut Backoff,
    stats: &Stats,
) -> Option<Duration> {
    match result {
        Ok(b) if b.transport_errors == 0 => {
            if b.released > 0 {
                debug!(
                    rows = b.released,
                    "outbox relay stopping: a claimed batch released unpublished"
                );
            }
            backoff.reset();
            None
        }
        Ok(b) => {
            stats.failed_batches.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("acemq.outbox.transport_errors").increment(b.transport_errors as u64);
            let wait = backoff.next_delay();
            warn!(
                rows = b.transport_errors,
                retry_in = ?wait,
                "outbox publish failed, the rows stay pending: {}",
                b.first_error.unwrap_or_default()
            );
            Some(wait)
        }
        Err(e) => {
            stats.failed_batches.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("acemq.outbox.database_errors").increment(1);
            let wait = backoff.next_delay();
            warn!(retry_in = ?wait, "outbox relay batch failed, the rows stay pending: {e}");
            Some(wait)
        }
    }
}

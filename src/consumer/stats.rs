//! A queue's counters, shared by the loops of all its generations, the
//! drain and the health handle, and the metric handles one loop updates.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use acemq_layers::Decision;
use metrics::Counter;
use tokio_util::sync::CancellationToken;

use super::strikes::Strikes;
use super::taken::TakenBack;

/// Per-queue counters shared by the loops of every generation, the drain
/// and the health handle.
#[derive(Debug, Default)]
pub(crate) struct QueueStats {
    /// Deliveries handed back without being handled (policy `hand_back`,
    /// the pause gate, a drain-cancelled handler).
    pub(crate) handed_back: AtomicUsize,
    /// Deliveries fetched and not started when `basic.cancel` was answered,
    /// plus those the stream yielded after.
    pub(crate) buffered_after_cancel: AtomicUsize,
    /// Handlers that finished after the drain began.
    pub(crate) finished_during_drain: AtomicUsize,
    /// Handlers finished in all.
    pub(crate) handled: AtomicUsize,
    /// Handlers finished with an acknowledgement (`Decision::Ack`).
    pub(crate) completed: AtomicUsize,
    /// Deliveries retried (in the broker).
    pub(crate) retried: AtomicUsize,
    /// Deliveries dead-lettered.
    pub(crate) dead_lettered: AtomicUsize,
    /// Handlers abandoned after ignoring cancellation.
    pub(crate) abandoned: AtomicUsize,
    /// Outcomes dropped because their channel was gone.
    pub(crate) orphaned: AtomicUsize,
    /// Outcomes lost with a channel or connection during the drain: handlers
    /// running and outcomes not yet sent when it was lost (the broker
    /// redelivers those messages).
    pub(crate) lost_in_drain: AtomicUsize,
    /// The drain is closing the channels itself: a close now is no loss.
    pub(crate) drain_closing: AtomicBool,
    /// Messages whose acknowledgement the broker timed out, and how often
    /// (every generation of the queue).
    pub(crate) strikes: Strikes,
    /// Messages still running in a generation whose deliveries the broker
    /// took back: not started again until those handlers end.
    pub(crate) taken_back: TakenBack,
    /// Settle frames sent (acks, multiple or not, nacks, rejects).
    pub(crate) settle_frames: AtomicUsize,
    /// The queue has no live consumer (recovering, or given up): readiness
    /// is off while any queue is down.
    pub(crate) down: AtomicBool,
    /// The queue's batcher (consumed in batches), made by its first
    /// generation: the limit on running batches and the held count.
    pub(crate) batcher: std::sync::OnceLock<acemq_layers::batch::Batcher>,
    /// Now: deliveries fetched and not started (gauge).
    pub(crate) buffered: AtomicUsize,
    /// Now: outcomes decided and not yet settled on the wire (gauge).
    pub(crate) unsettled: AtomicUsize,
    /// Now: live loops of this queue, all generations (gauge).
    pub(crate) loops: AtomicUsize,
    /// Cancelled by the drain once `basic.cancel` has been answered (or has
    /// failed, or the deadline passed).
    pub(crate) consumer_cancelled: CancellationToken,
    /// The runner cancelled the consumer of a queue paused too long: its
    /// work goes back to the broker until the queue is resumed.
    pub(crate) parked: AtomicBool,
}

/// Pre-registered counter handles, so the hot path builds no metric keys.
pub(super) struct OutcomeCounters {
    pub(super) ack: Counter,
    pub(super) retry: Counter,
    pub(super) dead_lettered: Counter,
    pub(super) rejected: Counter,
    pub(super) handed_back: Counter,
    pub(super) abandoned: Counter,
    pub(super) orphaned: Counter,
    pub(super) duration: metrics::Histogram,
    pub(super) frames: Counter,
}

impl OutcomeCounters {
    pub(super) fn new(queue: &str) -> Self {
        let c = |outcome: &'static str| metrics::counter!("acemq.deliveries", "queue" => queue.to_owned(), "outcome" => outcome);
        OutcomeCounters {
            ack: c("ack"),
            retry: c("retry"),
            dead_lettered: c("dead-lettered"),
            rejected: c("rejected-to-dlx"),
            handed_back: c("handed-back"),
            abandoned: c("abandoned"),
            orphaned: c("orphaned"),
            duration: metrics::histogram!("acemq.handler.duration", "queue" => queue.to_owned()),
            frames: metrics::counter!("acemq.settle.frames", "queue" => queue.to_owned()),
        }
    }
}

/// Decrements the queue's live-loop gauge when a loop ends, however it ends.
pub(super) struct LoopGauge<'a>(pub(super) &'a QueueStats);

impl Drop for LoopGauge<'_> {
    fn drop(&mut self) {
        self.0.loops.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Updates the counters and metrics for a finished handler (`draining`:
/// intake had stopped when it finished; `took`: from its start, or its
/// release by the pause gate, to its collection).
pub(super) fn record(
    outcomes: &OutcomeCounters,
    stats: &QueueStats,
    draining: bool,
    decision: &Decision,
    took: Duration,
) {
    outcomes.duration.record(took.as_secs_f64());
    stats.handled.fetch_add(1, Ordering::Relaxed);
    if draining && !matches!(decision, Decision::HandBack | Decision::Abandoned) {
        stats.finished_during_drain.fetch_add(1, Ordering::Relaxed);
    }
    match decision {
        Decision::Ack => {
            stats.completed.fetch_add(1, Ordering::Relaxed);
            outcomes.ack.increment(1)
        }
        Decision::Retry(_) => {
            stats.retried.fetch_add(1, Ordering::Relaxed);
            outcomes.retry.increment(1)
        }
        Decision::DeadLetter(d) => {
            stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
            if d.published {
                outcomes.dead_lettered.increment(1)
            } else {
                outcomes.rejected.increment(1)
            }
        }
        Decision::Abandoned => {
            stats.abandoned.fetch_add(1, Ordering::Relaxed);
            outcomes.abandoned.increment(1)
        }
        _ => {
            stats.handed_back.fetch_add(1, Ordering::Relaxed);
            outcomes.handed_back.increment(1)
        }
    }
}

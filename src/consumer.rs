//! The consumer loop: one per queue, on its own channel.
//!
//! Handlers and settles run in one task, each in a `FuturesUnordered`: a
//! handler's concurrency slot is released when the handler returns, before
//! its settle is awaited, and the stream is never serialised behind settles.

use std::future::{poll_fn, Future};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use acemq_layers::{BoxError, Decision, Delivery};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::Acker;
use lapin::{Channel, Consumer};
use metrics::Counter;
use tokio_util::sync::CancellationToken;
use tower::Service;
use tracing::{debug, error, warn, Instrument};

use crate::config::PrefetchPolicy;
use crate::convert::delivery_from_lapin;

/// Per-queue counters shared by the loop, the drain and the health handle.
#[derive(Debug, Default)]
pub(crate) struct QueueStats {
    /// Deliveries taken from the stream after intake stopped and handed back
    /// without being handled (policy `hand_back`), plus those the pause gate
    /// handed back.
    pub(crate) handed_back: AtomicUsize,
    /// Deliveries taken from the stream after `basic.cancel` was answered
    /// (either policy).
    pub(crate) buffered_after_cancel: AtomicUsize,
    /// Handlers that finished after the drain began (not counting
    /// hand-backs and abandonments).
    pub(crate) finished_during_drain: AtomicUsize,
    /// Handlers finished in all.
    pub(crate) handled: AtomicUsize,
    /// Deliveries retried (in the broker).
    pub(crate) retried: AtomicUsize,
    /// Deliveries dead-lettered.
    pub(crate) dead_lettered: AtomicUsize,
    /// Handlers abandoned after ignoring cancellation.
    pub(crate) abandoned: AtomicUsize,
    /// Which connection's consumer is the live one (bumped by each reconnect);
    /// a loop of an older connection must not flip readiness.
    pub(crate) generation: std::sync::atomic::AtomicU64,
    /// Whether the broker cancelled this consumer (queue deleted).
    pub(crate) cancelled_by_broker: AtomicBool,
    /// Cancelled by the drain once `basic.cancel` has been answered (or has
    /// failed, or the deadline passed). Until then a `hand_back` loop takes
    /// nothing from its stream: a delivery requeued while the consumer is
    /// still registered would come straight back to it.
    pub(crate) consumer_cancelled: CancellationToken,
}

/// Pre-registered counter handles, so the hot path builds no metric keys.
struct Outcomes {
    ack: Counter,
    retry: Counter,
    dead_lettered: Counter,
    rejected: Counter,
    handed_back: Counter,
    abandoned: Counter,
    duration: metrics::Histogram,
}

impl Outcomes {
    fn new(queue: &str) -> Self {
        let c = |outcome: &'static str| metrics::counter!("acemq.deliveries", "queue" => queue.to_owned(), "outcome" => outcome);
        Outcomes {
            ack: c("ack"),
            retry: c("retry"),
            dead_lettered: c("dead-lettered"),
            rejected: c("rejected-to-dlx"),
            handed_back: c("handed-back"),
            abandoned: c("abandoned"),
            duration: metrics::histogram!("acemq.handler.duration", "queue" => queue.to_owned()),
        }
    }
}

pub(crate) struct ConsumerLoop<S> {
    pub(crate) queue: Arc<str>,
    pub(crate) channel: Channel,
    pub(crate) consumer: Consumer,
    pub(crate) service: S,
    pub(crate) concurrency: usize,
    pub(crate) policy: PrefetchPolicy,
    pub(crate) dead_letter: bool,
    /// Cancelled when the drain stops intake.
    pub(crate) intake: CancellationToken,
    pub(crate) stats: Arc<QueueStats>,
    /// Notified when the stream ends outside a drain (connection lost or
    /// consumer cancelled by the broker): the reconnect supervisor looks.
    pub(crate) ended: Arc<tokio::sync::Notify>,
}

/// How many deliveries one poll of the loop may move along before it yields
/// to the runtime (so a busy stream cannot starve other tasks).
const POLL_BUDGET: usize = 64;

impl<S> ConsumerLoop<S>
where
    S: Service<Delivery, Response = Decision, Error = BoxError> + Send + 'static,
    S::Future: Send + 'static,
{
    /// Runs until the stream has ended and every handler and settle is done.
    ///
    /// One hand-written poll drives everything: finished handlers are turned
    /// into settles at once, settles complete in the background of the same
    /// task, and the stream is read whenever a concurrency slot is free and
    /// the service is ready. Each waker is registered once per poll, not once
    /// per event.
    pub(crate) async fn run(self) {
        let ConsumerLoop {
            queue,
            channel,
            mut consumer,
            mut service,
            concurrency,
            policy,
            dead_letter,
            intake,
            stats,
            ended,
        } = self;
        let outcomes = Outcomes::new(&queue);
        // Read on the first poll, after `install` bumped the generation.
        let generation = stats.generation.load(Ordering::Acquire);
        let is_live = || stats.generation.load(Ordering::Acquire) == generation;
        let mut handlers = FuturesUnordered::new();
        let mut settles = FuturesUnordered::new();
        let mut draining = false;
        let mut stream_done = false;
        let mut ready = false;
        let mut service_failed = false;
        let stop = intake.cancelled();
        let cancel_answered = stats.consumer_cancelled.cancelled();
        tokio::pin!(stop, cancel_answered);

        poll_fn(|cx| {
            let mut budget = POLL_BUDGET;
            loop {
                let mut progressed = false;
                // Finished handlers: record, then settle (without waiting).
                while let Poll::Ready(Some((decision, acker, started))) =
                    handlers.poll_next_unpin(cx)
                {
                    progressed = true;
                    record(&outcomes, &stats, &intake, &decision, started);
                    settles.push(settle(&channel, acker, decision, &queue, dead_letter));
                }
                while let Poll::Ready(Some(())) = settles.poll_next_unpin(cx) {
                    progressed = true;
                }
                if !draining && !stream_done && stop.as_mut().poll(cx).is_ready() {
                    draining = true;
                    progressed = true;
                }
                let hand_back_now = draining && policy == PrefetchPolicy::HandBack;
                // Handing back waits for the consumer's cancel to be answered:
                // a delivery requeued while the consumer is still registered
                // would be sent straight back.
                let want = !stream_done
                    && if hand_back_now {
                        cancel_answered.as_mut().poll(cx).is_ready()
                    } else {
                        handlers.len() < concurrency
                    };
                if want && !ready && !hand_back_now {
                    match service.poll_ready(cx) {
                        Poll::Ready(Ok(())) => ready = true,
                        Poll::Ready(Err(e)) => {
                            error!(queue = %queue, error = %e, "the handler service failed (poll_ready returned an error); this queue stops consuming and its prefetched deliveries go back to the broker; readiness is off");
                            stream_done = true;
                            progressed = true;
                            stats.cancelled_by_broker.store(true, Ordering::Relaxed);
                            service_failed = true;
                        }
                        Poll::Pending => {}
                    }
                }
                if want && (ready || hand_back_now) {
                    if let Poll::Ready(next) = consumer.poll_next_unpin(cx) {
                        progressed = true;
                        match next {
                            None => {
                                stream_done = true;
                                if !draining && is_live() {
                                    stats.cancelled_by_broker.store(true, Ordering::Relaxed);
                                    ended.notify_one();
                                    if channel.status().connected() {
                                        warn!(queue = %queue, "the broker cancelled this consumer (was the queue deleted?); readiness is off and no more deliveries are taken from it");
                                    } else {
                                        warn!(queue = %queue, "the consumer's channel closed; handlers still running finish, their settles are skipped (the broker requeues those deliveries)");
                                    }
                                }
                            }
                            Some(Err(e)) => {
                                stream_done = true;
                                if !draining && is_live() {
                                    stats.cancelled_by_broker.store(true, Ordering::Relaxed);
                                    ended.notify_one();
                                }
                                warn!(queue = %queue, error = %e, "the consumer's stream failed; no more deliveries are taken from it");
                            }
                            Some(Ok(raw)) if hand_back_now => {
                                stats.buffered_after_cancel.fetch_add(1, Ordering::Relaxed);
                                stats.handed_back.fetch_add(1, Ordering::Relaxed);
                                outcomes.handed_back.increment(1);
                                settles.push(settle(
                                    &channel,
                                    raw.acker,
                                    Decision::HandBack,
                                    &queue,
                                    dead_letter,
                                ));
                            }
                            Some(Ok(raw)) => {
                                if draining && stats.consumer_cancelled.is_cancelled() {
                                    stats.buffered_after_cancel.fetch_add(1, Ordering::Relaxed);
                                }
                                ready = false;
                                handlers.push(start_handler(&mut service, &queue, raw));
                            }
                        }
                    }
                }
                if stream_done && handlers.is_empty() && settles.is_empty() {
                    return Poll::Ready(());
                }
                if !progressed {
                    return Poll::Pending;
                }
                budget -= 1;
                if budget == 0 {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
        })
        .await;
        if service_failed && channel.status().connected() {
            // Every settle is done; closing the channel returns what the
            // broker had sent ahead, instead of leaving it unacknowledged.
            let _ = channel.close(200, "handler service failed".into()).await;
        }
        debug!(queue = %queue, "consumer loop finished");
    }
}

/// Updates the counters and metrics for a finished handler.
fn record(
    outcomes: &Outcomes,
    stats: &QueueStats,
    intake: &CancellationToken,
    decision: &Decision,
    started: Instant,
) {
    outcomes.duration.record(started.elapsed().as_secs_f64());
    stats.handled.fetch_add(1, Ordering::Relaxed);
    // `intake`, not the loop's own flag: the loop may see this handler end
    // before it sees the drain begin. A hand-back (a closed gate, a cancelled
    // handler) or an abandonment is not a handler that finished its work.
    if intake.is_cancelled() && !matches!(decision, Decision::HandBack | Decision::Abandoned) {
        stats.finished_during_drain.fetch_add(1, Ordering::Relaxed);
    }
    match decision {
        Decision::Ack => outcomes.ack.increment(1),
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

/// Turns a lapin delivery into a request, calls the stack, and returns the
/// future that yields the decision with the acker (inside the delivery's
/// span).
fn start_handler<S>(
    service: &mut S,
    queue: &Arc<str>,
    raw: lapin::message::Delivery,
) -> impl Future<Output = (Decision, Acker, Instant)> + Send + 'static
where
    S: Service<Delivery, Response = Decision, Error = BoxError>,
    S::Future: Send + 'static,
{
    let span = crate::span::process_span(queue, &raw);
    let (delivery, acker) = span.in_scope(|| delivery_from_lapin(queue, raw));
    crate::span::record_delivery(&span, &delivery);
    let started = Instant::now();
    let fut = span.in_scope(|| service.call(delivery));
    async move {
        let decision = match fut.await {
            Ok(d) => d,
            Err(e) => {
                error!(error = %e, "the handler stack returned an error instead of a decision; rejecting the delivery without requeue");
                Decision::DeadLetter(acemq_layers::DeadLetterDecision {
                    reason: acemq_layers::Reason::Rejected,
                    error: e.to_string(),
                    attempts: 0,
                    published: false,
                })
            }
        };
        crate::span::record_decision(&tracing::Span::current(), &decision);
        (decision, acker, started)
    }
    .instrument(span)
}

/// Carries out one decision on one delivery, exactly once. Settling on a
/// closed channel is skipped: the broker has already requeued the delivery.
pub(crate) async fn settle(
    channel: &Channel,
    acker: Acker,
    decision: Decision,
    queue: &str,
    dead_letter: bool,
) {
    if !channel.status().connected() {
        debug!(queue = %queue, outcome = decision.outcome(), "not settling on a closed channel; the broker has requeued the delivery");
        return;
    }
    let result = match &decision {
        Decision::Ack
        | Decision::Retry(acemq_layers::RetryDecision {
            via: acemq_layers::RetryVia::Rung(_),
            ..
        }) => acker.ack(BasicAckOptions::default()).await,
        Decision::DeadLetter(d) if d.published => acker.ack(BasicAckOptions::default()).await,
        Decision::DeadLetter(d) => {
            if !dead_letter {
                warn!(queue = %queue, reason = %d.reason, error = %d.error, "dead_letter is off for this queue: the broker drops the rejected delivery");
            }
            acker.reject(BasicRejectOptions { requeue: false }).await
        }
        Decision::Abandoned => {
            drop(acker);
            return;
        }
        _ => {
            acker
                .nack(BasicNackOptions {
                    multiple: false,
                    requeue: true,
                })
                .await
        }
    };
    match result {
        Ok(true) => {}
        Ok(false) => {
            debug!(queue = %queue, outcome = decision.outcome(), "settle skipped: the channel closed or the delivery was already settled")
        }
        Err(e) => {
            debug!(queue = %queue, outcome = decision.outcome(), error = %e, "settle failed on a closing channel; the broker requeues the delivery")
        }
    }
}

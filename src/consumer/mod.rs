//! The consumer loop: one per queue and generation (a queue's connection
//! and channel), on its own channel.
//!
//! The loop's state is [`Generation`]: a named state whose transitions are
//! methods, driven by one hand-written poll. Its rules:
//!
//! - **Intake.** The stream is read eagerly into the generation's buffer
//!   (the broker sends at most `prefetch` ahead), so the end of the stream —
//!   a lost channel or connection, a broker-sent cancel — is seen at once,
//!   not after the buffer has been worked through. A handler starts only
//!   while the channel lives, the queue's concurrency limit has a slot
//!   (one limit shared by every generation of the queue), and the stack is
//!   ready.
//! - **Loss.** The moment the channel (or its connection) is known gone,
//!   the generation is lost: no new handler starts, the buffer is dropped
//!   (the broker has taken it back), running handlers are cancelled through
//!   their tokens (`abandon_after` applies), and every outcome that arrives
//!   afterwards is an orphan: counted, logged at debug, never settled, never
//!   published (the retry and dead-letter layers read the lifeline too).
//! - **Hand-back.** Under `hand_back`, once the drain has stopped intake no
//!   new handler starts; what is buffered is handed back only after the
//!   broker answered `basic.cancel` (a delivery requeued to a still
//!   registered consumer would come straight back).
//! - **Settling.** Every outcome goes through the settle ledger, the only path
//!   that settles: acks coalesce into `multiple` runs, nacks and rejects go
//!   singly at their turn; held outcomes are flushed on the count, the time
//!   bound, when the loop is idle with the prefetch window used up (the
//!   broker then sends nothing until a settle), when intake stops, when the broker
//!   answered the cancel, and before the loop ends and closes its channel.
//!   A handler's concurrency slot is released when it returns, before its
//!   settle is sent.

mod stats;

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use acemq_layers::cancel::Slots;
use acemq_layers::{BoxError, Decision, Delivery, Lifeline};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use lapin::{Channel, Consumer};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, PollSemaphore};
use tower::Service;
use tracing::{debug, warn, Instrument};

use crate::amqp::convert::delivery_from_lapin_on;
use crate::config::PrefetchPolicy;
use crate::settle::ledger::{Bounds, Ledger, Op, Outcome};
use crate::settle::wire::send;
pub(crate) use stats::QueueStats;
use stats::{record, LoopGauge, Outcomes};

/// Why a generation stopped consuming (told to its queue's runner the
/// moment it is known; the loop then finishes its handlers on its own).
#[derive(Debug)]
pub(crate) enum End {
    /// The stream ended after the drain's `basic.cancel`.
    Drained,
    /// The broker cancelled the consumer outside a drain (queue deleted).
    CancelledByBroker,
    /// The channel or its connection is gone.
    Lost(lapin::Error),
    /// The stack's `poll_ready` failed.
    ServiceFailed(String),
    /// A pause lasted past `pause_hand_back_after`: the consumer was
    /// cancelled and the work handed back.
    Parked,
}

/// Everything one generation's loop is built from.
pub(crate) struct ConsumerLoop<S> {
    pub(crate) queue: Arc<str>,
    pub(crate) channel: Channel,
    pub(crate) consumer: Consumer,
    pub(crate) service: S,
    /// The queue's concurrency limit, shared by its generations.
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) policy: PrefetchPolicy,
    pub(crate) dead_letter: bool,
    pub(crate) bounds: Bounds,
    /// Cancelled when the drain stops intake.
    pub(crate) intake: CancellationToken,
    pub(crate) stats: Arc<QueueStats>,
    /// This generation's: lost with its channel.
    pub(crate) lifeline: Lifeline,
    /// This generation's handler cancellation (a child of the drain's root).
    pub(crate) cancel: CancellationToken,
    /// Told why the generation stopped consuming.
    pub(crate) ended: oneshot::Sender<End>,
}

/// How many rounds one poll of the loop may make before it yields to the
/// runtime (so a busy stream cannot starve other tasks).
const POLL_BUDGET: usize = 64;

type Finished = (Decision, u64, Instant);

/// The loop's state, apart from the futures it drives.
struct Generation<'a, S> {
    queue: &'a Arc<str>,
    channel: &'a Channel,
    service: S,
    ready: bool,
    slots: PollSemaphore,
    slot: Option<OwnedSemaphorePermit>,
    policy: PrefetchPolicy,
    dead_letter: bool,
    stats: &'a QueueStats,
    outcomes: Outcomes,
    lifeline: Lifeline,
    cancel: CancellationToken,
    buffer: VecDeque<lapin::message::Delivery>,
    ledger: Ledger,
    ops: Vec<Op>,
    /// The stream is still read.
    reading: bool,
    /// The drain stopped intake.
    stopping: bool,
    /// The broker answered the drain's `basic.cancel`.
    cancel_answered: bool,
    /// The channel is gone: outcomes are orphans.
    lost: bool,
    /// A flush of everything held is due.
    force_flush: bool,
    ended: Option<oneshot::Sender<End>>,
}

impl<S> Generation<'_, S>
where
    S: Service<Delivery, Response = Decision, Error = BoxError>,
    S::Future: Released + Send + 'static,
{
    /// Tells the runner why this generation stopped consuming (once).
    fn end(&mut self, why: End) {
        if let Some(tx) = self.ended.take() {
            let _ = tx.send(why);
        }
    }

    /// A delivery arrived.
    fn receive(&mut self, raw: lapin::message::Delivery) {
        if self.lost {
            return;
        }
        self.ledger.receive(raw.delivery_tag);
        if self.cancel_answered {
            self.stats
                .buffered_after_cancel
                .fetch_add(1, Ordering::Relaxed);
        }
        self.buffer.push_back(raw);
    }

    /// The stream ended (`None`).
    fn stream_ended(&mut self) {
        self.reading = false;
        self.force_flush = true;
        if self.stopping {
            self.end(End::Drained);
        } else if self.stats.parked.load(Ordering::Acquire) {
            // The runner cancelled this consumer (frames on one channel are
            // in order: the broker has the cancel before these requeues).
            self.hand_back_buffered();
            self.end(End::Parked);
        } else if !self.channel.status().connected() {
            self.lose(
                lapin::ErrorKind::InvalidChannelState(
                    lapin::ChannelState::Closed,
                    "the consumer's stream ended",
                )
                .into(),
            );
        } else {
            warn!(queue = %self.queue, "the broker cancelled this consumer (was the queue deleted?); consuming it again");
            self.end(End::CancelledByBroker);
        }
    }

    /// The channel or its connection is gone.
    fn lose(&mut self, error: lapin::Error) {
        self.reading = false;
        if self.lost {
            return;
        }
        self.lost = true;
        self.lifeline.lose();
        self.cancel.cancel();
        let dropped = self.buffer.len();
        self.buffer.clear();
        self.ledger = Ledger::new(Bounds {
            count: 0,
            delay: self.ledger.delay(),
            window: 0,
        });
        self.ops.clear();
        debug!(queue = %self.queue, dropped, error = %error, "generation lost: buffered deliveries dropped (the broker requeued them), running handlers cancelled");
        self.end(End::Lost(error));
    }

    /// A handler finished.
    fn finished(&mut self, (decision, tag, started): Finished, intake: &CancellationToken) {
        if self.lost || !self.channel.status().connected() {
            self.stats.orphaned.fetch_add(1, Ordering::Relaxed);
            self.outcomes.orphaned.increment(1);
            debug!(queue = %self.queue, delivery_tag = tag, outcome = decision.outcome(), "dropping the outcome of an orphaned delivery (its channel is gone; the broker redelivers it)");
            return;
        }
        record(&self.outcomes, self.stats, intake, &decision, started);
        if let Decision::DeadLetter(d) = &decision {
            if !d.published && !self.dead_letter {
                warn!(queue = %self.queue, reason = %d.reason, error = %d.error, "dead_letter is off for this queue: the broker drops the rejected delivery");
            }
        }
        let outcome = Outcome::of(&decision);
        self.ledger.record(tag, outcome, &mut self.ops);
    }

    /// Under `hand_back`, once the cancel is answered: what is buffered
    /// goes back.
    fn hand_back_buffered(&mut self) {
        while let Some(raw) = self.buffer.pop_front() {
            self.stats.handed_back.fetch_add(1, Ordering::Relaxed);
            self.outcomes.handed_back.increment(1);
            self.ledger
                .record(raw.delivery_tag, Outcome::Requeue, &mut self.ops);
        }
    }

    /// Whether a buffered delivery may start now (apart from slot and
    /// readiness).
    fn may_start(&self) -> bool {
        !self.lost
            && !self.buffer.is_empty()
            && (!self.stopping || self.policy == PrefetchPolicy::HandleBuffered)
    }

    /// Starts the next buffered delivery if a slot is free and the stack is
    /// ready. `Ready(None)` when nothing can start now.
    fn poll_start(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<impl Future<Output = Finished> + Send + 'static>> {
        if !self.may_start() {
            return Poll::Ready(None);
        }
        if self.slot.is_none() {
            match self.slots.poll_acquire(cx) {
                Poll::Ready(Some(p)) => self.slot = Some(p),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
        if !self.ready {
            match self.service.poll_ready(cx) {
                Poll::Ready(Ok(())) => self.ready = true,
                Poll::Ready(Err(e)) => {
                    tracing::error!(queue = %self.queue, error = %e, "the handler service failed (poll_ready returned an error); this queue's channel closes after the running handlers settle, so its prefetched deliveries go back, and the queue is consumed again after a backoff; readiness is off meanwhile");
                    self.reading = false;
                    self.buffer.clear();
                    self.force_flush = true;
                    self.end(End::ServiceFailed(e.to_string()));
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        let Some(raw) = self.buffer.pop_front() else {
            return Poll::Ready(None);
        };
        self.ready = false;
        let slot = self.slot.take();
        Poll::Ready(Some(start_handler(
            &mut self.service,
            self.queue,
            &self.lifeline,
            raw,
            slot,
        )))
    }

    fn publish_gauges(&self, settling: usize) {
        self.stats
            .buffered
            .store(self.buffer.len(), Ordering::Relaxed);
        self.stats
            .unsettled
            .store(self.ledger.held() + settling, Ordering::Relaxed);
    }
}

impl<S> ConsumerLoop<S>
where
    S: Service<Delivery, Response = Decision, Error = BoxError> + Send + 'static,
    S::Future: Released + Send + 'static,
{
    /// Runs until the stream has ended and every handler and settle is
    /// done; then closes its channel if it is still open (everything on it
    /// is settled, and what was abandoned or left goes back to the broker).
    pub(crate) async fn run(self) {
        let ConsumerLoop {
            queue,
            channel,
            mut consumer,
            service,
            slots,
            policy,
            dead_letter,
            bounds,
            intake,
            stats,
            lifeline,
            cancel,
            ended,
        } = self;
        stats.loops.fetch_add(1, Ordering::Relaxed);
        let _loops = LoopGauge(&stats);
        let mut st = Generation {
            queue: &queue,
            channel: &channel,
            service,
            ready: false,
            slots: PollSemaphore::new(slots),
            slot: None,
            policy,
            dead_letter,
            stats: &stats,
            outcomes: Outcomes::new(&queue),
            lifeline,
            cancel,
            buffer: VecDeque::new(),
            ledger: Ledger::new(bounds),
            ops: Vec::new(),
            reading: true,
            stopping: false,
            cancel_answered: false,
            lost: false,
            force_flush: false,
            ended: Some(ended),
        };
        // Each handler runs in a slot whose waker was made with the slot:
        // no allocation or reference count per delivery, and one call wakes
        // them all.
        let mut handlers = Slots::with_capacity(st.slots.available_permits());
        let mut settles = FuturesUnordered::new();
        // The handlers' cancellation: the stack's cancel layer registers no
        // waiter (woken_by_transport), the loop wakes every running handler
        // when it fires (`Slots::wake_all`), and a handler started after it
        // is polled once more after its first `Pending`.
        // Only two things cancel it: the loop itself when the generation is
        // lost, and the drain at its deadline — after it stopped intake. So
        // the token is watched only once `stopping` (no lock per round of
        // the loop while it consumes), and a loss wakes at once.
        let cancel_seen = st.cancel.clone();
        let handlers_cancelled = cancel_seen.cancelled();
        let mut cancel_woken = false;
        let stop = intake.cancelled();
        let cancel_answered = stats.consumer_cancelled.cancelled();
        let timer = tokio::time::sleep(bounds.delay);
        let mut timer_armed = false;
        tokio::pin!(stop, cancel_answered, timer, handlers_cancelled);

        poll_fn(|cx| {
            let mut budget = POLL_BUDGET;
            loop {
                let mut progressed = false;
                if !st.stopping && stop.as_mut().poll(cx).is_ready() {
                    st.stopping = true;
                    st.force_flush = true;
                    progressed = true;
                }
                if st.stopping
                    && !st.cancel_answered
                    && cancel_answered.as_mut().poll(cx).is_ready()
                {
                    st.cancel_answered = true;
                    st.force_flush = true;
                    progressed = true;
                    // What the broker had sent ahead and is still here.
                    st.stats
                        .buffered_after_cancel
                        .fetch_add(st.buffer.len(), Ordering::Relaxed);
                }
                if !cancel_woken
                    && (st.lost || (st.stopping && handlers_cancelled.as_mut().poll(cx).is_ready()))
                {
                    cancel_woken = true;
                    handlers.wake_all();
                    progressed = true;
                }
                // Intake: read eagerly, so a lost channel is seen at once.
                while st.reading {
                    match consumer.poll_next_unpin(cx) {
                        Poll::Ready(Some(Ok(raw))) => st.receive(raw),
                        Poll::Ready(Some(Err(e))) => st.lose(e),
                        Poll::Ready(None) => st.stream_ended(),
                        Poll::Pending => break,
                    }
                    progressed = true;
                }
                // Finished handlers: record, then settle (through the ledger).
                while let Poll::Ready(Some(done)) = handlers.poll_next_unpin(cx) {
                    st.finished(done, &intake);
                    progressed = true;
                }
                if st.cancel_answered
                    && st.policy == PrefetchPolicy::HandBack
                    && !st.buffer.is_empty()
                {
                    st.hand_back_buffered();
                    progressed = true;
                }
                // Start what may start.
                while let Poll::Ready(Some(fut)) = st.poll_start(cx) {
                    handlers.push(fut);
                    progressed = true;
                }
                // Flush what the bounds allow.
                if st.ledger.held() > 0 {
                    // Idle with the prefetch window used up: the broker
                    // waits for a settle, so waiting out the delay would
                    // only stall it. Idle otherwise (more is on its way, or
                    // the queue ran dry): the delay bounds the hold.
                    let idle = handlers.is_empty() && (st.buffer.is_empty() || st.lost);
                    let stalled = idle && (st.lost || st.ledger.window_full());
                    let mut force = st.force_flush || stalled || !st.reading;
                    if !force {
                        if !timer_armed {
                            timer
                                .as_mut()
                                .reset(tokio::time::Instant::now() + st.ledger.delay());
                            timer_armed = true;
                        }
                        if timer.as_mut().poll(cx).is_ready() {
                            force = true;
                        }
                    }
                    st.ledger.flush(force, &mut st.ops);
                    if force || st.ledger.held() == 0 {
                        timer_armed = false;
                    }
                }
                st.force_flush = false;
                if !st.ops.is_empty() {
                    let frames = st.ops.len();
                    st.stats.settle_frames.fetch_add(frames, Ordering::Relaxed);
                    st.outcomes.frames.increment(frames as u64);
                    for op in st.ops.drain(..) {
                        settles.push(send(st.channel, op, st.queue));
                    }
                    progressed = true;
                }
                while let Poll::Ready(Some(())) = settles.poll_next_unpin(cx) {
                    progressed = true;
                }
                st.publish_gauges(settles.len());
                if !st.reading
                    && st.buffer.is_empty()
                    && handlers.is_empty()
                    && settles.is_empty()
                    && st.ledger.held() == 0
                {
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
        st.publish_gauges(0);
        // In a drain, the drain closes the channel (and reports a close the
        // broker does not answer); otherwise the loop does.
        if channel.status().connected() && !intake.is_cancelled() {
            // Every settle is done: closing returns what the broker sent
            // ahead and what was abandoned.
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                channel.close(200, "OK".into()),
            )
            .await;
        }
        debug!(queue = %queue, "consumer loop finished");
    }
}

/// The stack's outermost future says when the pause gate let a held
/// delivery through (`acemq.handler.duration` starts there).
pub(crate) trait Released {
    fn released_at(&self) -> Option<tokio::time::Instant>;
}

impl<S, F> Released for acemq_layers::pause::future::ResponseFuture<S, F> {
    fn released_at(&self) -> Option<tokio::time::Instant> {
        acemq_layers::pause::future::ResponseFuture::released_at(self)
    }
}

/// Turns a lapin delivery into a request, calls the stack, and returns the
/// future that yields the decision with the delivery tag (inside the
/// delivery's span). The queue's concurrency slot is held until the stack
/// returns, not until the settle.
fn start_handler<S>(
    service: &mut S,
    queue: &Arc<str>,
    lifeline: &Lifeline,
    raw: lapin::message::Delivery,
    slot: Option<OwnedSemaphorePermit>,
) -> impl Future<Output = Finished> + Send + 'static
where
    S: Service<Delivery, Response = Decision, Error = BoxError>,
    S::Future: Released + Send + 'static,
{
    let tag = raw.delivery_tag;
    let span = crate::amqp::span::process_span(queue, &raw);
    let (delivery, _acker) = span.in_scope(|| delivery_from_lapin_on(queue, raw, lifeline));
    crate::amqp::span::record_delivery(&span, &delivery);
    let started = Instant::now();
    let fut = span.in_scope(|| service.call(delivery));
    async move {
        let mut fut = std::pin::pin!(fut);
        let output = fut.as_mut().await;
        // A delivery the pause gate held is timed from its release: the
        // time held is not handler time.
        let started = fut
            .released_at()
            .map_or(started, tokio::time::Instant::into_std);
        let decision = match output {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "the handler stack returned an error instead of a decision; rejecting the delivery without requeue");
                Decision::DeadLetter(acemq_layers::DeadLetterDecision {
                    reason: acemq_layers::Reason::Rejected,
                    error: e.to_string(),
                    attempts: 0,
                    published: false,
                })
            }
        };
        crate::amqp::span::record_decision(&tracing::Span::current(), &decision);
        drop(slot);
        (decision, tag, started)
    }
    .instrument(span)
}

//! One generation's state ([`Generation`]) and its transitions: what a
//! delivery, the end of the stream, a stop, the broker's answer to the
//! drain's cancel, a loss, a finished handler and the hand-back do to it,
//! and when a buffered delivery may start. Where the generation is in its
//! life is its [`Phase`].

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use acemq_layers::cancel::Slots;
use acemq_layers::{BoxError, Decision, Delivery, Lifeline};
use lapin::Channel;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tower::Service;
use tracing::{debug, warn};

use super::handler::{start_handler, Finished, Handling, Released};
use super::phase::Phase;
use super::stats::{record, OutcomeCounters, QueueStats};
use super::strikes::{Key, Started, Timeout};
use super::struck::Struck;
use crate::config::PrefetchPolicy;
use crate::convert::delivery_taken_from_lapin;
use crate::settle::ledger::{Bounds, Frame, Ledger, Settlement};

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
    /// A stream's connection is gone (why).
    StreamLost(String),
    /// A stream is no longer available: deleted, or its leader moved.
    StreamGone(String),
}

/// The loop's state, apart from the futures it drives.
pub(super) struct Generation<'a, S> {
    pub(super) queue: &'a Arc<str>,
    pub(super) channel: &'a Channel,
    /// The stack, knowing each delivery by its strike key.
    pub(super) service: Struck<S>,
    pub(super) ready: bool,
    pub(super) policy: PrefetchPolicy,
    pub(super) dead_letter: bool,
    pub(super) stats: &'a QueueStats,
    pub(super) outcomes: OutcomeCounters,
    pub(super) lifeline: Lifeline,
    pub(super) cancel: CancellationToken,
    /// Fetched and not started, with when each was received: converted on
    /// arrival, so what waits here and moves on to the stack is a reference
    /// count, not lapin's delivery with its properties.
    pub(super) buffer: VecDeque<(Delivery, Instant)>,
    /// Started and not finished: what an acknowledgement timeout strikes.
    pub(super) started: Started,
    /// Started, still running, and taken back by the broker (tag, key):
    /// released from the queue's `taken_back` as each ends.
    pub(super) taken: Vec<(u64, u64)>,
    /// Cancelled when the drain stops intake.
    pub(super) intake: &'a CancellationToken,
    pub(super) ledger: Ledger,
    pub(super) ops: Vec<Frame>,
    /// Consuming, stopping, the cancel answered, or lost; changed only by
    /// [`stop`](Self::stop), [`answer_cancel`](Self::answer_cancel) and
    /// [`lose`](Self::lose).
    pub(super) phase: Phase,
    /// The stream is still read (it ends apart from the phase: see
    /// [`Phase`]).
    pub(super) reading: bool,
    /// A flush of everything held is due.
    pub(super) force_flush: bool,
    /// Whether the channel was connected when this poll of the loop first
    /// asked (`None`: not asked yet; cleared at each poll). See
    /// [`channel_gone`](Self::channel_gone).
    pub(super) connected: Option<bool>,
    pub(super) ended: Option<oneshot::Sender<End>>,
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

    /// A delivery arrived (read from the stream `at`).
    pub(super) fn receive(&mut self, raw: &mut lapin::message::Delivery, at: Instant) {
        match self.phase {
            Phase::Lost => return,
            Phase::CancelAnswered => {
                self.stats
                    .buffered_after_cancel
                    .fetch_add(1, Ordering::Relaxed);
            }
            Phase::Consuming | Phase::Stopping => {}
        }
        self.ledger.receive(raw.delivery_tag);
        // Settled by tag through the ledger: lapin's acker is not used
        // (it is dropped with `raw`).
        let delivery = delivery_taken_from_lapin(self.queue, raw, &self.lifeline);
        self.buffer.push_back((delivery, at));
    }

    /// The drain stopped intake: what is held goes out. False when the
    /// phase did not change (not consuming).
    pub(super) fn stop(&mut self) -> bool {
        if !self.phase.stop() {
            return false;
        }
        self.force_flush = true;
        true
    }

    /// The broker answered the drain's `basic.cancel` (once stopping):
    /// what is held goes out, and what it had sent ahead and is still here
    /// is counted. False when the phase did not change.
    pub(super) fn answer_cancel(&mut self) -> bool {
        if !self.phase.answer_cancel() {
            return false;
        }
        self.force_flush = true;
        self.stats
            .buffered_after_cancel
            .fetch_add(self.buffer.len(), Ordering::Relaxed);
        true
    }

    /// The stream ended (`None`).
    pub(super) fn stream_ended(&mut self) {
        self.reading = false;
        self.force_flush = true;
        // The drain stops intake, then sends `basic.cancel`: the broker's
        // answer can end the stream before the loop has noticed the stop
        // (a busy machine, a round between the two). That end is the
        // drain's cancel, not the broker's: stop first.
        if self.intake.is_cancelled() {
            self.stop();
        }
        if self.phase.is_stopping() {
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
            let running = self.started.len();
            warn!(queue = %self.queue, running, "the broker cancelled this consumer (was the queue deleted, or, on RabbitMQ 4.3, an acknowledgement timed out?): its unsettled deliveries are the broker's again, so the {running} handler(s) still running are cancelled and their outcomes dropped; consuming it again");
            self.timed_out(Timeout::ConsumerCancelled);
            if self.phase.lose() {
                self.give_back();
            }
            self.end(End::CancelledByBroker);
        }
    }

    /// The channel or its connection is gone.
    pub(super) fn lose(&mut self, error: lapin::Error) {
        self.reading = false;
        if !self.phase.lose() {
            return;
        }
        if let Some(why) = Timeout::of_close(&error) {
            self.timed_out(why);
        }
        self.lost_in_drain(&error);
        let dropped = self.buffer.len();
        self.give_back();
        debug!(queue = %self.queue, dropped, error = %error, "generation lost: buffered deliveries dropped (the broker requeued them), running handlers cancelled");
        self.end(End::Lost(error));
    }

    /// The broker has every unsettled delivery of this generation back (a
    /// lost channel, a consumer it cancelled; the phase is lost): running
    /// handlers are cancelled, their messages wait in the queue's
    /// [`TakenBack`](super::taken::TakenBack) until they end, and nothing
    /// buffered or decided is settled any more.
    fn give_back(&mut self) {
        for (tag, key) in self.started.take_all() {
            let key = key.value();
            self.stats.taken_back.hold(key);
            self.taken.push((tag, key));
        }
        self.lifeline.lose();
        // What is held goes back with the channel: not waited for.
        self.lifeline.hand_back_held();
        self.cancel.cancel();
        self.buffer.clear();
        self.ledger = Ledger::new(Bounds {
            count: 0,
            delay: self.ledger.delay(),
            window: 0,
        });
        self.ops.clear();
    }

    /// A handler of a delivery taken back ended: its message may start
    /// again in the queue's consuming generation.
    fn release_taken(&mut self, tag: u64) {
        if let Some(at) = self.taken.iter().position(|(t, _)| *t == tag) {
            let (_, key) = self.taken.swap_remove(at);
            self.stats.taken_back.release(key);
        }
    }

    /// The broker timed out an acknowledgement: the suspects are struck
    /// (see `strikes`), each with a log line.
    fn timed_out(&self, why: Timeout) {
        let limit = self.service.limit();
        for (tag, strikes) in self.started.strike(&self.stats.strikes, why) {
            metrics::counter!("acemq.consumer.timeout_strikes", "queue" => self.queue.to_string())
                .increment(1);
            warn!(
                queue = %self.queue,
                delivery_tag = tag,
                strikes,
                consumer_timeout_strikes = limit,
                ?why,
                "the broker timed out this delivery's acknowledgement (consumer_timeout): strike {strikes} of {limit}; when it comes back after {limit} it is dead-lettered as consumer-timeout"
            );
        }
    }

    /// During the drain (not the drain's own close), a loss costs the
    /// outcomes of the handlers still running and those not yet sent: the
    /// broker redelivers those messages and their work is done again.
    fn lost_in_drain(&self, error: &lapin::Error) {
        if !self.intake.is_cancelled() || self.stats.drain_closing.load(Ordering::Acquire) {
            return;
        }
        let running = self.started.len();
        let unsent = self.ledger.held();
        let lost = running + unsent;
        if lost > 0 {
            self.stats.lost_in_drain.fetch_add(lost, Ordering::Relaxed);
            warn!(queue = %self.queue, running, unsent, error = %error, "the channel was lost during the drain: {running} handler(s) still running are cancelled and {unsent} outcome(s) not yet sent are dropped; the broker redelivers those {lost} message(s), and work already done for them is done again");
        }
    }

    /// A handler finished (collected `now`).
    pub(super) fn finished(
        &mut self,
        (decision, tag, started, held): Finished,
        now: tokio::time::Instant,
    ) {
        let key = self.started.remove(tag);
        if key.is_none() {
            self.release_taken(tag);
        }
        if held {
            self.held_handed_back(tag);
            return;
        }
        if self.channel_gone() {
            self.stats.orphaned.fetch_add(1, Ordering::Relaxed);
            self.outcomes.orphaned.increment(1);
            debug!(queue = %self.queue, delivery_tag = tag, outcome = decision.outcome(), "dropping the outcome of an orphaned delivery (its channel is gone; the broker redelivers it)");
            return;
        }
        // Intake stopped (the phase, not the token: its state is behind a
        // lock). An outcome of a lost generation never gets here.
        let draining = self.phase.is_stopping();
        let took = now.into_std().saturating_duration_since(started);
        record(&self.outcomes, self.stats, draining, &decision, took);
        let outcome = Settlement::of(&decision);
        if let (Some(key), Settlement::Ack | Settlement::Reject) = (key, outcome) {
            // Settled: a message struck before starts afresh if it is ever
            // published again. (Nothing struck: the body is not digested.)
            if !self.stats.strikes.is_empty() {
                self.stats.strikes.forget(key.value());
            }
        }
        self.ledger.record(tag, outcome, &mut self.ops);
    }

    /// The generation is lost, or its channel is no longer connected: an
    /// outcome now is an orphan's (the broker has the delivery back).
    ///
    /// While the stream is read, the channel's status is looked at once per
    /// poll of the loop: it sits behind a lock lapin's I/O thread takes for
    /// every frame, and a closed channel also ends the stream, which the
    /// loop reads in every round. An outcome that meets a channel closed
    /// since that look goes to the wire and fails there, harmlessly (the
    /// broker requeued the delivery). Once the stream has ended nothing
    /// else reports the close, so the status is looked at every time.
    pub(super) fn channel_gone(&mut self) -> bool {
        if self.phase.is_lost() {
            return true;
        }
        let connected = if self.reading {
            *self
                .connected
                .get_or_insert_with(|| self.channel.status().connected())
        } else {
            self.channel.status().connected()
        };
        !connected
    }

    /// A delivery handed back while it was held in the stack (before the
    /// claim): it goes back like a buffered one; on a lost channel the
    /// broker has it already.
    fn held_handed_back(&mut self, tag: u64) {
        if self.channel_gone() {
            debug!(queue = %self.queue, delivery_tag = tag, "a delivery held before its handler went back with the channel");
            return;
        }
        self.stats.handed_back.fetch_add(1, Ordering::Relaxed);
        self.outcomes.handed_back.increment(1);
        self.ledger.record(tag, Settlement::Requeue, &mut self.ops);
    }

    /// Under `hand_back`, once the cancel is answered: what is buffered
    /// goes back.
    pub(super) fn hand_back_buffered(&mut self) {
        while let Some((delivery, _)) = self.buffer.pop_front() {
            self.stats.handed_back.fetch_add(1, Ordering::Relaxed);
            self.outcomes.handed_back.increment(1);
            self.ledger
                .record(delivery.delivery_tag(), Settlement::Requeue, &mut self.ops);
        }
    }

    /// Whether the next buffered delivery's message still runs in a
    /// generation whose deliveries the broker took back: it waits until
    /// that handler ends (the loop is woken then).
    fn waits_for_taken_back(&self, cx: &Context<'_>) -> bool {
        let taken = &self.stats.taken_back;
        if taken.is_empty() {
            return false;
        }
        self.buffer
            .front()
            .is_some_and(|(d, _)| taken.waits(Key::taken(d).value(), cx))
    }

    /// Whether a buffered delivery may start now (apart from readiness).
    fn may_start(&self) -> bool {
        self.phase.starts_buffered(self.policy) && !self.buffer.is_empty()
    }

    /// Starts the next buffered delivery if the stack is ready (its claim
    /// point has a concurrency permit, or an outer layer takes it to hold),
    /// its future written straight into a slot of `handlers` (a handler's
    /// future is large: moved through a return value, it was copied once
    /// per step). Whether one started.
    pub(super) fn start(
        &mut self,
        handlers: &mut Slots<Handling<S::Future>>,
        cx: &mut Context<'_>,
    ) -> bool {
        if !self.may_start() || self.waits_for_taken_back(cx) {
            return false;
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
                    return false;
                }
                Poll::Pending => return false,
            }
        }
        let Some((delivery, received)) = self.buffer.pop_front() else {
            return false;
        };
        self.ready = false;
        let tag = delivery.delivery_tag();
        handlers.push(start_handler(
            &mut self.service,
            self.queue,
            delivery,
            self.dead_letter,
        ));
        let key = self.service.take_last_key();
        self.started.insert(tag, received, key);
        true
    }

    /// Publishes the buffered and unsettled gauges (`settling`: settles
    /// on their way).
    pub(super) fn publish_gauges(&self, settling: usize) {
        self.stats
            .buffered
            .store(self.buffer.len(), Ordering::Relaxed);
        self.stats
            .unsettled
            .store(self.ledger.held() + settling, Ordering::Relaxed);
    }
}

//! One poll of a generation's loop: rounds of named steps, always in the
//! same order, until the loop is finished, nothing progresses, or the
//! budget is spent.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use acemq_layers::cancel::Slots;
use acemq_layers::{BoxError, Decision, Delivery};
use futures::StreamExt;
use lapin::{Channel, Consumer};
use tokio::time::Sleep;
use tokio_util::sync::WaitForCancellationFuture;
use tower::Service;
use tracing::debug;

use super::generation::Generation;
use super::handler::{Handling, Released};
use super::phase::Phase;
use super::watched::Watched;
use crate::settle::wire::Writer;

/// How many rounds one poll of the loop may make before it yields to the
/// runtime (so a busy stream cannot starve other tasks).
const POLL_BUDGET: usize = 64;

/// How often the channel's status is looked at once its stream has ended
/// (the drain's `basic.cancel` was answered) while handlers or settles
/// remain: nothing else reports a channel closed after that.
const CHANNEL_CHECK: Duration = Duration::from_millis(100);

/// The loop between two polls: the generation's state, the handlers and
/// settles it drives, and the signals it watches.
///
/// `'a` is what the generation borrows (and the settles with it), `'p` the
/// loop's pinned futures and stream, `'w` the tokens those futures watch.
/// Fields drop in the order the loop's locals always did: settles,
/// handlers, then the state.
pub(super) struct Rounds<'a, 'p, 'w, S: Service<Delivery>> {
    /// Settle frames on the wire, queued in the ledger's order.
    pub(super) settles: Writer<'a, &'a Channel>,
    pub(super) handlers: Slots<Handling<S::Future>>,
    /// The queue's concurrency: how many handlers that finish at once one
    /// round may start (see [`start_handlers`](Self::start_handlers)).
    pub(super) concurrency: usize,
    pub(super) st: Generation<'a, S>,
    pub(super) consumer: &'p mut Consumer,
    /// Polls the consumer only when it may have something.
    pub(super) reader: Watched,
    /// The drain stopped intake (watched while consuming).
    pub(super) stop: Pin<&'p mut WaitForCancellationFuture<'w>>,
    /// Polls `stop` only once it has woken the loop.
    pub(super) stop_watch: Watched,
    /// The broker answered the drain's `basic.cancel` (watched while
    /// stopping).
    pub(super) cancel_answered: Pin<&'p mut WaitForCancellationFuture<'w>>,
    /// The handlers' cancellation (watched once intake stopped; a loss
    /// fires it at once), until every running handler has been woken for
    /// it: then `None`.
    pub(super) handlers_cancelled: Option<Pin<&'p mut WaitForCancellationFuture<'w>>>,
    /// The time bound of what the ledger holds.
    pub(super) hold: Timer<'p>,
    /// The next look at the channel's status (see [`CHANNEL_CHECK`]).
    pub(super) check: Timer<'p>,
    /// The clock as read when this round's last handler finished, while
    /// no handler has run since (none was left running): the ledger's time
    /// bound is checked against it (at concurrency 1, one reading a
    /// delivery where there were two).
    pub(super) finished_at: Option<tokio::time::Instant>,
}

/// A deadline set when a wait starts and cleared when it is over, checked
/// against the clock, and put to tokio's timer only when the loop is about
/// to wait (a `Sleep` the loop keeps pinned and resets only when the
/// deadline moved). For the ledger's time bound, a busy loop neither polls
/// nor re-registers the timer per delivery.
pub(super) struct Timer<'p> {
    sleep: Pin<&'p mut Sleep>,
    deadline: Option<tokio::time::Instant>,
}

impl<'p> Timer<'p> {
    pub(super) fn new(sleep: Pin<&'p mut Sleep>) -> Self {
        Self {
            sleep,
            deadline: None,
        }
    }

    /// Sets the deadline `after` from now unless one is set; whether it
    /// has passed.
    fn passed(&mut self, after: Duration) -> bool {
        self.passed_at(tokio::time::Instant::now(), after)
    }

    /// [`passed`](Self::passed), the clock read as `now`.
    fn passed_at(&mut self, now: tokio::time::Instant, after: Duration) -> bool {
        match self.deadline {
            None => {
                self.deadline = Some(now + after);
                false
            }
            Some(deadline) => now >= deadline,
        }
    }

    /// The wait is over: the next one sets its deadline afresh.
    fn disarm(&mut self) {
        self.deadline = None;
    }

    /// Before the loop waits: tokio's timer wakes it at the deadline, if
    /// one is set. Whether the deadline has passed already (then the loop
    /// goes on instead of waiting).
    fn fired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(deadline) = self.deadline else {
            return false;
        };
        if self.sleep.deadline() != deadline {
            self.sleep.as_mut().reset(deadline);
        }
        self.sleep.as_mut().poll(cx).is_ready()
    }

    /// Sets the deadline `after` from now unless one is set, and waits
    /// for it: whether it has passed.
    fn fired_after(&mut self, after: Duration, cx: &mut Context<'_>) -> bool {
        self.passed(after) || self.fired(cx)
    }
}

impl<S> Rounds<'_, '_, '_, S>
where
    S: Service<Delivery, Response = Decision, Error = BoxError>,
    S::Future: Released + Send + 'static,
{
    /// Runs rounds until the loop is finished (`Ready`), a round makes no
    /// progress, or the budget is spent (then it wakes itself first).
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut budget = POLL_BUDGET;
        self.st.connected = None;
        loop {
            let progressed = self.round(cx);
            if self.finished() {
                return Poll::Ready(());
            }
            if !progressed && !self.hold_fired(cx) {
                return Poll::Pending;
            }
            budget -= 1;
            if budget == 0 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
    }

    /// Before the loop waits with acknowledgements held: whether their
    /// time bound has passed already (tokio's timer is set to wake the
    /// loop at it otherwise).
    fn hold_fired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.st.ledger.held() == 0 {
            self.hold.disarm();
            return false;
        }
        self.hold.fired(cx)
    }

    /// One round: every step once, in this order; whether any progressed.
    fn round(&mut self, cx: &mut Context<'_>) -> bool {
        self.finished_at = None;
        let mut progressed = self.notice_stop(cx);
        progressed |= self.notice_cancel_answered(cx);
        progressed |= self.notice_handlers_cancelled(cx);
        progressed |= self.read_stream(cx);
        progressed |= self.watch_channel(cx);
        progressed |= self.collect_finished(cx) > 0;
        progressed |= self.hand_back();
        progressed |= self.start_handlers(cx);
        self.flush_ledger();
        progressed |= self.send_settles(cx);
        progressed |= self.poll_settles(cx);
        self.st.publish_gauges(self.settles.len());
        progressed
    }

    /// While consuming: the drain stopped intake.
    fn notice_stop(&mut self, cx: &mut Context<'_>) -> bool {
        let stop = &mut self.stop;
        self.st.phase == Phase::Consuming
            && self
                .stop_watch
                .poll(cx, |cx| stop.as_mut().poll(cx))
                .is_ready()
            && self.st.stop()
    }

    /// While stopping: the broker answered the drain's `basic.cancel`.
    fn notice_cancel_answered(&mut self, cx: &mut Context<'_>) -> bool {
        self.st.phase == Phase::Stopping
            && self.cancel_answered.as_mut().poll(cx).is_ready()
            && self.st.answer_cancel()
    }

    /// The generation is lost, or (once intake stopped) the handlers'
    /// cancellation fired: every running handler is woken, once.
    fn notice_handlers_cancelled(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(cancelled) = self.handlers_cancelled.as_mut() else {
            return false;
        };
        let fired = match self.st.phase {
            Phase::Consuming => false,
            Phase::Stopping | Phase::CancelAnswered => cancelled.as_mut().poll(cx).is_ready(),
            Phase::Lost => true,
        };
        if !fired {
            return false;
        }
        self.handlers_cancelled = None;
        // What is still held (before the claim) is not a handler to cancel:
        // it goes back at once.
        self.st.lifeline.hand_back_held();
        self.handlers.wake_all();
        true
    }

    /// Intake: read everything lapin has, so a lost channel is seen at
    /// once (the consumer is polled again only once lapin woke the loop for
    /// it: see [`Watched`]).
    fn read_stream(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progressed = false;
        // One reading of the clock for what arrives together.
        let mut now = None;
        while self.st.reading {
            let consumer = &mut *self.consumer;
            match self.reader.poll(cx, |cx| consumer.poll_next_unpin(cx)) {
                // Converted where lapin returned it (not moved out first).
                Poll::Ready(Some(Ok(ref mut raw))) => {
                    self.st.receive(raw, *now.get_or_insert_with(Instant::now))
                }
                Poll::Ready(Some(Err(e))) => self.st.lose(e),
                Poll::Ready(None) => self.st.stream_ended(),
                Poll::Pending => break,
            }
            progressed = true;
        }
        progressed
    }

    /// Once the stream has ended, nothing reports a closed channel: while
    /// handlers run or settles remain, its status is looked at every
    /// [`CHANNEL_CHECK`], and a channel found closed loses the generation
    /// (its handlers are cancelled, their outcomes are orphans).
    fn watch_channel(&mut self, cx: &mut Context<'_>) -> bool {
        let st = &mut self.st;
        let busy = !self.handlers.is_empty() || st.ledger.held() > 0 || !self.settles.is_empty();
        if st.reading || st.phase.is_lost() || !busy {
            self.check.disarm();
            return false;
        }
        loop {
            if !st.channel.status().connected() {
                self.check.disarm();
                st.lose(
                    lapin::ErrorKind::InvalidChannelState(
                        lapin::ChannelState::Closed,
                        "the channel closed after its consumer's stream ended",
                    )
                    .into(),
                );
                return true;
            }
            if !self.check.fired_after(CHANNEL_CHECK, cx) {
                return false;
            }
            self.check.disarm();
        }
    }

    /// Finished handlers: record, then settle (through the ledger). How
    /// many.
    fn collect_finished(&mut self, cx: &mut Context<'_>) -> usize {
        if self.handlers.is_empty() {
            return 0;
        }
        // Handlers run now: a reading of the clock before is stale.
        self.finished_at = None;
        let mut finished = 0;
        while let Poll::Ready(Some(done)) = self.handlers.poll_next_unpin(cx) {
            let now = tokio::time::Instant::now();
            self.st.finished(done, now);
            finished += 1;
            // The last one out: nothing runs after this reading.
            if self.handlers.is_empty() {
                self.finished_at = Some(now);
            }
        }
        finished
    }

    /// Under `hand_back`, once the cancel is answered: what is buffered
    /// goes back, and so does what is held in the stack before its claim
    /// (each handler's future is woken to race the claim for its delivery).
    fn hand_back(&mut self) -> bool {
        let st = &mut self.st;
        if !st.phase.hands_back(st.policy) {
            return false;
        }
        let mut progressed = false;
        if !st.buffer.is_empty() {
            st.hand_back_buffered();
            progressed = true;
        }
        if !st.lifeline.hands_back_held() {
            st.lifeline.hand_back_held();
            self.handlers.wake_all();
            progressed = true;
        }
        progressed
    }

    /// Start what may start, each handler polled as soon as it is started.
    ///
    /// A handler that finishes in its first poll (no await, or nothing to
    /// wait for) is collected before the next one asks for the queue's
    /// concurrency permit: its own permit is back by then, so the next
    /// start finds one free instead of queueing at the semaphore (and being
    /// woken by the release, which would poll this loop once more for
    /// nothing), and its outcome reaches this round's flush.
    ///
    /// Starting stops for this round once `concurrency` handlers have
    /// finished in it, as if each had held its permit until collected: a
    /// round then does no more handlers' work than the permits allow, and
    /// the ledger's time bound is checked between rounds (on a loop kept
    /// busy by CPU-bound handlers, starting on through the whole buffer
    /// would hold finished outcomes for a prefetch's worth of work).
    fn start_handlers(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progressed = false;
        let mut finished = 0;
        while finished < self.concurrency {
            if !self.st.start(&mut self.handlers, cx) {
                break;
            }
            finished += self.collect_finished(cx);
            progressed = true;
        }
        progressed
    }

    /// Flush what the bounds allow.
    fn flush_ledger(&mut self) {
        let st = &mut self.st;
        if st.ledger.held() > 0 {
            // Idle with the prefetch window used up: the broker
            // waits for a settle, so waiting out the delay would
            // only stall it. Idle otherwise (more is on its way, or
            // the queue ran dry): the delay bounds the hold.
            let lost = st.phase.is_lost();
            let idle = self.handlers.is_empty() && (st.buffer.is_empty() || lost);
            let stalled = idle && (lost || st.ledger.window_full());
            let mut force = st.force_flush || stalled || !st.reading;
            // The clock: tokio fires timers only when a worker parks or
            // every few dozen task polls, so a loop kept busy by a
            // saturated queue could otherwise hold a run well past its
            // bound (seen: 16 ms against 2 ms). Every round that holds
            // acknowledgements reads the clock (or takes `finished_at`, the
            // reading made when the last running handler finished); tokio's
            // timer is set only when the loop is about to wait (see
            // `hold_fired`).
            if !force
                && self.hold.passed_at(
                    self.finished_at.unwrap_or_else(tokio::time::Instant::now),
                    st.ledger.delay(),
                )
            {
                force = true;
            }
            st.ledger.flush(force, &mut st.ops);
            if force || st.ledger.held() == 0 {
                self.hold.disarm();
            }
        }
        st.force_flush = false;
    }

    /// What the ledger put out goes to the wire, queued in the ledger's
    /// order by the writer.
    fn send_settles(&mut self, cx: &mut Context<'_>) -> bool {
        let st = &mut self.st;
        if st.ops.is_empty() {
            return false;
        }
        let frames = st.ops.len();
        st.stats.settle_frames.fetch_add(frames, Ordering::Relaxed);
        st.outcomes.frames.increment(frames as u64);
        self.settles.queue(st.ops.drain(..), cx);
        true
    }

    /// Settles done (sent, or failed on a closing channel: the broker
    /// requeues what it did not get a settle for).
    fn poll_settles(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progressed = false;
        while let Poll::Ready(Some((op, result))) = self.settles.poll_next_unpin(cx) {
            progressed = true;
            if let Err(e) = result {
                debug!(queue = %self.st.queue, ?op, error = %e, "settle failed on a closing channel; the broker requeues the delivery");
            }
        }
        progressed
    }

    /// The stream has ended, nothing is buffered, every handler has
    /// returned and every outcome is settled.
    fn finished(&self) -> bool {
        !self.st.reading
            && self.st.buffer.is_empty()
            && self.handlers.is_empty()
            && self.settles.is_empty()
            && self.st.ledger.held() == 0
    }
}

//! The public [`Settler`]: the settle ledger and its writer behind a
//! channel of decisions, run by a task of its own (see the module docs of
//! [`settle`](crate::settle)).

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_layers::{Decision, Delivery, Lifeline};
use futures::StreamExt;
use lapin::Channel;
use tokio::sync::{mpsc, watch};
use tokio::time::{Interval, Sleep};
use tracing::{debug, warn};

use super::book::{deliveries, Book};
use super::ledger::{Bounds, Frame, Settlement};
use super::wire::Writer;
use crate::config::AckBatch;
use crate::convert::delivery_from_lapin_on;

/// How often the settler looks at its channel's status while deliveries
/// are outstanding, so a channel lost while nothing settles is known (and
/// the deliveries' lifeline lost) within this bound.
const LOSS_CHECK: Duration = Duration::from_millis(250);

/// How many queued messages the settler's task takes in one round before it
/// flushes and sends.
const ROUND: usize = 256;

/// Carries out [`Decision`]s on one lapin channel's deliveries through the
/// settle ledger: each delivery settled exactly once, acknowledgements
/// coalesced. See the [module docs](crate::settle) for the rules and an example.
///
/// The ledger lives in a task the settler spawns. It ends after
/// [`close`](Settler::close), or once the settler and every [`Ticket`] are
/// dropped (flushing what it holds first).
///
/// Example: the [module docs](crate::settle); runnable: `examples/own_consumer.rs`.
pub struct Settler {
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Msg>,
    done: watch::Receiver<Option<SettleReport>>,
}

/// One tracked delivery's right to be settled, once. Not `Clone`:
/// [`settle`](Ticket::settle) consumes it.
///
/// ```no_run
/// # fn handled(ticket: acemq::settle::Ticket) {
/// ticket.settle(acemq::Decision::Ack);
/// # }
/// ```
///
/// A second settle does not compile:
///
/// ```compile_fail
/// # fn handled(ticket: acemq::settle::Ticket) {
/// ticket.settle(acemq::Decision::Ack);
/// ticket.settle(acemq::Decision::Ack); // use of a moved value
/// # }
/// ```
///
/// Nor does a copy:
///
/// ```compile_fail
/// # fn handled(ticket: acemq::settle::Ticket) {
/// let copy = ticket.clone(); // no `Clone`
/// # }
/// ```
///
/// **A ticket dropped without `settle` hands its delivery back**: it is
/// nacked with requeue (at its turn, like any settle) and the broker
/// redelivers it. That is what happens to the tickets of a handler task
/// that panics or is aborted.
pub struct Ticket {
    tag: u64,
    settler: Option<(Arc<Shared>, mpsc::UnboundedSender<Msg>)>,
}

/// What [`Ticket::settle`] did with the decision.
///
/// Example: the [module docs](crate::settle); runnable: `examples/own_consumer.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleStatus {
    /// The settler has it and puts it on the wire in ledger order, at the
    /// latest after the [`AckBatch`] time bound (or at once when nothing
    /// else is outstanding). If the channel goes before it is sent, the
    /// report counts it in [`SettleReport::not_sent`].
    Queued,
    /// Nothing was sent: the channel is closed or lost. The broker has
    /// requeued the delivery and redelivers it; there is nothing to do.
    /// Counted in [`SettleReport::not_sent`] (an `Abandoned` decision, which
    /// sends nothing anyway, in [`SettleReport::abandoned`]).
    ChannelClosed,
    /// Nothing was sent: the settler was closed ([`Settler::close`]) before
    /// this ticket was settled. The delivery stays unacknowledged until its
    /// channel closes; then the broker redelivers it. Counted in
    /// [`SettleReport::not_sent`].
    SettlerClosed,
}

/// What a [`Settler`] has done so far, per delivery.
///
/// Example: the [module docs](crate::settle); runnable: `examples/own_consumer.rs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SettleReport {
    /// Deliveries [`track`](Settler::track)ed.
    pub tracked: u64,
    /// Deliveries acknowledged on the wire (a `multiple` ack counts every
    /// delivery it settled).
    pub acked: u64,
    /// `basic.ack` frames sent for them: `acked / ack_frames` is the
    /// coalescing achieved.
    pub ack_frames: u64,
    /// Deliveries requeued on the wire: handed back (`basic.nack` with
    /// requeue, dropped tickets included) or requeued by their handler
    /// (`basic.reject` with requeue).
    pub requeued: u64,
    /// Deliveries rejected without requeue on the wire (`basic.reject`).
    pub rejected: u64,
    /// Deliveries decided `Abandoned`: never settled here; the channel's
    /// close returns them to the broker.
    pub abandoned: u64,
    /// Settles that were not sent: the channel was closed or lost (before
    /// or while they were sent), or the settler was already closed. The
    /// broker redelivers those deliveries; nothing is lost.
    pub not_sent: u64,
    /// Tracked deliveries whose ticket was neither settled nor dropped yet,
    /// at the time of the report.
    pub unsettled: u64,
}

/// The parts a settler, its tickets and its task share.
struct Shared {
    queue: Arc<str>,
    channel: Channel,
    lifeline: Lifeline,
    lost: AtomicBool,
    /// The last tag tracked (0: none yet), to tell when the rules are broken.
    last_tag: AtomicU64,
    tracked: AtomicU64,
    outstanding: AtomicU64,
    acked: AtomicU64,
    ack_frames: AtomicU64,
    requeued: AtomicU64,
    rejected: AtomicU64,
    abandoned: AtomicU64,
    not_sent: AtomicU64,
}

impl Shared {
    /// Whether the channel is known gone; looks at its status when not yet.
    fn check_lost(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        if self.channel.status().connected() {
            return false;
        }
        self.lose();
        true
    }

    fn lose(&self) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            self.lifeline.lose();
            debug!(queue = %self.queue, "settler: the channel is gone; the broker requeued every unsettled delivery, and nothing more is sent");
        }
    }

    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn report(&self) -> SettleReport {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SettleReport {
            tracked: get(&self.tracked),
            acked: get(&self.acked),
            ack_frames: get(&self.ack_frames),
            requeued: get(&self.requeued),
            rejected: get(&self.rejected),
            abandoned: get(&self.abandoned),
            not_sent: get(&self.not_sent),
            unsettled: get(&self.outstanding),
        }
    }
}

/// What the settler and its tickets tell the task, in order.
#[derive(Debug)]
enum Msg {
    Receive(u64),
    Record(u64, Settlement),
    Close,
}

impl Settler {
    /// A settler for the deliveries of `channel`, consumed from `queue`
    /// (the name each [`Delivery`] carries), coalescing acknowledgements
    /// within `ack_batch`'s bounds.
    ///
    /// `prefetch` is the channel's prefetch (what you gave `basic_qos`; `0`
    /// for none). It sets `ack_batch`'s default run length, `min(50,
    /// prefetch / 2)` (at least 1), as for [`App`](crate::App)'s queues (an
    /// explicit count in `ack_batch` ignores it), and tells the settler when
    /// the broker has sent all it will until a settle: with every tracked
    /// delivery decided and the window used up, what is held goes out at
    /// once rather than after the delay.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it spawns the ledger's task).
    pub fn new(
        channel: Channel,
        queue: impl Into<Arc<str>>,
        ack_batch: AckBatch,
        prefetch: u16,
    ) -> Settler {
        let (count, delay) = ack_batch.bounds(prefetch);
        let shared = Arc::new(Shared {
            queue: queue.into(),
            channel,
            lifeline: Lifeline::new(),
            lost: AtomicBool::new(false),
            last_tag: AtomicU64::new(0),
            tracked: AtomicU64::new(0),
            outstanding: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            ack_frames: AtomicU64::new(0),
            requeued: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            not_sent: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let (done_tx, done) = watch::channel(None);
        let bounds = Bounds {
            count,
            delay,
            window: usize::from(prefetch),
        };
        tokio::spawn(run(shared.clone(), bounds, rx, done_tx));
        Settler { shared, tx, done }
    }

    /// Takes a delivery from the channel's consumer stream: returns it as
    /// an acemq [`Delivery`] (its lifeline is this channel's) and the
    /// [`Ticket`] that settles it.
    ///
    /// Call it for **every** delivery of the channel, **in arrival order**
    /// (in the stream's loop, before spawning the handler). The lapin
    /// delivery's `acker` is dropped unused: the ticket is the only way to
    /// settle it.
    pub fn track(&self, delivery: lapin::message::Delivery) -> (Delivery, Ticket) {
        let tag = delivery.delivery_tag;
        let previous = self.shared.last_tag.swap(tag, Ordering::Relaxed);
        if previous != 0 && tag != previous + 1 {
            warn!(queue = %self.shared.queue, delivery_tag = tag, previous, "delivery tags tracked out of sequence: every delivery of the channel must be tracked, in arrival order, by its one settler (no second consumer or basic_get on the channel, no auto-recovery); otherwise a multiple ack may settle a delivery nobody decided");
        }
        let (converted, acker) =
            delivery_from_lapin_on(&self.shared.queue, delivery, &self.shared.lifeline);
        // Never used: a `multiple` ack would not poison it.
        drop(acker);
        Shared::add(&self.shared.tracked, 1);
        Shared::add(&self.shared.outstanding, 1);
        // A closed settler's ticket says so when settled.
        let _ = self.tx.send(Msg::Receive(tag));
        let ticket = Ticket {
            tag,
            settler: Some((self.shared.clone(), self.tx.clone())),
        };
        (converted, ticket)
    }

    /// What the settler has done so far.
    pub fn report(&self) -> SettleReport {
        self.shared.report()
    }

    /// Whether the channel is known closed or lost (then settling sends
    /// nothing; see the [module docs](crate::settle)).
    pub fn is_lost(&self) -> bool {
        self.shared.check_lost()
    }

    /// Sends everything held, waits until every settle is on the wire (or
    /// failed on a closing channel), and returns the final report. Settles
    /// queued before the call are carried out; a ticket settled after it
    /// returns [`SettleStatus::SettlerClosed`] and sends nothing.
    ///
    /// Call it once your consumer is cancelled and every handler has
    /// settled its ticket (the report's [`unsettled`](SettleReport::unsettled)
    /// counts the tickets still out), and **before** closing the channel: a
    /// settle still in flight when the channel closes is lost, and the
    /// broker redelivers that delivery. Calling it again returns the same
    /// report.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: once polled, the settler closes whether or not
    /// the future is kept; dropping it only drops the wait, and a later
    /// call (or [`report`](Self::report)) gives the result.
    pub async fn close(&self) -> SettleReport {
        let _ = self.tx.send(Msg::Close);
        let mut done = self.done.clone();
        let report = match done.wait_for(Option::is_some).await {
            Ok(r) => *r,
            // The task is gone without a report (its runtime shut down).
            Err(_) => None,
        };
        report.unwrap_or_else(|| self.shared.report())
    }
}

impl fmt::Debug for Settler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settler")
            .field("queue", &self.shared.queue)
            .field("channel", &self.shared.channel.id())
            .field("lost", &self.shared.lost.load(Ordering::Relaxed))
            .field("report", &self.shared.report())
            .finish()
    }
}

impl Ticket {
    /// The delivery's tag on its channel.
    pub fn delivery_tag(&self) -> u64 {
        self.tag
    }

    /// Carries out `decision` (see the table in the [module docs](crate::settle)),
    /// once: the ticket is consumed. Returns at once; the settle goes out
    /// in ledger order.
    pub fn settle(mut self, decision: Decision) -> SettleStatus {
        self.finish(Settlement::of(&decision))
    }

    fn finish(&mut self, outcome: Settlement) -> SettleStatus {
        let Some((shared, tx)) = self.settler.take() else {
            return SettleStatus::SettlerClosed;
        };
        shared.outstanding.fetch_sub(1, Ordering::Relaxed);
        if outcome == Settlement::Never {
            Shared::add(&shared.abandoned, 1);
        }
        if shared.check_lost() {
            if outcome != Settlement::Never {
                Shared::add(&shared.not_sent, 1);
            }
            return SettleStatus::ChannelClosed;
        }
        // `Never` too: the ledger keeps it out of every `multiple` run.
        if tx.send(Msg::Record(self.tag, outcome)).is_err() {
            if outcome != Settlement::Never {
                Shared::add(&shared.not_sent, 1);
            }
            return SettleStatus::SettlerClosed;
        }
        SettleStatus::Queued
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.settler.is_some() {
            debug!(
                delivery_tag = self.tag,
                "a ticket was dropped unsettled: handing its delivery back"
            );
            self.finish(Settlement::Requeue);
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("delivery_tag", &self.tag)
            .field("settled", &self.settler.is_none())
            .finish()
    }
}

/// Counts a sent op in the report.
fn count_sent(shared: &Shared, op: Frame) {
    match op {
        Frame::Ack(_) => {
            Shared::add(&shared.acked, 1);
            Shared::add(&shared.ack_frames, 1);
        }
        Frame::AckUpTo { count, .. } => {
            Shared::add(&shared.acked, count as u64);
            Shared::add(&shared.ack_frames, 1);
        }
        Frame::Requeue(_) | Frame::RejectRequeue(_) => Shared::add(&shared.requeued, 1),
        Frame::Reject(_) => Shared::add(&shared.rejected, 1),
    }
}

/// Counts a settle the wire is done with: sent, or failed on a closing
/// channel (which is then lost).
fn settled(shared: &Shared, op: Frame, result: lapin::Result<()>) {
    match result {
        Ok(()) => count_sent(shared, op),
        Err(e) => {
            debug!(queue = %shared.queue, ?op, error = %e, "settle failed on a closing channel; the broker requeues the delivery");
            Shared::add(&shared.not_sent, deliveries(op));
            shared.lose();
        }
    }
}

/// The settler's task: takes what the settler and its tickets send, in
/// order, records it in the ledger, flushes on the bounds and sends, until
/// closed (or every sender is gone) and everything is sent.
async fn run(
    shared: Arc<Shared>,
    bounds: Bounds,
    rx: mpsc::UnboundedReceiver<Msg>,
    done: watch::Sender<Option<SettleReport>>,
) {
    let channel = &shared.channel;
    let mut settles = Writer::new(channel);
    let timer = tokio::time::sleep(bounds.delay);
    tokio::pin!(timer);
    let mut task = Task::new(&shared, bounds, rx, timer);

    loop {
        let mut force = false;
        tokio::select! {
            biased;
            Some((op, result)) = settles.next(), if !settles.is_empty() => {
                settled(&shared, op, result);
            }
            msg = task.rx.recv(), if !task.drained => task.take(msg),
            () = &mut task.timer, if task.timer_armed => force = true,
            _ = task.check.tick(), if !task.book.idle() || task.book.held() > 0 => {
                shared.check_lost();
            }
            // Unreachable: once `rx` is drained everything held is flushed
            // and sent, and the loop ends below.
            else => break,
        }
        task.notice_loss();
        task.flush(force);
        // Queued on the channel in the ledger's order, by the writer.
        if !task.book.ops.is_empty() {
            let ops = &mut task.book.ops;
            std::future::poll_fn(|cx| {
                settles.queue(ops.drain(..), cx);
                std::task::Poll::Ready(())
            })
            .await;
        }
        if task.drained && settles.is_empty() && task.book.held() == 0 {
            break;
        }
    }
    let report = shared.report();
    debug!(queue = %shared.queue, ?report, "settler closed");
    done.send_replace(Some(report));
}

/// The settler's task between rounds, apart from its settles on the wire:
/// the messages it takes, the book, the time bound of what it holds, and
/// the look at the channel's status.
struct Task<'s, 't> {
    shared: &'s Shared,
    rx: mpsc::UnboundedReceiver<Msg>,
    book: Book,
    delay: Duration,
    timer: Pin<&'t mut Sleep>,
    timer_armed: bool,
    check: Interval,
    /// The receiving side is closed (by `close`) or every sender is gone.
    closing: bool,
    /// `rx` has returned `None`: everything queued has been taken.
    drained: bool,
}

impl<'s, 't> Task<'s, 't> {
    fn new(
        shared: &'s Shared,
        bounds: Bounds,
        rx: mpsc::UnboundedReceiver<Msg>,
        timer: Pin<&'t mut Sleep>,
    ) -> Self {
        let mut check = tokio::time::interval(LOSS_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Task {
            shared,
            rx,
            book: Book::new(bounds),
            delay: bounds.delay,
            timer,
            timer_armed: false,
            check,
            closing: false,
            drained: false,
        }
    }

    /// What `rx` gave: a message, then up to a round of those already
    /// queued behind it; or `None`, everything queued has been taken.
    fn take(&mut self, msg: Option<Msg>) {
        match msg {
            Some(msg) => {
                self.handle(msg);
                for _ in 1..ROUND {
                    match self.rx.try_recv() {
                        Ok(msg) => self.handle(msg),
                        Err(_) => break,
                    }
                }
            }
            None => {
                self.closing = true;
                self.drained = true;
            }
        }
    }

    /// One message from the settler or a ticket.
    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Receive(tag) => self.book.receive(tag),
            Msg::Record(tag, outcome) => {
                if !self.book.record(tag, outcome) && outcome != Settlement::Never {
                    Shared::add(&self.shared.not_sent, 1);
                }
            }
            Msg::Close => {
                // What is queued still comes out of `rx`; nothing new gets in.
                self.closing = true;
                self.rx.close();
            }
        }
    }

    /// Once the channel is known lost: what was held or about to be sent
    /// is counted as not sent, and nothing more is.
    fn notice_loss(&mut self) {
        if self.shared.lost.load(Ordering::Acquire) {
            let dropped = self.book.lose();
            Shared::add(&self.shared.not_sent, dropped);
            self.timer_armed = false;
        }
    }

    /// Flushes what the bounds allow; everything held with `force` (the
    /// time bound passed).
    fn flush(&mut self, force: bool) {
        if self.book.held() > 0 {
            // Idle with the prefetch window used up: the broker waits for a
            // settle. Idle with room: more is on its way, the delay bounds
            // the hold (flushing at every lull would ack per burst).
            let stalled = self.book.idle() && self.book.ledger.window_full();
            // The clock as well as the timer (see the consumer loop's
            // flush): a busy runtime fires timers late.
            let late = self.timer_armed && tokio::time::Instant::now() >= self.timer.deadline();
            let force = force || stalled || self.closing || late;
            if !force && !self.timer_armed {
                self.timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + self.delay);
                self.timer_armed = true;
            }
            self.book.flush(force);
            if force || self.book.held() == 0 {
                self.timer_armed = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settlers_and_tickets_move_between_tasks() {
        fn send_sync_static<T: Send + Sync + 'static>() {}
        send_sync_static::<Settler>();
        send_sync_static::<Ticket>();
        send_sync_static::<SettleReport>();
    }
}

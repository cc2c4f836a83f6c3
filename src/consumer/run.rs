//! A generation's loop from start to end: [`ConsumerLoop::run`] builds the
//! generation's state, polls it in rounds until it is finished, and closes
//! its channel.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use acemq_layers::cancel::Slots;
use acemq_layers::{BoxError, Decision, Delivery, Lifeline};
use lapin::{Channel, Consumer};
use tokio::sync::{oneshot, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::Service;
use tracing::debug;

use super::generation::{End, Generation};
use super::handler::Released;
use super::phase::Phase;
use super::rounds::{Rounds, Timer};
use super::stats::{LoopGauge, OutcomeCounters, QueueStats};
use super::strikes::Started;
use super::struck::Struck;
use super::watched::Watched;
use crate::config::PrefetchPolicy;
use crate::settle::ledger::{Bounds, Ledger};
use crate::settle::wire::Writer;

/// Everything one generation's loop is built from.
pub(crate) struct ConsumerLoop<S> {
    pub(crate) queue: Arc<str>,
    pub(crate) channel: Channel,
    pub(crate) consumer: Consumer,
    pub(crate) service: S,
    /// The queue's concurrency permits, shared by its generations (taken
    /// at the stack's claim point; here only a size hint).
    pub(crate) permits: Arc<Semaphore>,
    /// The queue's `concurrency`.
    pub(crate) concurrency: usize,
    pub(crate) policy: PrefetchPolicy,
    pub(crate) dead_letter: bool,
    /// The queue's `consumer_timeout_strikes`.
    pub(crate) timeout_strikes: u32,
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
            permits,
            concurrency,
            policy,
            dead_letter,
            timeout_strikes,
            bounds,
            intake,
            stats,
            lifeline,
            cancel,
            ended,
        } = self;
        stats.loops.fetch_add(1, Ordering::Relaxed);
        let _loops = LoopGauge(&stats);
        let st = Generation {
            queue: &queue,
            channel: &channel,
            service: Struck::new(service, stats.clone(), timeout_strikes),
            ready: false,
            policy,
            dead_letter,
            stats: &stats,
            outcomes: OutcomeCounters::new(&queue),
            lifeline,
            cancel,
            buffer: VecDeque::new(),
            started: Started::default(),
            taken: Vec::new(),
            intake: &intake,
            ledger: Ledger::new(bounds),
            ops: Vec::new(),
            phase: Phase::Consuming,
            reading: true,
            force_flush: false,
            connected: None,
            ended: Some(ended),
        };
        // Each handler runs in a slot whose waker was made with the slot:
        // no allocation or reference count per delivery, and one call wakes
        // them all.
        let handlers = Slots::with_capacity(permits.available_permits());
        let settles = Writer::new(&channel);
        // The handlers' cancellation: the stack's cancel layer registers no
        // waiter (woken_by_transport), the loop wakes every running handler
        // when it fires (`Slots::wake_all`), and a handler started after it
        // is polled once more after its first `Pending`.
        // Only two things cancel it: the loop itself when the generation is
        // lost, and the drain at its deadline — after it stopped intake. So
        // the token is watched only once the phase is stopping (no lock per
        // round of the loop while it consumes), and a loss wakes at once.
        let cancel_seen = st.cancel.clone();
        let handlers_cancelled = cancel_seen.cancelled();
        let stop = intake.cancelled();
        let cancel_answered = stats.consumer_cancelled.cancelled();
        let timer = tokio::time::sleep(bounds.delay);
        let check = tokio::time::sleep(bounds.delay);
        tokio::pin!(stop, cancel_answered, timer, handlers_cancelled, check);
        let mut rounds = Rounds {
            settles,
            handlers,
            concurrency: concurrency.max(1),
            st,
            consumer: &mut consumer,
            reader: Watched::new(),
            stop,
            stop_watch: Watched::new(),
            cancel_answered,
            handlers_cancelled: Some(handlers_cancelled),
            hold: Timer::new(timer),
            check: Timer::new(check),
            finished_at: None,
        };
        poll_fn(|cx| rounds.poll(cx)).await;
        rounds.st.publish_gauges(0);
        close_unless_draining(&channel, &intake).await;
        debug!(queue = %queue, "consumer loop finished");
    }
}

/// In a drain, the drain closes the channel (and reports a close the
/// broker does not answer); otherwise the loop does.
async fn close_unless_draining(channel: &Channel, intake: &CancellationToken) {
    if channel.status().connected() && !intake.is_cancelled() {
        // Every settle is done: closing returns what the broker sent
        // ahead and what was abandoned.
        let _ = crate::connection::close_channel(channel, "OK").await;
    }
}

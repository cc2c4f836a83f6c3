//! One queue's runner: it starts the queue's generations one after another
//! until the drain, and recovers each one that ends — by how it ended.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::{Channel, Connection};
use tokio::sync::oneshot;
use tokio::task::{JoinError, JoinHandle};
use tracing::{error, info, warn};

use super::shared::{
    consume_on, panic_message, sleep_or_stop, Installed, Next, Opened, QueueParts, Shared,
};
use crate::app::error::StartError;
use crate::backoff::{Backoff, BACKOFF_MAX};
use crate::config::QueueConfig;
use crate::connection::{close_channel, ConnectionRole};
use crate::consumer::End;
use crate::topology::Topology;

/// How watching a generation ended: the loop's word, or without one the
/// loop's task result (`None`: not in yet).
type Ending = Result<End, Option<Result<(), JoinError>>>;

/// One queue's runner: runs its generations until the drain.
pub(crate) async fn run_queue(shared: Arc<Shared>, index: usize, first: Installed) {
    let mut runner = Runner {
        shared: &shared,
        index,
        q: &shared.config.queues[index],
        parts: &shared.queues[index],
        backoff: Backoff::new(),
    };
    let mut first = Some(first);
    loop {
        let started = Instant::now();
        let installed = if let Some(i) = first.take() {
            i
        } else {
            match runner.open_next().await {
                Next::On(g) => g,
                Next::Again => continue,
                Next::Stop => return,
            }
        };
        let (join, ended, channel) = installed;
        let stats = &runner.parts.stats;
        if stats.down.load(Ordering::Acquire) {
            stats.down.store(false, Ordering::Release);
        }
        info!(queue = %runner.q.name, "consuming");
        tokio::pin!(join);
        let mut ended = ended;
        let why = runner.watch(join.as_mut(), &mut ended, &channel).await;
        let why = match runner.classify(why, join, &channel).await {
            Next::On(why) => why,
            Next::Again => continue,
            Next::Stop => return,
        };
        if started.elapsed() > BACKOFF_MAX * 3 {
            runner.backoff.reset();
        }
        if let Next::Stop = runner.recover(why).await {
            return;
        }
    }
}

/// A queue's runner: what it keeps across generations.
struct Runner<'a> {
    shared: &'a Shared,
    index: usize,
    q: &'a QueueConfig,
    parts: &'a QueueParts,
    backoff: Backoff,
}

impl Runner<'_> {
    /// Opens the queue's next generation on the consuming connection and
    /// installs it.
    async fn open_next(&mut self) -> Next<Installed> {
        let opened = match self.reopen().await {
            Next::On(o) => o,
            Next::Again => return Next::Again,
            Next::Stop => return Next::Stop,
        };
        let channel = opened.channel.clone();
        match self.shared.install(self.index, opened) {
            Ok(Some(g)) => Next::On(g),
            Ok(None) => {
                // The drain began meanwhile: this consumer never ran.
                let _ = close_channel(&channel, "OK").await;
                Next::Stop
            }
            Err(panic) => {
                let q = self.q;
                error!(queue = %q.name, "building the handler stack panicked ({panic}); the queue is consumed again after a backoff");
                self.parts.stats.down.store(true, Ordering::Release);
                recovered(&q.name, "panic");
                let delay = self.backoff.next_delay();
                self.again_after(delay).await
            }
        }
    }

    /// Waits for the consuming connection, declares the queue again and
    /// opens a channel and a consumer for it; backs off when that fails.
    async fn reopen(&mut self) -> Next<Opened> {
        let shared = self.shared;
        let q = self.q;
        let live = shared.live(ConnectionRole::Consumer);
        let connection = tokio::select! {
            () = shared.intake.cancelled() => return Next::Stop,
            c = live.wait() => match c {
                Some(c) => c,
                // The supervisor holds the cell for the process's life.
                None => return Next::Stop,
            },
        };
        // Each step is bounded by `connect_timeout`: a broker that takes a
        // connection but never answers the queue's declaration or the
        // consume (seen on a cluster after a node was frozen, for about a
        // minute) would otherwise keep this queue unconsumed while it
        // waits; a bounded step fails like any other and is tried again.
        let bound = shared.config.connect_timeout;
        let unanswered = |step: &str| StartError::Consume {
            queue: q.name.clone(),
            message: format!("the broker did not answer {step} within {bound:?} (connect_timeout)"),
        };
        let refused = |e: lapin::Error| StartError::Consume {
            queue: q.name.clone(),
            message: e.to_string(),
        };
        let attempt = async {
            tokio::time::timeout(bound, declare_queue(&shared.topology, &q.name, &connection))
                .await
                .map_err(|_| unanswered("the queue's declaration"))??;
            let channel = tokio::time::timeout(bound, connection.create_channel())
                .await
                .map_err(|_| unanswered("channel.open"))?
                .map_err(refused)?;
            match tokio::time::timeout(bound, consume_on(&shared.name, q, &channel)).await {
                Ok(Ok((consumer, tag))) => Ok(Opened {
                    channel,
                    consumer,
                    tag,
                }),
                Ok(Err(e)) => Err(refused(e)),
                Err(_) => {
                    // Closed, not only dropped: a consume the broker
                    // answers late must not leave a consumer no one reads
                    // holding deliveries; the close cancels it, and the
                    // broker requeues what it sent.
                    let _ = close_channel(&channel, "basic.consume not answered in time").await;
                    Err(unanswered("basic.qos and basic.consume"))
                }
            }
        };
        let result = tokio::select! {
            () = shared.intake.cancelled() => return Next::Stop,
            r = attempt => r,
        };
        match result {
            Ok(o) => Next::On(o),
            Err(e) => {
                // The connection may be the one that failed: let its
                // supervisor look.
                live.suspect();
                let delay = self.backoff.next_delay();
                warn!(queue = %q.name, "could not consume the queue again: {e}; next attempt in {delay:.1?} (readiness is off)");
                self.again_after(delay).await
            }
        }
    }

    /// Watches a generation until it ends. A pause longer than
    /// `pause_hand_back_after` parks it meanwhile (once).
    async fn watch(
        &self,
        mut join: Pin<&mut JoinHandle<()>>,
        ended: &mut oneshot::Receiver<End>,
        channel: &Channel,
    ) -> Ending {
        let gate = &self.parts.gate;
        let bound = self.shared.config.pause_hand_back_after;
        let mut parked = false;
        loop {
            tokio::select! {
                // The loop says why before its task ends: when both are
                // ready, its word comes first (a parked generation read as
                // one that ended without a word would be consumed again at
                // once, and its deliveries handed back twice).
                biased;
                why = &mut *ended => break why.map_err(|_| None),
                res = &mut join => break Err(Some(res)),
                () = gate.paused_for(bound), if !parked => {
                    parked = true;
                    self.park(channel).await;
                }
            }
        }
    }

    /// Cancels the paused generation's consumer and hands its held
    /// deliveries back, so other instances take the work.
    async fn park(&self, channel: &Channel) {
        let q = self.q;
        let bound = self.shared.config.pause_hand_back_after;
        self.parts.stats.parked.store(true, Ordering::Release);
        info!(queue = %q.name, "paused for longer than pause_hand_back_after ({bound:?}): its consumer is cancelled and its deliveries handed back, so other instances take the work; resume consumes it again");
        let tag = format!("{}-{}", self.shared.name, q.name);
        let cancel = channel.basic_cancel(
            tag.as_str().into(),
            lapin::options::BasicCancelOptions::default(),
        );
        if let Err(e) = tokio::time::timeout(crate::connection::CLOSE_BOUND, cancel)
            .await
            .unwrap_or(Ok(()))
        {
            warn!(queue = %q.name, "basic.cancel failed ({e}); closing the channel hands the deliveries back instead");
            let _ = close_channel(channel, "paused").await;
        }
        self.parts.gate.hand_back_held();
    }

    /// Why the generation ended: the loop's word, or without one, nothing —
    /// unless its loop panicked: then its channel is closed and the queue is
    /// consumed again after a backoff.
    async fn classify(
        &mut self,
        why: Ending,
        join: Pin<&mut JoinHandle<()>>,
        channel: &Channel,
    ) -> Next<Option<End>> {
        match why {
            Ok(why) => Next::On(Some(why)),
            Err(res) => {
                // Without a word from the loop: it ended (a panic unwinding
                // drops its sender first). Its result says how.
                let res = match res {
                    Some(r) => r,
                    None => join.await,
                };
                match res {
                    Err(e) if e.is_panic() => {
                        let q = self.q;
                        let msg = panic_message(&*e.into_panic());
                        error!(queue = %q.name, "the consumer loop panicked ({msg}): its channel is closed so its deliveries go back to the broker, and the queue is consumed again after a backoff; readiness is off meanwhile");
                        self.parts.stats.down.store(true, Ordering::Release);
                        recovered(&q.name, "panic");
                        if channel.status().connected() {
                            let _ = close_channel(channel, "consumer loop panicked").await;
                        }
                        let delay = self.backoff.next_delay();
                        self.again_after(delay).await
                    }
                    _ => Next::On(None),
                }
            }
        }
    }

    /// Recovers from a generation's end, by its kind.
    async fn recover(&mut self, why: Option<End>) -> Next {
        let q = self.q;
        let stats = &self.parts.stats;
        match why {
            None | Some(End::Drained) => {
                if self.shared.intake.is_cancelled() {
                    return Next::Stop;
                }
                // Ended without saying why: treat as lost.
                stats.down.store(true, Ordering::Release);
                Next::Again
            }
            Some(End::Lost(e)) => self.recover_lost(e).await,
            Some(End::CancelledByBroker) => self.recover_cancelled().await,
            Some(End::Parked) => {
                tokio::select! {
                    () = self.shared.intake.cancelled() => return Next::Stop,
                    () = self.parts.gate.resumed() => {}
                }
                stats.parked.store(false, Ordering::Release);
                info!(queue = %q.name, "resumed: consuming the queue again");
                Next::Again
            }
            Some(End::StreamLost(why) | End::StreamGone(why) | End::ServiceFailed(why)) => {
                tracing::debug!(queue = %q.name, "the stack failed: {why}");
                stats.down.store(true, Ordering::Release);
                recovered(&q.name, "service-failed");
                let delay = self.backoff.next_delay();
                self.again_after(delay).await
            }
        }
    }

    /// The broker cancelled the consumer and left its channel open (a
    /// deleted queue; RabbitMQ 4.3's consumer timeout): the queue is
    /// declared again and consumed on a new channel. The old generation's
    /// unsettled deliveries are the broker's again: its running handlers
    /// are cancelled, their outcomes dropped, and a message still running
    /// there waits to start on the new channel until that handler ends;
    /// the old channel is closed once they all have.
    async fn recover_cancelled(&mut self) -> Next {
        let q = self.q;
        self.parts.stats.down.store(true, Ordering::Release);
        recovered(&q.name, "cancelled-by-broker");
        let delay = self.backoff.next_delay();
        info!(queue = %q.name, "declaring the queue again and consuming it in {delay:.1?}");
        self.again_after(delay).await
    }

    /// The generation was lost: its channel alone (the broker closed it),
    /// or with its connection.
    async fn recover_lost(&mut self, e: lapin::Error) -> Next {
        let q = self.q;
        let shared = self.shared;
        if shared.intake.is_cancelled() {
            return Next::Stop;
        }
        self.parts.stats.down.store(true, Ordering::Release);
        let live = shared.live(ConnectionRole::Consumer);
        let connection_alive = live.current().is_some_and(|c| c.status().connected());
        if connection_alive {
            let delay = self.backoff.next_delay();
            match reply(&e) {
                Some((code, text)) => warn!(
                    queue = %q.name,
                    reply_code = code,
                    "the broker closed this queue's channel ({code} {text}): {}; consuming again in {delay:.1?} (readiness is off meanwhile)",
                    advice(code, &text)
                ),
                None => {
                    warn!(queue = %q.name, "this queue's channel closed ({e}); consuming again in {delay:.1?} (readiness is off meanwhile)")
                }
            }
            recovered(&q.name, "channel-closed");
            self.again_after(delay).await
        } else {
            // The loss is the connection supervisor's one WARN line; here
            // only what it means for this queue.
            info!(queue = %q.name, "connection lost: this queue's running handlers are cancelled and their outcomes dropped (the broker redelivers those deliveries); consuming again once reconnected");
            recovered(&q.name, "connection-lost");
            live.suspect();
            // Wait for the supervisor to put a new connection in the cell.
            self.fresh_connection().await
        }
    }

    /// Waits until the consuming connection is a connected one.
    async fn fresh_connection(&self) -> Next {
        // A live connection first, as a check before the wait would.
        tokio::select! {
            biased;
            c = self.shared.live(ConnectionRole::Consumer).wait() => {
                if c.is_some() { Next::Again } else { Next::Stop }
            }
            () = self.shared.intake.cancelled() => Next::Stop,
        }
    }

    /// Sleeps `delay`, then goes round again; stops when the drain begins
    /// first.
    async fn again_after<T>(&self, delay: Duration) -> Next<T> {
        if sleep_or_stop(self.shared, delay).await {
            Next::Again
        } else {
            Next::Stop
        }
    }
}

/// Declares again what belongs to queue `q`: itself, its dead-letter queue
/// and its rungs (a deleted queue comes back).
async fn declare_queue(
    topology: &Topology,
    q: &str,
    connection: &Connection,
) -> Result<(), StartError> {
    Ok(topology.declare_for_queue(connection, q).await?)
}

/// A reply code and text out of a lapin error, when the broker sent one.
fn reply(error: &lapin::Error) -> Option<(u16, String)> {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(e) => Some((e.get_id(), e.get_message().to_string())),
        _ => None,
    }
}

/// What to tell an operator about a channel the broker closed.
fn advice(code: u16, text: &str) -> &'static str {
    if code == 406 && text.contains("timed out") {
        "a handler (or an operator pause) held a delivery longer than the broker's \
         consumer_timeout: raise consumer_timeout in rabbitmq.conf, or lower shutdown_timeout \
         and the pause"
    } else if code == 404 {
        "the queue is gone (deleted?): it is declared again"
    } else if code == 406 {
        "the broker refused something this channel did (a second settle of one delivery, or a \
         precondition)"
    } else {
        "the channel is reopened"
    }
}

fn recovered(queue: &str, cause: &'static str) {
    metrics::counter!("acemq.consumer.recoveries", "queue" => queue.to_owned(), "cause" => cause)
        .increment(1);
}

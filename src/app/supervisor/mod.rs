//! The supervisor: two connections (consuming, publishing), each watched and
//! reopened with capped, jittered backoff, and one long-lived runner per
//! queue that starts a generation (a channel and its consumer loop) and
//! recovers it when it ends — a lost connection, a channel the broker closed
//! (`consumer_timeout`, 404, 406), a consumer the broker cancelled (queue
//! deleted), a stack whose `poll_ready` failed, or a loop that panicked.
//!
//! Shaped like mini-redis's listener: the runner owns the queue's
//! concurrency semaphore (shared by its generations, so an old generation's
//! handlers still hold their slots while a new one starts) and hands each
//! generation the shutdown tokens; a generation's whole life is one
//! [`ConsumerLoop`] whose `run` returns when it is done.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_layers::{Cancellation, Lifeline, PauseHandle};
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer, Event};
use tokio::sync::{oneshot, watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::amqp::connection::ConnectionRole;
use crate::amqp::connection::{connect_any_via, ConnectOptions, ConnectionFactory, Via};
use crate::amqp::publisher::Publisher;
use crate::amqp::topology::Topology;
use crate::app::drain::{Link, QueueHandle};
use crate::app::error::StartError;
use crate::app::generation::{LoopFuture, StartCtx, Starter};
use crate::app::health::Health;
use crate::config::{Config, QueueConfig};
use crate::consumer::{End, QueueStats};

/// How often a connection's status is looked at again when no event came.
const STATUS_RECHECK: Duration = Duration::from_secs(1);

/// The first reconnect or recovery delay; it doubles up to [`BACKOFF_MAX`].
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(200);
/// The cap on the reconnect and recovery delay.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Capped exponential backoff with full jitter: each delay is drawn from
/// `[base/2, base]`, so instances restarted together (a broker restart)
/// spread out instead of reconnecting in lockstep — also at the cap, where
/// tower's `ExponentialBackoff` stops jittering.
#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    seed: RandomState,
    n: u64,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff {
            base: BACKOFF_MIN,
            seed: RandomState::new(),
            n: 0,
        }
    }

    /// The next delay.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let r = self.seed.hash_one(self.n);
        self.n += 1;
        let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
        let d = self.base.mul_f64(0.5 + 0.5 * unit);
        self.base = (self.base * 2).min(BACKOFF_MAX);
        d
    }

    pub(crate) fn reset(&mut self) {
        self.base = BACKOFF_MIN;
    }
}

/// One of the two connections: the current one (`None` while it is being
/// reopened), for whoever needs it.
pub(crate) struct Conn {
    pub(crate) role: ConnectionRole,
    pub(crate) tx: watch::Sender<Option<Arc<Connection>>>,
    /// Poked by a runner whose generation was lost with its connection, so
    /// the supervisor looks at once.
    pub(crate) suspect: tokio::sync::Notify,
}

impl Conn {
    pub(crate) fn new(role: ConnectionRole, tx: watch::Sender<Option<Arc<Connection>>>) -> Self {
        Conn {
            role,
            tx,
            suspect: tokio::sync::Notify::new(),
        }
    }

    pub(crate) fn current(&self) -> Option<Arc<Connection>> {
        self.tx.borrow().clone()
    }

    /// Waits until a connection is open.
    async fn connected(&self) -> Arc<Connection> {
        let mut rx = self.tx.subscribe();
        loop {
            if let Some(c) = rx.borrow_and_update().clone() {
                if c.status().connected() {
                    return c;
                }
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// One queue's parts that outlive its generations.
pub(crate) struct QueueSlot {
    pub(crate) starter: Starter,
    pub(crate) gate: PauseHandle,
    pub(crate) stats: Arc<QueueStats>,
    /// The queue's concurrency limit, shared by its generations.
    pub(crate) slots: Arc<Semaphore>,
}

/// What every generation is built from.
pub(crate) struct Shared {
    pub(crate) link: Arc<Link>,
    pub(crate) config: Config,
    pub(crate) addresses: Vec<String>,
    pub(crate) options: ConnectOptions,
    pub(crate) name: String,
    /// The user's connection factory, for every reconnect too.
    pub(crate) factory: Option<ConnectionFactory>,
    pub(crate) slots: Vec<QueueSlot>,
    pub(crate) health: Health,
    pub(crate) publisher: Publisher,
    pub(crate) topology: Topology,
    pub(crate) consume: Conn,
    pub(crate) publish: Conn,
    /// Cancelled when the drain stops intake (every runner and supervisor
    /// stops there).
    pub(crate) intake: CancellationToken,
    /// Cancelled once the broker answered the drain's cancels: in-process
    /// retry waits move to their rungs.
    pub(crate) draining: CancellationToken,
    /// Cancelled at the drain's deadline: every generation's handlers.
    pub(crate) root: CancellationToken,
    pub(crate) tracker: TaskTracker,
}

/// A channel with `basic.qos` and a consumer on it: a generation about to
/// start.
pub(crate) struct Opened {
    pub(crate) channel: Channel,
    pub(crate) consumer: Consumer,
    pub(crate) tag: String,
}

/// Opens a channel and a consumer for `q` on `connection`.
pub(crate) async fn open(
    name: &str,
    q: &QueueConfig,
    connection: &Connection,
) -> Result<Opened, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(q.prefetch, BasicQosOptions::default())
        .await?;
    let tag = format!("{name}-{}", q.name);
    let consumer = channel
        .basic_consume(
            q.name.as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok(Opened {
        channel,
        consumer,
        tag,
    })
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

/// A generation registered as its queue's live one, its loop spawned.
pub(crate) type Installed = (tokio::task::JoinHandle<()>, oneshot::Receiver<End>, Channel);

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

impl Shared {
    /// Builds generation `opened` of queue `index`, registers it as the
    /// queue's live one and spawns its loop — unless the drain has begun.
    pub(crate) fn install(
        &self,
        index: usize,
        opened: Opened,
    ) -> Result<Option<Installed>, String> {
        let q = &self.config.queues[index];
        let slot = &self.slots[index];
        let (tx, rx) = oneshot::channel();
        let cancel = self.root.child_token();
        let ctx = StartCtx {
            queue: q,
            config: &self.config,
            channel: opened.channel.clone(),
            consumer: opened.consumer,
            health: &self.health,
            publisher: &self.publisher,
            intake: &self.intake,
            draining: &self.draining,
            stats: slot.stats.clone(),
            gate: slot.gate.clone(),
            slots: slot.slots.clone(),
            // The handlers' token rides on the lifeline every delivery of
            // the generation shares: the cancellation layer hands it over
            // without a reference count (`CancelLayer::from_cancellation`).
            lifeline: Lifeline::with_cancellation(Cancellation::new(cancel.clone())),
            cancel,
            ended: tx,
        };
        // Building the stack clones the handler: a panicking `Clone` must
        // not take the runner down with it.
        let fut: LoopFuture = panic::catch_unwind(AssertUnwindSafe(|| (slot.starter)(ctx)))
            .map_err(|p| panic_message(&*p))?;
        let mut queues = self.link.queues.lock().unwrap_or_else(|p| p.into_inner());
        if self.intake.is_cancelled() {
            return Ok(None);
        }
        let join = self.tracker.spawn(fut);
        queues[index] = Some(QueueHandle {
            name: q.name.clone(),
            channel: opened.channel.clone(),
            consumer_tag: opened.tag,
            gate: slot.gate.clone(),
            stats: slot.stats.clone(),
        });
        drop(queues);
        slot.stats.down.store(false, Ordering::Release);
        Ok(Some((join, rx, opened.channel)))
    }
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

/// One queue's runner: runs its generations until the drain.
pub(crate) async fn run_queue(shared: Arc<Shared>, index: usize, first: Installed) {
    let q = &shared.config.queues[index];
    let stats = shared.slots[index].stats.clone();
    let mut backoff = Backoff::new();
    let mut first = Some(first);
    loop {
        let started = Instant::now();
        let installed = if let Some(i) = first.take() {
            i
        } else {
            let opened = {
                let connection = tokio::select! {
                    () = shared.intake.cancelled() => return,
                    c = shared.consume.connected() => c,
                };
                let attempt = async {
                    declare_queue(&shared.topology, &q.name, &connection).await?;
                    open(&shared.name, q, &connection)
                        .await
                        .map_err(|e| StartError::Consume {
                            queue: q.name.clone(),
                            message: e.to_string(),
                        })
                };
                let result = tokio::select! {
                    () = shared.intake.cancelled() => return,
                    r = attempt => r,
                };
                match result {
                    Ok(o) => o,
                    Err(e) => {
                        // The connection may be the one that failed: let its
                        // supervisor look.
                        shared.consume.suspect.notify_one();
                        let delay = backoff.next_delay();
                        warn!(queue = %q.name, "could not consume the queue again: {e}; next attempt in {delay:.1?} (readiness is off)");
                        if !sleep_or_stop(&shared, delay).await {
                            return;
                        }
                        continue;
                    }
                }
            };
            let channel = opened.channel.clone();
            match shared.install(index, opened) {
                Ok(Some(g)) => g,
                Ok(None) => {
                    // The drain began meanwhile: this consumer never ran.
                    let _ = tokio::time::timeout(
                        Duration::from_secs(2),
                        channel.close(200, "OK".into()),
                    )
                    .await;
                    return;
                }
                Err(panic) => {
                    error!(queue = %q.name, "building the handler stack panicked ({panic}); the queue is consumed again after a backoff");
                    stats.down.store(true, Ordering::Release);
                    recovered(&q.name, "panic");
                    if !sleep_or_stop(&shared, backoff.next_delay()).await {
                        return;
                    }
                    continue;
                }
            }
        };
        let (join, ended, channel) = installed;
        if stats.down.load(Ordering::Acquire) {
            stats.down.store(false, Ordering::Release);
        }
        info!(queue = %q.name, "consuming");
        tokio::pin!(join);
        let mut ended = ended;
        let gate = &shared.slots[index].gate;
        let bound = shared.config.pause_hand_back_after;
        let mut parked = false;
        let why = loop {
            tokio::select! {
                why = &mut ended => break why.map_err(|_| None),
                res = &mut join => break Err(Some(res)),
                () = gate.paused_for(bound), if !parked => {
                    parked = true;
                    stats.parked.store(true, Ordering::Release);
                    info!(queue = %q.name, "paused for longer than pause_hand_back_after ({bound:?}): its consumer is cancelled and its deliveries handed back, so other instances take the work; resume consumes it again");
                    let tag = format!("{}-{}", shared.name, q.name);
                    let cancel = channel.basic_cancel(tag.as_str().into(), lapin::options::BasicCancelOptions::default());
                    if let Err(e) = tokio::time::timeout(Duration::from_secs(2), cancel).await.unwrap_or(Ok(())) {
                        warn!(queue = %q.name, "basic.cancel failed ({e}); closing the channel hands the deliveries back instead");
                        let _ = tokio::time::timeout(Duration::from_secs(2), channel.close(200, "paused".into())).await;
                    }
                    gate.hand_back_held();
                }
            }
        };
        let why = match why {
            Ok(why) => Some(why),
            Err(res) => {
                // Without a word from the loop: it ended (a panic unwinding
                // drops its sender first). Its result says how.
                let res = match res {
                    Some(r) => r,
                    None => join.await,
                };
                match res {
                    Err(e) if e.is_panic() => {
                        let msg = panic_message(&*e.into_panic());
                        error!(queue = %q.name, "the consumer loop panicked ({msg}): its channel is closed so its deliveries go back to the broker, and the queue is consumed again after a backoff; readiness is off meanwhile");
                        stats.down.store(true, Ordering::Release);
                        recovered(&q.name, "panic");
                        if channel.status().connected() {
                            let _ = tokio::time::timeout(
                                Duration::from_secs(2),
                                channel.close(200, "consumer loop panicked".into()),
                            )
                            .await;
                        }
                        if !sleep_or_stop(&shared, backoff.next_delay()).await {
                            return;
                        }
                        continue;
                    }
                    _ => None,
                }
            }
        };
        if started.elapsed() > BACKOFF_MAX * 3 {
            backoff.reset();
        }
        match why {
            None | Some(End::Drained) => {
                if shared.intake.is_cancelled() {
                    return;
                }
                // Ended without saying why: treat as lost.
                stats.down.store(true, Ordering::Release);
            }
            Some(End::Lost(e)) => {
                if shared.intake.is_cancelled() {
                    return;
                }
                stats.down.store(true, Ordering::Release);
                let connection_alive = shared
                    .consume
                    .current()
                    .is_some_and(|c| c.status().connected());
                if connection_alive {
                    let delay = backoff.next_delay();
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
                    if !sleep_or_stop(&shared, delay).await {
                        return;
                    }
                } else {
                    warn!(queue = %q.name, "the connection was lost: handlers still running are cancelled and their outcomes dropped (the broker redelivers those deliveries); consuming again once reconnected");
                    recovered(&q.name, "connection-lost");
                    shared.consume.suspect.notify_one();
                    // Wait for the supervisor to drop the lost connection.
                    let mut rx = shared.consume.tx.subscribe();
                    loop {
                        let fresh = rx
                            .borrow_and_update()
                            .as_ref()
                            .is_some_and(|c| c.status().connected());
                        if fresh {
                            break;
                        }
                        tokio::select! {
                            () = shared.intake.cancelled() => return,
                            r = rx.changed() => if r.is_err() { return },
                        }
                    }
                }
            }
            Some(End::CancelledByBroker) => {
                stats.down.store(true, Ordering::Release);
                recovered(&q.name, "cancelled-by-broker");
                let delay = backoff.next_delay();
                info!(queue = %q.name, "declaring the queue again and consuming it in {delay:.1?}");
                if !sleep_or_stop(&shared, delay).await {
                    return;
                }
            }
            Some(End::Parked) => {
                tokio::select! {
                    () = shared.intake.cancelled() => return,
                    () = gate.resumed() => {}
                }
                stats.parked.store(false, Ordering::Release);
                info!(queue = %q.name, "resumed: consuming the queue again");
            }
            Some(End::ServiceFailed(why)) => {
                tracing::debug!(queue = %q.name, "the stack failed: {why}");
                stats.down.store(true, Ordering::Release);
                recovered(&q.name, "service-failed");
                if !sleep_or_stop(&shared, backoff.next_delay()).await {
                    return;
                }
            }
        }
    }
}

fn recovered(queue: &str, cause: &'static str) {
    metrics::counter!("acemq.consumer.recoveries", "queue" => queue.to_owned(), "cause" => cause)
        .increment(1);
}

/// Sleeps `delay` unless the drain begins first; `false` when it did.
async fn sleep_or_stop(shared: &Shared, delay: Duration) -> bool {
    tokio::select! {
        () = shared.intake.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

/// Watches one connection; when it is lost, reopens it with capped, jittered
/// backoff (declaring the topology again first, for the consuming one) and
/// publishes the new one. Stops when the drain begins, also mid-outage.
pub(crate) async fn supervise(shared: Arc<Shared>, consuming: bool) {
    let conn = if consuming {
        &shared.consume
    } else {
        &shared.publish
    };
    let role = conn.role;
    loop {
        let Some(connection) = conn.current() else {
            return;
        };
        let mut events: std::pin::Pin<Box<dyn futures::Stream<Item = Event> + Send>> =
            Box::pin(connection.events_listener());
        loop {
            if !connection.status().connected() {
                break;
            }
            tokio::select! {
                () = shared.intake.cancelled() => return,
                () = conn.suspect.notified() => {}
                // A fallback: a broker that closes the connection cleanly
                // (`stop_app`: connection.close 320) is not always reported
                // as an event; the status is looked at again every second.
                () = tokio::time::sleep(STATUS_RECHECK) => {}
                ev = events.next() => match ev {
                    Some(Event::ConnectionBlocked(reason)) => {
                        metrics::counter!("acemq.connection.blocked", "connection" => role.as_str()).increment(1);
                        shared.health.set_blocked(role, true);
                        warn!(connection = role.as_str(), "the broker blocked this connection ({reason}): a resource alarm (memory or disk); publishes wait, and the consumers' connection, which never publishes, keeps acknowledging");
                    }
                    Some(Event::ConnectionUnblocked) => {
                        shared.health.set_blocked(role, false);
                        info!(connection = role.as_str(), "the broker unblocked this connection");
                    }
                    Some(Event::Error(e)) => {
                        warn!(connection = role.as_str(), "connection error: {e}");
                    }
                    Some(_) => {}
                    None => {
                        // No more events: the status tells from now on.
                        events = Box::pin(futures::stream::pending());
                    }
                },
            }
        }
        conn.tx.send_replace(None);
        shared.health.set_connected(role, false);
        shared.health.set_blocked(role, false);
        warn!(
            connection = role.as_str(),
            "the {} connection to the broker was lost; reconnecting with backoff (readiness is off until then)",
            role.as_str()
        );
        let mut backoff = Backoff::new();
        loop {
            let attempt = async {
                let name = format!("{}{}", shared.name, role.suffix());
                let connected = connect_any_via(
                    &shared.addresses,
                    &name,
                    shared.config.connect_timeout,
                    &shared.options,
                    Some(Via {
                        role,
                        factory: shared.factory.as_ref(),
                    }),
                )
                .await?;
                let broker = connected.address.clone();
                let c = Arc::new(connected.connection);
                if consuming {
                    shared.topology.declare(&c).await?;
                }
                Ok::<_, StartError>((c, broker))
            };
            let result = tokio::select! {
                () = shared.intake.cancelled() => return,
                r = attempt => r,
            };
            match result {
                Ok((c, broker)) => {
                    if shared.intake.is_cancelled() {
                        let _ = c.close(200, "OK".into()).await;
                        return;
                    }
                    *shared
                        .link
                        .connection(role)
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
                    conn.tx.send_replace(Some(c));
                    shared.health.set_connected(role, true);
                    shared.health.set_broker(role, Some(broker.clone()));
                    info!(
                        connection = role.as_str(),
                        broker = %broker,
                        "reconnected to the broker{}",
                        if consuming { "; topology declared again, consumers resume" } else { "" }
                    );
                    break;
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    warn!(
                        connection = role.as_str(),
                        "reconnect failed: {e}; next attempt in {delay:.1?}"
                    );
                    if !sleep_or_stop(&shared, delay).await {
                        return;
                    }
                }
            }
        }
    }
}

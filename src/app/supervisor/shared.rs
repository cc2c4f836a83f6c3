//! What the supervisor and every queue's runner share: the two connections
//! (their cells, in the [`Link`]), each queue's long-lived parts, and how a generation is opened and
//! installed.

use crate::sync::Locked;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use acemq_layers::{Cancellation, Lifeline, PauseHandle};
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use tokio::sync::{oneshot, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::drain::{Link, QueueHandle};
use crate::app::generation::{LoopFuture, Source, StartCtx, Starter};
use crate::app::health::Health;
use crate::config::{Config, QueueConfig};
use crate::connection::Live;
use crate::connection::{ConnectOptions, ConnectionFactory, ConnectionRole};
use crate::consumer::{End, QueueStats};
use crate::publisher::Publisher;
use crate::topology::Topology;

/// One queue's parts that outlive its generations.
pub(crate) struct QueueParts {
    pub(crate) starter: Starter,
    pub(crate) gate: PauseHandle,
    pub(crate) stats: Arc<QueueStats>,
    /// The queue's concurrency permits, shared by its generations.
    pub(crate) permits: Arc<Semaphore>,
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
    /// Each queue's parts, in the config's order of queues.
    pub(crate) queues: Vec<QueueParts>,
    pub(crate) health: Health,
    pub(crate) publisher: Publisher,
    pub(crate) topology: Topology,
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
    let (consumer, tag) = consume_on(name, q, &channel).await?;
    Ok(Opened {
        channel,
        consumer,
        tag,
    })
}

/// `basic.qos` and a consumer for `q` on `channel`, with the consumer's tag.
pub(crate) async fn consume_on(
    name: &str,
    q: &QueueConfig,
    channel: &Channel,
) -> Result<(Consumer, String), lapin::Error> {
    channel
        .basic_qos(q.prefetch, BasicQosOptions::default())
        .await?;
    let tag = format!("{name}-{}", q.name);
    let mut arguments = FieldTable::default();
    if let Some(timeout) = q.sent_consumer_timeout() {
        // Milliseconds, as the broker reads it (RabbitMQ 4.3 and later;
        // earlier brokers ignore an argument they do not know).
        let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        arguments.insert(
            "x-consumer-timeout".into(),
            lapin::types::AMQPValue::LongLongInt(ms),
        );
    }
    let consumer = channel
        .basic_consume(
            q.name.as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            arguments,
        )
        .await?;
    Ok((consumer, tag))
}

/// A generation's loop task and the word it sends when it ends.
pub(crate) type Spawned = (tokio::task::JoinHandle<()>, oneshot::Receiver<End>);

/// A generation registered as its queue's live one, its loop spawned.
pub(crate) type Installed = (tokio::task::JoinHandle<()>, oneshot::Receiver<End>, Channel);

impl Shared {
    /// The live connection of `role` (its cell is in the [`Link`]).
    pub(crate) fn live(&self, role: ConnectionRole) -> &Live {
        self.link.connections.get(role)
    }

    /// Builds generation `opened` of queue `index`, registers it as the
    /// queue's live one and spawns its loop — unless the drain has begun.
    pub(crate) fn install(
        &self,
        index: usize,
        opened: Opened,
    ) -> Result<Option<Installed>, String> {
        let channel = opened.channel.clone();
        let source = Source::Queue {
            channel: opened.channel,
            consumer: opened.consumer,
        };
        Ok(self
            .install_source(index, source, Some(channel.clone()), opened.tag)?
            .map(|(join, rx)| (join, rx, channel)))
    }

    /// Builds a generation of queue `index` from `source`, registers it as
    /// the queue's live one and spawns its loop — unless the drain has
    /// begun.
    pub(crate) fn install_source(
        &self,
        index: usize,
        source: Source,
        channel: Option<Channel>,
        tag: String,
    ) -> Result<Option<Spawned>, String> {
        let q = &self.config.queues[index];
        let parts = &self.queues[index];
        let (tx, rx) = oneshot::channel();
        let cancel = self.root.child_token();
        let ctx = StartCtx {
            queue: q,
            config: &self.config,
            source,
            health: &self.health,
            publisher: &self.publisher,
            intake: &self.intake,
            draining: &self.draining,
            stats: parts.stats.clone(),
            gate: parts.gate.clone(),
            permits: parts.permits.clone(),
            // The handlers' token rides on the lifeline every delivery of
            // the generation shares: the cancellation layer hands it over
            // without a reference count (`CancelLayer::from_cancellation`).
            lifeline: Lifeline::with_cancellation(Cancellation::new(cancel.clone())),
            cancel,
            ended: tx,
        };
        // Building the stack clones the handler: a panicking `Clone` must
        // not take the runner down with it.
        let fut: LoopFuture = panic::catch_unwind(AssertUnwindSafe(|| (parts.starter)(ctx)))
            .map_err(|p| panic_message(&*p))?;
        let mut queues = self.link.queues.locked();
        if self.intake.is_cancelled() {
            return Ok(None);
        }
        let join = self.tracker.spawn(fut);
        queues[index] = Some(QueueHandle {
            name: q.name.clone(),
            channel,
            consumer_tag: tag,
            gate: parts.gate.clone(),
            stats: parts.stats.clone(),
        });
        drop(queues);
        parts.stats.down.store(false, Ordering::Release);
        Ok(Some((join, rx)))
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

/// Sleeps `delay` unless the drain begins first; `false` when it did.
pub(super) async fn sleep_or_stop(shared: &Shared, delay: Duration) -> bool {
    tokio::select! {
        () = shared.intake.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

/// What a step of a queue's runner or a connection's supervisor tells its
/// loop.
pub(super) enum Next<T = ()> {
    /// Go on with what the step made.
    On(T),
    /// Go round the loop again.
    Again,
    /// Stop: the drain began.
    Stop,
}

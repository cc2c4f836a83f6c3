//! The type-erased per-queue stack builder: what the supervisor hands a new
//! generation ([`StartCtx`]) and the [`Starter`] that turns it into the
//! generation's consumer loop, building the queue's stack again each time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use acemq_layers::{BoxError, Decision, Delivery, Lifeline, PauseHandle};
use tokio::sync::{oneshot, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::Service;

use crate::app::health::Health;
use crate::config::{Config, QueueConfig};
use crate::consumer::{ConsumerLoop, End, Partition, QueueStats, Released, StreamLoop};
use crate::publisher::Publisher;
use crate::settle::ledger::Bounds;
use crate::stack::Parts;

/// A generation's consumer loop, type-erased.
pub(crate) type LoopFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a generation is started from: its channel and consumer, the
/// queue's parts that outlive generations, and the runner's shared handles.
pub(crate) struct StartCtx<'a> {
    pub(crate) queue: &'a QueueConfig,
    pub(crate) config: &'a Config,
    /// Where the generation's deliveries come from.
    pub(crate) source: Source,
    pub(crate) health: &'a Health,
    pub(crate) publisher: &'a Publisher,
    /// Cancelled when the drain stops intake.
    pub(crate) intake: &'a CancellationToken,
    /// Cancelled once the broker answered the drain's cancels.
    pub(crate) draining: &'a CancellationToken,
    pub(crate) gate: PauseHandle,
    pub(crate) stats: Arc<QueueStats>,
    /// The queue's concurrency permits, shared by its generations.
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) lifeline: Lifeline,
    pub(crate) cancel: CancellationToken,
    pub(crate) ended: oneshot::Sender<End>,
}

/// Builds a queue's stack and loop for one generation (shared by a stream
/// and its work queue).
pub(crate) type Starter = Arc<dyn Fn(StartCtx<'_>) -> LoopFuture + Send + Sync>;

/// A generation's source of deliveries. Made once per generation and
/// moved once into its loop: the size of lapin's consumer costs nothing
/// per delivery.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Source {
    /// A queue: a channel and the consumer on it.
    Queue {
        channel: lapin::Channel,
        consumer: lapin::Consumer,
    },
    /// A stream: a stream connection subscribed to each partition.
    Stream(StreamSource),
}

/// A stream generation's connection, its events and partitions.
pub(crate) struct StreamSource {
    pub(crate) client: crate::stream::StreamClient,
    pub(crate) events: tokio::sync::mpsc::UnboundedReceiver<crate::stream::StreamEvent>,
    pub(crate) partitions: Vec<Partition>,
    pub(crate) fallback: crate::stream::OffsetSpec,
}

impl<'a> StartCtx<'a> {
    /// What the queue's stack is built from for this generation.
    pub(crate) fn stack_parts(&self) -> Parts<'a, Publisher> {
        Parts {
            queue: self.queue,
            gate: self.gate.clone(),
            in_flight: self.health.in_flight().clone(),
            concurrency: Some(self.permits.clone()),
            batch: None,
            publisher: self.publisher.clone(),
            draining: self.draining.clone(),
            // The supervisor (the one maker of a `StartCtx`) puts
            // the handlers' token on every generation's lifeline.
            cancel: self
                .lifeline
                .cancellation()
                .expect("a generation's lifeline carries its handlers' token")
                .clone(),
            abandon_after: self.config.abandon_after,
            woken_by_loop: true,
        }
    }

    /// The generation's consumer loop around `service`, type-erased.
    pub(crate) fn consumer_loop<S>(self, service: S) -> LoopFuture
    where
        S: Service<Delivery, Response = Decision, Error = BoxError> + Send + 'static,
        S::Future: Released + Send + 'static,
    {
        let q = self.queue;
        let (channel, consumer) = match self.source {
            Source::Queue { channel, consumer } => (channel, consumer),
            Source::Stream(s) => {
                let lp = StreamLoop {
                    queue: Arc::from(q.delivery_label()),
                    client: s.client,
                    events: s.events,
                    partitions: s.partitions,
                    consumer_name: q.stream_consumer_name().to_owned(),
                    fallback: s.fallback,
                    service,
                    prefetch: usize::from(q.prefetch),
                    store: q.offset_store,
                    dead_letter: q.dead_letter,
                    intake: self.intake.clone(),
                    stats: self.stats,
                    lifeline: self.lifeline,
                    cancel: self.cancel,
                    ended: self.ended,
                };
                return Box::pin(lp.run());
            }
        };
        let lp = ConsumerLoop {
            queue: Arc::from(q.delivery_label()),
            channel,
            consumer,
            service,
            permits: self.permits,
            concurrency: q.concurrency,
            policy: self.config.prefetch_policy,
            dead_letter: q.dead_letter,
            timeout_strikes: q.consumer_timeout_strikes,
            bounds: ack_bounds(q),
            intake: self.intake.clone(),
            stats: self.stats,
            lifeline: self.lifeline,
            cancel: self.cancel,
            ended: self.ended,
        };
        Box::pin(lp.run())
    }
}

/// The ledger's bounds for a queue.
fn ack_bounds(q: &QueueConfig) -> Bounds {
    let (count, delay) = q.ack_batch.bounds(q.prefetch);
    Bounds {
        count,
        delay,
        window: usize::from(q.prefetch),
    }
}

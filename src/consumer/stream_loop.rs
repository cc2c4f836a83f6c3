//! A stream generation's loop: one stream connection's subscriptions (one
//! per partition) read through the queue's stack, their offsets stored
//! only behind settled work, and the drain's last store confirmed.
//!
//! Chunks arrive in the order the broker sent them (one reader parses the
//! socket in order), so the loop needs no re-ordering. Credit: the broker
//! sends a subscription one chunk per credit; the loop grants one back per
//! chunk while fewer than `prefetch` messages are buffered or in the stack,
//! so what the loop holds is at most `prefetch` messages plus the chunks
//! already granted (`INITIAL_CREDIT` per partition, each at most the
//! broker's largest chunk).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_layers::{BoxError, Decision, Delivery, Lifeline};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tower::Service;
use tracing::{debug, info, warn};

use super::generation::End;
use super::handler::{start_handler, Finished, Handling, Released};
use super::offsets::Offsets;
use super::stats::{record, LoopGauge, OutcomeCounters, QueueStats};
use super::stream_delivery::{delivery_of, delivery_offset, redelivered};
use crate::config::OffsetStore;
use crate::connection::CLOSE_BOUND;
use crate::stream::{Chunk, OffsetSpec, StreamClient, StreamEvent};

/// Chunks granted to each subscription when it starts.
pub(crate) const INITIAL_CREDIT: u16 = 2;

/// One partition of a stream generation: subscription id = its index.
#[derive(Debug)]
pub(crate) struct Partition {
    /// The partition's stream (the stream itself for a plain stream).
    pub(crate) stream: String,
    /// The offset stored under the consumer's name when subscribed.
    pub(crate) stored: Option<u64>,
}

/// Everything one stream generation's loop is built from.
pub(crate) struct StreamLoop<S> {
    /// The name deliveries carry (the config entry's).
    pub(crate) queue: Arc<str>,
    pub(crate) client: StreamClient,
    pub(crate) events: mpsc::UnboundedReceiver<StreamEvent>,
    pub(crate) partitions: Vec<Partition>,
    pub(crate) consumer_name: String,
    /// Where a partition that becomes active starts when nothing is stored.
    pub(crate) fallback: OffsetSpec,
    pub(crate) service: S,
    pub(crate) prefetch: usize,
    pub(crate) store: OffsetStore,
    pub(crate) dead_letter: bool,
    pub(crate) intake: CancellationToken,
    pub(crate) stats: Arc<QueueStats>,
    pub(crate) lifeline: Lifeline,
    pub(crate) cancel: CancellationToken,
    pub(crate) ended: oneshot::Sender<End>,
}

type Running<F> = FuturesUnordered<Pin<Box<Handling<F>>>>;

/// A partition given up whose answer to the broker waits for its running
/// handlers (`stream_sac`), until `by` at the latest.
#[derive(Debug)]
pub(super) struct StepDown {
    pub(super) part: usize,
    pub(super) correlation_id: u32,
    pub(super) by: Instant,
}

/// What the loop keeps of a message between its read and its settle.
pub(super) struct Read {
    pub(super) partition: usize,
    offset: u64,
    delivery: Delivery,
    /// Times handed back and read again here.
    reruns: u32,
}

/// A running loop's state (its answers to a single active consumer's
/// updates: `stream_sac`).
pub(super) struct State<'a> {
    pub(super) queue: &'a Arc<str>,
    pub(super) client: &'a StreamClient,
    pub(super) partitions: Vec<(String, Offsets)>,
    owed: Vec<u16>,
    pub(super) consumer_name: &'a str,
    store: OffsetStore,
    prefetch: usize,
    pub(super) buffer: VecDeque<Delivery>,
    pub(super) read: HashMap<u64, Read>,
    /// Partitions given up whose answer waits for their running handlers.
    pub(super) stepping_down: Vec<StepDown>,
    next_tag: u64,
    lifeline: &'a Lifeline,
    stats: &'a QueueStats,
    outcomes: OutcomeCounters,
    /// `acemq.stream.stores`, registered once.
    stores: metrics::Counter,
    stopping: bool,
}

impl<S> StreamLoop<S>
where
    S: Service<Delivery, Response = Decision, Error = BoxError> + Send + 'static,
    S::Future: Released + Send + 'static,
{
    /// Runs until the drain (or a loss) and every handler is done; at the
    /// drain, stores each partition's offset and confirms it.
    pub(crate) async fn run(self) {
        let StreamLoop {
            queue,
            client,
            mut events,
            partitions,
            consumer_name,
            fallback,
            mut service,
            prefetch,
            store,
            dead_letter,
            intake,
            stats,
            lifeline,
            cancel,
            ended,
        } = self;
        stats.loops.fetch_add(1, Ordering::Relaxed);
        let _gauge = LoopGauge(&stats);
        let mut st = State {
            queue: &queue,
            client: &client,
            owed: vec![0; partitions.len()],
            partitions: partitions
                .into_iter()
                .map(|p| (p.stream, Offsets::new(p.stored)))
                .collect(),
            consumer_name: &consumer_name,
            store,
            prefetch: prefetch.max(1),
            buffer: VecDeque::new(),
            read: HashMap::new(),
            stepping_down: Vec::new(),
            next_tag: 0,
            lifeline: &lifeline,
            stats: &stats,
            outcomes: OutcomeCounters::new(&queue),
            stores: metrics::counter!("acemq.stream.stores", "queue" => queue.to_string()),
            stopping: false,
        };
        let mut running: Running<S::Future> = FuturesUnordered::new();
        let mut tick = tokio::time::interval(st.store.within.min(Duration::from_millis(250)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut end: Option<End> = None;
        loop {
            if (st.stopping || end.is_some()) && running.is_empty() {
                break;
            }
            let can_start = !st.stopping && end.is_none() && !st.buffer.is_empty();
            tokio::select! {
                biased;
                () = intake.cancelled(), if !st.stopping => {
                    st.stop(&mut running);
                }
                Some(done) = running.next(), if !running.is_empty() => {
                    // One clock read for the settle, the store and the step-downs.
                    let now = Instant::now();
                    st.finished(done, now);
                    if end.is_none() {
                        // `every` settled is due at once, not at the tick.
                        st.store_due(now, false);
                        st.step_downs_due(now).await;
                    }
                    st.grant();
                }
                ev = events.recv(), if end.is_none() => match ev {
                    Some(StreamEvent::Chunk(chunk)) => st.chunk(chunk),
                    Some(StreamEvent::ConsumerUpdate { subscription, correlation_id, active }) => {
                        st.consumer_update(subscription, correlation_id, active, fallback).await;
                    }
                    Some(StreamEvent::MetadataUpdate { stream, code }) => {
                        warn!(queue = %queue, stream = %stream, code, "the stream is no longer available (deleted, or its leader moved): its running handlers finish and their outcomes are not stored; it is declared and subscribed again from the stored offset");
                        end = Some(End::StreamGone(format!("{stream}: metadata update {code}")));
                        cancel.cancel();
                        st.hand_back_held(&mut running);
                    }
                    Some(StreamEvent::Closed(e)) => {
                        if !st.stopping {
                            warn!(queue = %queue, error = %e, "the stream connection was lost: running handlers are cancelled and their outcomes not stored; reading again from the stored offset once reconnected");
                        }
                        end = Some(End::StreamLost(e.to_string()));
                        cancel.cancel();
                        st.hand_back_held(&mut running);
                    }
                    Some(StreamEvent::CreditRefused { subscription, code }) => {
                        debug!(queue = %queue, subscription, ?code, "the broker refused credit (the subscription is gone)");
                    }
                    None => {
                        end = Some(End::StreamLost("the stream connection's reader ended".to_owned()));
                        cancel.cancel();
                        st.hand_back_held(&mut running);
                    }
                },
                ready = std::future::poll_fn(|cx| service.poll_ready(cx)), if can_start => match ready {
                    Ok(()) => {
                        let delivery = st.buffer.pop_front().expect("can_start: not empty");
                        running.push(Box::pin(start_handler(&mut service, &queue, delivery, dead_letter)));
                    }
                    Err(e) => {
                        tracing::error!(queue = %queue, error = %e, "the handler service failed (poll_ready returned an error); the stream is subscribed again from the stored offset after a backoff");
                        st.buffer.clear();
                        end = Some(End::ServiceFailed(e.to_string()));
                    }
                },
                _ = tick.tick() => {
                    if end.is_none() {
                        let now = Instant::now();
                        st.store_due(now, false);
                        st.step_downs_due(now).await;
                    }
                }
            }
            st.publish_gauges(running.len());
        }
        if end.is_none() {
            // Stored and confirmed before the subscriptions end: with a
            // single active consumer, ending one hands the partition to
            // the next consumer at once, which starts from the stored
            // offset.
            st.store_due(Instant::now(), true);
            st.confirm().await;
            st.unsubscribe().await;
            let _ = tokio::time::timeout(CLOSE_BOUND, client.close()).await;
            end = Some(End::Drained);
        } else {
            let _ = tokio::time::timeout(CLOSE_BOUND, client.close()).await;
        }
        st.publish_gauges(0);
        let _ = ended.send(end.unwrap_or(End::Drained));
    }
}

impl State<'_> {
    /// The drain stopped intake: no more credit and no chunk taken (the
    /// subscriptions end only after the drain's last store), what no
    /// handler started is handed back (its offsets are not stored), and
    /// held ones go.
    fn stop<F>(&mut self, running: &mut Running<F>)
    where
        F: std::future::Future<Output = Result<Decision, BoxError>> + Released,
    {
        self.stopping = true;
        let handed = self.buffer.len();
        for d in self.buffer.drain(..) {
            self.read.remove(&d.delivery_tag());
        }
        if handed > 0 {
            self.stats.handed_back.fetch_add(handed, Ordering::Relaxed);
            self.stats
                .buffered_after_cancel
                .fetch_add(handed, Ordering::Relaxed);
            self.outcomes.handed_back.increment(handed as u64);
        }
        self.hand_back_held(running);
    }

    /// Marks the lifeline and polls every handler again, so those held
    /// before the claim resolve as handed back.
    fn hand_back_held<F>(&self, running: &mut Running<F>)
    where
        F: std::future::Future<Output = Result<Decision, BoxError>> + Released,
    {
        self.lifeline.hand_back_held();
        let all: Vec<_> = std::mem::take(running).into_iter().collect();
        running.extend(all);
    }

    /// Ends every subscription, each within [`CLOSE_BOUND`].
    async fn unsubscribe(&self) {
        let subs = (0..self.partitions.len()).map(|i| {
            let client = self.client;
            async move {
                let id = u8::try_from(i).unwrap_or(u8::MAX);
                let _ = tokio::time::timeout(CLOSE_BOUND, client.unsubscribe(id)).await;
            }
        });
        futures::future::join_all(subs).await;
    }

    fn chunk(&mut self, chunk: Chunk) {
        if self.stopping {
            // Sent on credit granted before the drain: not read, so not
            // stored; the next consumer reads it.
            return;
        }
        let part = usize::from(chunk.subscription);
        let Some((stream, offsets)) = self.partitions.get_mut(part) else {
            debug!(queue = %self.queue, subscription = chunk.subscription, "a chunk for an unknown subscription; dropped");
            return;
        };
        let stream = stream.clone();
        for m in chunk.messages {
            if !offsets.read(m.offset) {
                continue;
            }
            self.next_tag += 1;
            let tag = self.next_tag;
            let delivery = delivery_of(self.queue, &stream, m, tag, self.lifeline);
            self.read.insert(
                tag,
                Read {
                    partition: part,
                    offset: delivery_offset(&delivery),
                    delivery: delivery.clone(),
                    reruns: 0,
                },
            );
            self.buffer.push_back(delivery);
        }
        self.owed[part] = self.owed[part].saturating_add(1);
        self.grant();
    }

    /// Gives owed credit back while the loop holds fewer than `prefetch`.
    fn grant(&mut self) {
        if self.stopping || self.read.len() >= self.prefetch {
            return;
        }
        for (i, owed) in self.owed.iter_mut().enumerate() {
            if *owed > 0 {
                let id = u8::try_from(i).unwrap_or(u8::MAX);
                if self.client.credit(id, *owed).is_ok() {
                    *owed = 0;
                }
            }
        }
    }

    fn finished(&mut self, (decision, tag, started, held): Finished, now: Instant) {
        let Some(read) = self.read.remove(&tag) else {
            return;
        };
        if held {
            // Handed back before its handler ran: not settled, not stored.
            self.stats.handed_back.fetch_add(1, Ordering::Relaxed);
            self.outcomes.handed_back.increment(1);
            return;
        }
        let took = now.saturating_duration_since(started);
        record(&self.outcomes, self.stats, self.stopping, &decision, took);
        match decision {
            Decision::Ack | Decision::Retry(_) | Decision::DeadLetter(_) => {
                // A retry or a dead letter is settled once its copy is
                // confirmed in the broker (the layers did that first).
                if let Some((_, offsets)) = self.partitions.get_mut(read.partition) {
                    offsets.settle(read.offset, now);
                }
            }
            Decision::HandBack | Decision::Requeue
                if !self.stopping && !self.lifeline.hands_back_held() =>
            {
                // A stream has no requeue: read it again here.
                self.next_tag += 1;
                let reruns = read.reruns.saturating_add(1);
                let again = redelivered(&read.delivery, self.next_tag, self.lifeline, reruns);
                self.read.insert(
                    self.next_tag,
                    Read {
                        delivery: again.clone(),
                        reruns,
                        ..read
                    },
                );
                self.buffer.push_front(again);
            }
            _ => {}
        }
    }

    /// Stores each partition's settled offset where a store is due
    /// (`force`: wherever anything settled is unstored).
    fn store_due(&mut self, now: Instant, force: bool) {
        for (stream, offsets) in &mut self.partitions {
            if let Some(offset) = offsets.due(now, self.store.every, self.store.within, force) {
                match self.client.store_offset(self.consumer_name, stream, offset) {
                    Ok(()) => {
                        offsets.stored(offset);
                        self.stores.increment(1);
                    }
                    Err(e) => {
                        debug!(queue = %self.queue, stream = %stream, error = %e, "storing the offset failed; it is stored at the next chance")
                    }
                }
            }
        }
    }

    /// The drain's last stores, read back: `store_offset` has no answer.
    /// A partition this loop stored nothing to (none read, or another
    /// instance is its active consumer) has nothing to confirm.
    async fn confirm(&self) {
        for (stream, offsets) in &self.partitions {
            let Some(want) = offsets.last_sent() else {
                continue;
            };
            let deadline = tokio::time::Instant::now() + CLOSE_BOUND;
            let mut seen = None;
            while tokio::time::Instant::now() < deadline {
                match tokio::time::timeout_at(
                    deadline,
                    self.client.query_offset(self.consumer_name, stream),
                )
                .await
                {
                    Ok(Ok(Some(o))) if o >= want => {
                        seen = Some(o);
                        break;
                    }
                    Ok(Ok(o)) => seen = o,
                    _ => break,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if seen.is_some_and(|o| o >= want) {
                info!(queue = %self.queue, stream = %stream, consumer = self.consumer_name, offset = want, "offset stored and confirmed at the drain");
            } else {
                warn!(queue = %self.queue, stream = %stream, consumer = self.consumer_name, offset = want, read_back = ?seen, "the drain's offset store was not confirmed within {CLOSE_BOUND:?}: the next start may read up to the offset_store bound again");
            }
        }
    }

    fn publish_gauges(&self, running: usize) {
        self.stats
            .buffered
            .store(self.buffer.len(), Ordering::Relaxed);
        let pending: usize = self.partitions.iter().map(|(_, o)| o.pending()).sum();
        self.stats
            .unsettled
            .store(pending.max(running), Ordering::Relaxed);
    }
}

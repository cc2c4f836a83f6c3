//! A single active consumer's updates in a stream generation's loop: the
//! broker makes this instance a partition's active consumer (it reads from
//! the stored offset), or takes that away. Giving a partition up, what no
//! handler started is left to the next consumer at once, and the broker is
//! answered once the partition's running handlers have ended and what
//! settled is stored (or after [`STEP_DOWN_BOUND`]): the broker activates
//! the next consumer only after that answer, so it starts after everything
//! this instance handled.

use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::stream_loop::{State, StepDown};
use crate::stream::OffsetSpec;

/// How long giving a partition up waits for its running handlers before
/// the broker is answered anyway (their messages are then read again by
/// the next consumer). RabbitMQ closes a connection whose answer is
/// 60 s late.
pub(super) const STEP_DOWN_BOUND: Duration = Duration::from_secs(30);

impl State<'_> {
    /// The broker made this instance the partition's active consumer
    /// (it reads from the stored offset), or took that away (answered by
    /// [`step_downs_due`](Self::step_downs_due)).
    pub(super) async fn consumer_update(
        &mut self,
        sub: u8,
        correlation_id: u32,
        active: bool,
        fallback: OffsetSpec,
    ) {
        let part = usize::from(sub);
        let Some((stream, _)) = self.partitions.get(part) else {
            return;
        };
        let stream = stream.clone();
        if !active {
            let dropped = self.drop_buffered(part);
            let running = self.running_on(part);
            info!(queue = %self.queue, stream = %stream, dropped, running, "no longer the partition's active consumer: what was not started is left to the new one, which starts once the running handlers have ended");
            self.stepping_down.push(StepDown {
                part,
                correlation_id,
                by: Instant::now() + STEP_DOWN_BOUND,
            });
            self.step_downs_due(Instant::now()).await;
            return;
        }
        // A step-down still waiting on this partition is answered first.
        if let Some(i) = self.stepping_down.iter().position(|s| s.part == part) {
            let s = self.stepping_down.swap_remove(i);
            self.give_up(s).await;
        }
        let stored = self
            .client
            .query_offset(self.consumer_name, &stream)
            .await
            .ok()
            .flatten();
        if let Some((_, offsets)) = self.partitions.get_mut(part) {
            offsets.restart(stored);
        }
        info!(queue = %self.queue, stream = %stream, stored = ?stored, "active consumer of the partition: reading from the stored offset");
        let spec = stored.map_or(fallback, |o| OffsetSpec::Offset(o + 1));
        self.answer(correlation_id, spec, &stream).await;
    }

    /// Answers each partition given up whose running handlers have ended,
    /// or whose bound has passed.
    pub(super) async fn step_downs_due(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.stepping_down.len() {
            let (part, by) = (self.stepping_down[i].part, self.stepping_down[i].by);
            // A handler handing its message back put it in the buffer.
            self.drop_buffered(part);
            if self.running_on(part) == 0 || now >= by {
                let s = self.stepping_down.swap_remove(i);
                self.give_up(s).await;
            } else {
                i += 1;
            }
        }
    }

    /// Stores what settled, forgets the rest and answers the broker.
    async fn give_up(&mut self, s: StepDown) {
        let running = self.running_on(s.part);
        let Some((stream, offsets)) = self.partitions.get_mut(s.part) else {
            return;
        };
        let stream = stream.clone();
        if let Some(o) = offsets.due(Instant::now(), 1, Duration::ZERO, true) {
            if self
                .client
                .store_offset(self.consumer_name, &stream, o)
                .is_ok()
            {
                offsets.stored(o);
            }
        }
        offsets.forget_unsettled();
        if running > 0 {
            warn!(queue = %self.queue, stream = %stream, running, "the partition was given up with handlers still running on it (they took over {STEP_DOWN_BOUND:?}, or the broker made this instance active again first): the next consumer reads their messages again");
        }
        self.answer(s.correlation_id, OffsetSpec::Next, &stream)
            .await;
    }

    async fn answer(&self, correlation_id: u32, spec: OffsetSpec, stream: &str) {
        if let Err(e) = self
            .client
            .answer_consumer_update(correlation_id, spec)
            .await
        {
            warn!(queue = %self.queue, stream = %stream, error = %e, "answering the broker's consumer update failed");
        }
    }

    /// Drops the partition's messages no handler started; how many.
    fn drop_buffered(&mut self, part: usize) -> usize {
        let before = self.buffer.len();
        let read = &mut self.read;
        self.buffer.retain(|d| {
            let tag = d.delivery_tag();
            let keep = read.get(&tag).is_none_or(|r| r.partition != part);
            if !keep {
                read.remove(&tag);
            }
            keep
        });
        before - self.buffer.len()
    }

    /// The partition's messages in the stack (read, not buffered, not
    /// finished).
    fn running_on(&self, part: usize) -> usize {
        let read = self.read.values().filter(|r| r.partition == part).count();
        read.saturating_sub(
            self.buffer
                .iter()
                .filter(|d| {
                    self.read
                        .get(&d.delivery_tag())
                        .is_some_and(|r| r.partition == part)
                })
                .count(),
        )
    }
}

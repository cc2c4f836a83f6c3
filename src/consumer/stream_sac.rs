//! A single active consumer's updates in a stream generation's loop: the
//! broker makes this instance a partition's active consumer (it reads from
//! the stored offset), or takes that away (what settled is stored first,
//! what no handler started is left to the next consumer). The broker waits
//! for the answer before it activates the next consumer.

use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::stream_loop::State;
use crate::stream::OffsetSpec;

impl State<'_> {
    /// The broker made this instance the partition's active consumer, or
    /// took that away: start from the stored offset, or store what settled
    /// and forget what is unsettled.
    pub(super) async fn consumer_update(
        &mut self,
        sub: u8,
        correlation_id: u32,
        active: bool,
        fallback: OffsetSpec,
    ) {
        let part = usize::from(sub);
        let Some((stream, offsets)) = self.partitions.get_mut(part) else {
            return;
        };
        let stream = stream.clone();
        let spec = if active {
            let stored = self
                .client
                .query_offset(self.consumer_name, &stream)
                .await
                .ok()
                .flatten();
            offsets.restart(stored);
            info!(queue = %self.queue, stream = %stream, stored = ?stored, "active consumer of the partition: reading from the stored offset");
            stored.map_or(fallback, |o| OffsetSpec::Offset(o + 1))
        } else {
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
            info!(queue = %self.queue, stream = %stream, dropped = before - self.buffer.len(), "no longer the partition's active consumer: what was not started is left to the new one");
            OffsetSpec::Next
        };
        if let Err(e) = self
            .client
            .answer_consumer_update(correlation_id, spec)
            .await
        {
            warn!(queue = %self.queue, stream = %stream, error = %e, "answering the broker's consumer update failed");
        }
    }
}

//! A stream partition's offsets: which messages read are settled, the last
//! offset settled together with everything before it, and when it is due
//! to be stored.
//!
//! Stored offsets only ever name a message whose outcome is settled along
//! with every message read before it: a handler that finishes early does
//! not move the offset past one still running. A stored offset is where the
//! next reader of the consumer's name resumes (after it), so what was
//! settled and not yet stored is read again after a crash: at most
//! `every` messages, or what settled within `within`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// One partition's read, unsettled and settled offsets.
#[derive(Debug)]
pub(crate) struct Offsets {
    /// Read and not yet settled together with everything before them, in
    /// the order read (increasing), each with whether it is settled.
    pending: VecDeque<(u64, bool)>,
    /// Messages at or below this are not taken (already stored or read).
    floor: Option<u64>,
    /// The last offset settled with everything before it.
    settled: Option<u64>,
    /// The last offset stored (sent in a store, or stored when read).
    stored: Option<u64>,
    /// The last offset this reader sent in a store.
    sent: Option<u64>,
    /// Settled since the last store, and when the first of them settled.
    unstored: u32,
    since: Option<Instant>,
}

impl Offsets {
    /// A partition whose stored offset is `stored` (messages at or below
    /// it are dropped when read).
    pub(crate) fn new(stored: Option<u64>) -> Self {
        Offsets {
            pending: VecDeque::new(),
            floor: stored,
            settled: stored,
            stored,
            sent: None,
            unstored: 0,
            since: None,
        }
    }

    /// Takes message `offset` as read; `false` when it is at or below what
    /// was stored or read already (the broker starts at a chunk's first
    /// message, which may be before the offset asked for).
    pub(crate) fn read(&mut self, offset: u64) -> bool {
        if self.floor.is_some_and(|f| offset <= f) {
            return false;
        }
        self.floor = Some(offset);
        self.pending.push_back((offset, false));
        true
    }

    /// Marks `offset` settled; moves the settled offset over every
    /// contiguous settled message at the front.
    pub(crate) fn settle(&mut self, offset: u64, now: Instant) {
        if let Ok(i) = self.pending.binary_search_by_key(&offset, |(o, _)| *o) {
            self.pending[i].1 = true;
        }
        while let Some(&(o, true)) = self.pending.front() {
            self.pending.pop_front();
            self.settled = Some(o);
            self.unstored = self.unstored.saturating_add(1);
            self.since.get_or_insert(now);
        }
    }

    /// The offset to store now, if a store is due: `every` settled since
    /// the last, or the first of them `within` ago (`force`: whenever
    /// anything is unstored, as at the drain).
    pub(crate) fn due(
        &self,
        now: Instant,
        every: u32,
        within: Duration,
        force: bool,
    ) -> Option<u64> {
        let settled = self.settled?;
        if self.stored == Some(settled) {
            return None;
        }
        let due = force
            || self.unstored >= every
            || self
                .since
                .is_some_and(|s| now.saturating_duration_since(s) >= within);
        due.then_some(settled)
    }

    /// A store of `offset` was sent.
    pub(crate) fn stored(&mut self, offset: u64) {
        self.stored = Some(offset);
        self.sent = Some(offset);
        self.unstored = 0;
        self.since = None;
    }

    /// The last offset this reader sent in a store (since it was made or
    /// restarted); `None` when it stored nothing.
    pub(crate) fn last_sent(&self) -> Option<u64> {
        self.sent
    }

    /// Read and not settled together with everything before them.
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Drops what was read and is unsettled (another consumer takes the
    /// partition over from the stored offset); settled offsets stay.
    pub(crate) fn forget_unsettled(&mut self) {
        self.pending.clear();
        self.floor = self.settled;
    }

    /// Starts again from `stored` (the partition became active again, or
    /// was subscribed anew).
    pub(crate) fn restart(&mut self, stored: Option<u64>) {
        *self = Offsets::new(stored);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: u32 = 3;
    const WITHIN: Duration = Duration::from_secs(1);

    #[test]
    fn a_store_never_passes_an_unsettled_message() {
        let now = Instant::now();
        let mut o = Offsets::new(None);
        for off in 10..15 {
            assert!(o.read(off));
        }
        // 11..14 finish before 10: nothing is settled with all before it.
        for off in 11..15 {
            o.settle(off, now);
        }
        assert_eq!(o.due(now, 1, WITHIN, true), None);
        o.settle(10, now);
        assert_eq!(o.due(now, EVERY, WITHIN, false), Some(14));
        o.stored(14);
        assert_eq!(o.due(now, 1, WITHIN, true), None);
        assert_eq!(o.pending(), 0);
    }

    #[test]
    fn stores_are_coalesced_by_count_and_time() {
        let now = Instant::now();
        let mut o = Offsets::new(Some(4));
        assert!(!o.read(3), "at or below the stored offset is dropped");
        assert!(!o.read(4));
        for off in 5..7 {
            assert!(o.read(off));
            o.settle(off, now);
        }
        assert_eq!(
            o.due(now, EVERY, WITHIN, false),
            None,
            "2 < every, not yet within"
        );
        assert_eq!(o.due(now + WITHIN, EVERY, WITHIN, false), Some(6));
        assert!(o.read(7));
        o.settle(7, now);
        assert_eq!(o.due(now, EVERY, WITHIN, false), Some(7), "every reached");
    }

    #[test]
    fn offsets_with_gaps_are_contiguous_in_the_order_read() {
        // Offsets of a stream may skip numbers (entries that are not
        // messages): contiguity is the order read, not arithmetic.
        let now = Instant::now();
        let mut o = Offsets::new(None);
        for off in [0, 1, 5, 9] {
            assert!(o.read(off));
        }
        for off in [9, 0, 1] {
            o.settle(off, now);
        }
        assert_eq!(o.due(now, 1, WITHIN, true), Some(1));
        o.settle(5, now);
        assert_eq!(o.due(now, 1, WITHIN, true), Some(9));
    }

    #[test]
    fn forgetting_unsettled_keeps_what_was_settled() {
        let now = Instant::now();
        let mut o = Offsets::new(None);
        for off in 0..4 {
            o.read(off);
        }
        o.settle(0, now);
        o.settle(2, now);
        o.forget_unsettled();
        assert_eq!(o.due(now, 1, WITHIN, true), Some(0));
        assert!(o.read(1), "read again after the settled offset");
        o.stored(0);
        assert_eq!(o.last_sent(), Some(0));
        o.restart(Some(7));
        assert!(!o.read(7));
        assert_eq!(o.last_sent(), None, "read when subscribed, not sent");
    }
}

//! The settler task's bookkeeping ([`Book`]): what was received and
//! decided, and what to send; no I/O (unit-tested).

use super::ledger::{Bounds, Frame, Ledger, Settlement};

/// The ledger's side of the task: what was received and decided, and what
/// to send; no I/O (unit-tested).
#[derive(Debug)]
pub(super) struct Book {
    pub(super) ledger: Ledger,
    bounds: Bounds,
    /// Tags received and not decided yet.
    pending: u64,
    /// The channel is gone: nothing more is recorded or sent.
    lost: bool,
    pub(super) ops: Vec<Frame>,
}

impl Book {
    pub(super) fn new(bounds: Bounds) -> Self {
        Book {
            ledger: Ledger::new(bounds),
            bounds,
            pending: 0,
            lost: false,
            ops: Vec::new(),
        }
    }

    pub(super) fn receive(&mut self, tag: u64) {
        if self.lost {
            return;
        }
        self.pending += 1;
        self.ledger.receive(tag);
    }

    /// Records an outcome; `false` when the channel is gone (not sent).
    pub(super) fn record(&mut self, tag: u64, outcome: Settlement) -> bool {
        if self.lost {
            return false;
        }
        self.pending = self.pending.saturating_sub(1);
        self.ledger.record(tag, outcome, &mut self.ops);
        true
    }

    /// Every tracked delivery is decided.
    pub(super) fn idle(&self) -> bool {
        self.pending == 0
    }

    pub(super) fn held(&self) -> usize {
        self.ledger.held()
    }

    pub(super) fn flush(&mut self, force: bool) {
        if !self.lost {
            self.ledger.flush(force, &mut self.ops);
        }
    }

    /// The channel is gone: returns how many deliveries' settles were held
    /// or about to be sent (now never sent).
    pub(super) fn lose(&mut self) -> u64 {
        if self.lost {
            return 0;
        }
        self.lost = true;
        self.pending = 0;
        let dropped =
            self.ledger.held() as u64 + self.ops.iter().map(|op| deliveries(*op)).sum::<u64>();
        self.ops.clear();
        self.ledger = Ledger::new(self.bounds);
        dropped
    }
}

/// How many deliveries `op` settles.
pub(super) fn deliveries(op: Frame) -> u64 {
    match op {
        Frame::AckUpTo { count, .. } => count as u64,
        Frame::Ack(_) | Frame::Requeue(_) | Frame::RejectRequeue(_) | Frame::Reject(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn book(count: usize) -> Book {
        Book::new(Bounds {
            count,
            delay: Duration::from_millis(2),
            window: 0,
        })
    }

    #[test]
    fn idle_once_every_received_tag_is_decided() {
        let mut b = book(10);
        b.receive(1);
        b.receive(2);
        assert!(!b.idle());
        assert!(b.record(2, Settlement::Ack));
        assert!(!b.idle());
        assert!(b.record(1, Settlement::Never));
        assert!(b.idle());
        b.flush(true);
        // Tag 1 is never settled, so 2 goes alone: no `multiple` over 1.
        assert_eq!(b.ops, vec![Frame::Ack(2)]);
    }

    #[test]
    fn a_lost_channel_drops_what_was_held_and_records_nothing_more() {
        let mut b = book(10);
        (1..=4).for_each(|t| b.receive(t));
        assert!(b.record(2, Settlement::Ack));
        assert!(b.record(3, Settlement::Requeue));
        b.flush(false);
        assert!(b.ops.is_empty(), "tag 1 is pending: {:?}", b.ops);
        assert_eq!(b.held(), 2);
        assert_eq!(b.lose(), 2);
        assert_eq!(b.lose(), 0, "counted once");
        assert!(b.idle(), "nothing is pending on a lost channel");
        assert!(!b.record(1, Settlement::Ack));
        b.flush(true);
        assert!(b.ops.is_empty());
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn ops_count_the_deliveries_they_settle() {
        assert_eq!(deliveries(Frame::AckUpTo { tag: 9, count: 7 }), 7);
        assert_eq!(deliveries(Frame::Ack(3)), 1);
        assert_eq!(deliveries(Frame::Reject(3)), 1);
        assert_eq!(deliveries(Frame::Requeue(3)), 1);
    }

    #[test]
    fn a_lost_book_counts_ops_not_yet_sent_too() {
        let mut b = book(2);
        (1..=3).for_each(|t| b.receive(t));
        (1..=3).for_each(|t| {
            b.record(t, Settlement::Ack);
        });
        b.flush(false);
        assert_eq!(b.ops, vec![Frame::AckUpTo { tag: 2, count: 2 }]);
        assert_eq!(b.held(), 1);
        assert_eq!(b.lose(), 3);
    }
}

//! The settle ledger for fuzzing and its corpus replay (`fuzz/props/ledger.rs`):
//! not part of acemq's API, hidden from its docs, and free to change with
//! the ledger.

use std::time::Duration;

use super::ledger::{Bounds, Frame, Ledger, Settlement};

/// A frame the ledger asked to send, as the fuzz property checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DoorFrame {
    /// `basic.ack` of one tag.
    Ack(u64),
    /// `basic.ack` with `multiple` up to `tag`, settling `count` deliveries.
    AckUpTo {
        /// The highest tag covered.
        tag: u64,
        /// How many deliveries it settles.
        count: usize,
    },
    /// `basic.nack` with requeue.
    Requeue(u64),
    /// `basic.reject` with requeue.
    RejectRequeue(u64),
    /// `basic.reject` without requeue.
    Reject(u64),
}

/// An outcome recorded for a tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DoorOutcome {
    /// Acknowledge.
    Ack,
    /// Hand back (nack with requeue).
    Requeue,
    /// The handler's requeue (reject with requeue).
    RejectRequeue,
    /// Reject without requeue.
    Reject,
    /// Never settled by this process (abandoned).
    Never,
}

/// One generation's ledger, driven event by event.
#[derive(Debug)]
pub struct LedgerDoor {
    ledger: Ledger,
    out: Vec<Frame>,
}

impl LedgerDoor {
    /// A ledger flushing runs at `count` tags (`0`: coalescing off) for a
    /// channel with prefetch `window` (`0`: unlimited), with the 2 ms delay.
    pub fn new(count: usize, window: usize) -> Self {
        LedgerDoor {
            ledger: Ledger::new(Bounds {
                count,
                delay: Duration::from_millis(2),
                window,
            }),
            out: Vec::new(),
        }
    }

    /// A delivery arrived with `tag`.
    pub fn receive(&mut self, tag: u64) {
        self.ledger.receive(tag);
    }

    /// Records `tag`'s outcome; the frames to send now.
    pub fn record(&mut self, tag: u64, outcome: DoorOutcome) -> Vec<DoorFrame> {
        let outcome = match outcome {
            DoorOutcome::Ack => Settlement::Ack,
            DoorOutcome::Requeue => Settlement::Requeue,
            DoorOutcome::RejectRequeue => Settlement::RejectRequeue,
            DoorOutcome::Reject => Settlement::Reject,
            DoorOutcome::Never => Settlement::Never,
        };
        self.ledger.record(tag, outcome, &mut self.out);
        self.take()
    }

    /// Flushes (`force`: the time bound passed, or the loop is idle); the
    /// frames to send.
    pub fn flush(&mut self, force: bool) -> Vec<DoorFrame> {
        self.ledger.flush(force, &mut self.out);
        self.take()
    }

    /// Outcomes decided and not sent.
    pub fn held(&self) -> usize {
        self.ledger.held()
    }

    /// Whether every tag the prefetch window allows is unsettled.
    pub fn window_full(&self) -> bool {
        self.ledger.window_full()
    }

    fn take(&mut self) -> Vec<DoorFrame> {
        self.out
            .drain(..)
            .map(|f| match f {
                Frame::Ack(t) => DoorFrame::Ack(t),
                Frame::AckUpTo { tag, count } => DoorFrame::AckUpTo { tag, count },
                Frame::Requeue(t) => DoorFrame::Requeue(t),
                Frame::RejectRequeue(t) => DoorFrame::RejectRequeue(t),
                Frame::Reject(t) => DoorFrame::Reject(t),
            })
            .collect()
    }
}

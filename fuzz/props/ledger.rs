//! The `ledger` target's property: the settle ledger (through its hidden
//! door, `acemq::settle::door`) driven by an arbitrary sequence of events —
//! a delivery received, an outcome recorded for any tag received (or not),
//! a flush (forced or not), the channel lost (a new generation, tags from 1
//! again) — checked as the broker would see the frames:
//!
//! - no frame names tag 0, or a tag not received on this generation;
//! - every tag is settled at most once, and only as it was decided (an
//!   `ack` as an ack, a hand-back as a nack, …); an abandoned tag never;
//! - a `multiple` ack covers only tags decided `ack` (or settled before),
//!   and its count is the number of tags it settles;
//! - after a forced flush every decided tag is settled and nothing is held;
//! - with coalescing off, an outcome goes out at once, alone (there the
//!   ledger keeps no book: it is fed one outcome per received tag, as the
//!   loop does).
//!
//! Shared by `fuzz/fuzz_targets/ledger.rs` and the replay test
//! (`tests/fuzz_corpus.rs`).

use acemq::settle::door::{DoorFrame, DoorOutcome, LedgerDoor};

/// One generation under check: what was received, decided and settled.
struct Generation {
    door: LedgerDoor,
    coalescing: bool,
    /// Index = tag; tag 0 unused.
    received: Vec<bool>,
    decided: Vec<Option<DoorOutcome>>,
    settled: Vec<bool>,
}

impl Generation {
    fn new(count: usize, window: usize) -> Self {
        Generation {
            door: LedgerDoor::new(count, window),
            coalescing: count > 0,
            received: vec![false],
            decided: vec![None],
            settled: vec![false],
        }
    }

    fn next_tag(&self) -> u64 {
        self.received.len() as u64
    }

    fn receive(&mut self, gap: u64) {
        // RabbitMQ's tags count up by one; the ledger fills a gap with tags
        // it will not settle, so a gap's tags are never received here.
        for _ in 0..gap {
            self.received.push(false);
            self.decided.push(None);
            self.settled.push(false);
        }
        let tag = self.next_tag();
        self.received.push(true);
        self.decided.push(None);
        self.settled.push(false);
        self.door.receive(tag);
    }

    fn record(&mut self, tag: u64, outcome: DoorOutcome) {
        let t = tag as usize;
        // The loop records one outcome per received tag; a second outcome
        // or one for a tag never received must be ignored by the ledger.
        let first = t < self.received.len() && self.received[t] && self.decided[t].is_none();
        if !self.coalescing && !first {
            // Coalescing off, the ledger keeps no book: the loop's one
            // record per received tag is what keeps settle-once there.
            return;
        }
        if first {
            self.decided[t] = Some(outcome);
        }
        let frames = self.door.record(tag, outcome);
        if !self.coalescing {
            if first && outcome != DoorOutcome::Never {
                assert_eq!(
                    frames.len(),
                    1,
                    "coalescing off: {tag}'s outcome goes out at once, alone: {frames:?}"
                );
            } else if first {
                assert!(
                    frames.is_empty(),
                    "coalescing off: an abandoned tag is never sent: {frames:?}"
                );
            }
        } else {
            assert!(
                frames.is_empty(),
                "coalescing: record sends nothing itself: {frames:?}"
            );
        }
        self.check(&frames);
    }

    fn flush(&mut self, force: bool) {
        let frames = self.door.flush(force);
        self.check(&frames);
        if force {
            assert_eq!(self.door.held(), 0, "a forced flush leaves nothing held");
            for t in 1..self.received.len() {
                if let Some(o) = self.decided[t] {
                    let sent = o != DoorOutcome::Never;
                    assert_eq!(
                        self.settled[t], sent,
                        "tag {t} ({o:?}) after a forced flush"
                    );
                }
            }
        }
    }

    fn settle_one(&mut self, tag: u64, as_: DoorOutcome) {
        let t = tag as usize;
        assert!(tag > 0, "a frame names tag 0");
        assert!(
            t < self.received.len() && self.received[t],
            "a frame names tag {tag}, never received"
        );
        assert!(!self.settled[t], "tag {tag} settled twice");
        assert_eq!(self.decided[t], Some(as_), "tag {tag} settled as {as_:?}");
        self.settled[t] = true;
    }

    fn check(&mut self, frames: &[DoorFrame]) {
        for f in frames {
            match *f {
                DoorFrame::Ack(t) => self.settle_one(t, DoorOutcome::Ack),
                DoorFrame::Requeue(t) => self.settle_one(t, DoorOutcome::Requeue),
                DoorFrame::RejectRequeue(t) => self.settle_one(t, DoorOutcome::RejectRequeue),
                DoorFrame::Reject(t) => self.settle_one(t, DoorOutcome::Reject),
                DoorFrame::AckUpTo { tag, count } => {
                    assert!(tag > 0, "a multiple ack with tag 0");
                    assert!(count > 1, "a multiple ack of {count} tag(s)");
                    let mut covered = 0;
                    for u in 1..=tag as usize {
                        if u < self.received.len() && self.received[u] && !self.settled[u] {
                            assert_eq!(
                                self.decided[u],
                                Some(DoorOutcome::Ack),
                                "the multiple ack to {tag} covers tag {u}"
                            );
                            self.settled[u] = true;
                            covered += 1;
                        }
                    }
                    assert_eq!(covered, count, "the count of the multiple ack to {tag}");
                }
            }
        }
    }
}

fn outcome(b: u8) -> DoorOutcome {
    match b % 8 {
        0 => DoorOutcome::Requeue,
        1 => DoorOutcome::Reject,
        2 => DoorOutcome::RejectRequeue,
        3 => DoorOutcome::Never,
        _ => DoorOutcome::Ack,
    }
}

/// The property, on raw bytes: the first two pick the bounds (count 0–15,
/// window 0–63), then each byte (with the next as its argument) is an
/// event. At most 4,096 events.
pub(crate) fn check(data: &[u8]) {
    let (count, window) = match data {
        [c, w, ..] => (usize::from(c % 16), usize::from(w % 64)),
        _ => return,
    };
    let mut g = Generation::new(count, window);
    let mut bytes = data[2..].iter().copied().take(8192);
    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        match op % 8 {
            0..=2 => g.receive(u64::from(arg % 4 == 0) * u64::from(arg % 3)),
            3 | 4 => {
                // Mostly a received tag without an outcome; sometimes any.
                let n = g.next_tag();
                let tag = if arg & 0x80 == 0 && n > 1 {
                    let open: Vec<u64> = (1..n)
                        .filter(|&t| g.received[t as usize] && g.decided[t as usize].is_none())
                        .collect();
                    if open.is_empty() {
                        u64::from(arg)
                    } else {
                        open[usize::from(arg) % open.len()]
                    }
                } else {
                    u64::from(arg & 0x7f)
                };
                g.record(tag, outcome(arg.rotate_right(3)));
            }
            5 | 6 => g.flush(arg % 3 == 0),
            _ => {
                // The channel lost: what was not sent is never sent on it;
                // a new generation starts at tag 1.
                g = Generation::new(count, window);
            }
        }
    }
    // Every remaining tag decided, then a forced flush: all settled once.
    for t in 1..g.next_tag() {
        if g.received[t as usize] && g.decided[t as usize].is_none() {
            g.record(t, DoorOutcome::Ack);
        }
    }
    g.flush(true);
    for t in 1..g.received.len() {
        if g.received[t] {
            let never = g.decided[t] == Some(DoorOutcome::Never);
            assert_eq!(
                g.settled[t], !never,
                "tag {t} at the end ({:?})",
                g.decided[t]
            );
        }
    }
}

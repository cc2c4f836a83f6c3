//! The settle ledger: the only path by which a generation's deliveries are
//! settled, coalescing acknowledgements while each delivery keeps its own
//! outcome.
//!
//! The loop records every delivery tag as it arrives and every outcome as
//! its handler finishes. The ledger sends one `basic.ack` with `multiple`
//! for the longest contiguous run of acknowledged tags from the lowest
//! unsettled one; a nack (hand back) or reject in the run's way goes out on
//! its own, at its turn, after the run before it. Acknowledged tags held
//! above a lower tag that is not settled yet (a long handler, an in-process
//! wait, an abandoned handler) go out singly once the time bound passes, so
//! they never stall the window. Every tag is settled exactly once.
//!
//! This is Bloomberg rmqcpp's `MultipleAckHandler` model: runs are
//! coalesced, outcomes are not merged.
//!
//! Rules that keep settle-once (facts of lapin 4.12.3 and RabbitMQ 3.10):
//! a `multiple` ack covers every unacknowledged tag up to its own, so it is
//! only sent when every tag it covers is decided `ack` or already settled;
//! nothing here ever sends tag 0 with `multiple` (lapin would drop its own
//! buffer); and lapin's `Acker`s are never used, since a `multiple` ack does
//! not poison the ones it covers.

use std::collections::VecDeque;
use std::time::Duration;

use acemq_layers::{Decision, RetryDecision, RetryVia};

/// What the ledger asks the loop to send, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// `basic.ack` of one tag.
    Ack(u64),
    /// `basic.ack` with `multiple`: every unacknowledged tag up to `tag`,
    /// which settles `count` deliveries (the ledger's acked tags it covers).
    AckUpTo {
        /// The highest tag covered.
        tag: u64,
        /// How many deliveries it settles.
        count: usize,
    },
    /// `basic.nack` with `requeue`: hand back (a drain, the pause gate, a
    /// cancelled handler; not counted by RabbitMQ 4.3's quorum queues).
    Requeue(u64),
    /// `basic.reject` with `requeue`: the handler gave the delivery back
    /// (counted in `x-delivery-count` by quorum queues on every version).
    RejectRequeue(u64),
    /// `basic.reject` without requeue: to the queue's dead-letter exchange.
    Reject(u64),
}

/// One delivery's state in the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TagState {
    /// Received; no outcome yet (handler running, waiting, or buffered).
    Pending,
    /// Decided, not sent yet.
    Ack,
    Requeue,
    RejectRequeue,
    Reject,
    /// Never settled by this process (an abandoned handler): the channel's
    /// close returns it. Blocks every run that would cover it.
    Never,
    /// Sent.
    Settled,
}

impl TagState {
    /// The frame that settles this entry's tag alone, when it is decided
    /// and not sent.
    fn single(self, tag: u64) -> Option<Frame> {
        match self {
            TagState::Ack => Some(Frame::Ack(tag)),
            TagState::Requeue => Some(Frame::Requeue(tag)),
            TagState::RejectRequeue => Some(Frame::RejectRequeue(tag)),
            TagState::Reject => Some(Frame::Reject(tag)),
            TagState::Pending | TagState::Never | TagState::Settled => None,
        }
    }
}

/// The bounds of coalescing for one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// Flush a run when it reaches this many tags; `0` turns coalescing off
    /// (every outcome is sent on its own at once).
    pub(crate) count: usize,
    /// Flush whatever is held once the oldest held outcome is this old.
    pub(crate) delay: Duration,
    /// The channel's prefetch (`0`: unlimited). When every tag it allows
    /// is unsettled the broker sends nothing more, so an idle loop must
    /// flush at once rather than wait out `delay`.
    pub(crate) window: usize,
}

/// A generation's ledger (one channel: a reconnect starts a new one).
#[derive(Debug)]
pub(crate) struct Ledger {
    bounds: Bounds,
    /// The tag of `entries[0]`.
    base: u64,
    entries: VecDeque<TagState>,
    /// Decided outcomes not sent yet.
    held: usize,
    /// Of those, the ones sent singly (requeues and rejects): a flush
    /// that is not forced has nothing to send while there are none and
    /// fewer than `count` acknowledgements are held, and returns at once.
    singles: usize,
    /// Tags received and not sent yet (the broker counts them against the
    /// prefetch window).
    open: usize,
}

impl Ledger {
    pub(crate) fn new(bounds: Bounds) -> Self {
        Ledger {
            bounds,
            base: 1,
            entries: VecDeque::new(),
            held: 0,
            singles: 0,
            open: 0,
        }
    }

    /// Whether outcomes are held at all.
    pub(crate) fn coalescing(&self) -> bool {
        self.bounds.count > 0
    }

    pub(crate) fn delay(&self) -> Duration {
        self.bounds.delay
    }

    /// Outcomes decided and not sent yet.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Whether the broker has sent all the prefetch window allows and waits
    /// for a settle: the loop, if it has nothing else to do, flushes now.
    pub(crate) fn window_full(&self) -> bool {
        self.bounds.window > 0 && self.open >= self.bounds.window
    }

    /// A delivery arrived with `tag`. Tags on one channel count up from 1;
    /// a gap (never seen from RabbitMQ) is filled with tags this ledger
    /// will not settle.
    pub(crate) fn receive(&mut self, tag: u64) {
        if !self.coalescing() {
            return;
        }
        if self.entries.is_empty() && tag >= self.base {
            self.base = tag;
        }
        let next = self.base + self.entries.len() as u64;
        if tag < next {
            // Out of order (not seen from RabbitMQ): keep it out of every run.
            return;
        }
        for _ in next..tag {
            self.entries.push_back(TagState::Settled);
        }
        self.entries.push_back(TagState::Pending);
        self.open += 1;
    }

    /// Records the outcome of `tag`. With coalescing off, the op to send
    /// now is pushed to `out`.
    pub(crate) fn record(&mut self, tag: u64, outcome: Settlement, out: &mut Vec<Frame>) {
        if !self.coalescing() {
            match outcome {
                Settlement::Ack => out.push(Frame::Ack(tag)),
                Settlement::Requeue => out.push(Frame::Requeue(tag)),
                Settlement::RejectRequeue => out.push(Frame::RejectRequeue(tag)),
                Settlement::Reject => out.push(Frame::Reject(tag)),
                Settlement::Never => {}
            }
            return;
        }
        let Some(i) = tag.checked_sub(self.base).map(|i| i as usize) else {
            // Below the window: settled already. Never settle twice.
            return;
        };
        // Already decided, or never received: never settle twice.
        if let Some(e @ TagState::Pending) = self.entries.get_mut(i) {
            *e = match outcome {
                Settlement::Ack => TagState::Ack,
                Settlement::Requeue => TagState::Requeue,
                Settlement::RejectRequeue => TagState::RejectRequeue,
                Settlement::Reject => TagState::Reject,
                Settlement::Never => TagState::Never,
            };
            if outcome != Settlement::Never {
                self.held += 1;
            }
            if matches!(
                outcome,
                Settlement::Requeue | Settlement::RejectRequeue | Settlement::Reject
            ) {
                self.singles += 1;
            }
        }
    }

    /// Sends what the bounds allow: runs from the front that reached the
    /// count, and the nacks/rejects at the front. With `force` (the time
    /// bound passed, the loop is idle, or a cancel, close or drain step is
    /// next) everything decided goes out: the run as one `multiple` ack,
    /// and outcomes stuck above an unsettled tag singly.
    pub(crate) fn flush(&mut self, force: bool, out: &mut Vec<Frame>) {
        if !self.coalescing() || self.held == 0 {
            return;
        }
        // No run can reach the count (a run is of held acknowledgements)
        // and no requeue or reject waits for its turn: nothing to send.
        if !force && self.held < self.bounds.count && self.singles == 0 {
            return;
        }
        // The contiguous front.
        let mut run_end: Option<u64> = None;
        let mut run_len = 0usize;
        let mut i = 0usize;
        while i < self.entries.len() {
            let tag = self.base + i as u64;
            match self.entries[i] {
                TagState::Settled => {}
                TagState::Ack => {
                    run_end = Some(tag);
                    run_len += 1;
                    if run_len >= self.bounds.count {
                        self.send_run(run_end.take(), run_len, out);
                        run_len = 0;
                    }
                }
                TagState::Requeue | TagState::RejectRequeue | TagState::Reject => {
                    // Its turn: the run before it first, then it alone.
                    self.send_run(run_end.take(), run_len, out);
                    run_len = 0;
                    out.push(self.entries[i].single(tag).expect("a settle"));
                    self.entries[i] = TagState::Settled;
                    self.held -= 1;
                    self.singles -= 1;
                    self.open -= 1;
                }
                TagState::Pending | TagState::Never => break,
            }
            i += 1;
        }
        if force {
            self.send_run(run_end.take(), run_len, out);
            // Stuck above the first unsettled tag: singly.
            for j in i..self.entries.len() {
                let tag = self.base + j as u64;
                let Some(op) = self.entries[j].single(tag) else {
                    continue;
                };
                if !matches!(op, Frame::Ack(_)) {
                    self.singles -= 1;
                }
                out.push(op);
                self.entries[j] = TagState::Settled;
                self.held -= 1;
                self.open -= 1;
            }
        }
        self.compact();
        debug_assert_eq!(
            self.singles,
            self.entries
                .iter()
                .filter(|e| matches!(
                    e,
                    TagState::Requeue | TagState::RejectRequeue | TagState::Reject
                ))
                .count(),
            "the count of held requeues and rejects"
        );
    }

    /// Sends the run ending at `end` (of `len` acked tags): one `multiple`
    /// ack, or a single ack when it is one tag.
    fn send_run(&mut self, end: Option<u64>, len: usize, out: &mut Vec<Frame>) {
        let Some(end) = end else { return };
        if len == 0 {
            return;
        }
        out.push(if len == 1 {
            Frame::Ack(end)
        } else {
            Frame::AckUpTo {
                tag: end,
                count: len,
            }
        });
        let upto = (end - self.base) as usize;
        for e in self.entries.iter_mut().take(upto + 1) {
            if *e == TagState::Ack {
                *e = TagState::Settled;
                self.held -= 1;
                self.open -= 1;
            }
        }
    }

    /// Drops settled tags from the front.
    fn compact(&mut self) {
        while self.entries.front() == Some(&TagState::Settled) {
            self.entries.pop_front();
            self.base += 1;
        }
    }
}

/// A delivery's settle, as the ledger sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settlement {
    Ack,
    /// Hand back: `basic.nack` with requeue.
    Requeue,
    /// The handler's own requeue: `basic.reject` with requeue.
    RejectRequeue,
    Reject,
    /// Not settled by this process (abandoned).
    Never,
}

impl Settlement {
    /// How a [`Decision`] is carried out: the one mapping the consumer loop
    /// and [`Settler`](crate::settle::Settler) share.
    ///
    /// - acknowledge: `Ack`, a retry whose copy is on a rung (published and
    ///   confirmed), a dead-letter whose copy is in `Q.dlq`;
    /// - reject without requeue (the queue's own dead-letter exchange, or
    ///   gone): a dead-letter whose copy was not published;
    /// - never settled (the channel's close returns it): `Abandoned`;
    /// - requeue counted as a failure (reject with requeue): the handler's
    ///   `Requeue`;
    /// - hand back (nack with requeue): `HandBack`, an in-process retry no
    ///   retry layer carried out, and anything newer.
    pub(crate) fn of(decision: &Decision) -> Settlement {
        match decision {
            Decision::Ack
            | Decision::Retry(RetryDecision {
                via: RetryVia::Rung(_),
                ..
            }) => Settlement::Ack,
            Decision::DeadLetter(d) if d.published => Settlement::Ack,
            Decision::DeadLetter(_) => Settlement::Reject,
            Decision::Abandoned => Settlement::Never,
            Decision::Requeue
            | Decision::Retry(RetryDecision {
                via: RetryVia::Queue,
                ..
            }) => Settlement::RejectRequeue,
            _ => Settlement::Requeue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(count: usize) -> Ledger {
        Ledger::new(Bounds {
            count,
            delay: Duration::from_millis(2),
            window: 0,
        })
    }

    #[test]
    fn the_window_is_full_when_every_prefetched_tag_is_unsettled() {
        let mut l = Ledger::new(Bounds {
            count: 2,
            delay: Duration::from_millis(2),
            window: 3,
        });
        let mut out = Vec::new();
        for t in 1..=3 {
            l.receive(t);
        }
        assert!(l.window_full(), "3 received, none settled");
        l.record(1, Settlement::Ack, &mut out);
        l.flush(false, &mut out);
        assert!(out.is_empty(), "1 held: below the count");
        assert!(
            l.window_full(),
            "a held ack still counts against the window"
        );
        l.flush(true, &mut out);
        assert_eq!(out, vec![Frame::Ack(1)]);
        assert!(!l.window_full(), "one sent: room for one more");
        l.receive(4);
        assert!(l.window_full());
        l.record(3, Settlement::Never, &mut out);
        l.record(2, Settlement::Reject, &mut out);
        l.flush(false, &mut out);
        assert_eq!(out, vec![Frame::Ack(1), Frame::Reject(2)]);
        assert!(
            !l.window_full(),
            "the reject went out; the abandoned tag stays open"
        );
        l.receive(5);
        assert!(l.window_full());
    }

    fn run(l: &mut Ledger, events: &[(u64, Settlement)]) -> Vec<Frame> {
        let mut out = Vec::new();
        for &(t, o) in events {
            l.record(t, o, &mut out);
            l.flush(false, &mut out);
        }
        out
    }

    #[test]
    fn a_contiguous_run_goes_out_as_one_multiple_ack_at_the_count() {
        let mut l = ledger(4);
        (1..=8).for_each(|t| l.receive(t));
        let out = run(
            &mut l,
            &(1..=8).map(|t| (t, Settlement::Ack)).collect::<Vec<_>>(),
        );
        assert_eq!(
            out,
            vec![
                Frame::AckUpTo { tag: 4, count: 4 },
                Frame::AckUpTo { tag: 8, count: 4 }
            ]
        );
        assert_eq!(l.held(), 0);
    }

    #[test]
    fn a_nack_in_the_middle_goes_out_alone_at_its_turn_after_the_run_before_it() {
        let mut l = ledger(10);
        (1..=5).for_each(|t| l.receive(t));
        let mut out = run(
            &mut l,
            &[
                (1, Settlement::Ack),
                (2, Settlement::Ack),
                (3, Settlement::Requeue),
                (4, Settlement::Ack),
                (5, Settlement::Reject),
            ],
        );
        l.flush(true, &mut out);
        assert_eq!(
            out,
            vec![
                Frame::AckUpTo { tag: 2, count: 2 },
                Frame::Requeue(3),
                Frame::Ack(4),
                Frame::Reject(5)
            ]
        );
    }

    #[test]
    fn a_handlers_requeue_is_a_reject_at_its_turn_and_a_hand_back_stays_a_nack() {
        // The handler's requeue (counted by quorum queues on every version)
        // and the drain's hand-back (a nack, not counted on RabbitMQ 4.3)
        // each go out alone, in tag order, between the coalesced runs.
        let mut l = ledger(10);
        (1..=6).for_each(|t| l.receive(t));
        let mut out = run(
            &mut l,
            &[
                (1, Settlement::Ack),
                (2, Settlement::RejectRequeue),
                (3, Settlement::Ack),
                (4, Settlement::Ack),
                (5, Settlement::Requeue),
                (6, Settlement::Ack),
            ],
        );
        l.flush(true, &mut out);
        assert_eq!(
            out,
            vec![
                Frame::Ack(1),
                Frame::RejectRequeue(2),
                Frame::AckUpTo { tag: 4, count: 2 },
                Frame::Requeue(5),
                Frame::Ack(6)
            ]
        );
        // Above a pending tag, at the time bound: singly, as what it is.
        let mut l = ledger(10);
        (1..=3).for_each(|t| l.receive(t));
        let mut out = run(
            &mut l,
            &[(2, Settlement::RejectRequeue), (3, Settlement::Ack)],
        );
        assert!(out.is_empty(), "tag 1 is pending: {out:?}");
        l.flush(true, &mut out);
        assert_eq!(out, vec![Frame::RejectRequeue(2), Frame::Ack(3)]);
        // Coalescing off: at once.
        let mut l = ledger(0);
        let mut out = Vec::new();
        l.record(7, Settlement::RejectRequeue, &mut out);
        assert_eq!(out, vec![Frame::RejectRequeue(7)]);
    }

    #[test]
    fn acks_above_a_pending_tag_wait_for_the_bound_then_go_out_singly() {
        let mut l = ledger(2);
        (1..=4).for_each(|t| l.receive(t));
        let mut out = run(
            &mut l,
            &[
                (2, Settlement::Ack),
                (3, Settlement::Ack),
                (4, Settlement::Ack),
            ],
        );
        assert!(out.is_empty(), "nothing may cover pending tag 1: {out:?}");
        l.flush(true, &mut out);
        assert_eq!(out, vec![Frame::Ack(2), Frame::Ack(3), Frame::Ack(4)]);
        // Tag 1 finishes later: it goes alone, and nothing is sent twice.
        let mut out = Vec::new();
        l.record(1, Settlement::Ack, &mut out);
        l.flush(true, &mut out);
        assert_eq!(out, vec![Frame::Ack(1)]);
        assert_eq!(l.held(), 0);
    }

    #[test]
    fn an_abandoned_tag_is_never_covered_by_a_multiple_ack() {
        let mut l = ledger(2);
        (1..=3).for_each(|t| l.receive(t));
        let mut out = run(
            &mut l,
            &[
                (1, Settlement::Never),
                (2, Settlement::Ack),
                (3, Settlement::Ack),
            ],
        );
        l.flush(true, &mut out);
        assert_eq!(out, vec![Frame::Ack(2), Frame::Ack(3)]);
    }

    #[test]
    fn a_second_outcome_for_a_tag_is_ignored() {
        let mut l = ledger(8);
        l.receive(1);
        let mut out = Vec::new();
        l.record(1, Settlement::Ack, &mut out);
        l.record(1, Settlement::Reject, &mut out);
        l.flush(true, &mut out);
        l.record(1, Settlement::Ack, &mut out);
        l.flush(true, &mut out);
        assert_eq!(out, vec![Frame::Ack(1)]);
    }

    #[test]
    fn each_decision_maps_to_its_settle() {
        use acemq_layers::{DeadLetterDecision, Reason};
        let dead = |published| {
            Decision::DeadLetter(DeadLetterDecision {
                reason: Reason::Rejected,
                error: "no".into(),
                attempts: 1,
                published,
            })
        };
        let retry = |via| {
            Decision::Retry(RetryDecision {
                attempt: 2,
                delay: Duration::from_secs(1),
                via,
            })
        };
        assert_eq!(Settlement::of(&Decision::Ack), Settlement::Ack);
        assert_eq!(
            Settlement::of(&retry(RetryVia::Rung("q.retry.1s".into()))),
            Settlement::Ack
        );
        assert_eq!(
            Settlement::of(&retry(RetryVia::Process)),
            Settlement::Requeue
        );
        assert_eq!(
            Settlement::of(&retry(RetryVia::Queue)),
            Settlement::RejectRequeue
        );
        assert_eq!(Settlement::of(&dead(true)), Settlement::Ack);
        assert_eq!(Settlement::of(&dead(false)), Settlement::Reject);
        assert_eq!(Settlement::of(&Decision::HandBack), Settlement::Requeue);
        assert_eq!(
            Settlement::of(&Decision::Requeue),
            Settlement::RejectRequeue
        );
        assert_eq!(Settlement::of(&Decision::Abandoned), Settlement::Never);
    }

    #[test]
    fn coalescing_off_sends_each_outcome_at_once() {
        let mut l = ledger(0);
        l.receive(1);
        l.receive(2);
        let out = run(&mut l, &[(2, Settlement::Ack), (1, Settlement::Requeue)]);
        assert_eq!(out, vec![Frame::Ack(2), Frame::Requeue(1)]);
    }

    #[test]
    fn no_op_ever_names_tag_zero_and_every_tag_is_settled_once() {
        // Random-ish orders over 200 tags, with forced flushes in between.
        for seed in 0..50u64 {
            let mut l = ledger(1 + (seed as usize % 7));
            let n = 200u64;
            (1..=n).for_each(|t| l.receive(t));
            let mut order: Vec<u64> = (1..=n).collect();
            let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            for i in (1..order.len()).rev() {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                order.swap(i, (x >> 33) as usize % (i + 1));
            }
            // What the broker would see: a tag is settled once, and a
            // multiple ack may only cover tags decided `ack` (or settled).
            let mut decided = vec![None; n as usize + 1];
            let mut settled = vec![0u32; n as usize + 1];
            let mut check = |ops: &mut Vec<Frame>, decided: &[Option<Settlement>]| {
                for op in ops.drain(..) {
                    match op {
                        Frame::AckUpTo { tag: t, count } => {
                            assert!(t > 0, "seed {seed}: multiple with tag 0");
                            let mut covered = 0;
                            for u in 1..=t as usize {
                                if settled[u] == 0 {
                                    assert_eq!(
                                        decided[u],
                                        Some(Settlement::Ack),
                                        "seed {seed}: multiple ack to {t} covers tag {u}"
                                    );
                                    settled[u] = 1;
                                    covered += 1;
                                }
                            }
                            assert_eq!(covered, count, "seed {seed}: the count of the ack to {t}");
                        }
                        Frame::Ack(t)
                        | Frame::Requeue(t)
                        | Frame::RejectRequeue(t)
                        | Frame::Reject(t) => {
                            assert!(t > 0);
                            let want = match op {
                                Frame::Ack(_) => Settlement::Ack,
                                Frame::Requeue(_) => Settlement::Requeue,
                                Frame::RejectRequeue(_) => Settlement::RejectRequeue,
                                _ => Settlement::Reject,
                            };
                            assert_eq!(decided[t as usize], Some(want), "seed {seed}: tag {t}");
                            settled[t as usize] += 1;
                        }
                    }
                }
            };
            let mut out = Vec::new();
            for (k, t) in order.iter().enumerate() {
                let o = match t % 11 {
                    0 => Settlement::Requeue,
                    1 => Settlement::Reject,
                    2 => Settlement::RejectRequeue,
                    _ => Settlement::Ack,
                };
                decided[*t as usize] = Some(o);
                l.record(*t, o, &mut out);
                l.flush(k % 13 == 0, &mut out);
                check(&mut out, &decided);
            }
            l.flush(true, &mut out);
            check(&mut out, &decided);
            assert!(
                settled[1..].iter().all(|&c| c == 1),
                "seed {seed}: {settled:?}"
            );
            assert_eq!(l.held(), 0);
        }
    }
}

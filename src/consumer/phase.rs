//! Where a generation is in its life ([`Phase`]): consuming, stopping
//! before and after the broker answered the drain's `basic.cancel`, or
//! lost. The transitions are its methods; a phase only moves forward, and a
//! lost generation stays lost.

use crate::config::PrefetchPolicy;

/// A generation's phase.
///
/// ```text
///  Consuming ──stop──▶ Stopping ──answer_cancel──▶ CancelAnswered
///      │                  │                             │
///      └──────────────────┴────────────lose─────────────┴──▶ Lost
/// ```
///
/// Changed only through [`stop`](Self::stop),
/// [`answer_cancel`](Self::answer_cancel) and [`lose`](Self::lose); each
/// says whether it changed the phase, so what a transition does to the
/// rest of the generation happens once. The stream is apart from it: the
/// drain's `basic.cancel` ends the stream, but the loop may read that end
/// before or after it learns that the broker answered, and a broker's own
/// cancel, a park or a failed stack end it while the generation consumes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Phase {
    /// Deliveries start as the stack is ready.
    #[default]
    Consuming,
    /// The drain stopped intake; the broker has not answered its
    /// `basic.cancel` yet, so nothing is handed back (a delivery requeued
    /// to a consumer still registered would come straight back). Under
    /// `handle_buffered` what is buffered still starts.
    Stopping,
    /// The broker answered the drain's `basic.cancel`: under `hand_back`
    /// what is buffered, and what is held before its claim, goes back.
    CancelAnswered,
    /// The channel or its connection is gone, or the broker cancelled the
    /// consumer outside a drain (RabbitMQ 4.3's consumer timeout returns
    /// its unsettled deliveries): nothing starts, and every outcome is an
    /// orphan (the broker has the deliveries back).
    Lost,
}

impl Phase {
    /// The drain stopped intake. Changes only a consuming phase: stopping
    /// again, or stopping a lost generation, leaves the phase as it is.
    #[must_use = "what stopping does happens only when the phase changed"]
    pub(super) fn stop(&mut self) -> bool {
        if *self != Self::Consuming {
            return false;
        }
        *self = Self::Stopping;
        true
    }

    /// The broker answered the drain's `basic.cancel`. Only a stopping
    /// generation waits for that answer (the drain cancels before it
    /// answers): from `Consuming` it is a bug, asserted in debug builds and
    /// ignored otherwise. A second answer, or an answer after a loss,
    /// leaves the phase as it is.
    #[must_use = "what the answer does happens only when the phase changed"]
    pub(super) fn answer_cancel(&mut self) -> bool {
        debug_assert_ne!(
            *self,
            Self::Consuming,
            "the cancel answered before intake stopped"
        );
        if *self != Self::Stopping {
            return false;
        }
        *self = Self::CancelAnswered;
        true
    }

    /// The channel or its connection is gone, from any phase; false when it
    /// was lost already. Nothing leaves `Lost`.
    #[must_use = "what a loss does happens only when the phase changed"]
    pub(super) fn lose(&mut self) -> bool {
        if *self == Self::Lost {
            return false;
        }
        *self = Self::Lost;
        true
    }

    /// The drain stopped intake (and the generation is not lost).
    pub(super) fn is_stopping(self) -> bool {
        matches!(self, Self::Stopping | Self::CancelAnswered)
    }

    /// The channel is gone.
    pub(super) fn is_lost(self) -> bool {
        self == Self::Lost
    }

    /// Whether a buffered delivery may start (the stack ready): while
    /// consuming, and once intake stopped only under `handle_buffered`.
    pub(super) fn starts_buffered(self, policy: PrefetchPolicy) -> bool {
        match self {
            Self::Consuming => true,
            Self::Stopping | Self::CancelAnswered => policy == PrefetchPolicy::HandleBuffered,
            Self::Lost => false,
        }
    }

    /// Whether what is buffered or held goes back now: under `hand_back`,
    /// once the broker answered the cancel.
    pub(super) fn hands_back(self, policy: PrefetchPolicy) -> bool {
        self == Self::CancelAnswered && policy == PrefetchPolicy::HandBack
    }
}

#[cfg(test)]
mod tests {
    use super::Phase::{self, CancelAnswered, Consuming, Lost, Stopping};
    use crate::config::PrefetchPolicy::{HandBack, HandleBuffered};

    #[test]
    fn a_drain_moves_the_phase_forward_once_and_each_step_again_changes_nothing() {
        let mut p = Phase::default();
        assert_eq!(p, Consuming);
        assert!(p.stop());
        assert_eq!(p, Stopping);
        assert!(!p.stop());
        assert_eq!(p, Stopping);
        assert!(p.answer_cancel());
        assert_eq!(p, CancelAnswered);
        assert!(!p.answer_cancel());
        assert!(
            !p.stop(),
            "stop after the cancel was answered is idempotent"
        );
        assert_eq!(p, CancelAnswered);
    }

    #[test]
    fn a_lost_phase_is_reached_from_every_phase_once_and_never_left() {
        for from in [Consuming, Stopping, CancelAnswered] {
            let mut p = from;
            assert!(p.lose(), "{from:?}");
            assert_eq!(p, Lost);
            assert!(!p.lose());
            assert!(!p.stop());
            assert!(!p.answer_cancel());
            assert_eq!(p, Lost, "lost from {from:?} went back to another phase");
            assert!(p.is_lost() && !p.is_stopping());
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "the cancel answered before intake stopped")]
    fn a_cancel_answered_while_consuming_is_a_bug() {
        let mut p = Consuming;
        let _ = p.answer_cancel();
    }

    #[test]
    fn buffered_deliveries_start_while_consuming_and_after_a_stop_only_when_handled() {
        for policy in [HandBack, HandleBuffered] {
            assert!(Consuming.starts_buffered(policy));
            assert!(!Lost.starts_buffered(policy));
            for p in [Stopping, CancelAnswered] {
                assert_eq!(p.starts_buffered(policy), policy == HandleBuffered);
            }
        }
    }

    #[test]
    fn what_is_buffered_goes_back_only_under_hand_back_once_the_cancel_is_answered() {
        for p in [Consuming, Stopping, CancelAnswered, Lost] {
            assert_eq!(p.hands_back(HandBack), p == CancelAnswered, "{p:?}");
            assert!(!p.hands_back(HandleBuffered), "{p:?}");
        }
        assert!(!Consuming.is_stopping() && Stopping.is_stopping());
        assert!(CancelAnswered.is_stopping());
    }
}

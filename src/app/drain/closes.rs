//! What the drain closes at its end, in order: one step after another, each
//! waiting at most [`CLOSE_BOUND`] for the broker. The drain performs
//! exactly these steps, and its worst case counts them.

use crate::connection::{ConnectionRole, CLOSE_BOUND};

/// One close the drain awaits before the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CloseStep {
    /// Every consumer channel, all at once.
    ConsumerChannels,
    /// The publisher's channel.
    PublisherChannel,
    /// A connection; its cell is emptied.
    Connection(ConnectionRole),
}

/// The drain's closes, in order: the consumer channels (together), the
/// publisher's channel, the publishing connection, the consumers'
/// connection.
pub(super) const CLOSE_STEPS: [CloseStep; 4] = [
    CloseStep::ConsumerChannels,
    CloseStep::PublisherChannel,
    CloseStep::Connection(ConnectionRole::Publisher),
    CloseStep::Connection(ConnectionRole::Consumer),
];

/// The longest the drain's closes take together: [`CLOSE_BOUND`] for each
/// of the [`CLOSE_STEPS`].
pub(super) const CLOSES_WORST_CASE: std::time::Duration =
    CLOSE_BOUND.saturating_mul(CLOSE_STEPS.len() as u32);

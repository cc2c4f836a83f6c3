//! The one way a ledger operation becomes a settle frame on a channel,
//! for the consumer loop and the [`Settler`](crate::settle::Settler).

use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::Channel;
use tracing::debug;

use super::ledger::Frame;

/// Sends one settle. A failure is a closing channel: the broker requeues
/// what it did not get a settle for. Settles are polled in the order they
/// were pushed (`FuturesUnordered` runs new futures first-in first-out),
/// and lapin queues a settle's frame at its first poll: frames go out in
/// the ledger's order.
pub(crate) async fn send(channel: &Channel, op: Frame, queue: &str) {
    if let Err(e) = send_op(channel, op).await {
        debug!(queue = %queue, ?op, error = %e, "settle failed on a closing channel; the broker requeues the delivery");
    }
}

/// Puts one ledger op on the wire (the loop's and the
/// [`Settler`](crate::settle::Settler)'s one way to settle). lapin queues
/// the frame at the future's first poll.
pub(crate) async fn send_op(channel: &Channel, op: Frame) -> lapin::Result<()> {
    match op {
        Frame::Ack(tag) => {
            channel
                .basic_ack(tag, BasicAckOptions { multiple: false })
                .await
        }
        Frame::AckUpTo { tag, .. } => {
            debug_assert!(tag > 0, "never multiple with tag 0");
            channel
                .basic_ack(tag, BasicAckOptions { multiple: true })
                .await
        }
        Frame::Requeue(tag) => {
            channel
                .basic_nack(
                    tag,
                    BasicNackOptions {
                        multiple: false,
                        requeue: true,
                    },
                )
                .await
        }
        Frame::RejectRequeue(tag) => {
            channel
                .basic_reject(tag, BasicRejectOptions { requeue: true })
                .await
        }
        Frame::Reject(tag) => {
            channel
                .basic_reject(tag, BasicRejectOptions { requeue: false })
                .await
        }
    }
}

//! The one way ledger frames reach a channel, for the consumer loop and the
//! [`Settler`](crate::settle::Settler): a [`Writer`] that queues them in
//! the ledger's order by construction.
//!
//! lapin's `basic_ack`, `basic_nack` and `basic_reject` are `async fn`s
//! that put their frame on the channel's outgoing queue at their first poll
//! (`tests/broker/settle.rs` pins that). Order on the wire is therefore the
//! order of first polls. [`Writer::queue`] polls each frame's future once,
//! as it is made and before the next one is made, so a `multiple` ack never
//! overtakes an earlier reject (which would settle a tag twice: a 406, the
//! channel closed, every unacknowledged delivery redelivered) whatever a
//! container's polling order. Completions may then overlap: the writer
//! keeps the futures that are not finished and reports each as it ends.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, Stream};
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::Channel;

use super::ledger::Frame;

/// The channel's settle calls as the writer needs them: a seam, so a unit
/// test can stand in a sink that completes out of order.
pub(crate) trait SettleSink<'c> {
    /// `frame`'s settle; its frame is queued on the channel at its first
    /// poll.
    fn settle(&self, frame: Frame) -> BoxFuture<'c, lapin::Result<()>>;
}

impl<'c> SettleSink<'c> for &'c Channel {
    fn settle(&self, frame: Frame) -> BoxFuture<'c, lapin::Result<()>> {
        Box::pin(send_op(self, frame))
    }
}

/// A frame's settle once it is queued, with the frame it carries.
struct Queued<'c> {
    frame: Frame,
    settle: BoxFuture<'c, lapin::Result<()>>,
}

impl Future for Queued<'_> {
    type Output = (Frame, lapin::Result<()>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let frame = self.frame;
        self.settle.as_mut().poll(cx).map(|r| (frame, r))
    }
}

/// Settle frames for one channel: queued in the order given, finished in
/// any order.
pub(crate) struct Writer<'c, S> {
    sink: S,
    in_flight: FuturesUnordered<Queued<'c>>,
    /// Finished at their first poll, not reported yet.
    done: Vec<(Frame, lapin::Result<()>)>,
}

impl<'c, S: SettleSink<'c>> Writer<'c, S> {
    pub(crate) fn new(sink: S) -> Self {
        Writer {
            sink,
            in_flight: FuturesUnordered::new(),
            done: Vec::new(),
        }
    }

    /// Queues `frames` on the channel, in this order: each frame's settle is
    /// polled once (which queues its frame) before the next one is made.
    /// `cx` is woken when one of them finishes.
    pub(crate) fn queue(&mut self, frames: impl IntoIterator<Item = Frame>, cx: &mut Context<'_>) {
        for frame in frames {
            let mut settle = self.sink.settle(frame);
            match settle.as_mut().poll(cx) {
                Poll::Ready(result) => self.done.push((frame, result)),
                Poll::Pending => self.in_flight.push(Queued { frame, settle }),
            }
        }
    }

    /// Settles queued and not reported as finished yet.
    pub(crate) fn len(&self) -> usize {
        self.in_flight.len() + self.done.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'c, S: SettleSink<'c> + Unpin> Stream for Writer<'c, S> {
    type Item = (Frame, lapin::Result<()>);

    /// The next settle to finish; `Ready(None)` when none is queued.
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(done) = self.done.pop() {
            return Poll::Ready(Some(done));
        }
        Pin::new(&mut self.in_flight).poll_next(cx)
    }
}

/// Puts one ledger frame on the wire. lapin queues the frame at the
/// future's first poll.
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures::StreamExt;

    use super::*;

    /// A sink that records the order in which frames are queued (first
    /// polled) and finishes each only when the test says so.
    #[derive(Clone, Default)]
    struct Fake {
        queued: Arc<Mutex<Vec<Frame>>>,
        release: Arc<Mutex<Vec<Frame>>>,
        wakers: Arc<Mutex<Vec<std::task::Waker>>>,
    }

    impl Fake {
        /// Lets `frames`' settles finish, and wakes whoever waits on them.
        fn finish(&self, frames: impl IntoIterator<Item = Frame>) {
            self.release.lock().unwrap().extend(frames);
            for w in self.wakers.lock().unwrap().drain(..) {
                w.wake();
            }
        }
    }

    impl<'c> SettleSink<'c> for Fake {
        fn settle(&self, frame: Frame) -> BoxFuture<'c, lapin::Result<()>> {
            let fake = self.clone();
            let mut first = true;
            Box::pin(futures::future::poll_fn(move |cx| {
                if std::mem::take(&mut first) {
                    fake.queued.lock().unwrap().push(frame);
                }
                if fake.release.lock().unwrap().contains(&frame) {
                    Poll::Ready(Ok(()))
                } else {
                    fake.wakers.lock().unwrap().push(cx.waker().clone());
                    Poll::Pending
                }
            }))
        }
    }

    #[test]
    fn frames_are_queued_in_the_order_given_before_queue_returns_and_finish_in_any_order() {
        let fake = Fake::default();
        let mut writer = Writer::new(fake.clone());
        let frames = [
            Frame::Reject(1),
            Frame::AckUpTo { tag: 5, count: 4 },
            Frame::Requeue(6),
            Frame::Ack(7),
        ];
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        writer.queue(frames, &mut cx);
        // Queued on the channel, in the ledger's order, before anything
        // else polls them: no container's polling order is involved.
        assert_eq!(*fake.queued.lock().unwrap(), frames);
        assert_eq!(writer.len(), 4);

        // They finish out of order: the last first.
        fake.finish([Frame::Ack(7)]);
        let done = writer.poll_next_unpin(&mut cx);
        assert!(matches!(done, Poll::Ready(Some((Frame::Ack(7), Ok(()))))));
        fake.finish([
            Frame::Requeue(6),
            Frame::Reject(1),
            Frame::AckUpTo { tag: 5, count: 4 },
        ]);
        let mut rest = Vec::new();
        while let Poll::Ready(Some((f, r))) = writer.poll_next_unpin(&mut cx) {
            assert!(r.is_ok());
            rest.push(f);
        }
        assert_eq!(rest.len(), 3, "{rest:?}");
        assert!(writer.is_empty());
        // More frames after some finished: still queued after the first ones.
        writer.queue([Frame::Ack(8), Frame::Reject(9)], &mut cx);
        assert_eq!(
            fake.queued.lock().unwrap()[4..],
            [Frame::Ack(8), Frame::Reject(9)]
        );
    }
}

//! The response future of the cancellation layer.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::{BoxError, Decision};
use crate::lifeline::Cancellation;
use crate::sync::{OwnedNotified, WaitForCancellationFutureOwned};
use crate::{HandlerPanic, IntoVerdict};

pin_project! {
    /// Response future of [`Cancel`](super::Cancel): the handler's future,
    /// its panics caught, abandoned if it runs on too long after
    /// cancellation.
    ///
    /// # Cancellation safety
    ///
    /// Dropping it drops the handler's future, as abandonment does.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<F> {
        #[pin]
        handler: Handler<F>,
        #[pin]
        watch: Watch,
        child: Cancellation,
        abandon_after: Duration,
        attempt: u32,
        // Whether the layer registers its own wake-up for the cancellation
        // (else the transport wakes it: `CancelLayer::woken_by_transport`).
        self_waking: bool,
    }
}

pin_project! {
    #[project = HandlerProj]
    enum Handler<F> {
        Running {
            #[pin]
            fut: F,
        },
        // Boxed (a panic is rare): the running future stays small.
        Panicked {
            error: Option<Box<HandlerPanic>>,
        },
        Done,
    }
}

pin_project! {
    #[project = WatchProj]
    enum Watch {
        // No interest registered yet: the handler has not returned `Pending`.
        Idle,
        // Woken by the transport on cancellation: no waiter registered; a
        // poll asks the token.
        Passive,
        // Waiting for the watcher to see the token cancelled (created
        // before `fired` was checked: a cancellation in between is kept).
        Signal {
            #[pin]
            notified: OwnedNotified,
            // Polled before: the handler woke for its own reasons.
            again: bool,
        },
        // Outside a tokio runtime: waiting on the token itself (boxed: rare).
        Token {
            cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
        },
        // Cancelled: the grace period runs (boxed: only after a cancel).
        Grace {
            sleep: Pin<Box<Sleep>>,
        },
    }
}

impl Watch {
    // The grace period after the cancellation was seen.
    fn grace(abandon_after: Duration) -> Watch {
        Watch::Grace {
            sleep: Box::pin(tokio::time::sleep(abandon_after)),
        }
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(
        fut: F,
        child: Cancellation,
        abandon_after: Duration,
        attempt: u32,
        self_waking: bool,
    ) -> Self {
        ResponseFuture {
            handler: Handler::Running { fut },
            watch: Watch::Idle,
            child,
            abandon_after,
            attempt,
            self_waking,
        }
    }

    pub(crate) fn panicked(
        payload: &(dyn Any + Send),
        child: Cancellation,
        abandon_after: Duration,
    ) -> Self {
        ResponseFuture {
            handler: Handler::Panicked {
                error: Some(Box::new(HandlerPanic::from_payload(payload))),
            },
            watch: Watch::Idle,
            child,
            abandon_after,
            attempt: 1,
            self_waking: true,
        }
    }
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<R, E>>,
    R: IntoVerdict,
    E: Into<BoxError>,
{
    type Output = Result<Decision, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();

        let polled = match this.handler.as_mut().project() {
            HandlerProj::Running { fut } => panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))),
            HandlerProj::Panicked { error } => {
                let error = error.take().unwrap_or_else(|| {
                    Box::new(HandlerPanic::from_payload(&"panic already reported"))
                });
                this.handler.set(Handler::Done);
                return Poll::Ready(Err(error));
            }
            HandlerProj::Done => panic!("cancel::ResponseFuture polled after completion"),
        };
        match polled {
            Ok(Poll::Pending) => {}
            Ok(Poll::Ready(result)) => {
                this.handler.set(Handler::Done);
                return Poll::Ready(match result {
                    Ok(r) => Ok(r.into_verdict().into_decision(*this.attempt)),
                    // Stopped because it was told to: not a failure.
                    Err(_) if this.child.is_cancelled() => Ok(Decision::HandBack),
                    Err(e) => Err(e.into()),
                });
            }
            Err(payload) => {
                let error = HandlerPanic::from_payload(&*payload);
                this.handler.set(Handler::Done);
                return Poll::Ready(Err(Box::new(error)));
            }
        }

        // The handler is still running: watch for cancellation, then for the
        // end of the grace period.
        loop {
            match this.watch.as_mut().project() {
                // The first `Pending`: the transport wakes this future when
                // the token is cancelled, and for a request started after
                // that, at once (see `Wakeable`).
                WatchProj::Idle if !*this.self_waking => {
                    this.watch.set(Watch::Passive);
                    return Poll::Pending;
                }
                WatchProj::Passive => {
                    if !this.child.is_cancelled() {
                        return Poll::Pending;
                    }
                    this.watch.set(Watch::grace(*this.abandon_after));
                }
                WatchProj::Idle => match this.child.waiter() {
                    Some(notified) => this.watch.set(Watch::Signal {
                        notified,
                        again: false,
                    }),
                    None => {
                        let cancelled = Box::pin(this.child.cancelled_owned());
                        this.watch.set(Watch::Token { cancelled });
                    }
                },
                WatchProj::Signal { notified, again } => {
                    // The watcher says so a task switch after the cancel; a
                    // handler polled again (it woke for its own reasons)
                    // asks the token itself, so the grace period starts at
                    // the first poll that can see the cancellation.
                    let seen = this.child.fired() || (*again && this.child.is_cancelled());
                    if !seen {
                        *again = true;
                        std::task::ready!(notified.poll(cx));
                    }
                    this.watch.set(Watch::grace(*this.abandon_after));
                }
                WatchProj::Token { cancelled } => {
                    std::task::ready!(cancelled.as_mut().poll(cx));
                    this.watch.set(Watch::grace(*this.abandon_after));
                }
                WatchProj::Grace { sleep } => {
                    std::task::ready!(sleep.as_mut().poll(cx));
                    this.handler.set(Handler::Done);
                    return Poll::Ready(Ok(Decision::Abandoned));
                }
            }
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let handler = match &self.handler {
            Handler::Running { .. } => "running",
            Handler::Panicked { .. } => "panicked",
            Handler::Done => "done",
        };
        let watch = match &self.watch {
            Watch::Idle => "idle",
            Watch::Passive => "woken by the transport",
            Watch::Signal { .. } | Watch::Token { .. } => "watching the token",
            Watch::Grace { .. } => "grace period",
        };
        f.debug_struct("ResponseFuture")
            .field("handler", &handler)
            .field("watch", &watch)
            .field("cancelled", &self.child.is_cancelled())
            .field("abandon_after", &self.abandon_after)
            .finish()
    }
}

pin_project! {
    /// A transport's wrapper around each request's future when the
    /// cancellation layer is [`woken_by_transport`](super::CancelLayer::woken_by_transport):
    /// it keeps the waker of its last `Pending` poll, so the transport can
    /// [`wake`](Self::wake) every running request when it cancels their
    /// root token (acemq's consumer loop does). A request started after
    /// that is made with [`after_cancel`](Self::after_cancel): it wakes
    /// itself once after its first `Pending`, so its layer sees the
    /// cancellation too.
    ///
    /// Costs a waker clone per request that waits (no lock, nothing shared).
    /// A transport that keeps its requests in one set can use
    /// [`Slots`](super::Slots) instead, which costs nothing per request.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct Wakeable<F> {
        #[pin]
        fut: F,
        waker: Option<std::task::Waker>,
        nudge: bool,
    }
}

impl<F> Wakeable<F> {
    /// Wraps a request started before its root token was cancelled.
    pub fn new(fut: F) -> Self {
        Wakeable {
            fut,
            waker: None,
            nudge: false,
        }
    }

    /// Wraps a request started once its root token was cancelled (and the
    /// transport has woken the others).
    pub fn after_cancel(fut: F) -> Self {
        Wakeable {
            fut,
            waker: None,
            nudge: true,
        }
    }

    /// Wakes the request if it is waiting: its next poll sees the
    /// cancellation. One not polled yet wakes itself once after its first
    /// `Pending` (a layer woken by its transport answers its first poll
    /// without asking the token), as one made with
    /// [`after_cancel`](Self::after_cancel).
    pub fn wake(self: Pin<&mut Self>) {
        let this = self.project();
        match this.waker.take() {
            Some(waker) => waker.wake(),
            None => *this.nudge = true,
        }
    }
}

impl<F: Future> Future for Wakeable<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        match this.fut.poll(cx) {
            Poll::Ready(out) => {
                *this.waker = None;
                Poll::Ready(out)
            }
            Poll::Pending => {
                if std::mem::take(this.nudge) {
                    cx.waker().wake_by_ref();
                }
                match this.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *this.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

impl<F> fmt::Debug for Wakeable<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeable")
            .field("waiting", &self.waker.is_some())
            .finish_non_exhaustive()
    }
}

//! The response future of the cancellation layer.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Sleep;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::{BoxError, Decision};
use crate::lifeline::Cancellation;
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

impl<F> ResponseFuture<F> {
    pub(crate) fn new(fut: F, child: Cancellation, abandon_after: Duration, attempt: u32) -> Self {
        ResponseFuture {
            handler: Handler::Running { fut },
            watch: Watch::Idle,
            child,
            abandon_after,
            attempt,
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
                    let sleep = Box::pin(tokio::time::sleep(*this.abandon_after));
                    this.watch.set(Watch::Grace { sleep });
                }
                WatchProj::Token { cancelled } => {
                    std::task::ready!(cancelled.as_mut().poll(cx));
                    let sleep = Box::pin(tokio::time::sleep(*this.abandon_after));
                    this.watch.set(Watch::Grace { sleep });
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

//! The response future of the pause gate.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::Service;

use super::handle::{HeldGuard, State as Gate};
use super::{Decision, Delivery};
use crate::sync::OwnedNotified;

pin_project! {
    /// Response future of [`Pause`](super::Pause): calls the inner service
    /// at once on an open gate, waits in the gate while it is paused, and
    /// hands the delivery back on a closed one.
    ///
    /// # Cancellation safety
    ///
    /// Dropping a held future drops its delivery without calling the inner
    /// service and uncounts it from [`held`](super::PauseHandle::held);
    /// dropping it after the call drops the inner future.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<S, F> {
        #[pin]
        state: State<S, F>,
        // Set when a held request is let through: a request called at once
        // reads no clock here.
        released_at: Option<Instant>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, F> {
        Calling {
            #[pin]
            fut: F,
        },
        // Boxed: only a paused gate holds, and the open gate's future
        // stays the size of the inner one (every layer outside moves it).
        Held {
            held: Pin<Box<Held<S>>>,
        },
        HandBack,
        Done,
    }
}

pin_project! {
    /// What a held delivery keeps while it waits in the gate.
    struct Held<S> {
        svc: Option<S>,
        req: Option<Delivery>,
        #[pin]
        notified: OwnedNotified,
        guard: HeldGuard,
    }
}

impl<S, F> ResponseFuture<S, F> {
    pub(crate) fn calling(fut: F) -> Self {
        ResponseFuture {
            state: State::Calling { fut },
            released_at: None,
        }
    }

    pub(crate) fn handed_back() -> Self {
        ResponseFuture {
            state: State::HandBack,
            released_at: None,
        }
    }

    pub(crate) fn held(svc: S, req: Delivery, notified: OwnedNotified, guard: HeldGuard) -> Self {
        ResponseFuture {
            state: State::Held {
                held: Box::pin(Held {
                    svc: Some(svc),
                    req: Some(req),
                    notified,
                    guard,
                }),
            },
            released_at: None,
        }
    }

    /// When the gate stopped holding this request: let it through to the
    /// inner service at a resume, or handed it back at a close or
    /// [`hand_back_held`](super::PauseHandle::hand_back_held). `None` when
    /// it was never held (called at once, or handed back by a closed gate
    /// at the call) or is still held. A transport that times its handler
    /// from the call into the gate takes this as the start instead, so the
    /// time spent held is not counted as handler time.
    pub fn released_at(&self) -> Option<Instant> {
        self.released_at
    }
}

impl<S, F, E> Future for ResponseFuture<S, F>
where
    S: Service<Delivery, Response = Decision, Error = E, Future = F>,
    F: Future<Output = Result<Decision, E>>,
{
    type Output = Result<Decision, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut state = this.state;
        loop {
            match state.as_mut().project() {
                StateProj::Calling { fut } => {
                    let output = std::task::ready!(fut.poll(cx));
                    state.set(State::Done);
                    return Poll::Ready(output);
                }
                StateProj::HandBack => {
                    state.set(State::Done);
                    return Poll::Ready(Ok(Decision::HandBack));
                }
                StateProj::Held { held } => {
                    let held = held.as_mut().project();
                    let (mut notified, guard) = (held.notified, held.guard);
                    // Register before reading the state, so a resume or
                    // close after the read wakes this task.
                    notified.as_mut().enable();
                    if guard.evicted() {
                        *this.released_at = Some(Instant::now());
                        state.set(State::Done);
                        return Poll::Ready(Ok(Decision::HandBack));
                    }
                    match guard.shared().state() {
                        Gate::Paused => {
                            if notified.as_mut().poll(cx).is_pending() {
                                return Poll::Pending;
                            }
                            // Woken: wait again on a fresh registration and
                            // read the state once more.
                            let again = guard.shared().notify.clone().notified_owned();
                            notified.set(again);
                            continue;
                        }
                        Gate::Closed => {
                            *this.released_at = Some(Instant::now());
                            state.set(State::Done);
                            return Poll::Ready(Ok(Decision::HandBack));
                        }
                        Gate::Open => {
                            let (svc, req) = (held.svc.take(), held.req.take());
                            let (Some(mut svc), Some(req)) = (svc, req) else {
                                unreachable!("a held delivery is called once")
                            };
                            *this.released_at = Some(Instant::now());
                            state.set(State::Calling { fut: svc.call(req) });
                        }
                    }
                }
                StateProj::Done => panic!("pause::ResponseFuture polled after completion"),
            }
        }
    }
}

impl<S, F> fmt::Debug for ResponseFuture<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Calling { .. } => "calling",
            State::Held { .. } => "held",
            State::HandBack => "handing back",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

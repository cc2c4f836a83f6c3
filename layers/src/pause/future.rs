//! The response future of the pause gate.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::Service;

use super::circuit::ProbeMark;
use super::handle::{release_probe, Admit, HeldGuard, Shared};
use super::{Decision, Delivery};
use crate::sync::OwnedNotified;

pin_project! {
    /// Response future of [`Pause`](super::Pause): calls the inner service
    /// at once on an open gate, waits in the gate while it is paused (or
    /// its circuit is open, or half-open with the probe out), and hands the
    /// delivery back on a closed one.
    ///
    /// # Cancellation safety
    ///
    /// Dropping a held future drops its delivery without calling the inner
    /// service and uncounts it from [`held`](super::PauseHandle::held);
    /// dropping it after the call drops the inner future. A half-open
    /// circuit's probe that ends without its first attempt deciding
    /// (dropped, or never reaching the breaker) lets another request be the
    /// probe.
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
        // The half-open circuit's probe: its ticket frees the probe when
        // the breaker did not decide on it.
        Probing {
            #[pin]
            fut: F,
            ticket: Box<ProbeTicket>,
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

    pub(crate) fn probing(fut: F, ticket: ProbeTicket) -> Self {
        ResponseFuture {
            state: State::Probing {
                fut,
                ticket: Box::new(ticket),
            },
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
                StateProj::Calling { fut } | StateProj::Probing { fut, .. } => {
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
                    let admit = guard.shared().admit();
                    if admit == Admit::Hold {
                        if notified.as_mut().poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        // Woken: wait again on a fresh registration and
                        // read the state once more.
                        let again = guard.shared().notify.clone().notified_owned();
                        notified.set(again);
                        continue;
                    }
                    *this.released_at = Some(Instant::now());
                    if admit == Admit::HandBack {
                        state.set(State::Done);
                        return Poll::Ready(Ok(Decision::HandBack));
                    }
                    let (svc, req) = (held.svc.take(), held.req.take());
                    let (Some(mut svc), Some(mut req)) = (svc, req) else {
                        unreachable!("a held delivery is called once")
                    };
                    if let Admit::Probe(epoch) = admit {
                        let ticket = Box::new(ProbeTicket::new(guard.shared_arc(), epoch));
                        req.extensions_mut().insert(ProbeMark(epoch));
                        let fut = svc.call(req);
                        state.set(State::Probing { fut, ticket });
                    } else {
                        state.set(State::Calling { fut: svc.call(req) });
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
            State::Probing { .. } => "probing",
            State::Held { .. } => "held",
            State::HandBack => "handing back",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

/// The half-open circuit's probe of one epoch: when it ends without the
/// breaker deciding on it (the epoch unchanged), the probe is free again.
pub(crate) struct ProbeTicket {
    shared: Arc<Shared>,
    epoch: u64,
}

impl ProbeTicket {
    pub(crate) fn new(shared: Arc<Shared>, epoch: u64) -> Self {
        ProbeTicket { shared, epoch }
    }
}

impl Drop for ProbeTicket {
    fn drop(&mut self) {
        if release_probe(&self.shared, self.epoch) {
            tracing::debug!(
                queue = self.shared.queue().map_or("", |q| &**q),
                "the circuit's probe ended without a decision from the breaker; the next delivery is the probe"
            );
        }
    }
}

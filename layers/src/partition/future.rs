//! The response future of the partition layer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower::Service;

use super::table::{Held, Place};
use super::Delivery;

pin_project! {
    /// Response future of [`Partition`](super::Partition): the inner
    /// future, holding its key until it completes — or, while the key runs
    /// another delivery, a place in the key's line.
    ///
    /// # Cancellation safety
    ///
    /// Dropping it while it waits leaves the line (the key passes on if it
    /// had come to this delivery); dropping it while it runs drops the
    /// inner future and frees the key.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<S, F> {
        #[pin]
        state: State<S, F>,
        held: Option<Held>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, F> {
        Running {
            #[pin]
            fut: F,
        },
        // Boxed: only a delivery whose key runs waits, and a running
        // future stays the size of the inner one.
        Waiting {
            waiting: Box<Waiting<S>>,
        },
        Done,
    }
}

/// What a waiting delivery keeps.
struct Waiting<S> {
    svc: S,
    req: Option<Delivery>,
    place: Option<Place>,
}

impl<S, F> ResponseFuture<S, F> {
    pub(super) fn running(fut: F, held: Option<Held>) -> Self {
        ResponseFuture {
            state: State::Running { fut },
            held,
        }
    }

    pub(super) fn waiting(svc: S, req: Delivery, place: Place) -> Self {
        ResponseFuture {
            state: State::Waiting {
                waiting: Box::new(Waiting {
                    svc,
                    req: Some(req),
                    place: Some(place),
                }),
            },
            held: None,
        }
    }
}

impl<S, F, R, E> Future for ResponseFuture<S, F>
where
    S: Service<Delivery, Response = R, Error = E, Future = F>,
    F: Future<Output = Result<R, E>>,
{
    type Output = Result<R, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Running { fut } => {
                    let output = std::task::ready!(fut.poll(cx));
                    // The key passes on as soon as the result exists.
                    this.held.take();
                    this.state.set(State::Done);
                    return Poll::Ready(output);
                }
                StateProj::Waiting { waiting } => {
                    if let Some(place) = &waiting.place {
                        let turn = place.turn.as_ref().expect("a waiting place has a turn");
                        if !turn.is_granted() {
                            turn.register(cx.waker());
                            if !turn.is_granted() {
                                return Poll::Pending;
                            }
                        }
                    }
                    if let Some(place) = waiting.place.take() {
                        *this.held = Some(place.into_held());
                    }
                    // The key is this delivery's: now it takes what the
                    // service below reserves (a concurrency permit).
                    if let Err(e) = std::task::ready!(waiting.svc.poll_ready(cx)) {
                        this.held.take();
                        this.state.set(State::Done);
                        return Poll::Ready(Err(e));
                    }
                    let req = waiting
                        .req
                        .take()
                        .expect("a waiting delivery is called once");
                    let fut = waiting.svc.call(req);
                    this.state.set(State::Running { fut });
                }
                StateProj::Done => panic!("partition::ResponseFuture polled after completion"),
            }
        }
    }
}

impl<S, F> fmt::Debug for ResponseFuture<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Running { .. } => "running",
            State::Waiting { waiting } if waiting.place.is_some() => "waiting for its key",
            State::Waiting { .. } => "waiting for the service below",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("holds_key", &self.held.is_some())
            .finish()
    }
}

//! The response future of [`DeadLetterRetry`](super::DeadLetterRetry).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures::future::BoxFuture;
use pin_project_lite::pin_project;
use tower::Service;

use super::service::Shared;
use crate::dead_letter::{act, Act};
use crate::decision::Decision;
use crate::delivery::Delivery;
use crate::error::{BoxError, Classify};
use crate::publish::Publish;
use crate::retry::failure_path;

pin_project! {
    /// Response future of [`DeadLetterRetry`](super::DeadLetterRetry).
    ///
    /// While the first attempt runs this is that attempt's future,
    /// unboxed; only a failure, or something to dead-letter, switches to a
    /// boxed future that carries out the retry schedule or the publish.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<S, P, C>
    where
        S: Service<Delivery>,
    {
        #[pin]
        state: State<S::Future>,
        // Taken when the result is known.
        pending: Option<Pending<S, P, C>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The first attempt is running.
        Attempt {
            #[pin]
            future: F,
        },
        // Redelivered past the bound, or struck out: the service below is
        // not called.
        Limited {
            decision: Option<Decision>,
        },
        // The attempt failed: waits, rung publishes and further attempts.
        Failing {
            future: BoxFuture<'static, Result<Decision, BoxError>>,
        },
        // The dead-letter copy (or a request's error reply) on its way.
        Publishing {
            future: BoxFuture<'static, Decision>,
        },
    }
}

/// What the delivery keeps until its result is known.
struct Pending<S, P, C> {
    /// The service made ready for the first attempt, for the retries
    /// (`None` when it was not called).
    service: Option<S>,
    delivery: Delivery,
    shared: Arc<Shared<P, C>>,
    /// The dead-letter layer is enabled.
    dead_letter: bool,
}

impl<S, P, C> ResponseFuture<S, P, C>
where
    S: Service<Delivery>,
{
    pub(crate) fn attempt(
        future: S::Future,
        service: S,
        delivery: Delivery,
        shared: Arc<Shared<P, C>>,
        dead_letter: bool,
    ) -> Self {
        ResponseFuture {
            state: State::Attempt { future },
            pending: Some(Pending {
                service: Some(service),
                delivery,
                shared,
                dead_letter,
            }),
        }
    }

    pub(crate) fn limited(
        decision: Decision,
        delivery: Delivery,
        shared: Arc<Shared<P, C>>,
        dead_letter: bool,
    ) -> Self {
        ResponseFuture {
            state: State::Limited {
                decision: Some(decision),
            },
            pending: Some(Pending {
                service: None,
                delivery,
                shared,
                dead_letter,
            }),
        }
    }
}

impl<S, P, C> Future for ResponseFuture<S, P, C>
where
    S: Service<Delivery, Response = Decision, Error = BoxError> + Send + 'static,
    S::Future: Send,
    P: Publish,
    C: Classify,
{
    type Output = Result<Decision, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let result = match this.state.as_mut().project() {
                StateProj::Attempt { future } => match ready!(future.poll(cx)) {
                    Err(error) => {
                        // The retry layer's part: the schedule, boxed.
                        let pending = this.pending.as_mut();
                        let Some(Pending {
                            service: service @ Some(_),
                            delivery,
                            shared,
                            ..
                        }) = pending
                        else {
                            // Unreachable: the service is kept until now.
                            return Poll::Ready(Err(error));
                        };
                        let future = Box::pin(failure_path(
                            service.take().expect("matched `Some` above"),
                            delivery.clone(),
                            shared.retry.clone(),
                            error,
                        ));
                        this.state.set(State::Failing { future });
                        continue;
                    }
                    ok => ok,
                },
                StateProj::Limited { decision } => Ok(decision
                    .take()
                    .expect("dead_letter_retry::ResponseFuture polled after completion")),
                StateProj::Failing { future } => ready!(future.as_mut().poll(cx)),
                StateProj::Publishing { future } => {
                    return Poll::Ready(Ok(ready!(future.as_mut().poll(cx))));
                }
            };
            // The dead-letter layer's part.
            let Some(pending) = this.pending.take() else {
                return Poll::Ready(result);
            };
            let config = &pending.shared.dead_letter;
            match act(result, pending.delivery, config, pending.dead_letter) {
                Act::Done(result) => return Poll::Ready(result),
                Act::Publish(future) => this.state.set(State::Publishing { future }),
            }
        }
    }
}

impl<S, P, C> fmt::Debug for ResponseFuture<S, P, C>
where
    S: Service<Delivery>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Attempt { .. } => "attempt",
            State::Limited { .. } => "limited",
            State::Failing { .. } => "failing",
            State::Publishing { .. } => "publishing",
        };
        let mut d = f.debug_struct("ResponseFuture");
        d.field("state", &state);
        if let Some(pending) = &self.pending {
            d.field("queue", &pending.delivery.queue())
                .field("attempt", &pending.delivery.attempt());
        }
        d.finish()
    }
}

//! The response future of [`Retry`](super::Retry).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures::future::BoxFuture;
use pin_project_lite::pin_project;
use tower::Service;

use super::failure::failure_path;
use super::layer::Config;
use crate::decision::Decision;
use crate::delivery::Delivery;
use crate::error::{BoxError, Classify};
use crate::publish::Publish;

pin_project! {
    /// Response future of [`Retry`](super::Retry).
    ///
    /// While the handler's first attempt runs this is that attempt's future,
    /// unboxed; only a failure switches to a boxed future that carries out
    /// the retry schedule.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<S, P, C>
    where
        S: Service<Delivery>,
    {
        #[pin]
        state: State<S::Future>,
        retry: Option<Pending<S, P, C>>,
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
        // It failed: waits, rung publishes and further attempts.
        Failing {
            future: BoxFuture<'static, Result<Decision, BoxError>>,
        },
    }
}

/// What a retry needs, kept from the call.
struct Pending<S, P, C> {
    service: S,
    delivery: Delivery,
    config: Arc<Config<P, C>>,
}

impl<S, P, C> ResponseFuture<S, P, C>
where
    S: Service<Delivery>,
{
    pub(crate) fn new(
        future: S::Future,
        service: S,
        delivery: Delivery,
        config: Arc<Config<P, C>>,
    ) -> Self {
        ResponseFuture {
            state: State::Attempt { future },
            retry: Some(Pending {
                service,
                delivery,
                config,
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
            match this.state.as_mut().project() {
                StateProj::Attempt { future } => {
                    let error = match ready!(future.poll(cx)) {
                        Ok(decision) => return Poll::Ready(Ok(decision)),
                        Err(error) => error,
                    };
                    let Some(pending) = this.retry.take() else {
                        // Unreachable: the state leaves `Attempt` when this is taken.
                        return Poll::Ready(Err(error));
                    };
                    let future = Box::pin(failure_path(
                        pending.service,
                        pending.delivery,
                        pending.config,
                        error,
                    ));
                    this.state.set(State::Failing { future });
                }
                StateProj::Failing { future } => return future.as_mut().poll(cx),
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
            State::Failing { .. } => "failing",
        };
        let mut d = f.debug_struct("ResponseFuture");
        d.field("state", &state);
        if let Some(pending) = &self.retry {
            d.field("queue", &pending.delivery.queue())
                .field("attempt", &pending.delivery.attempt());
        }
        d.finish()
    }
}

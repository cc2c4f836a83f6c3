//! The response future of the circuit breaker.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::state::Shared;
use crate::decision::Decision;
use crate::error::{BoxError, Classify};

pin_project! {
    /// Response future of [`CircuitBreaker`](super::CircuitBreaker): the
    /// inner future, whose result is counted (and may trip, close or reopen
    /// the circuit) as it completes.
    ///
    /// # Cancellation safety
    ///
    /// Dropped before it completes, the attempt counts for nothing; a
    /// probe's gate lets another delivery be the probe.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<F, C> {
        #[pin]
        inner: F,
        shared: Arc<Shared<C>>,
        probe: Option<u64>,
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn new(inner: F, shared: Arc<Shared<C>>, probe: Option<u64>) -> Self {
        ResponseFuture {
            inner,
            shared,
            probe,
        }
    }
}

impl<F, C> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<Decision, BoxError>>,
    C: Classify,
{
    type Output = Result<Decision, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = std::task::ready!(this.inner.poll(cx));
        let seen = this.shared.judge(&output);
        this.shared.observe(seen, this.probe.take());
        Poll::Ready(output)
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("probe", &self.probe.is_some())
            .finish_non_exhaustive()
    }
}

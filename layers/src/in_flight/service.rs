use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;

use super::counter::{Guard, QueueCount};
use super::future::ResponseFuture;
use super::{Delivery, InFlightCounter, InFlightLayer};

/// Counts the requests inside `S` in an [`InFlightCounter`]; see the
/// [module docs](super).
///
/// # Clone
///
/// A clone shares the counter and is ready exactly when a clone of the
/// inner service is.
#[derive(Clone)]
pub struct InFlight<S> {
    inner: S,
    counter: InFlightCounter,
    /// The count of the last queue seen, so the hot path needs no lock.
    last: Option<Arc<QueueCount>>,
}

impl<S> InFlight<S> {
    /// Wraps `inner`, counting into `counter`.
    pub fn new(inner: S, counter: InFlightCounter) -> Self {
        InFlight {
            inner,
            counter,
            last: None,
        }
    }

    /// A layer that wraps services with an [`InFlight`] counting into `counter`.
    pub const fn layer(counter: InFlightCounter) -> InFlightLayer {
        InFlightLayer::new(counter)
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutable.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<Delivery> for InFlight<S>
where
    S: Service<Delivery>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Delivery) -> Self::Future {
        let count = self.counter.queue_count(&mut self.last, req.queue_arc());
        // Counted before the inner `call` runs: a panic in it uncounts.
        let guard = Guard::new(count);
        ResponseFuture::new(self.inner.call(req), guard)
    }
}

impl<S: fmt::Debug> fmt::Debug for InFlight<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("inner", &self.inner)
            .field("counter", &self.counter)
            .finish()
    }
}

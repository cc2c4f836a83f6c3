//! The claim point: [`Claim`] and [`ClaimLayer`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::PollSemaphore;
use tower::{Layer, Service};

use super::counter::{Guard, QueueCount};
use super::future::ClaimFuture;
use super::{Delivery, InFlightCounter};
use crate::Decision;

/// Claims each delivery as it enters the handler's side of the stack:
/// counts it as in flight and gives it a concurrency permit; see the
/// [module docs](super#held-until-claimed).
#[derive(Clone, Debug)]
pub struct ClaimLayer {
    counter: InFlightCounter,
    limit: Option<Arc<Semaphore>>,
}

impl ClaimLayer {
    /// Counts claimed deliveries into `counter`; no concurrency limit.
    pub const fn new(counter: InFlightCounter) -> Self {
        ClaimLayer {
            counter,
            limit: None,
        }
    }

    /// Runs at most as many claimed deliveries at once as `limit` has
    /// permits (share one semaphore between every service of a queue: the
    /// limit then holds across them). A delivery waiting before the claim
    /// holds no permit.
    pub fn concurrency(mut self, limit: Arc<Semaphore>) -> Self {
        self.limit = Some(limit);
        self
    }
}

impl<S> Layer<S> for ClaimLayer {
    type Service = Claim<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Claim {
            inner,
            counter: self.counter.clone(),
            last: None,
            limit: self.limit.clone().map(PollSemaphore::new),
            permit: None,
        }
    }
}

/// The claim point in front of `S`; see [`ClaimLayer`] and the
/// [module docs](super#held-until-claimed).
///
/// # Clone
///
/// A clone shares the counter and the limit, and holds no permit: it is
/// ready once it has one and a clone of the inner service is ready.
pub struct Claim<S> {
    inner: S,
    counter: InFlightCounter,
    /// The count of the last queue seen, so the hot path needs no lock.
    last: Option<Arc<QueueCount>>,
    limit: Option<PollSemaphore>,
    /// Taken by `poll_ready`, given to the next claimed delivery.
    permit: Option<OwnedSemaphorePermit>,
}

impl<S: Clone> Clone for Claim<S> {
    fn clone(&self) -> Self {
        Claim {
            inner: self.inner.clone(),
            counter: self.counter.clone(),
            last: self.last.clone(),
            limit: self.limit.clone(),
            permit: None,
        }
    }
}

impl<S> Claim<S> {
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

impl<S> Service<Delivery> for Claim<S>
where
    S: Service<Delivery, Response = Decision>,
{
    type Response = Decision;
    type Error = S::Error;
    type Future = ClaimFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.permit.is_none() {
            if let Some(limit) = &mut self.limit {
                // The semaphore is never closed.
                self.permit = std::task::ready!(limit.poll_acquire(cx));
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Delivery) -> Self::Future {
        if !req.claim() {
            // Handed back while held: the handler never runs, and the
            // permit stays here for the next delivery.
            return ClaimFuture::refused();
        }
        let count = self.counter.queue_count(&mut self.last, req.queue_arc());
        // Counted before the inner `call` runs: a panic in it uncounts.
        let guard = Guard::new(count);
        // The permit goes into the delivery's shared part, where the layers
        // below can give it up while only a copy's confirm is awaited; the
        // guard gives it back when the claim ends.
        let kept = self.permit.take().map(|permit| req.keep_permit(permit));
        ClaimFuture::claimed(self.inner.call(req), guard, kept)
    }
}

impl<S: fmt::Debug> fmt::Debug for Claim<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("inner", &self.inner)
            .field("counter", &self.counter)
            .field("limited", &self.limit.is_some())
            .field("permit", &self.permit.is_some())
            .finish()
    }
}

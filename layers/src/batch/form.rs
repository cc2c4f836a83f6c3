//! Forming batches before the claim: [`BatchLayer`] and [`Batching`].

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tower::{Layer, Service};

use super::state::{BatchState, Batcher, Forming, Ticket};
use crate::Delivery;

/// Forms batches in front of the claim; see the [module docs](super).
///
/// Each service it makes forms its own batches (a stack built again gets
/// new ones); the limit on running batches is the [`Batcher`]'s.
#[derive(Clone, Debug)]
pub struct BatchLayer {
    batcher: Batcher,
}

impl BatchLayer {
    /// Forms batches as `batcher` says.
    pub const fn new(batcher: Batcher) -> Self {
        BatchLayer { batcher }
    }
}

impl<S> Layer<S> for BatchLayer {
    type Service = Batching<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Batching {
            inner,
            forming: self.batcher.forming(),
        }
    }
}

/// Holds each delivery until its batch is formed and may run, then passes
/// it on (to the claim) with its place in the batch; see [`BatchLayer`].
///
/// # Clone
///
/// Clones form the same batches.
#[derive(Clone)]
pub struct Batching<S> {
    inner: S,
    forming: Forming,
}

impl<S> Batching<S> {
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

impl<S: fmt::Debug> fmt::Debug for Batching<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batching")
            .field("inner", &self.inner)
            .field("batcher", &self.forming.batcher)
            .finish()
    }
}

impl<S> Service<Delivery> for Batching<S>
where
    S: Service<Delivery> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    /// Always ready: a delivery waiting for its batch is held, and the
    /// service below is made ready for it once its batch may run (the
    /// broker's prefetch bounds how many wait).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, delivery: Delivery) -> Self::Future {
        let ticket = self.forming.join();
        let forming = self.forming.clone();
        let inner = self.inner.clone();
        Box::pin(member(forming, ticket, inner, delivery))
    }
}

/// One delivery's way through its batch: wait until the batch is formed
/// and may run (held), then go on to the claim and the handler.
async fn member<S>(
    forming: Forming,
    ticket: Ticket,
    inner: S,
    mut delivery: Delivery,
) -> Result<S::Response, S::Error>
where
    S: Service<Delivery>,
{
    let mut place = Place {
        state: ticket.state.clone(),
        index: ticket.index,
        held: Some(forming.batcher.clone()),
    };
    forming
        .batcher
        .held_counter()
        .fetch_add(1, Ordering::Relaxed);
    let state = &place.state;
    if !state.closed.is_cancelled() {
        let closed = std::pin::pin!(state.closed.cancelled());
        let timer = std::pin::pin!(tokio::time::sleep_until(state.deadline));
        if let futures::future::Either::Right(_) = futures::future::select(closed, timer).await {
            forming.close(state);
        }
    }
    state.permit(forming.batcher.running()).await;
    delivery.extensions_mut().insert(ticket);
    let watch = delivery.clone();
    let mut inner = inner;
    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
    let response = inner.call(delivery);
    // Claimed (in flight) or refused (handed back): held no longer.
    place.unhold();
    if watch.is_handed_back() {
        // Refused by the claim (handed back while held): not coming.
        place.state.leave(place.index);
    }
    response.await
}

/// The member's place: it leaves its batch when it is dropped (handed back
/// while held, or done — decided without the handler, say), so the batch
/// never waits for a member that will not come.
struct Place {
    state: Arc<BatchState>,
    index: usize,
    /// Counted as held until it passes the claim.
    held: Option<Batcher>,
}

impl Place {
    fn unhold(&mut self) {
        if let Some(b) = self.held.take() {
            b.held_counter().fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.unhold();
        self.state.leave(self.index);
    }
}

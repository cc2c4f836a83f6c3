//! Running a batch: [`BatchHandler`], the handler of every member.

use std::fmt;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::FutureExt;
use tower::Service;

use super::request::{Batch, BatchFailed, IntoOutcomes, Outcomes};
use super::state::{Runner, Ticket};
use crate::{BoxError, Delivery, Verdict};

/// Turns a service of [`Batch`]es into the handler of each delivery: the
/// members of a batch formed by a [`BatchLayer`](super::BatchLayer) wait
/// here for each other, the batch service is called once for them all,
/// and each gets its own outcome back. A delivery that is not a member of
/// a batch being formed — an in-process retry, or one that came another
/// way — is a batch of one.
///
/// # Clone
///
/// Clones call clones of the batch service.
#[derive(Clone)]
pub struct BatchHandler<S> {
    inner: S,
}

impl<S> BatchHandler<S> {
    /// Runs batches with `inner`.
    pub const fn new(inner: S) -> Self {
        BatchHandler { inner }
    }

    /// The batch service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The batch service, mutable.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the batch service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for BatchHandler<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchHandler")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S> Service<Delivery> for BatchHandler<S>
where
    S: Service<Batch> + Clone + Send + 'static,
    S::Response: IntoOutcomes + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Verdict;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Verdict, BoxError>>;

    /// Always ready: the batch service is made ready when a batch runs.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, delivery: Delivery) -> Self::Future {
        let inner = self.inner.clone();
        let Some(ticket) = delivery.extensions().get::<Ticket>().cloned() else {
            return alone(inner, delivery).boxed();
        };
        let runner = || -> Runner {
            Box::new(move |deliveries: Vec<Delivery>| run(inner.clone(), deliveries).boxed())
        };
        match ticket.state.arrive(ticket.index, delivery, runner) {
            Ok(outcome) => async move {
                outcome.await.unwrap_or_else(|_| {
                    Err(
                        "the batch ended without an outcome for this delivery (its handler \
                         panicked, or the runtime is shutting down)"
                            .into(),
                    )
                })
            }
            .boxed(),
            Err(delivery) => alone(self.inner.clone(), delivery).boxed(),
        }
    }
}

/// A batch of one (an in-process retry).
async fn alone<S>(inner: S, delivery: Delivery) -> Result<Verdict, BoxError>
where
    S: Service<Batch>,
    S::Response: IntoOutcomes,
    S::Error: Into<BoxError>,
{
    run(inner, vec![delivery])
        .await
        .pop()
        .unwrap_or_else(|| Err("the batch handler returned no outcome".into()))
}

/// Calls the batch service once; a failure of the whole batch (or a panic)
/// is every delivery's.
async fn run<S>(inner: S, deliveries: Vec<Delivery>) -> Outcomes
where
    S: Service<Batch>,
    S::Response: IntoOutcomes,
    S::Error: Into<BoxError>,
{
    let len = deliveries.len();
    let mut inner = inner;
    let call = async move {
        std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
        inner.call(Batch::new(deliveries)).await
    };
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(Ok(response)) => response.into_outcomes(len),
        Ok(Err(e)) => BatchFailed::new(e.into()).for_each(len),
        Err(panic) => {
            BatchFailed::new(Box::new(crate::HandlerPanic::from_payload(&*panic))).for_each(len)
        }
    }
}

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::task::{Context, Poll};
use std::time::Duration;

use tower::Service;

use super::future::ResponseFuture;
use super::{BoxError, CancelLayer, Decision, Delivery};
use crate::lifeline::Cancellation;
use crate::sync::CancellationToken;
use crate::IntoVerdict;

/// Runs `S` with the root's cancellation for every request, a caught panic and abandonment;
/// see the [module docs](super).
///
/// # Clone
///
/// Clones share the root token; a clone is ready exactly when a clone of the
/// inner service is.
#[derive(Clone)]
pub struct Cancel<S> {
    inner: S,
    // The view every request gets: cloning it is one atomic increment, so
    // a request costs no allocation and no lock here.
    view: Cancellation,
    abandon_after: Duration,
    self_waking: bool,
}

impl<S> Cancel<S> {
    /// Wraps `inner`, giving each request a view of `root`; abandons after
    /// [`CancelLayer::DEFAULT_ABANDON_AFTER`].
    pub fn new(inner: S, root: CancellationToken) -> Self {
        Cancel {
            inner,
            view: Cancellation::new(root),
            abandon_after: CancelLayer::DEFAULT_ABANDON_AFTER,
            self_waking: true,
        }
    }

    /// Wraps `inner`, giving each request `cancellation` itself (see
    /// [`CancelLayer::from_cancellation`]).
    pub fn from_cancellation(inner: S, cancellation: Cancellation) -> Self {
        Cancel {
            inner,
            view: cancellation,
            abandon_after: CancelLayer::DEFAULT_ABANDON_AFTER,
            self_waking: true,
        }
    }

    /// The transport wakes every running request when it cancels the root
    /// (running them in a [`Slots`](super::Slots), or wrapping each in a
    /// [`Wakeable`](super::future::Wakeable)), so the
    /// layer registers no waiter of its own; see
    /// [`CancelLayer::woken_by_transport`].
    pub fn woken_by_transport(mut self) -> Self {
        self.self_waking = false;
        self
    }

    /// How long a handler may run on after its token is cancelled before it
    /// is abandoned.
    pub fn abandon_after(mut self, abandon_after: Duration) -> Self {
        self.abandon_after = abandon_after;
        self
    }

    /// A layer giving each request a child of `root`.
    pub const fn layer(root: CancellationToken) -> CancelLayer {
        CancelLayer::new(root)
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

impl<S, R, E> Service<Delivery> for Cancel<S>
where
    S: Service<Delivery, Response = R, Error = E>,
    R: IntoVerdict,
    E: Into<BoxError>,
{
    type Response = Decision;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Delivery) -> Self::Future {
        let attempt = req.attempt();
        // No reference count touched when the request's lifeline carries
        // this view (the consumer loop's generations).
        req.use_token(&self.view);
        let token = self.view.clone();
        // A handler may panic before it returns its future, too.
        match panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(fut) => {
                ResponseFuture::new(fut, token, self.abandon_after, attempt, self.self_waking)
            }
            Err(payload) => ResponseFuture::panicked(&*payload, token, self.abandon_after),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Cancel<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("inner", &self.inner)
            .field("token", &self.view)
            .field("abandon_after", &self.abandon_after)
            .field("self_waking", &self.self_waking)
            .finish()
    }
}

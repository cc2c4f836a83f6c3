use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tower::Service;

use super::future::ResponseFuture;
use super::{BoxError, CancelLayer, Decision, Delivery, DEFAULT_ABANDON_AFTER};
use crate::IntoOutcome;

/// Runs `S` with a child token per request, a caught panic and abandonment;
/// see the [module docs](super).
///
/// # Clone
///
/// Clones share the root token; a clone is ready exactly when a clone of the
/// inner service is.
#[derive(Clone)]
pub struct Cancel<S> {
    inner: S,
    root: CancellationToken,
    // A child of `root` that lives as long as this service and its clones.
    // tokio-util frees a token's list of children when the last child is
    // dropped; this one keeps the list alive, so a request's child token
    // costs one allocation (its node), not two (node and list). Shared by
    // an `Arc` so cloning the service (the retry layer does, per request)
    // takes no lock.
    _keep: Arc<CancellationToken>,
    abandon_after: Duration,
}

impl<S> Cancel<S> {
    /// Wraps `inner`, giving each request a child of `root`; abandons after
    /// [`DEFAULT_ABANDON_AFTER`].
    pub fn new(inner: S, root: CancellationToken) -> Self {
        Cancel {
            inner,
            _keep: Arc::new(root.child_token()),
            root,
            abandon_after: DEFAULT_ABANDON_AFTER,
        }
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
    R: IntoOutcome,
    E: Into<BoxError>,
{
    type Response = Decision;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Delivery) -> Self::Future {
        let child = self.root.child_token();
        let attempt = req.attempt();
        req.set_token(child.clone());
        // A handler may panic before it returns its future, too.
        match panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(fut) => ResponseFuture::new(fut, child, self.abandon_after, attempt),
            Err(payload) => ResponseFuture::panicked(&*payload, child, self.abandon_after),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Cancel<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("inner", &self.inner)
            .field("root", &self.root)
            .field("abandon_after", &self.abandon_after)
            .finish()
    }
}

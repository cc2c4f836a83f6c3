//! The futures of the in-flight layer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::counter::{Guard, Shared};
use crate::delivery::PermitGuard;
use crate::sync::atomic::Ordering;
use crate::sync::{self, OwnedNotified};

pin_project! {
    /// Response future of [`InFlight`](super::InFlight): the inner future,
    /// counted as in flight until it completes or is dropped.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        guard: Option<Guard>,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, guard: Guard) -> Self {
        ResponseFuture {
            inner,
            guard: Some(guard),
        }
    }
}

impl<F: Future> Future for ResponseFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = std::task::ready!(this.inner.poll(cx));
        // Uncount as soon as the result exists, not when the caller gets
        // round to dropping the future.
        this.guard.take();
        Poll::Ready(output)
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("in_flight", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// Resolves when nothing is in flight; returned by
    /// [`InFlightCounter::wait_idle`](super::InFlightCounter::wait_idle).
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: dropping it unregisters the waiter and loses nothing.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct WaitIdle {
        shared: Arc<Shared>,
        #[pin]
        notified: OwnedNotified,
        waiter: Waiter,
    }
}

/// Counts a live `WaitIdle` (see `Shared::waiters`).
struct Waiter(Arc<Shared>);

impl Drop for Waiter {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

impl WaitIdle {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        // Created before the waiter is counted: a notification sent once
        // the count is seen reaches this future even before its first poll.
        let notified = shared.idle.clone().notified_owned();
        shared.waiters.fetch_add(1, Ordering::SeqCst);
        WaitIdle {
            waiter: Waiter(shared.clone()),
            shared,
            notified,
        }
    }
}

impl Future for WaitIdle {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        // Register before reading the count: a guard that brings the count
        // to 0 after the read then wakes this waiter.
        this.notified.as_mut().enable();
        // `waiters` written (in `new`), then `total` read: see `Guard`'s drop.
        sync::seq_cst_order();
        if this.shared.total.load(Ordering::SeqCst) == 0 {
            return Poll::Ready(());
        }
        // Woken only by the guard that brought the total to 0: resolve,
        // even if another delivery has started since.
        this.notified.poll(cx)
    }
}

impl fmt::Debug for WaitIdle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitIdle")
            .field("total", &self.shared.total.load(Ordering::Relaxed))
            .finish()
    }
}

pin_project! {
    /// Response future of [`Claim`](super::Claim): the inner future,
    /// counted as in flight until it completes or is dropped, and holding
    /// its concurrency permit until then or until the layers below give it
    /// up while only a copy's confirm is awaited (see the
    /// [module docs](super#confirming)) — or, for a delivery handed back
    /// before the claim, [`Decision::HandBack`](crate::Decision::HandBack)
    /// at once, the inner service never called.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ClaimFuture<F> {
        #[pin]
        inner: Option<F>,
        guard: Option<Guard>,
        permit: Option<ClaimPermit>,
    }
}

/// A claimed delivery's concurrency permit: kept in the delivery, where the
/// layers below may give it up (the usual case), or kept here by a second
/// claim point under a first.
pub(crate) type ClaimPermit = Result<PermitGuard, tokio::sync::OwnedSemaphorePermit>;

impl<F> ClaimFuture<F> {
    pub(crate) fn claimed(inner: F, guard: Guard, permit: Option<ClaimPermit>) -> Self {
        ClaimFuture {
            inner: Some(inner),
            guard: Some(guard),
            permit,
        }
    }

    pub(crate) fn refused() -> Self {
        ClaimFuture {
            inner: None,
            guard: None,
            permit: None,
        }
    }
}

impl<F, E> Future for ClaimFuture<F>
where
    F: Future<Output = Result<crate::Decision, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(Ok(crate::Decision::HandBack));
        };
        let output = std::task::ready!(inner.poll(cx));
        // Uncount and free the permit as soon as the result exists.
        this.guard.take();
        this.permit.take();
        Poll::Ready(output)
    }
}

impl<F> fmt::Debug for ClaimFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimFuture")
            .field("claimed", &self.inner.is_some())
            .field("in_flight", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

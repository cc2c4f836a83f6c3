use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;

use crate::redelivery::RedeliveryLimitLayer;

use super::future::ResponseFuture;
use crate::decision::Decision;
use crate::delivery::Delivery;
use crate::error::{BoxError, Classify, DefaultClassifier};
use crate::publish::Publish;
use crate::retry::RetryWaits;

/// Dead-letter, redelivery limit and retry in one service; see the
/// [module docs](super).
///
/// # Clone
///
/// A clone is a clone of the inner service with the same configuration
/// (the retry wait count is shared).
pub struct DeadLetterRetry<S, P, C = DefaultClassifier> {
    inner: S,
    shared: Arc<Shared<P, C>>,
    redelivery_limit: RedeliveryLimitLayer,
    dead_letter: bool,
}

/// The two layers' configurations, behind the one reference a delivery
/// keeps.
pub(crate) struct Shared<P, C> {
    pub(crate) retry: Arc<crate::retry::Config<P, C>>,
    pub(crate) dead_letter: Arc<crate::dead_letter::Config<P, C>>,
}

impl<S, P, C> DeadLetterRetry<S, P, C> {
    pub(crate) fn from_parts(
        inner: S,
        shared: Arc<Shared<P, C>>,
        redelivery_limit: RedeliveryLimitLayer,
        dead_letter: bool,
    ) -> Self {
        DeadLetterRetry {
            inner,
            shared,
            redelivery_limit,
            dead_letter,
        }
    }

    /// The in-process retry waits in progress (shared with the layer and
    /// every service it made).
    pub fn waiting(&self) -> RetryWaits {
        RetryWaits::new(self.shared.retry.shared.clone())
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutable.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, P, C> Service<Delivery> for DeadLetterRetry<S, P, C>
where
    S: Service<Delivery, Response = Decision, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
    P: Publish,
    C: Classify,
{
    type Response = Decision;
    type Error = BoxError;
    type Future = ResponseFuture<S, P, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut delivery: Delivery) -> Self::Future {
        let shared = self.shared.clone();
        if shared.retry.policy.in_queue {
            crate::retry::in_queue_attempt(&mut delivery);
        }
        if let Some(decision) = crate::redelivery::limited(&delivery, self.redelivery_limit) {
            // Not called: the service made ready stays for the next call.
            return ResponseFuture::limited(decision, delivery, shared, self.dead_letter);
        }
        // The service made ready goes into the future (a retry calls it
        // again); a fresh clone, not yet ready, stays here.
        let clone = self.inner.clone();
        let mut inner = mem::replace(&mut self.inner, clone);
        let future = inner.call(delivery.clone());
        ResponseFuture::attempt(future, inner, delivery, shared, self.dead_letter)
    }
}

impl<S: Clone, P, C> Clone for DeadLetterRetry<S, P, C> {
    fn clone(&self) -> Self {
        DeadLetterRetry {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            redelivery_limit: self.redelivery_limit,
            dead_letter: self.dead_letter,
        }
    }
}

impl<S: fmt::Debug, P, C> fmt::Debug for DeadLetterRetry<S, P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterRetry")
            .field("inner", &self.inner)
            .field("retry", &self.shared.retry)
            .field("redelivery_limit", &self.redelivery_limit)
            .field("dead_letter", &self.dead_letter)
            .finish()
    }
}

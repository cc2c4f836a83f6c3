use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio_util::sync::CancellationToken;
use tower::Service;

use super::future::ResponseFuture;
use super::layer::{Config, RetryLayer, RetryWaits};
use super::policy::RetryPolicy;
use crate::decision::Decision;
use crate::delivery::Delivery;
use crate::error::{BoxError, Classify, DefaultClassifier};
use crate::publish::Publish;

/// Retries a failed delivery on a [`RetryPolicy`]: in process for a short
/// delay, on a rung queue in the broker for a long one; dead-letters it when
/// attempts run out or the failure is permanent.
///
/// See the [module docs](crate::retry) for the behaviour.
pub struct Retry<S, P, C = DefaultClassifier> {
    inner: S,
    config: Arc<Config<P, C>>,
}

impl<S, P: Publish> Retry<S, P> {
    /// Wraps `inner` with the default classifier. Use [`RetryLayer`] to share
    /// the wait count between services or to choose a classifier.
    pub fn new(inner: S, policy: RetryPolicy, publisher: P, draining: CancellationToken) -> Self {
        tower::Layer::layer(&RetryLayer::new(policy, publisher, draining), inner)
    }

    /// A [`RetryLayer`]; the same as [`RetryLayer::new`].
    pub fn layer(policy: RetryPolicy, publisher: P, draining: CancellationToken) -> RetryLayer<P> {
        RetryLayer::new(policy, publisher, draining)
    }
}

impl<S, P, C> Retry<S, P, C> {
    pub(crate) fn from_config(inner: S, config: Arc<Config<P, C>>) -> Self {
        Retry { inner, config }
    }

    /// The in-process waits in progress (shared with the layer and every
    /// service it made).
    pub fn waiting(&self) -> RetryWaits {
        RetryWaits::new(self.config.shared.clone())
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

impl<S, P, C> Service<Delivery> for Retry<S, P, C>
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
        if self.config.policy.in_queue {
            in_queue_attempt(&mut delivery);
        }
        // The service made ready goes into the future (it may call again);
        // a fresh clone, not yet ready, stays here.
        let clone = self.inner.clone();
        let mut inner = mem::replace(&mut self.inner, clone);
        let future = inner.call(delivery.clone());
        ResponseFuture::new(future, inner, delivery, self.config.clone())
    }
}

/// Retries in the queue itself leave the message as it was published: its
/// attempt is one more than the failed returns the broker counted
/// (`x-delivery-count`), or what its attempt header says if that is more.
pub(crate) fn in_queue_attempt(delivery: &mut Delivery) {
    let failed = delivery
        .headers()
        .get(crate::headers::DELIVERY_COUNT_HEADER)
        .and_then(|v| v.as_i64())
        .and_then(|n| u32::try_from(n).ok());
    if let Some(n) = failed {
        let attempt = delivery.attempt().max(n.saturating_add(1));
        delivery.set_attempt(attempt);
    }
}

impl<S: Clone, P, C> Clone for Retry<S, P, C> {
    fn clone(&self) -> Self {
        Retry {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, P, C> fmt::Debug for Retry<S, P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

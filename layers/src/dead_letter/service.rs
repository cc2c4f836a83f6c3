use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;

use super::future::{Pending, ResponseFuture};
use super::layer::DeadLetterLayer;
use super::replies::ErrorReplies;
use crate::decision::Decision;
use crate::delivery::Delivery;
use crate::error::{BoxError, Classify, DefaultClassifier};
use crate::publish::Publish;

/// Publishes what cannot be handled to the queue's dead-letter queue,
/// `{queue}.dlq`, with the reason headers and a confirm.
///
/// See the [module docs](crate::dead_letter) for the behaviour.
pub struct DeadLetter<S, P, C = DefaultClassifier> {
    inner: S,
    config: Arc<Config<P, C>>,
    enabled: bool,
}

/// What every call of one service shares.
pub(crate) struct Config<P, C> {
    pub(crate) publisher: P,
    pub(crate) classifier: Arc<C>,
    pub(crate) replies: ErrorReplies,
}

impl<S, P: Publish> DeadLetter<S, P> {
    /// Wraps `inner`, enabled, with the default classifier.
    pub fn new(inner: S, publisher: P) -> Self {
        DeadLetter::from_parts(
            inner,
            publisher,
            Arc::new(DefaultClassifier),
            true,
            ErrorReplies::none(),
        )
    }

    /// A [`DeadLetterLayer`]; the same as [`DeadLetterLayer::new`].
    pub fn layer(publisher: P) -> DeadLetterLayer<P> {
        DeadLetterLayer::new(publisher)
    }
}

impl<S, P, C> DeadLetter<S, P, C> {
    pub(crate) fn from_parts(
        inner: S,
        publisher: P,
        classifier: Arc<C>,
        enabled: bool,
        replies: ErrorReplies,
    ) -> Self {
        DeadLetter {
            inner,
            config: Arc::new(Config {
                publisher,
                classifier,
                replies,
            }),
            enabled,
        }
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

impl<S, P, C> Service<Delivery> for DeadLetter<S, P, C>
where
    S: Service<Delivery, Response = Decision, Error = BoxError>,
    P: Publish,
    C: Classify,
{
    type Response = Decision;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, P, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, delivery: Delivery) -> Self::Future {
        // Disabled, a delivery is kept only if it is a request whose caller
        // is owed an error reply should it be dead-lettered.
        let pending =
            (self.enabled || owed_reply(&self.config.replies, &delivery)).then(|| Pending {
                delivery: delivery.clone(),
                config: self.config.clone(),
                copy: self.enabled,
            });
        ResponseFuture::new(self.inner.call(delivery), pending)
    }
}

/// Whether `delivery` is a request whose caller `replies` allows an error
/// reply to.
pub(crate) fn owed_reply(replies: &ErrorReplies, delivery: &Delivery) -> bool {
    replies.is_serving()
        && delivery
            .properties()
            .reply_to
            .as_deref()
            .is_some_and(|r| replies.allows(r))
}

impl<S: Clone, P, C> Clone for DeadLetter<S, P, C> {
    fn clone(&self) -> Self {
        DeadLetter {
            inner: self.inner.clone(),
            config: self.config.clone(),
            enabled: self.enabled,
        }
    }
}

impl<S: fmt::Debug, P, C> fmt::Debug for DeadLetter<S, P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetter")
            .field("inner", &self.inner)
            .field("publisher", &std::any::type_name::<P>())
            .field("classifier", &std::any::type_name::<C>())
            .field("enabled", &self.enabled)
            .finish()
    }
}

use std::fmt;
use std::sync::Arc;

use tower::Layer;

use super::service::{DeadLetterRetry, Shared};
use crate::dead_letter::DeadLetterLayer;
use crate::error::{Classify, DefaultClassifier};
use crate::publish::Publish;
use crate::redelivery::RedeliveryLimitLayer;
use crate::retry::{RetryLayer, RetryWaits};

/// Applies [`DeadLetterRetry`]: the dead-letter, redelivery-limit and
/// retry layers, stacked in that order, as one service; see the [module
/// docs](super).
pub struct DeadLetterRetryLayer<P, C = DefaultClassifier> {
    shared: Arc<Shared<P, C>>,
    redelivery_limit: RedeliveryLimitLayer,
    dead_letter: bool,
}

impl<P: Publish, C: Classify> DeadLetterRetryLayer<P, C> {
    /// The three layers as one. Each keeps its own settings: the
    /// dead-letter layer's publisher, classifier and whether it is enabled;
    /// the bound on redeliveries; the retry layer's policy, publisher,
    /// classifier, drain token and wait count (shared with `retry` and
    /// every service it made).
    pub fn new(
        dead_letter: DeadLetterLayer<P, C>,
        redelivery_limit: RedeliveryLimitLayer,
        retry: RetryLayer<P, C>,
    ) -> Self {
        DeadLetterRetryLayer {
            shared: Arc::new(Shared {
                retry: retry.config().clone(),
                dead_letter: Arc::new(dead_letter.config()),
            }),
            redelivery_limit,
            dead_letter: dead_letter.is_enabled(),
        }
    }
}

impl<P, C> DeadLetterRetryLayer<P, C> {
    /// The in-process retry waits in progress, across every service this
    /// layer (and the retry layer it was built from) made.
    pub fn waiting(&self) -> RetryWaits {
        RetryWaits::new(self.shared.retry.shared.clone())
    }
}

impl<S, P: Publish, C: Classify> Layer<S> for DeadLetterRetryLayer<P, C> {
    type Service = DeadLetterRetry<S, P, C>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadLetterRetry::from_parts(
            inner,
            self.shared.clone(),
            self.redelivery_limit,
            self.dead_letter,
        )
    }
}

impl<P, C> Clone for DeadLetterRetryLayer<P, C> {
    fn clone(&self) -> Self {
        DeadLetterRetryLayer {
            shared: self.shared.clone(),
            redelivery_limit: self.redelivery_limit,
            dead_letter: self.dead_letter,
        }
    }
}

impl<P, C> fmt::Debug for DeadLetterRetryLayer<P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterRetryLayer")
            .field("retry", &self.shared.retry)
            .field("redelivery_limit", &self.redelivery_limit)
            .field("dead_letter", &self.dead_letter)
            .finish()
    }
}

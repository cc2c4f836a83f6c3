use std::fmt;
use std::sync::Arc;

use tower::Layer;

use super::replies::ErrorReplies;
use super::service::DeadLetter;
use crate::error::{Classify, DefaultClassifier};
use crate::publish::Publish;

/// Applies [`DeadLetter`] to a service: what cannot be handled is published
/// to the queue's dead-letter queue with the reason headers.
///
/// See the [module docs](crate::dead_letter) for the behaviour.
pub struct DeadLetterLayer<P, C = DefaultClassifier> {
    publisher: P,
    classifier: Arc<C>,
    enabled: bool,
    replies: ErrorReplies,
}

impl<P> DeadLetterLayer<P> {
    /// A dead-letter layer publishing with `publisher`, enabled, classifying
    /// failures with [`DefaultClassifier`].
    pub fn new(publisher: P) -> Self {
        DeadLetterLayer {
            publisher,
            classifier: Arc::new(DefaultClassifier),
            enabled: true,
            replies: ErrorReplies::none(),
        }
    }
}

impl<P, C> DeadLetterLayer<P, C> {
    /// Classifies failures that reach this layer with `classifier` instead
    /// (only failures no retry layer below has turned into a decision).
    pub fn classifier<C2: Classify>(self, classifier: C2) -> DeadLetterLayer<P, C2> {
        DeadLetterLayer {
            publisher: self.publisher,
            classifier: Arc::new(classifier),
            enabled: self.enabled,
            replies: self.replies,
        }
    }

    /// Whether the layer acts (default `true`). Disabled, it passes every
    /// result through untouched: for a queue configured with
    /// `dead_letter: false`, so one stack type serves every queue.
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Whether the layer acts.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Which dead-lettered requests get an error reply (default
    /// [`ErrorReplies::none`]): see [`ErrorReplies`]. Applies enabled or
    /// not.
    pub fn replies(mut self, replies: ErrorReplies) -> Self {
        self.replies = replies;
        self
    }

    /// What its services share.
    pub(crate) fn config(&self) -> super::Config<P, C>
    where
        P: Clone,
    {
        super::Config {
            publisher: self.publisher.clone(),
            classifier: self.classifier.clone(),
            replies: self.replies.clone(),
        }
    }
}

impl<S, P: Publish, C: Classify> Layer<S> for DeadLetterLayer<P, C> {
    type Service = DeadLetter<S, P, C>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadLetter::from_parts(
            inner,
            self.publisher.clone(),
            self.classifier.clone(),
            self.enabled,
            self.replies.clone(),
        )
    }
}

impl<P: Clone, C> Clone for DeadLetterLayer<P, C> {
    fn clone(&self) -> Self {
        DeadLetterLayer {
            publisher: self.publisher.clone(),
            classifier: self.classifier.clone(),
            enabled: self.enabled,
            replies: self.replies.clone(),
        }
    }
}

impl<P, C> fmt::Debug for DeadLetterLayer<P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterLayer")
            .field("publisher", &std::any::type_name::<P>())
            .field("classifier", &std::any::type_name::<C>())
            .field("enabled", &self.enabled)
            .field("replies", &self.replies)
            .finish()
    }
}

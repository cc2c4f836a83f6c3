use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;
use tower::Layer;

use super::policy::RetryPolicy;
use super::service::Retry;
use crate::error::{Classify, DefaultClassifier};
use crate::publish::Publish;

/// Applies [`Retry`] to a service: failures are retried on a
/// [`RetryPolicy`], in process or on a rung queue, until attempts run out.
///
/// Every service this layer makes shares one [`RetryWaits`] counter and one
/// record of the missing rungs already warned about.
///
/// See the [module docs](crate::retry) for the behaviour.
pub struct RetryLayer<P, C = DefaultClassifier> {
    config: Arc<Config<P, C>>,
}

impl<P> RetryLayer<P> {
    /// A retry layer on `policy`, publishing rung copies with `publisher`,
    /// and declining in-process waits once `draining` is cancelled.
    ///
    /// Failures are classified by [`DefaultClassifier`]; see
    /// [`classifier`](Self::classifier).
    pub fn new(policy: RetryPolicy, publisher: P, draining: CancellationToken) -> Self {
        RetryLayer {
            config: Arc::new(Config {
                policy,
                publisher,
                classifier: DefaultClassifier,
                draining,
                shared: Arc::new(Shared::default()),
            }),
        }
    }
}

impl<P: Clone, C> RetryLayer<P, C> {
    /// Classifies failures with `classifier` instead.
    pub fn classifier<C2: Classify>(self, classifier: C2) -> RetryLayer<P, C2> {
        let c = &self.config;
        RetryLayer {
            config: Arc::new(Config {
                policy: c.policy.clone(),
                publisher: c.publisher.clone(),
                classifier,
                draining: c.draining.clone(),
                shared: c.shared.clone(),
            }),
        }
    }
}

impl<P, C> RetryLayer<P, C> {
    /// The number of in-process waits in progress, across every service
    /// this layer made: the state a drain may read.
    pub fn waiting(&self) -> RetryWaits {
        RetryWaits::new(self.config.shared.clone())
    }

    /// The retry schedule.
    pub fn policy(&self) -> &RetryPolicy {
        &self.config.policy
    }

    /// What every service of this layer shares.
    pub(crate) fn config(&self) -> &Arc<Config<P, C>> {
        &self.config
    }
}

impl<S, P: Publish, C: Classify> Layer<S> for RetryLayer<P, C> {
    type Service = Retry<S, P, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::from_config(inner, self.config.clone())
    }
}

impl<P, C> Clone for RetryLayer<P, C> {
    fn clone(&self) -> Self {
        RetryLayer {
            config: self.config.clone(),
        }
    }
}

impl<P, C> fmt::Debug for RetryLayer<P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RetryLayer").field(&self.config).finish()
    }
}

/// A count of the in-process retry waits in progress, shared by every
/// service one [`RetryLayer`] made. Cheap to clone.
///
/// A wait ends when its delay has passed, when the drain starts (the
/// delivery moves to its rung or is handed back), or when its future is
/// dropped; the count follows in each case.
#[derive(Clone)]
pub struct RetryWaits {
    shared: Arc<Shared>,
}

impl RetryWaits {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        RetryWaits { shared }
    }

    /// How many deliveries are waiting out an in-process backoff now.
    pub fn count(&self) -> usize {
        self.shared.waiting()
    }
}

impl fmt::Debug for RetryWaits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryWaits")
            .field("count", &self.count())
            .finish()
    }
}

/// What every service of one layer shares.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    waiting: AtomicUsize,
    /// Rung names already warned about as missing; touched only on that
    /// failure path.
    warned_missing: Mutex<HashSet<String>>,
}

impl Shared {
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Counts a wait for as long as the guard lives.
    pub(crate) fn wait_guard(self: &Arc<Self>) -> WaitGuard {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        WaitGuard {
            shared: self.clone(),
        }
    }

    /// `true` the first time `rung` is reported missing.
    pub(crate) fn first_missing(&self, rung: &str) -> bool {
        let mut set = self
            .warned_missing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if set.contains(rung) {
            false
        } else {
            set.insert(rung.to_owned())
        }
    }
}

/// Decrements the wait count on drop: the wait ended, however it ended.
#[derive(Debug)]
pub(crate) struct WaitGuard {
    shared: Arc<Shared>,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The per-layer configuration every call of every service shares.
pub(crate) struct Config<P, C> {
    pub(crate) policy: RetryPolicy,
    pub(crate) publisher: P,
    pub(crate) classifier: C,
    pub(crate) draining: CancellationToken,
    pub(crate) shared: Arc<Shared>,
}

impl<P, C> fmt::Debug for Config<P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("policy", &self.policy)
            .field("publisher", &std::any::type_name::<P>())
            .field("classifier", &std::any::type_name::<C>())
            .field("draining", &self.draining.is_cancelled())
            .field("waiting", &self.shared.waiting())
            .finish()
    }
}

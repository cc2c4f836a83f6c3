use std::fmt;
use std::sync::Arc;

use tower::Layer;

use super::policy::BreakerPolicy;
use super::service::CircuitBreaker;
use super::state::Shared;
use crate::error::{Classify, DefaultClassifier};
use crate::pause::{Circuit, PauseHandle};

/// Applies [`CircuitBreaker`] to a service: counts its attempts and opens
/// the circuit of the gate controlled by a [`PauseHandle`]; see the
/// [module docs](super).
///
/// Every service this layer makes (a stack built again after a reconnect,
/// say) shares one window and one circuit: keep the layer, not a new one
/// per service.
pub struct CircuitBreakerLayer<C = DefaultClassifier> {
    shared: Arc<Shared<C>>,
}

impl CircuitBreakerLayer {
    /// A breaker on `policy` acting on the gate `gate` controls (the
    /// [`PauseLayer`](crate::PauseLayer) outermost in the same stack).
    /// Failures are classified by [`DefaultClassifier`]; see
    /// [`classifier`](Self::classifier).
    pub fn new(gate: PauseHandle, policy: BreakerPolicy) -> Self {
        CircuitBreakerLayer {
            shared: Arc::new(Shared::new(gate, policy, DefaultClassifier)),
        }
    }
}

impl<C: Classify> CircuitBreakerLayer<C> {
    /// Classifies failures with `classifier` instead (give it the retry
    /// layer's: what that retries, this counts).
    pub fn classifier<C2: Classify>(self, classifier: C2) -> CircuitBreakerLayer<C2> {
        let s = &self.shared;
        CircuitBreakerLayer {
            shared: Arc::new(Shared::new(s.gate.clone(), s.policy.clone(), classifier)),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &BreakerPolicy {
        &self.shared.policy
    }

    /// The circuit's state now.
    pub fn circuit(&self) -> Circuit {
        self.shared.gate.circuit()
    }
}

impl<S, C: Classify> Layer<S> for CircuitBreakerLayer<C> {
    type Service = CircuitBreaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::from_shared(inner, self.shared.clone())
    }
}

impl<C> Clone for CircuitBreakerLayer<C> {
    fn clone(&self) -> Self {
        CircuitBreakerLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<C> fmt::Debug for CircuitBreakerLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CircuitBreakerLayer")
            .field(&self.shared)
            .finish()
    }
}

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;

use super::future::ResponseFuture;
use super::layer::CircuitBreakerLayer;
use super::policy::BreakerPolicy;
use super::state::Shared;
use crate::decision::Decision;
use crate::delivery::Delivery;
use crate::error::{BoxError, Classify};
use crate::pause::{Circuit, PauseHandle, ProbeMark};

/// Counts the attempts of `S` and opens the circuit of a pause gate when
/// too many fail; see the [module docs](super).
///
/// # Clone
///
/// Clones share the window and the circuit; a clone is ready exactly when a
/// clone of the inner service is.
pub struct CircuitBreaker<S, C = crate::DefaultClassifier> {
    inner: S,
    shared: Arc<Shared<C>>,
}

impl<S> CircuitBreaker<S> {
    /// Wraps `inner`; see [`CircuitBreakerLayer::new`] (use the layer to
    /// share one circuit between the services of several stacks).
    pub fn new(inner: S, gate: PauseHandle, policy: BreakerPolicy) -> Self {
        tower::Layer::layer(&CircuitBreakerLayer::new(gate, policy), inner)
    }

    /// A [`CircuitBreakerLayer`]; the same as [`CircuitBreakerLayer::new`].
    pub fn layer(gate: PauseHandle, policy: BreakerPolicy) -> CircuitBreakerLayer {
        CircuitBreakerLayer::new(gate, policy)
    }
}

impl<S, C> CircuitBreaker<S, C> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<C>>) -> Self {
        CircuitBreaker { inner, shared }
    }

    /// The circuit's state now.
    pub fn circuit(&self) -> Circuit {
        self.shared.gate.circuit()
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

impl<S, C> Service<Delivery> for CircuitBreaker<S, C>
where
    S: Service<Delivery, Response = Decision, Error = BoxError>,
    C: Classify,
{
    type Response = Decision;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, delivery: Delivery) -> Self::Future {
        let gate = &self.shared.gate.shared;
        gate.name_queue(delivery.queue_arc());
        // Only a half-open circuit has a probe: a closed one reads no
        // extension.
        let probe = if gate.word().circuit() == Circuit::HalfOpen {
            delivery.extensions().get::<ProbeMark>().map(|m| m.0)
        } else {
            None
        };
        ResponseFuture::new(self.inner.call(delivery), self.shared.clone(), probe)
    }
}

impl<S: Clone, C> Clone for CircuitBreaker<S, C> {
    fn clone(&self) -> Self {
        CircuitBreaker {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for CircuitBreaker<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .field("shared", &self.shared)
            .finish()
    }
}

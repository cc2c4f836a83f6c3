use std::fmt;
use std::mem;
use std::task::{Context, Poll};

use tower::Service;

use super::circuit::ProbeMark;
use super::future::ProbeTicket;
use super::future::ResponseFuture;
use super::handle::{Admit, HeldGuard};
use super::{Decision, Delivery, PauseHandle, PauseLayer};

/// A pause gate in front of `S`; see the [module docs](super).
///
/// # Clone
///
/// Clones share the gate; a clone is ready exactly when a clone of the inner
/// service is.
#[derive(Clone)]
pub struct Pause<S> {
    inner: S,
    handle: PauseHandle,
}

impl<S> Pause<S> {
    /// Puts the gate controlled by `handle` in front of `inner`.
    pub fn new(inner: S, handle: PauseHandle) -> Self {
        Pause { inner, handle }
    }

    /// A layer that puts the gate controlled by `handle` in front of services.
    pub const fn layer(handle: PauseHandle) -> PauseLayer {
        PauseLayer::new(handle)
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

impl<S> Service<Delivery> for Pause<S>
where
    S: Service<Delivery, Response = Decision> + Clone,
{
    type Response = Decision;
    type Error = S::Error;
    type Future = ResponseFuture<S, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Delivery) -> Self::Future {
        let shared = &self.handle.shared;
        match shared.admit() {
            Admit::Call => ResponseFuture::calling(self.inner.call(req)),
            Admit::HandBack => ResponseFuture::handed_back(),
            Admit::Probe(epoch) => {
                let ticket = ProbeTicket::new(shared.clone(), epoch);
                req.extensions_mut().insert(ProbeMark(epoch));
                ResponseFuture::probing(self.inner.call(req), ticket)
            }
            Admit::Hold => {
                // Take the service that was made ready; leave a clone (not
                // yet ready) for the next `poll_ready`.
                let clone = self.inner.clone();
                let ready = mem::replace(&mut self.inner, clone);
                let notified = shared.notify.clone().notified_owned();
                ResponseFuture::held(ready, req, notified, HeldGuard::new(shared.clone()))
            }
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Pause<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pause")
            .field("inner", &self.inner)
            .field("handle", &self.handle)
            .finish()
    }
}

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;

use super::future::ResponseFuture;
use super::table::{Entry, Held, Place, Shared};
use super::{Delivery, Key, PartitionLayer};

/// Runs deliveries of one key one at a time, in arrival order, in front
/// of `S`; see the [module docs](super).
///
/// # Clone
///
/// Clones share the keys and their lines (so do the services of one
/// [`PartitionLayer`]); a clone is ready when there is room to wait and a
/// clone of the inner service is ready.
pub struct Partition<S, K> {
    inner: S,
    key: K,
    shared: Arc<Shared>,
}

impl<S: Clone, K: Clone> Clone for Partition<S, K> {
    fn clone(&self) -> Self {
        Partition {
            inner: self.inner.clone(),
            key: self.key.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, K> Partition<S, K> {
    pub(super) fn new(inner: S, key: K, shared: Arc<Shared>) -> Self {
        Partition { inner, key, shared }
    }

    /// A layer keyed by `key` with the default bounds.
    pub fn layer(key: K) -> PartitionLayer<K> {
        PartitionLayer::new(key)
    }

    /// Deliveries waiting for their key's turn now (held: not in flight).
    pub fn waiting(&self) -> usize {
        self.shared.waiting()
    }

    /// Keys running now, and slots handed over to the locked table.
    #[cfg(test)]
    pub(crate) fn keys_and_locked_slots(&self) -> (usize, usize) {
        (self.shared.running_keys(), self.shared.locked_slots())
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

impl<S, K> Service<Delivery> for Partition<S, K>
where
    S: Service<Delivery> + Clone,
    K: Key,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Room to wait first: a full line takes nothing more in, and the
        // broker's prefetch, not memory, bounds what waits.
        if !self.shared.poll_room(cx.waker()) {
            return Poll::Pending;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Delivery) -> Self::Future {
        let Some(key) = self.key.key_mut(&mut req) else {
            return ResponseFuture::running(self.inner.call(req), None);
        };
        match self.shared.enter(key) {
            Entry::Run => {
                let held = Held {
                    shared: self.shared.clone(),
                    key,
                };
                ResponseFuture::running(self.inner.call(req), Some(held))
            }
            Entry::Wait(turn) => {
                // The ready service stays here for the next delivery (what
                // readiness reserved, a concurrency permit, goes to a
                // delivery that can run); the waiter readies a clone when
                // its turn comes.
                let place = Place {
                    shared: self.shared.clone(),
                    key,
                    turn: Some(turn),
                };
                ResponseFuture::waiting(self.inner.clone(), req, place)
            }
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for Partition<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Partition")
            .field("inner", &self.inner)
            .field("waiting", &self.shared.waiting())
            .field("running_keys", &self.shared.running_keys())
            .finish_non_exhaustive()
    }
}

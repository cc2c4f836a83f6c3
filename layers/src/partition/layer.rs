use std::fmt;
use std::sync::Arc;

use tower::Layer;

use super::table::{Bounds, Shared};
use super::Partition;

/// The default bound on deliveries waiting for one key's turn.
pub const DEFAULT_MAX_WAITING_PER_KEY: usize = 256;
/// The default bound on deliveries waiting for their key's turn, all keys.
pub const DEFAULT_MAX_WAITING: usize = 1024;

/// Runs deliveries with equal keys one at a time, in arrival order; see
/// the [module docs](super).
///
/// Every service this layer makes shares one table of keys (a queue's
/// generations, the clones tower makes).
#[derive(Clone)]
pub struct PartitionLayer<K> {
    key: K,
    shared: Arc<Shared>,
}

impl<K> PartitionLayer<K> {
    /// Keys deliveries with `key` (an [`OrderedBy`](super::OrderedBy), or
    /// a closure `Fn(&Delivery) -> Option<u64>`), waiting at most
    /// [`DEFAULT_MAX_WAITING_PER_KEY`] per key and [`DEFAULT_MAX_WAITING`]
    /// in all.
    pub fn new(key: K) -> Self {
        PartitionLayer::with_bounds(
            key,
            Bounds {
                per_key: DEFAULT_MAX_WAITING_PER_KEY,
                total: DEFAULT_MAX_WAITING,
            },
        )
    }

    fn with_bounds(key: K, bounds: Bounds) -> Self {
        PartitionLayer {
            key,
            shared: Arc::new(Shared::new(bounds, 64)),
        }
    }

    /// At most `n` deliveries wait for one key's turn (at least 1): when a
    /// key's line is full, `poll_ready` is `Pending` until it moves.
    pub fn max_waiting_per_key(self, n: usize) -> Self {
        let bounds = Bounds {
            per_key: n.max(1),
            ..self.shared.bounds
        };
        PartitionLayer::with_bounds(self.key, bounds)
    }

    /// At most `n` deliveries wait for their key's turn, all keys together
    /// (at least 1): when that many wait, `poll_ready` is `Pending` until
    /// one runs.
    pub fn max_waiting(self, n: usize) -> Self {
        let bounds = Bounds {
            total: n.max(1),
            ..self.shared.bounds
        };
        PartitionLayer::with_bounds(self.key, bounds)
    }

    /// Deliveries waiting for their key's turn now, in every service this
    /// layer made.
    pub fn waiting(&self) -> usize {
        self.shared.waiting()
    }
}

impl<S, K: Clone> Layer<S> for PartitionLayer<K> {
    type Service = Partition<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Partition::new(inner, self.key.clone(), self.shared.clone())
    }
}

impl<K> fmt::Debug for PartitionLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartitionLayer")
            .field("max_waiting_per_key", &self.shared.bounds.per_key)
            .field("max_waiting", &self.shared.bounds.total)
            .field("waiting", &self.shared.waiting())
            .finish_non_exhaustive()
    }
}

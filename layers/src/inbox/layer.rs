use tower::Layer;

use super::{Inbox, InboxStore, MissingId};

/// Skips deliveries already processed, per (queue, message id); see the
/// [module docs](super).
#[derive(Clone, Debug)]
pub struct InboxLayer<St> {
    store: St,
    missing: MissingId,
}

impl<St> InboxLayer<St> {
    /// Keeps its marks in `store`; a delivery without message id is
    /// handled with a warning (see [`missing_id`](Self::missing_id)).
    pub const fn new(store: St) -> Self {
        InboxLayer {
            store,
            missing: MissingId::Handle,
        }
    }

    /// What to do with a delivery that has no message id (default
    /// [`MissingId::Handle`]).
    pub const fn missing_id(mut self, missing: MissingId) -> Self {
        self.missing = missing;
        self
    }
}

impl<S, St: InboxStore> Layer<S> for InboxLayer<St> {
    type Service = Inbox<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Inbox::new(inner, self.store.clone()).missing_id(self.missing)
    }
}

use std::fmt;
use std::sync::Arc;

use tower::Layer;

use super::{Inbox, InboxStore, MissingId};
use crate::Delivery;

/// A delivery's inbox key from code: see [`InboxLayer::key_fn`].
#[derive(Clone)]
pub struct InboxKey(Arc<KeyFn>);

type KeyFn = dyn Fn(&Delivery) -> Option<String> + Send + Sync;

impl InboxKey {
    /// Keys deliveries with `f`: `None` (or an empty key) is a delivery
    /// without a key, which [`MissingId`] decides about.
    pub fn new(f: impl Fn(&Delivery) -> Option<String> + Send + Sync + 'static) -> Self {
        InboxKey(Arc::new(f))
    }

    pub(super) fn key(&self, delivery: &Delivery) -> Option<String> {
        (self.0)(delivery)
    }
}

impl fmt::Debug for InboxKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InboxKey(fn)")
    }
}

/// Skips deliveries already processed, per (queue, key) — the message id
/// unless [`key_fn`](Self::key_fn) says otherwise; see the
/// [module docs](super).
#[derive(Clone, Debug)]
pub struct InboxLayer<St> {
    store: St,
    missing: MissingId,
    key: Option<InboxKey>,
}

impl<St> InboxLayer<St> {
    /// Keeps its marks in `store`, keyed by message id; a delivery without
    /// one is handled with a warning and no mark (see
    /// [`missing_id`](Self::missing_id): a duplicate of it is handled
    /// again).
    pub const fn new(store: St) -> Self {
        InboxLayer {
            store,
            missing: MissingId::Handle,
            key: None,
        }
    }

    /// What to do with a delivery that has no key (default
    /// [`MissingId::Handle`]).
    pub const fn missing_id(mut self, missing: MissingId) -> Self {
        self.missing = missing;
        self
    }

    /// Keys deliveries with `f`, a function of the delivery (its body
    /// included), instead of the message id: for publishers that set no
    /// message id but carry one of their own, an event id in the body, say.
    /// `None` or an empty key is a delivery without a key
    /// ([`missing_id`](Self::missing_id) decides). The key is stored as is,
    /// per queue: equal keys are one piece of work.
    ///
    /// ```
    /// use acemq_layers::inbox::{InboxLayer, MemoryInbox, MissingId};
    ///
    /// // The event id is the body's first line.
    /// let layer = InboxLayer::new(MemoryInbox::new())
    ///     .key_fn(|d| {
    ///         let line = d.body().split(|b| *b == b'\n').next()?;
    ///         std::str::from_utf8(line).ok().map(str::to_owned)
    ///     })
    ///     .missing_id(MissingId::Reject);
    /// # let _ = layer;
    /// ```
    pub fn key_fn(
        mut self,
        f: impl Fn(&Delivery) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key = Some(InboxKey::new(f));
        self
    }
}

impl<S, St: InboxStore> Layer<S> for InboxLayer<St> {
    type Service = Inbox<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        if self.missing == MissingId::Handle {
            super::service::warn_once_handle();
        }
        Inbox::new(inner, self.store.clone())
            .missing_id(self.missing)
            .with_key(self.key.clone())
    }
}

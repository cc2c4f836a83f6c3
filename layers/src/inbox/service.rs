use std::borrow::Cow;
use std::fmt;
use std::mem;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tower::Service;

use super::error::MissingMessageId;
use super::future::ResponseFuture;
use super::layer::InboxKey;
use super::{InboxLayer, InboxOutcome, InboxStore, MissingId};
use crate::delivery::Delivery;
use crate::error::{BoxError, Reject};

/// Skips deliveries whose (queue, message id) `St` has processed, and runs
/// the others inside a unit of work of `St`; see the [module docs](super).
///
/// # Clone
///
/// A clone shares the store. `call` moves the service made ready into the
/// response future and keeps a clone, so the inner service must be `Clone`.
#[derive(Clone)]
pub struct Inbox<S, St> {
    inner: S,
    store: St,
    missing: MissingId,
    key: Option<InboxKey>,
}

/// Says once per process, when the first inbox service with
/// [`MissingId::Handle`] is built (at start), what that default costs.
pub(super) fn warn_once_handle() {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "the inbox handles a delivery without a key (message id) with no mark \
             (MissingId::Handle, the default): a redelivery of it runs the handler again; \
             set a message id on every publish, key the inbox with key_fn, or refuse such \
             deliveries with missing_id(MissingId::Reject)"
        );
    }
}

impl<S, St> Inbox<S, St> {
    /// Wraps `inner`, keeping marks in `store`.
    pub fn new(inner: S, store: St) -> Self {
        Inbox {
            inner,
            store,
            missing: MissingId::Handle,
            key: None,
        }
    }

    /// Keys deliveries with `key` instead of the message id (`None`: the
    /// message id); see [`InboxLayer::key_fn`].
    pub fn with_key(mut self, key: Option<InboxKey>) -> Self {
        self.key = key;
        self
    }

    /// What to do with a delivery without message id (default
    /// [`MissingId::Handle`]).
    pub fn missing_id(mut self, missing: MissingId) -> Self {
        self.missing = missing;
        self
    }

    /// A layer that wraps services with an [`Inbox`] on `store`.
    pub const fn layer(store: St) -> InboxLayer<St> {
        InboxLayer::new(store)
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

impl<S, St> Service<Delivery> for Inbox<S, St>
where
    S: Service<Delivery> + Clone,
    S::Error: Into<BoxError>,
    St: InboxStore,
{
    type Response = InboxOutcome<S::Response>;
    type Error = BoxError;
    type Future = ResponseFuture<S, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Delivery) -> Self::Future {
        let key: Option<Cow<'_, str>> = match &self.key {
            Some(f) => f.key(&req).map(Cow::Owned),
            None => req.properties().message_id.as_deref().map(Cow::Borrowed),
        };
        let begin = match (key.filter(|k| !k.is_empty()), self.missing) {
            (Some(id), _) => self.store.begin(Some((req.queue(), &id))),
            (None, MissingId::Handle) => {
                metrics::counter!("acemq.inbox.missing_id", "queue" => req.queue().to_owned())
                    .increment(1);
                tracing::warn!(
                    queue = req.queue(),
                    delivery_tag = req.delivery_tag(),
                    "delivery without an inbox key (message id): the inbox cannot recognise a \
                     duplicate of it; handling it anyway (set a message id on every publish)"
                );
                self.store.begin(None)
            }
            (None, MissingId::Reject) => {
                metrics::counter!("acemq.inbox.missing_id", "queue" => req.queue().to_owned())
                    .increment(1);
                let error = Reject::new(MissingMessageId::new(req.queue()));
                return ResponseFuture::rejected(error.into());
            }
        };
        // The service made ready is the one that is called (STYLE 5).
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        ResponseFuture::new(begin, inner, req, self.store.clone())
    }
}

impl<S: fmt::Debug, St: fmt::Debug> fmt::Debug for Inbox<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("inner", &self.inner)
            .field("store", &self.store)
            .field("missing", &self.missing)
            .field("key", &self.key)
            .finish()
    }
}

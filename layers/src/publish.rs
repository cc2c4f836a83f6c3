//! The one thing the retry and dead-letter layers need from a transport:
//! publish a copy of a delivery, with a confirm.

use std::future::Future;

use crate::decision::DeadLetterDecision;
use crate::delivery::Delivery;
use crate::error::BoxError;
use crate::headers::{
    Headers, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER, REDELIVERY_COUNT_HEADERS,
};

/// The headers a copy of `delivery` (rung or dead-letter) starts from: the
/// original ones, without the broker's `x-delivery-count` and
/// `x-acquired-count`, with where the
/// message came from (`x-acemq-original-exchange` / `-routing-key`) added
/// on the first hop and kept after.
pub(crate) fn copy_headers(delivery: &Delivery) -> Headers {
    let mut headers = delivery.headers().clone();
    for name in REDELIVERY_COUNT_HEADERS {
        headers.remove(name);
    }
    if headers.get(ORIGINAL_EXCHANGE_HEADER).is_none() {
        headers.insert(ORIGINAL_EXCHANGE_HEADER, delivery.exchange());
    }
    if headers.get(ORIGINAL_ROUTING_KEY_HEADER).is_none() {
        headers.insert(ORIGINAL_ROUTING_KEY_HEADER, delivery.routing_key());
    }
    headers
}

/// A copy of a delivery to publish to `queue` (through the default exchange)
/// with `mandatory` set, carrying the original body and properties and these
/// headers (the original ones with the layer's additions).
#[derive(Debug)]
pub struct Outgoing<'a> {
    /// The target queue.
    pub queue: &'a str,
    /// The delivery whose body and properties are copied.
    pub delivery: &'a Delivery,
    /// The headers the copy carries.
    pub headers: Headers,
}

impl Outgoing<'_> {
    /// Tells the layer that published this copy that it is queued on the
    /// channel and only its confirm is still awaited: the delivery gives up
    /// the concurrency permit its claim took, so the next delivery's
    /// handler can run while this confirm is outstanding.
    /// The delivery becomes *confirming*: still in flight (counted, waited
    /// for by the drain), still unacknowledged (bounded by the prefetch),
    /// and settled only once the confirm is in. A [`Publish`]
    /// implementation calls it between sending the copy and awaiting its
    /// confirm; one that never calls it keeps the permit until the outcome
    /// exists, as a delivery without a claim point always does.
    ///
    /// If the copy then fails and the delivery is retried in this process
    /// (a rung copy refused), the retry layer takes a permit back before
    /// the next attempt. Calling it more than once, or for a delivery that
    /// keeps no permit, does nothing.
    pub fn queued(&self) {
        self.delivery.give_up_permit();
    }
}

/// The error reply owed to the caller of a request that is being
/// dead-lettered: the request carried `reply_to` and a `correlation_id` on
/// a queue that serves requests
/// ([`ErrorReplies`](crate::dead_letter::ErrorReplies)), so someone waits
/// for an answer that will not come. The dead-letter layer
/// hands it to [`Publish::reply_error`] once the request's fate is settled
/// (after the copy to the dead-letter queue, before the request is
/// acknowledged).
#[derive(Debug)]
#[non_exhaustive]
pub struct ErrorReply<'a> {
    /// Where the caller waits (the request's `reply_to`).
    pub reply_to: &'a str,
    /// The request's `correlation_id`, which the reply carries back.
    pub correlation_id: &'a str,
    /// The request.
    pub delivery: &'a Delivery,
    /// Why it is dead-lettered, the last error, how many attempts.
    pub decision: &'a DeadLetterDecision,
    /// Whether the reply may carry the error's text (the queue opted in,
    /// [`ErrorReplies::error_text`](crate::dead_letter::ErrorReplies::error_text));
    /// otherwise only the reason and a generic text. `false` from
    /// [`ErrorReply::of`].
    pub error_text: bool,
}

impl<'a> ErrorReply<'a> {
    /// The reply owed for `delivery` under `decision`, if the delivery is a
    /// request: it carries a non-empty `reply_to` and a `correlation_id`.
    pub fn of(delivery: &'a Delivery, decision: &'a DeadLetterDecision) -> Option<Self> {
        let properties = delivery.properties();
        let reply_to = properties.reply_to.as_deref().filter(|r| !r.is_empty())?;
        let correlation_id = properties.correlation_id.as_deref()?;
        Some(ErrorReply {
            reply_to,
            correlation_id,
            delivery,
            decision,
            error_text: false,
        })
    }
}

/// Why a publish did not deliver.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The broker returned the message: no queue by that name (NO_ROUTE).
    #[error("no queue named {queue:?}: the broker returned the message (NO_ROUTE)")]
    Unroutable {
        /// The queue the copy was addressed to.
        queue: String,
    },
    /// The broker refused the message (a negative confirm).
    #[error("the broker nacked the publish to {queue:?}")]
    Nacked {
        /// The queue the copy was addressed to.
        queue: String,
    },
    /// The broker is refusing publishes for now (a resource alarm blocked
    /// the connection); nothing was sent.
    #[error("publish to {queue:?} not sent: {message}")]
    Blocked {
        /// The queue the copy was addressed to.
        queue: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The channel or connection is gone, or another transport failure.
    ///
    /// Build one with [`PublishError::transport`] or
    /// [`PublishError::transport_with_source`]; match it with
    /// `PublishError::Transport { queue, .. }`.
    #[error("publish to {queue:?} failed: {message}")]
    #[non_exhaustive]
    Transport {
        /// The queue the copy was addressed to.
        queue: String,
        /// What went wrong, in words (it already contains the source's own
        /// text where there is one, so [`display_chain`](crate::display_chain)
        /// does not repeat it).
        message: String,
        /// The underlying error (lapin's, a serialiser's, …), when there is
        /// one: [`source()`](std::error::Error::source) returns it, so it can
        /// be downcast.
        #[source]
        source: Option<BoxError>,
    },
}

impl PublishError {
    /// A [`Transport`](Self::Transport) failure without an underlying error
    /// (e.g. no connection open within the wait).
    pub fn transport(queue: impl Into<String>, message: impl Into<String>) -> Self {
        PublishError::Transport {
            queue: queue.into(),
            message: message.into(),
            source: None,
        }
    }

    /// A [`Transport`](Self::Transport) failure caused by `source`, which
    /// [`source()`](std::error::Error::source) returns.
    ///
    /// ```
    /// use acemq_layers::PublishError;
    /// let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "pipe");
    /// let e = PublishError::transport_with_source("q", io.to_string(), io);
    /// let source = std::error::Error::source(&e).expect("a source");
    /// assert!(source.downcast_ref::<std::io::Error>().is_some());
    /// ```
    pub fn transport_with_source(
        queue: impl Into<String>,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        PublishError::Transport {
            queue: queue.into(),
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// Publishes copies of deliveries with mandatory + confirm. The `acemq`
/// crate implements it over a confirm-mode lapin channel; tests use a
/// recording fake.
pub trait Publish: Clone + Send + Sync + 'static {
    /// Publishes `message` and waits for the broker's confirm. An unroutable
    /// message is [`PublishError::Unroutable`], never success.
    ///
    /// Call [`Outgoing::queued`] once the copy is sent and only its confirm
    /// is awaited: the delivery's concurrency permit is then free for the
    /// next handler while the confirm is outstanding.
    fn publish(
        &self,
        message: Outgoing<'_>,
    ) -> impl Future<Output = Result<(), PublishError>> + Send;

    /// Declares `queue` again from the topology (the dead-letter layer calls
    /// this when its queue was deleted while running).
    fn redeclare(&self, queue: &str) -> impl Future<Output = Result<(), PublishError>> + Send;

    /// Sends the caller of a request being dead-lettered its error reply
    /// (see [`ErrorReply`]): not mandatory (a caller that has gone is not an
    /// error), waiting for the confirm where the transport has them. The
    /// `acemq` crate writes the wire format of `acemq::rpc`; the default
    /// sends nothing.
    fn reply_error(
        &self,
        reply: ErrorReply<'_>,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        let _ = reply;
        std::future::ready(Ok(()))
    }
}

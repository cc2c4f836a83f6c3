//! One call: the request, the reply, and why a call ended without one.

use std::time::Duration;

use lapin::BasicProperties;

/// The direct reply-to pseudo-queue.
#[doc(hidden)]
pub const REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// One call: where it goes, its body, properties, and its deadline.
///
/// Example: the [module docs](crate::rpc); runnable: `examples/rpc.rs`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RpcRequest {
    /// The exchange (`""`: the default exchange, `routing_key` names the queue).
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
    /// The body.
    pub body: Vec<u8>,
    /// Properties (its `correlation_id`, `reply_to` and `expiration` are
    /// set by the client).
    pub properties: BasicProperties,
    /// How long the call may take, end to end; also the request's
    /// `expiration`.
    pub timeout: Duration,
}

impl RpcRequest {
    /// A request to `exchange` with `routing_key`.
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        body: impl Into<Vec<u8>>,
        timeout: Duration,
    ) -> Self {
        RpcRequest {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            body: body.into(),
            properties: BasicProperties::default(),
            timeout,
        }
    }

    /// With `properties` (e.g. a content type or headers).
    pub fn with_properties(mut self, properties: BasicProperties) -> Self {
        self.properties = properties;
        self
    }
}

/// A reply: its body and properties.
///
/// Example: the [module docs](crate::rpc); runnable: `examples/rpc.rs`.
#[derive(Clone, Debug)]
pub struct Reply {
    body: Vec<u8>,
    properties: BasicProperties,
}

impl Reply {
    pub(super) fn from_delivery(d: lapin::message::Delivery) -> Self {
        Reply {
            body: d.data,
            properties: d.properties,
        }
    }

    /// The reply's body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The reply's properties.
    pub fn properties(&self) -> &BasicProperties {
        &self.properties
    }

    /// The body, owned.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

/// Why a call ended without a reply.
///
/// Example: the [module docs](crate::rpc); runnable: `examples/rpc.rs`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// No reply within the deadline.
    #[error("no reply within {after:?}")]
    Timeout {
        /// The call's deadline.
        after: Duration,
    },
    /// The broker returned the request: nothing is bound to take it.
    #[error("the request to {target:?} is unroutable: nothing is bound to take it (NO_ROUTE)")]
    Unroutable {
        /// Where it was sent (`queue` or `exchange/routing key`).
        target: String,
    },
    /// The request was dead-lettered: the server sent an error reply (see
    /// [Error replies](crate::rpc#error-replies)). The request is in the
    /// server queue's dead-letter queue with the same reason.
    #[error("the request was dead-lettered ({reason}): {detail}")]
    #[non_exhaustive]
    Rejected {
        /// Why, as the `x-acemq-reason` header says (`rejected`,
        /// `max-attempts`, `panic`, …; [`Reason::from_header`] reads it).
        ///
        /// [`Reason::from_header`]: crate::Reason::from_header
        reason: String,
        /// The handler's last error, as the server saw it.
        detail: String,
    },
    /// No connection, or it was lost while the call waited.
    #[error("the call failed on its connection: {message}")]
    ConnectionLost {
        /// What happened.
        message: String,
    },
}

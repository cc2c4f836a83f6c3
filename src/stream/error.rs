//! What can go wrong talking to the stream plugin: the broker's response
//! codes as a typed enum, and [`StreamError`], whose text says what was
//! wrong and what to do.

use std::time::Duration;

/// A response code of the stream protocol (the broker's answer to a
/// request), by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseCode {
    /// `0x01`: the request succeeded.
    Ok,
    /// `0x02`: the stream does not exist.
    StreamDoesNotExist,
    /// `0x03`: the subscription id is already in use on this connection.
    SubscriptionIdAlreadyExists,
    /// `0x04`: no subscription has this id on this connection.
    SubscriptionIdDoesNotExist,
    /// `0x05`: the stream already exists.
    StreamAlreadyExists,
    /// `0x06`: the stream exists but is not available (no leader, being
    /// deleted).
    StreamNotAvailable,
    /// `0x07`: the SASL mechanism is not supported.
    SaslMechanismNotSupported,
    /// `0x08`: wrong username or password.
    AuthenticationFailure,
    /// `0x09`: a SASL error.
    SaslError,
    /// `0x0a`: a SASL challenge.
    SaslChallenge,
    /// `0x0b`: the user may only connect from localhost.
    SaslAuthenticationFailureLoopback,
    /// `0x0c`: the user may not use the virtual host (or it does not exist).
    VirtualHostAccessFailure,
    /// `0x0d`: the broker did not know a frame.
    UnknownFrame,
    /// `0x0e`: a frame was over the negotiated maximum.
    FrameTooLarge,
    /// `0x0f`: the broker failed internally.
    InternalError,
    /// `0x10`: the user lacks a permission on the resource.
    AccessRefused,
    /// `0x11`: a precondition failed.
    PreconditionFailed,
    /// `0x12`: the publisher does not exist.
    PublisherDoesNotExist,
    /// `0x13`: no offset is stored for the reference.
    NoOffset,
    /// A code this client does not know.
    Other(u16),
}

impl ResponseCode {
    /// The code's name for a number read from the wire.
    pub fn from_u16(code: u16) -> Self {
        use ResponseCode::*;
        match code {
            0x01 => Ok,
            0x02 => StreamDoesNotExist,
            0x03 => SubscriptionIdAlreadyExists,
            0x04 => SubscriptionIdDoesNotExist,
            0x05 => StreamAlreadyExists,
            0x06 => StreamNotAvailable,
            0x07 => SaslMechanismNotSupported,
            0x08 => AuthenticationFailure,
            0x09 => SaslError,
            0x0a => SaslChallenge,
            0x0b => SaslAuthenticationFailureLoopback,
            0x0c => VirtualHostAccessFailure,
            0x0d => UnknownFrame,
            0x0e => FrameTooLarge,
            0x0f => InternalError,
            0x10 => AccessRefused,
            0x11 => PreconditionFailed,
            0x12 => PublisherDoesNotExist,
            0x13 => NoOffset,
            other => Other(other),
        }
    }

    /// The number on the wire.
    pub fn as_u16(self) -> u16 {
        use ResponseCode::*;
        match self {
            Ok => 0x01,
            StreamDoesNotExist => 0x02,
            SubscriptionIdAlreadyExists => 0x03,
            SubscriptionIdDoesNotExist => 0x04,
            StreamAlreadyExists => 0x05,
            StreamNotAvailable => 0x06,
            SaslMechanismNotSupported => 0x07,
            AuthenticationFailure => 0x08,
            SaslError => 0x09,
            SaslChallenge => 0x0a,
            SaslAuthenticationFailureLoopback => 0x0b,
            VirtualHostAccessFailure => 0x0c,
            UnknownFrame => 0x0d,
            FrameTooLarge => 0x0e,
            InternalError => 0x0f,
            AccessRefused => 0x10,
            PreconditionFailed => 0x11,
            PublisherDoesNotExist => 0x12,
            NoOffset => 0x13,
            Other(code) => code,
        }
    }
}

impl std::fmt::Display for ResponseCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?} (0x{:02x})", self.as_u16())
    }
}

/// Why a stream operation failed. Each message says what was wrong and
/// what to do; none carries the password.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// Nothing listens on the stream port, or the TCP connect failed.
    #[error(
        "the stream plugin is not listening on {addr} ({reason}): enable it with \
         `rabbitmq-plugins enable rabbitmq_stream` and check the host and port (default 5552)"
    )]
    Unreachable {
        /// `host:port`.
        addr: String,
        /// The operating system's reason.
        reason: String,
    },
    /// The connect (TCP and the handshake) took longer than its bound.
    #[error(
        "connecting to the stream plugin at {addr} took over {bound:?}: check that the \
         broker is up and the port is the stream port (5552), not AMQP's"
    )]
    ConnectTimeout {
        /// `host:port`.
        addr: String,
        /// The bound waited.
        bound: Duration,
    },
    /// The broker refused the username or password.
    #[error(
        "the broker refused user {username:?}'s credentials ({code}): check the username \
         and password"
    )]
    Authentication {
        /// The user that tried.
        username: String,
        /// The broker's code.
        code: ResponseCode,
    },
    /// The user may not use the virtual host, or it does not exist.
    #[error(
        "user {username:?} may not open virtual host {vhost:?}: create it or grant \
         permissions (`rabbitmqctl set_permissions -p {vhost} {username} ...`)"
    )]
    VirtualHost {
        /// The user.
        username: String,
        /// The virtual host asked for.
        vhost: String,
    },
    /// The stream does not exist.
    #[error(
        "stream {stream:?} does not exist: declare it (x-queue-type=stream) or check its name"
    )]
    StreamDoesNotExist {
        /// The stream named.
        stream: String,
    },
    /// The stream exists but has no available leader (or is being deleted).
    #[error("stream {stream:?} is not available (no leader, or being deleted): retry later")]
    StreamNotAvailable {
        /// The stream named.
        stream: String,
    },
    /// The subscription id is already in use on this connection.
    #[error("subscription id {id} is already in use on this connection: unsubscribe it first or pick another id")]
    SubscriptionIdInUse {
        /// The id.
        id: u8,
    },
    /// No subscription has this id on this connection.
    #[error("no subscription has id {id} on this connection: subscribe first")]
    UnknownSubscription {
        /// The id.
        id: u8,
    },
    /// The user lacks a permission for the operation.
    #[error(
        "access refused to {what}: grant the user read (and for offsets, write) permission on it"
    )]
    AccessRefused {
        /// What was refused (the operation and resource).
        what: String,
    },
    /// Any other response code the broker answered a request with.
    #[error("the broker answered {what} with {code}: see the broker's log")]
    Refused {
        /// The request.
        what: String,
        /// The broker's code.
        code: ResponseCode,
    },
    /// The broker did not answer a request within its bound.
    #[error(
        "the broker did not answer {what} within {bound:?}: the connection may be stuck; reconnect"
    )]
    RequestTimeout {
        /// The request.
        what: &'static str,
        /// The bound waited.
        bound: Duration,
    },
    /// A frame was over the negotiated maximum frame size.
    #[error(
        "a frame of {size} bytes is over the negotiated maximum of {max} bytes: the \
         connection was closed; this is a broker fault or not the stream port"
    )]
    FrameTooLarge {
        /// The frame's announced size.
        size: u32,
        /// The negotiated maximum.
        max: u32,
    },
    /// A chunk was over [`max_chunk_bytes`](super::StreamOptions::max_chunk_bytes).
    #[error(
        "a chunk of {size} bytes is over max_chunk_bytes ({max} bytes): the connection was \
         closed; raise `streams.max_chunk_bytes` in the config (StreamOptions::max_chunk_bytes; a subscription holds up to credit × \
         chunk size in memory)"
    )]
    ChunkTooLarge {
        /// The Deliver frame's size.
        size: u32,
        /// The limit.
        max: u32,
    },
    /// The broker sent something this client cannot read.
    #[error("the broker sent a frame this client cannot read ({0}): the connection was closed; report it with the broker's version")]
    Protocol(String),
    /// The broker closed the connection.
    #[error("the broker closed the stream connection ({code}: {reason:?}); reconnect")]
    ClosedByBroker {
        /// The broker's closing code.
        code: u16,
        /// The broker's reason.
        reason: String,
    },
    /// The broker was silent for twice the heartbeat.
    #[error("the broker sent nothing for {silent:?} (twice the heartbeat): the connection was closed; reconnect")]
    HeartbeatTimeout {
        /// How long it was silent.
        silent: Duration,
    },
    /// The socket failed or the peer went away.
    #[error("the stream connection was lost ({0}); reconnect")]
    Io(String),
    /// The connection is closed (by [`close`](super::StreamClient::close)
    /// or a failure before); nothing more can be sent.
    #[error("the stream connection is closed: connect again")]
    Closed,
    /// The broker's version does not have the command (RabbitMQ 3.10
    /// does not answer a command it does not know: the request would only
    /// time out).
    #[error("{what} needs RabbitMQ {needs} or later; this broker is {version}: upgrade it")]
    Unsupported {
        /// The request.
        what: &'static str,
        /// The first version with it.
        needs: &'static str,
        /// The broker's version (`unknown` when it did not say).
        version: String,
    },
    /// An argument cannot be sent (a string over the protocol's 32,767
    /// bytes, for one).
    #[error("cannot send {0}: shorten it")]
    Invalid(String),
}

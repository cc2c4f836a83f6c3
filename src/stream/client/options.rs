//! Where and how to connect to the stream plugin.

use std::time::Duration;

/// How to reach the stream plugin (plain TCP; TLS is not supported).
///
/// ```
/// let opts = acemq::stream::StreamOptions {
///     username: "app".into(),
///     password: "secret".into(),
///     ..Default::default()
/// };
/// assert!(!format!("{opts:?}").contains("secret"));
/// ```
#[derive(Clone)]
pub struct StreamOptions {
    /// The broker's host.
    pub host: String,
    /// The stream plugin's port (5552 by default).
    pub port: u16,
    /// The user.
    pub username: String,
    /// The user's password (never logged, redacted by `Debug`).
    pub password: String,
    /// The virtual host.
    pub vhost: String,
    /// The connection's name, shown by the management UI.
    pub connection_name: String,
    /// The bound on TCP connect and the whole handshake.
    pub connect_timeout: Duration,
    /// The heartbeat asked for, in whole seconds (the broker's, when lower,
    /// wins; under a second leaves it to the broker). The connection is
    /// declared lost after twice the negotiated heartbeat without a frame
    /// from the broker.
    pub heartbeat: Duration,
    /// The largest chunk (Deliver frame) accepted; a larger one closes the
    /// connection with [`StreamError::ChunkTooLarge`](crate::stream::StreamError::ChunkTooLarge).
    /// The broker sends a chunk whole, over the negotiated frame size if
    /// it is bigger (chunks of an AMQP 0-9-1 publisher's batches are), so
    /// this bounds what one chunk may allocate; a subscription holds up to
    /// credit × this. 64 MiB by default.
    pub max_chunk_bytes: u32,
}

impl Default for StreamOptions {
    /// `guest`@`127.0.0.1:5552`, virtual host `/`, 10 s to connect, 60 s
    /// heartbeat, chunks up to 64 MiB.
    fn default() -> Self {
        StreamOptions {
            host: "127.0.0.1".into(),
            port: 5552,
            username: "guest".into(),
            password: "guest".into(),
            vhost: "/".into(),
            connection_name: "acemq-stream".into(),
            connect_timeout: Duration::from_secs(10),
            heartbeat: Duration::from_secs(60),
            max_chunk_bytes: 64 * 1024 * 1024,
        }
    }
}

/// The password redacted.
impl std::fmt::Debug for StreamOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamOptions")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("vhost", &self.vhost)
            .field("connection_name", &self.connection_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("heartbeat", &self.heartbeat)
            .field("max_chunk_bytes", &self.max_chunk_bytes)
            .finish()
    }
}

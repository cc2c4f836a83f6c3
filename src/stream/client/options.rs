//! Where and how to connect to the stream plugin.

use std::time::Duration;

use crate::config::Config;

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

impl StreamOptions {
    /// The stream plugin's address and credentials for `config`: the host,
    /// user, password and virtual host of the first of `addresses` (the
    /// resolved AMQP addresses), the port (and host, if set) of the
    /// config's `streams` section; the connection is named
    /// `{name}-streams`. An error says what is wrong with the address (not
    /// a URL, `amqps://`), never its password.
    #[doc(hidden)]
    pub fn from_config(
        config: &Config,
        addresses: &[String],
        name: &str,
    ) -> Result<StreamOptions, String> {
        let addr = addresses.first().ok_or_else(|| {
            "no broker address to take the stream plugin's host and credentials from".to_owned()
        })?;
        let url =
            url::Url::parse(addr).map_err(|e| format!("the broker address is not a URL ({e})"))?;
        if url.scheme() == "amqps" {
            return Err("streams over TLS are not supported: consume the stream over a plain \
                        connection (amqp://) on a trusted network, or consume an AMQP queue instead"
                .to_owned());
        }
        let decode = |s: &str| {
            url::form_urlencoded::parse(s.as_bytes())
                .map(|(k, v)| {
                    if v.is_empty() {
                        k.into_owned()
                    } else {
                        format!("{k}={v}")
                    }
                })
                .collect::<String>()
        };
        let vhost = match url.path() {
            "" | "/" => "/".to_owned(),
            p => decode(&p[1..]),
        };
        let username = if url.username().is_empty() {
            "guest".to_owned()
        } else {
            decode(url.username())
        };
        let password = url.password().map_or_else(|| "guest".to_owned(), decode);
        let host = config
            .streams
            .advertised_host
            .clone()
            .or_else(|| url.host_str().map(str::to_owned))
            .unwrap_or_else(|| "localhost".to_owned());
        Ok(StreamOptions {
            host,
            port: config.streams.port,
            username,
            password,
            vhost,
            connection_name: format!("{name}-streams"),
            connect_timeout: config.connect_timeout,
            heartbeat: config.heartbeat.unwrap_or(Duration::from_secs(60)),
            max_chunk_bytes: config.streams.max_chunk_bytes,
        })
    }
}

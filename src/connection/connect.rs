//! Opening a connection: to one address, or to the first of several that
//! answers, directly or through a connection factory of the user's.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lapin::tcp::OwnedTLSConfig;
use lapin::types::LongString;
use lapin::{Connection, ConnectionProperties, DefaultConnectionBuilder};

use super::error::{map_connect_error, ConnectError};
use super::tls::tls_config;
use crate::config::address::{
    check_address, redact, resolve_addresses_with, shuffled, with_heartbeat,
};
use crate::config::{Config, TlsConfig};

/// How to connect, beyond the address: the heartbeat to ask for and the
/// TLS files. [`ConnectOptions::from_config`] takes them from a [`Config`].
///
/// Example: the [module docs](crate::connection).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// The heartbeat interval to ask for (whole seconds); `None` takes the
    /// broker's. An address's own `heartbeat=` query wins.
    pub heartbeat: Option<Duration>,
    /// CA bundle and client certificate for `amqps://` addresses.
    pub tls: Option<TlsConfig>,
}

impl ConnectOptions {
    /// The heartbeat and TLS settings of `config`.
    pub fn from_config(config: &Config) -> Self {
        ConnectOptions {
            heartbeat: config.heartbeat,
            tls: config.tls.clone(),
        }
    }

    /// These options with `heartbeat`.
    pub fn with_heartbeat(mut self, heartbeat: Option<Duration>) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// These options with `tls`.
    pub fn with_tls(mut self, tls: Option<TlsConfig>) -> Self {
        self.tls = tls;
        self
    }
}

/// Which of an [`App`](crate::App)'s two connections a [`ConnectRequest`]
/// is for.
///
/// Example: the one on [`App::connection_factory`](crate::App::connection_factory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectionRole {
    /// The consumers' connection (consumes and settles, never publishes).
    Consumer,
    /// The publishing connection (rung and dead-letter copies, your
    /// messages through [`Publisher`](crate::Publisher)).
    Publisher,
}

impl ConnectionRole {
    /// `"consumer"` or `"publisher"`, as in acemq's logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionRole::Consumer => "consumer",
            ConnectionRole::Publisher => "publisher",
        }
    }

    /// Added to the connection name.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            ConnectionRole::Consumer => "",
            ConnectionRole::Publisher => " (publisher)",
        }
    }
}

/// What acemq would open a connection with, handed to a connection factory
/// ([`App::connection_factory`](crate::App::connection_factory)) for every
/// connection the `App` opens or reopens: the address (one of the resolved
/// addresses, in acemq's shuffled order, with the config's heartbeat in its
/// query), the connection name, which connection it is, acemq's
/// [`ConnectionProperties`] and the TLS settings read from the config's
/// files. Add to them, or build the connection your own way.
///
/// The address holds the password: log [`redacted_uri`](Self::redacted_uri),
/// never [`uri`](Self::uri). `Debug` shows it redacted.
///
/// Example: the one on [`App::connection_factory`](crate::App::connection_factory).
#[non_exhaustive]
pub struct ConnectRequest {
    uri: String,
    name: String,
    role: ConnectionRole,
    properties: ConnectionProperties,
    tls: OwnedTLSConfig,
}

impl ConnectRequest {
    /// The address to connect to, heartbeat applied. **It holds the
    /// password**: pass it to lapin, never to a log line.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The address with its password replaced by `***`, safe to log.
    pub fn redacted_uri(&self) -> String {
        redact(&self.uri)
    }

    /// The connection name (`App::connection_name`, with ` (publisher)`
    /// added for the publishing connection); acemq's properties already
    /// carry it.
    pub fn connection_name(&self) -> &str {
        &self.name
    }

    /// Which connection this is.
    pub fn role(&self) -> ConnectionRole {
        self.role
    }

    /// The properties acemq would connect with (the connection name set).
    pub fn properties(&self) -> &ConnectionProperties {
        &self.properties
    }

    /// The properties, to add to in place.
    pub fn properties_mut(&mut self) -> &mut ConnectionProperties {
        &mut self.properties
    }

    /// This request with `properties` instead (start from
    /// [`properties`](Self::properties) to keep the connection name).
    pub fn with_properties(mut self, properties: ConnectionProperties) -> Self {
        self.properties = properties;
        self
    }

    /// The TLS settings acemq read from the config's `tls:` files (empty
    /// without them).
    pub fn tls_config(&self) -> &OwnedTLSConfig {
        &self.tls
    }

    /// Connects as acemq does by default (lapin's `DefaultConnectionBuilder`
    /// with this address, these properties and TLS settings). acemq applies
    /// its connect timeout around the factory, not here.
    pub async fn connect(self) -> Result<Connection, lapin::Error> {
        DefaultConnectionBuilder::new()?
            .with_uri_str(self.uri)
            .with_properties(self.properties)
            .with_tls_config(self.tls)
            .connect()
            .await
    }
}

impl fmt::Debug for ConnectRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectRequest")
            .field("uri", &self.redacted_uri())
            .field("name", &self.name)
            .field("role", &self.role)
            .field("properties", &self.properties)
            .field(
                "tls",
                &format_args!(
                    "{{ cert_chain: {}, identity: {} }}",
                    self.tls.cert_chain.is_some(),
                    self.tls.identity.is_some()
                ),
            )
            .finish()
    }
}

type FactoryFuture = Pin<Box<dyn Future<Output = Result<Connection, lapin::Error>> + Send>>;

/// A user's connection factory, as [`App::connection_factory`](crate::App::connection_factory)
/// keeps it. Cheap to clone.
#[derive(Clone)]
pub(crate) struct ConnectionFactory {
    f: Arc<dyn Fn(ConnectRequest) -> FactoryFuture + Send + Sync>,
}

impl ConnectionFactory {
    /// Wraps `f`, called with every [`ConnectRequest`].
    pub(crate) fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(ConnectRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Connection, lapin::Error>> + Send + 'static,
    {
        ConnectionFactory {
            f: Arc::new(move |req| Box::pin(f(req)) as FactoryFuture),
        }
    }

    fn call(&self, req: ConnectRequest) -> FactoryFuture {
        (self.f)(req)
    }
}

impl fmt::Debug for ConnectionFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionFactory").finish_non_exhaustive()
    }
}

/// How an `App` opens one connection: which it is, and the user's factory
/// if there is one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Via<'a> {
    pub(crate) role: ConnectionRole,
    pub(crate) factory: Option<&'a ConnectionFactory>,
}

/// A connection, and which address answered.
///
/// Example: the [module docs](crate::connection).
#[derive(Debug)]
pub struct Connected {
    /// The open connection.
    pub connection: Connection,
    /// The address that answered, password hidden (safe to log and to show
    /// in a health snapshot).
    pub address: String,
    /// Its index in the list given to [`connect_any`].
    pub index: usize,
}

/// Connects to `addr` within `timeout`, naming the connection `name` (shown
/// by `rabbitmqctl list_connections client_properties`). A comma-separated
/// `addr` (as `AMQP_ADDR` may be) is a list: see [`connect_any`].
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), acemq::connection::ConnectError> {
/// let addr = acemq::connection::amqp_addr_from_env();
/// let conn = acemq::connection::connect(&addr, "shop-tools", Duration::from_secs(10)).await?;
/// # let _ = conn; Ok(()) }
/// ```
pub async fn connect(
    addr: &str,
    name: &str,
    timeout: Duration,
) -> Result<Connection, ConnectError> {
    if addr.contains(',') {
        let list = resolve_addresses_with(Some(&[addr.to_owned()]), None, &[]);
        return connect_any(&list, name, timeout, &ConnectOptions::default())
            .await
            .map(|c| c.connection);
    }
    connect_with(addr, name, timeout, &ConnectOptions::default()).await
}

/// Tries `addresses` in shuffled order, each within `timeout`, and returns
/// the first connection that opens, with the (redacted) address that
/// answered. With one address its own error comes back; with several,
/// [`ConnectError::NoneAnswered`] names every address tried and why each
/// failed (a start that gets it exits 69).
///
/// Example: the [module docs](crate::connection).
pub async fn connect_any(
    addresses: &[String],
    name: &str,
    timeout: Duration,
    options: &ConnectOptions,
) -> Result<Connected, ConnectError> {
    connect_any_via(addresses, name, timeout, options, None).await
}

/// [`connect_any`], each attempt through `via`'s factory when it has one.
pub(crate) async fn connect_any_via(
    addresses: &[String],
    name: &str,
    timeout: Duration,
    options: &ConnectOptions,
    via: Option<Via<'_>>,
) -> Result<Connected, ConnectError> {
    let order = shuffled(addresses);
    let mut tried = Vec::with_capacity(order.len());
    for addr in &order {
        match connect_via(addr, name, timeout, options, via).await {
            Ok(connection) => {
                let index = addresses.iter().position(|a| a == addr).unwrap_or(0);
                return Ok(Connected {
                    connection,
                    address: redact(addr),
                    index,
                });
            }
            Err(e) => {
                tracing::debug!(broker = %redact(addr), "connect failed: {e}");
                tried.push(e);
            }
        }
    }
    match tried.len() {
        0 => Err(ConnectError::BadAddress {
            redacted: String::new(),
            reason: "no address given".to_owned(),
        }),
        1 => Err(tried.remove(0)),
        _ => Err(ConnectError::NoneAnswered { tried }),
    }
}

/// Connects to `addr` within `timeout` with `options`, naming the
/// connection `name`.
pub(crate) async fn connect_with(
    addr: &str,
    name: &str,
    timeout: Duration,
    options: &ConnectOptions,
) -> Result<Connection, ConnectError> {
    connect_via(addr, name, timeout, options, None).await
}

/// [`connect_with`], through `via`'s factory when it has one (the same
/// checks before, the same timeout and error mapping around it).
async fn connect_via(
    addr: &str,
    name: &str,
    timeout: Duration,
    options: &ConnectOptions,
    via: Option<Via<'_>>,
) -> Result<Connection, ConnectError> {
    let redacted = redact(addr);
    if let Err(reason) = check_address(addr) {
        return Err(ConnectError::BadAddress { redacted, reason });
    }
    let request = ConnectRequest {
        uri: with_heartbeat(addr, options.heartbeat),
        name: name.to_owned(),
        role: via.map_or(ConnectionRole::Consumer, |v| v.role),
        properties: ConnectionProperties::default()
            .with_connection_name(LongString::from(name.to_owned())),
        tls: tls_config(options.tls.as_ref())?,
    };
    let attempt = match via.and_then(|v| v.factory) {
        Some(factory) => factory.call(request),
        None => Box::pin(request.connect()),
    };
    match tokio::time::timeout(timeout, attempt).await {
        Err(_) => Err(ConnectError::Timeout { redacted, timeout }),
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(map_connect_error(addr, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn when_no_address_answers_the_error_names_every_address_tried() {
        // Ports nothing listens on (refused at once).
        let addrs = strings(&[
            "amqp://guest:s3cret@127.0.0.1:1/%2f",
            "amqp://guest:s3cret@127.0.0.1:2/%2f",
        ]);
        let e = connect_any(
            &addrs,
            "t",
            Duration::from_secs(5),
            &ConnectOptions::default(),
        )
        .await
        .unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, ConnectError::NoneAnswered { ref tried } if tried.len() == 2),
            "{e:?}"
        );
        assert!(
            text.contains("127.0.0.1:1") && text.contains("127.0.0.1:2"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");
    }

    /// The broker the tests use, with `scheme` and `query`.
    fn broker(scheme: &str, query: &str) -> String {
        let plain = crate::connection::amqp_addr_from_env();
        format!("{scheme}{}{query}", plain.trim_start_matches("amqp://"))
    }

    #[cfg(not(feature = "tls"))]
    #[tokio::test]
    async fn an_amqps_address_is_refused_at_connect_without_the_tls_feature() {
        // The broker's plain port: without a TLS backend lapin would open
        // it in plain text, the password included.
        let e = connect(&broker("amqps://", ""), "t", Duration::from_secs(5))
            .await
            .expect_err("amqps:// without the tls feature connects in plain text");
        assert!(matches!(e, ConnectError::BadAddress { .. }), "{e:?}");
        assert!(e.is_config());
        assert!(e.to_string().contains("`tls` feature"), "{e}");
    }

    #[tokio::test]
    async fn a_query_parameter_lapin_cannot_read_is_a_bad_address_not_an_unreachable_broker() {
        let e = connect(
            &broker("amqp://", "?heartbeat=notanumber"),
            "t",
            Duration::from_secs(5),
        )
        .await
        .expect_err("heartbeat=notanumber");
        assert!(matches!(e, ConnectError::BadAddress { .. }), "{e:?}");
        assert!(e.to_string().contains("heartbeat=notanumber"), "{e}");
        // The same broker with a heartbeat lapin reads connects.
        let c = connect(
            &broker("amqp://", "?heartbeat=30"),
            "t",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        crate::connection::close_connection(&c, "OK").await.unwrap();
    }

    #[test]
    fn a_missing_tls_file_is_named() {
        let tls = TlsConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..TlsConfig::default()
        };
        let e = tls_config(Some(&tls)).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }
}

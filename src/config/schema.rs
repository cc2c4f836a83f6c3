//! The top-level schema: [`Config`] and [`TlsConfig`], their defaults, and
//! looking a queue up by name.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::duration;
use super::queue::{PrefetchPolicy, QueueConfig};
use super::routing::ExchangeConfig;
use super::stream_keys::StreamsConfig;

/// The whole configuration: the drain's deadlines and the queues to consume.
///
/// Every field but `queues` has a default; `queues` must name at least one
/// queue. [`Default`] gives the defaults with no queues, a starting point for
/// building a config in code.
///
/// ```
/// use std::time::Duration;
/// use acemq::config::{Config, QueueConfig};
///
/// let mut config = Config::new([QueueConfig::new("shop.orders")]);
/// config.shutdown_timeout = Duration::from_secs(10);
/// config.validate().unwrap();
/// assert_eq!(config.queue("shop.orders").unwrap().prefetch, QueueConfig::DEFAULT_PREFETCH);
/// ```
///
/// Its `Debug` shows every field, each address with its password replaced
/// by `***` ([`redact`](crate::connection::redact)): a config can be
/// logged.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// The one deadline for the whole drain, all consumers together (default
    /// 20 s; at most [`Config::MAX_DRAIN_DURATION`], 24 h). Must not be zero,
    /// and with `abandon_after` should fit inside `host_timeout` (see
    /// [`Config::host_deadline_warning`]).
    #[serde(deserialize_with = "duration::deserialize")]
    pub shutdown_timeout: Duration,
    /// How long handlers still running when `shutdown_timeout` passes are
    /// given, once their cancellation tokens are cancelled, before they are
    /// abandoned (default 5 s; at most [`Config::MAX_DRAIN_DURATION`], 24 h).
    #[serde(deserialize_with = "duration::deserialize")]
    pub abandon_after: Duration,
    /// The orchestrator's grace period between SIGTERM and SIGKILL, e.g.
    /// Kubernetes' `terminationGracePeriodSeconds` (default 30 s). Used only
    /// to warn about a drain that cannot finish in time. At most
    /// [`Config::MAX_DRAIN_DURATION`], 24 h.
    #[serde(deserialize_with = "duration::deserialize")]
    pub host_timeout: Duration,
    /// How long connecting to the broker at start may take (default 10 s; at
    /// most [`Config::MAX_CONNECT_TIMEOUT`], 1 h).
    #[serde(deserialize_with = "duration::deserialize")]
    pub connect_timeout: Duration,
    /// What a drain does with deliveries the broker sent ahead that no
    /// handler has started (default [`PrefetchPolicy::HandBack`]).
    pub prefetch_policy: PrefetchPolicy,
    /// The brokers to connect to, e.g. the nodes of a cluster (default:
    /// empty, meaning `AMQP_ADDR` or the local default). Tried in shuffled
    /// order, the first that answers wins; on a loss the others are tried.
    /// `AMQP_ADDR` (one address, or several separated by commas) overrides
    /// this list, and an address given in code overrides both: see
    /// [`crate::connection::resolve_addresses`]. Every address of the list
    /// a start picks is checked first
    /// ([`check_address`](crate::connection::check_address): scheme, host,
    /// port, query parameters, `amqps://` only with the `tls` feature), not
    /// only the one that answers; one that is not usable fails the start
    /// with exit 78.
    pub addresses: Vec<String>,
    /// The heartbeat interval to ask the broker for (default: none, the
    /// broker's own, 60 s on RabbitMQ; 1 to 65535 whole seconds). A dead
    /// peer is noticed after about two intervals. A `heartbeat=` in an
    /// address's query wins over this.
    #[serde(deserialize_with = "duration::option::deserialize")]
    pub heartbeat: Option<Duration>,
    /// TLS files for `amqps://` addresses (default: none, the OS's root
    /// certificates and no client certificate). Needs the `tls` feature.
    pub tls: Option<TlsConfig>,
    /// How long an operator pause may hold a queue's deliveries before they
    /// are handed back to the broker and the queue's consumer is cancelled,
    /// so other instances take the work (and the broker's
    /// `consumer_timeout`, 30 min by default, is never reached); resume
    /// consumes again (default 30 s; `0` hands back at once; at most
    /// [`Config::MAX_PAUSE_HAND_BACK_AFTER`], 24 h).
    #[serde(deserialize_with = "duration::deserialize")]
    pub pause_hand_back_after: Duration,
    /// The queues to consume, started in this order (no default: at least
    /// one is required).
    pub queues: Vec<QueueConfig>,

    // -- routing: see `config/routing.rs` --
    /// Exchanges to declare before the queues are bound to them (default
    /// none). See [`ExchangeConfig`].
    pub exchanges: Vec<ExchangeConfig>,

    /// The stream plugin's listener, for `type: stream` queues (default
    /// port 5552, the AMQP address's host). See [`StreamsConfig`].
    pub streams: StreamsConfig,
}

/// TLS files for `amqps://` addresses: a CA bundle to trust instead of the
/// OS's roots, and a client certificate with its key for brokers that
/// authenticate clients by certificate. Paths are read at connect time.
///
/// ```yaml
/// tls:
///   ca_file: /etc/acemq/ca.pem
///   cert_file: /etc/acemq/client.pem   # with key_file, or neither
///   key_file: /etc/acemq/client.key    # PKCS#8, PEM
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the certificate authorities to trust (the broker's chain).
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key, PKCS#8 (with
    /// `cert_file`).
    pub key_file: Option<PathBuf>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured, so a field added later cannot be left out unseen.
        let Config {
            shutdown_timeout,
            abandon_after,
            host_timeout,
            connect_timeout,
            prefetch_policy,
            addresses,
            heartbeat,
            tls,
            pause_hand_back_after,
            queues,
            exchanges,
            streams,
        } = self;
        let addresses: Vec<String> = addresses
            .iter()
            .map(|a| super::address::redact(a))
            .collect();
        f.debug_struct("Config")
            .field("shutdown_timeout", shutdown_timeout)
            .field("abandon_after", abandon_after)
            .field("host_timeout", host_timeout)
            .field("connect_timeout", connect_timeout)
            .field("prefetch_policy", prefetch_policy)
            .field("addresses", &addresses)
            .field("heartbeat", heartbeat)
            .field("tls", tls)
            .field("pause_hand_back_after", pause_hand_back_after)
            .field("queues", queues)
            .field("exchanges", exchanges)
            .field("streams", streams)
            .finish()
    }
}

impl Default for Config {
    /// The defaults, with no queues (which [`Config::validate`] rejects: add
    /// at least one).
    fn default() -> Self {
        Config {
            shutdown_timeout: Config::DEFAULT_SHUTDOWN_TIMEOUT,
            abandon_after: Config::DEFAULT_ABANDON_AFTER,
            host_timeout: Config::DEFAULT_HOST_TIMEOUT,
            connect_timeout: Config::DEFAULT_CONNECT_TIMEOUT,
            prefetch_policy: PrefetchPolicy::HandBack,
            addresses: Vec::new(),
            heartbeat: None,
            tls: None,
            pause_hand_back_after: Config::DEFAULT_PAUSE_HAND_BACK_AFTER,
            queues: Vec::new(),
            exchanges: Vec::new(),
            streams: StreamsConfig::default(),
        }
    }
}

impl Config {
    /// The default `shutdown_timeout`: 20 s.
    pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);
    /// The default `abandon_after`: 5 s, the cancellation layer's default.
    pub const DEFAULT_ABANDON_AFTER: Duration = acemq_layers::CancelLayer::DEFAULT_ABANDON_AFTER;
    /// The default `host_timeout`: 30 s.
    pub const DEFAULT_HOST_TIMEOUT: Duration = Duration::from_secs(30);
    /// The default `connect_timeout`: 10 s.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    /// The default `pause_hand_back_after`: 30 s.
    pub const DEFAULT_PAUSE_HAND_BACK_AFTER: Duration = Duration::from_secs(30);

    /// The defaults with these queues, a starting point for a config built in
    /// code (the struct is `#[non_exhaustive]`: set the other fields on the
    /// value this returns, then call [`Config::validate`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::config::{Config, QueueConfig};
    ///
    /// let mut config = Config::new([QueueConfig::new("shop.orders")]);
    /// config.shutdown_timeout = Duration::from_secs(10);
    /// config.validate().unwrap();
    /// ```
    pub fn new(queues: impl IntoIterator<Item = QueueConfig>) -> Self {
        Config {
            queues: queues.into_iter().collect(),
            ..Config::default()
        }
    }

    /// The queue named `name`, if the config has one.
    pub fn queue(&self, name: &str) -> Option<&QueueConfig> {
        self.queues.iter().find(|q| q.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_password() {
        let mut config = Config::new([QueueConfig::new("q")]);
        config.addresses = vec![
            "amqp://shop:s3cret@rabbit-1:5672/%2f".to_owned(),
            "amqps://shop:hunter2@rabbit-2:5671/shop?heartbeat=10".to_owned(),
        ];
        for shown in [format!("{config:?}"), format!("{config:#?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(
                shown.contains("amqp://shop:***@rabbit-1:5672/%2f"),
                "{shown}"
            );
            assert!(shown.contains("rabbit-2:5671"), "{shown}");
            assert!(shown.contains("shutdown_timeout"), "{shown}");
            assert!(shown.contains("\"q\""), "{shown}");
        }
    }
}

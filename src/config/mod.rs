//! Configuration: one serde struct, loaded from YAML, TOML or JSON.
//!
//! [`Config`] holds the drain's deadlines and one [`QueueConfig`] per queue
//! to consume. The same struct loads from any of the three formats; the
//! loaders pick the format by file extension ([`Config::from_path`]) or are
//! told it ([`Config::from_str`]), and every loader runs
//! [`Config::validate`], so a `Config` obtained from one is usable as is.
//!
//! Durations are a number of seconds (`10`, `0.5`) or a string with a unit
//! (`"400ms"`, `"10s"`, `"1.5s"`, `"2m"`, `"1h"`). Spaces around the number
//! and the unit are allowed, so `"300 ms"` is 300 milliseconds (deliberately:
//! it is what a human writes and means one thing); any other unit or text is
//! an error naming the key and the forms. Unknown keys are an error naming
//! the key, so a typo is not silently ignored.
//!
//! ```
//! use std::time::Duration;
//! use acemq::config::Config;
//!
//! let config = Config::from_yaml_str(
//!     r#"
//! shutdown_timeout: 20
//! queues:
//!   - name: shop.orders
//!     prefetch: 20
//!     concurrency: 4
//!     dead_letter: true
//!     retries: { max_attempts: 5, initial_delay: 10, max_delay: 300, broker_wait_threshold: 10 }
//! "#,
//! )
//! .unwrap();
//!
//! let orders = config.queue("shop.orders").unwrap();
//! assert_eq!(orders.dlq_name(), "shop.orders.dlq");
//! let rungs: Vec<String> = orders.rungs().into_iter().map(|(name, _)| name).collect();
//! assert_eq!(
//!     rungs,
//!     ["shop.orders.retry.10s", "shop.orders.retry.20s", "shop.orders.retry.40s", "shop.orders.retry.80s"]
//! );
//! assert_eq!(config.abandon_after, Duration::from_secs(5)); // the default
//! assert!(config.host_deadline_warning().is_none()); // 20 s + 5 s is below 30 s
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use acemq_layers::{rung_name, RetryPolicy};
use serde::Deserialize;

pub(crate) mod address;
mod routing;
pub use routing::{ArgValue, Arguments, BindingConfig, ExchangeConfig, ExchangeKind};

/// The longest queue name RabbitMQ accepts, in bytes (an AMQP short string).
const MAX_QUEUE_NAME_BYTES: usize = 255;

/// The longest `x-message-ttl` RabbitMQ accepts, in milliseconds.
const MAX_TTL_MS: u128 = u32::MAX as u128;

/// The whole configuration: the drain's deadlines and the queues to consume.
///
/// Every field but `queues` has a default; `queues` must name at least one
/// queue. [`Default`] gives the defaults with no queues, a starting point for
/// building a config in code.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// The one deadline for the whole drain, all consumers together (default
    /// 20 s). Must not be zero, and with `abandon_after` should fit inside
    /// `host_timeout` (see [`Config::host_deadline_warning`]).
    #[serde(deserialize_with = "duration::deserialize")]
    pub shutdown_timeout: Duration,
    /// How long handlers still running when `shutdown_timeout` passes are
    /// given, once their cancellation tokens are cancelled, before they are
    /// abandoned (default 5 s).
    #[serde(deserialize_with = "duration::deserialize")]
    pub abandon_after: Duration,
    /// The orchestrator's grace period between SIGTERM and SIGKILL, e.g.
    /// Kubernetes' `terminationGracePeriodSeconds` (default 30 s). Used only
    /// to warn about a drain that cannot finish in time.
    #[serde(deserialize_with = "duration::deserialize")]
    pub host_timeout: Duration,
    /// How long connecting to the broker at start may take (default 10 s).
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
    /// [`crate::connection::resolve_addresses`].
    pub addresses: Vec<String>,
    /// The heartbeat interval to ask the broker for (default: none, the
    /// broker's own, 60 s on RabbitMQ). A dead peer is noticed after about
    /// two intervals. A `heartbeat=` in an address's query wins over this.
    #[serde(deserialize_with = "duration::option::deserialize")]
    pub heartbeat: Option<Duration>,
    /// TLS files for `amqps://` addresses (default: none, the OS's root
    /// certificates and no client certificate). Needs the `tls` feature.
    pub tls: Option<TlsConfig>,
    /// How long an operator pause may hold a queue's deliveries before they
    /// are handed back to the broker and the queue's consumer is cancelled,
    /// so other instances take the work (and the broker's
    /// `consumer_timeout`, 30 min by default, is never reached); resume
    /// consumes again (default 30 s; `0` hands back at once).
    #[serde(deserialize_with = "duration::deserialize")]
    pub pause_hand_back_after: Duration,
    /// The queues to consume, started in this order (no default: at least
    /// one is required).
    pub queues: Vec<QueueConfig>,

    // -- routing: see `config/routing.rs` --
    /// Exchanges to declare before the queues are bound to them (default
    /// none). See [`ExchangeConfig`].
    pub exchanges: Vec<ExchangeConfig>,
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

/// What a drain does with deliveries buffered in the channel that no handler
/// has started. Serialised as `hand_back` or `handle_buffered`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefetchPolicy {
    /// Leave them unacknowledged so the broker redelivers them after the
    /// restart; they are counted as handed back. The drain is bounded by
    /// `concurrency`. The default.
    #[default]
    HandBack,
    /// Handle them before the drain finishes. The drain is bounded by
    /// `prefetch`.
    HandleBuffered,
}

/// The RabbitMQ queue type, the `x-queue-type` argument. Serialised as
/// `classic` or `quorum`. The dead-letter queue and the rungs take the type of
/// their queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    /// A classic queue. The default.
    #[default]
    Classic,
    /// A quorum queue (replicated; its rungs dead-letter at least once).
    Quorum,
}

impl QueueType {
    /// The value of the `x-queue-type` argument: `classic` or `quorum`.
    pub const fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
        }
    }
}

/// One queue to consume, and what its failures do.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct QueueConfig {
    /// The queue's name in RabbitMQ (required; not empty, no whitespace or
    /// control characters, not starting with `amq.`).
    pub name: String,
    /// The queue type, key `type` (default [`QueueType::Classic`]).
    #[serde(rename = "type", default)]
    pub kind: QueueType,
    /// How many unacknowledged deliveries the broker may send ahead, the
    /// consumer's `basic.qos` (default 32; at least 1).
    #[serde(default = "QueueConfig::default_prefetch")]
    pub prefetch: u16,
    /// How many handlers may run at once on this queue (default 8; at least
    /// 1).
    #[serde(default = "QueueConfig::default_concurrency")]
    pub concurrency: usize,
    /// Declare `{name}.dlq` and dead-letter there, with the reason, what
    /// fails for good (default false).
    #[serde(default)]
    pub dead_letter: bool,
    /// The retry schedule (default none: one attempt, no retry).
    #[serde(default)]
    pub retries: Option<RetriesConfig>,
    /// Acknowledgement coalescing (default on: see [`AckBatch`]); `0` turns
    /// it off.
    #[serde(default)]
    pub ack_batch: AckBatch,

    // -- routing and the redelivery bound: see `config/routing.rs` --
    /// Consume the queue (default true). `false`: the queue (and its
    /// dead-letter queue, rungs and bindings) is declared, and nothing
    /// consumes it here — a queue this process only publishes to. It then
    /// takes no handler.
    #[serde(default = "QueueConfig::default_consume")]
    pub consume: bool,
    /// Declare nothing for the queue: it is declared elsewhere (by an
    /// operator, another service) and acemq only checks that it exists — and
    /// that its `.dlq` and rungs do, when `dead_letter` and `retries` ask for
    /// them — failing the start with an error naming it if not (default
    /// false). A passive queue takes no `arguments` and no `bindings`.
    #[serde(default)]
    pub passive: bool,
    /// Further arguments of the queue's declaration, passed through as they
    /// are (default none): `x-max-length`, `x-single-active-consumer`,
    /// `x-max-priority`, … They must match an existing queue's. acemq sets
    /// `x-queue-type` (from `type`) and, with `dead_letter`, the
    /// `x-dead-letter-*` arguments itself; those are rejected here. Only the
    /// queue itself takes them, not its `.dlq` or rungs.
    #[serde(default)]
    pub arguments: Arguments,
    /// Bindings of the queue to exchanges (default none: the queue is
    /// reached through the default exchange by its name, as always).
    #[serde(default)]
    pub bindings: Vec<BindingConfig>,
    /// The most times the broker may redeliver a message before it is
    /// dead-lettered with reason `redelivered`, without calling the handler
    /// (default 50; at least 1). Read from the `x-delivery-count` header,
    /// which only quorum queues set; see
    /// [`RedeliveryLimitLayer`](acemq_layers::RedeliveryLimitLayer).
    #[serde(default = "QueueConfig::default_max_redeliveries")]
    pub max_redeliveries: u32,
}

/// How a queue's acknowledgements are coalesced: one `basic.ack` with
/// `multiple` for a contiguous run of acknowledged deliveries, each
/// delivery still settled exactly once with its own outcome.
///
/// In config: `ack_batch: 0` turns it off (every delivery acknowledged on
/// its own, at once); `ack_batch: 20` sets the run's length; `ack_batch:
/// { count: 20, delay: "2ms" }` sets both bounds. By default the run is
/// flushed at `min(50, prefetch / 2)` tags (at least 1), or 2 ms after the
/// oldest acknowledgement it holds, or as soon as the loop is idle while
/// every tag the prefetch allows is unsettled (the broker then waits for a
/// settle), and always before a cancel, a channel close or a drain step. An
/// idle loop with room in the window does not flush at once: more is on its
/// way, and flushing at every lull would send an acknowledgement per burst
/// of frames, not per run (measured: the broker's CPU per message fell to
/// the plain multi-ack consumer's, BENCHMARKS.md).
///
/// The cost: an acknowledgement still held when the process is killed
/// (SIGKILL, OOM) is lost, and that delivery is redelivered — a duplicate,
/// never a loss. A SIGTERM costs nothing: the drain flushes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AckBatch {
    /// The run's length; `None` for the default; `Some(0)` off.
    pub count: Option<usize>,
    /// The time bound; `None` for the default (2 ms).
    pub delay: Option<Duration>,
}

impl AckBatch {
    /// The default time bound: 2 ms.
    pub const DEFAULT_DELAY: Duration = Duration::from_millis(2);
    /// The cap on the default run length: 50.
    pub const DEFAULT_MAX_COUNT: usize = 50;

    /// Coalescing off: every delivery acknowledged on its own.
    pub const fn off() -> Self {
        AckBatch {
            count: Some(0),
            delay: None,
        }
    }

    /// Runs of at most `count` (0: off), flushed after `delay` at the latest.
    pub const fn new(count: usize, delay: Duration) -> Self {
        AckBatch {
            count: Some(count),
            delay: Some(delay),
        }
    }

    /// The run length and time bound for a queue with `prefetch`.
    pub fn bounds(&self, prefetch: u16) -> (usize, Duration) {
        let count = self
            .count
            .unwrap_or_else(|| (usize::from(prefetch) / 2).clamp(1, AckBatch::DEFAULT_MAX_COUNT));
        (count, self.delay.unwrap_or(AckBatch::DEFAULT_DELAY))
    }
}

impl RetriesConfig {
    /// The config form of a policy given in code.
    pub fn from_policy(p: &RetryPolicy) -> Self {
        RetriesConfig {
            max_attempts: p.max_attempts,
            initial_delay: p.initial_delay,
            max_delay: p.max_delay,
            broker_wait_threshold: p.broker_wait_threshold,
            jitter: p.jitter,
            retry_panics: p.retry_panics,
        }
    }
}

impl<'de> Deserialize<'de> for AckBatch {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Count(usize),
            Table {
                #[serde(default)]
                count: Option<usize>,
                #[serde(default, with = "duration::option")]
                delay: Option<Duration>,
            },
        }
        match Form::deserialize(deserializer).map_err(|_| {
            serde::de::Error::custom(
                "ack_batch: expected a run length (0 turns coalescing off, e.g. 20) or a table \
                 { count: 20, delay: \"2ms\" }",
            )
        })? {
            Form::Count(n) => Ok(AckBatch {
                count: Some(n),
                delay: None,
            }),
            Form::Table { count, delay } => Ok(AckBatch { count, delay }),
        }
    }
}

/// A queue's retry schedule: attempt `n` that fails is followed by attempt
/// `n + 1` after `min(initial_delay · 2^(n-1), max_delay)`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RetriesConfig {
    /// Attempts in all, the first included (required; at least 1; 1 means no
    /// retry).
    pub max_attempts: u32,
    /// The delay after the first failure (required; not zero).
    #[serde(deserialize_with = "duration::deserialize")]
    pub initial_delay: Duration,
    /// The cap on any delay (required; at least `initial_delay`).
    #[serde(deserialize_with = "duration::deserialize")]
    pub max_delay: Duration,
    /// Delays at or above this wait on a rung queue in the broker, shorter
    /// ones in this process (default 30 s).
    #[serde(
        default = "RetriesConfig::default_broker_wait_threshold",
        deserialize_with = "duration::deserialize"
    )]
    pub broker_wait_threshold: Duration,
    /// Randomise in-process delays by ±20 % (default false).
    #[serde(default)]
    pub jitter: bool,
    /// Retry a handler that panicked like a transient failure (default false:
    /// a panic is dead-lettered with reason `panic`).
    #[serde(default)]
    pub retry_panics: bool,
}

/// A config file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// YAML, extension `.yaml` or `.yml`.
    Yaml,
    /// TOML, extension `.toml`.
    Toml,
    /// JSON, extension `.json`.
    Json,
}

impl Format {
    /// The format a file's extension names (case-insensitive), if any.
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "yaml" | "yml" => Some(Format::Yaml),
            "toml" => Some(Format::Toml),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Yaml => "YAML",
            Format::Toml => "TOML",
            Format::Json => "JSON",
        })
    }
}

/// A config that could not be read, parsed or accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file's extension names no format this crate reads.
    #[error(
        "cannot tell the format of config file {}: name it .yaml, .yml, .toml or .json",
        path.display()
    )]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// The text is not valid in its format, or does not match the struct
    /// (wrong type, unknown key, missing required key).
    #[error(
        "cannot parse {format} config{}: {message}",
        path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default()
    )]
    Parse {
        /// The file, when the config came from one.
        path: Option<PathBuf>,
        /// The format it was parsed as.
        format: Format,
        /// The parser's message, with the line and column where it gives them.
        message: String,
    },
    /// The config parsed but a value is not usable.
    #[error("invalid config: {field} {problem}: {fix}")]
    Invalid {
        /// The path of the offending field, e.g. `queues[0].prefetch`.
        field: String,
        /// What is wrong with it, e.g. `is 0`.
        problem: String,
        /// What to do about it.
        fix: String,
    },
}

impl ConfigError {
    /// The path of the offending field (e.g. `queues[0].prefetch`) for an
    /// [`Invalid`](ConfigError::Invalid) config; `None` otherwise.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }

    pub(crate) fn invalid(
        field: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            problem: problem.into(),
            fix: fix.into(),
        }
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
        }
    }
}

impl Config {
    /// The default `shutdown_timeout`: 20 s.
    pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);
    /// The default `abandon_after`: 5 s.
    pub const DEFAULT_ABANDON_AFTER: Duration = Duration::from_secs(5);
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

    /// Reads, parses and validates a config file, choosing the format by its
    /// extension: `.yaml`/`.yml`, `.toml` or `.json`.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let format = Format::from_path(path).ok_or_else(|| ConfigError::UnknownFormat {
            path: path.to_path_buf(),
        })?;
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, format, Some(path))
    }

    /// Parses and validates a config given as text in `format`.
    #[allow(clippy::should_implement_trait)] // two arguments: not `FromStr`
    pub fn from_str(text: &str, format: Format) -> Result<Config, ConfigError> {
        Config::parse(text, format, None)
    }

    /// Parses and validates a YAML config.
    pub fn from_yaml_str(text: &str) -> Result<Config, ConfigError> {
        Config::from_str(text, Format::Yaml)
    }

    /// Parses and validates a TOML config.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        Config::from_str(text, Format::Toml)
    }

    /// Parses and validates a JSON config.
    pub fn from_json_str(text: &str) -> Result<Config, ConfigError> {
        Config::from_str(text, Format::Json)
    }

    fn parse(text: &str, format: Format, path: Option<&Path>) -> Result<Config, ConfigError> {
        let parsed = match format {
            Format::Yaml => serde_yaml_ng::from_str::<Config>(text).map_err(|e| e.to_string()),
            Format::Toml => toml::from_str::<Config>(text).map_err(|e| e.to_string()),
            Format::Json => serde_json::from_str::<Config>(text).map_err(|e| e.to_string()),
        };
        let config = parsed.map_err(|message| ConfigError::Parse {
            path: path.map(Path::to_path_buf),
            format,
            message: message.trim_end().to_owned(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value, returning the first that is unusable as
    /// [`ConfigError::Invalid`] naming the field and the fix. The loaders call
    /// it; call it yourself on a config built in code.
    ///
    /// Rejected: no queues; `shutdown_timeout` or `connect_timeout` zero; a
    /// queue name that is empty, repeated, contains whitespace or control
    /// characters, starts with `amq.`, or makes a derived queue name longer
    /// than 255 bytes; `prefetch` or `concurrency` zero; `max_attempts` zero,
    /// `initial_delay` zero, `max_delay` below `initial_delay`, or a rung
    /// delay beyond the broker's longest TTL.
    ///
    /// A drain deadline that does not fit inside `host_timeout` is not an
    /// error: see [`Config::host_deadline_warning`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.shutdown_timeout.is_zero() {
            return Err(ConfigError::invalid(
                "shutdown_timeout",
                "is 0",
                "set it to the drain's deadline, comfortably below host_timeout (default 20s)",
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::invalid(
                "connect_timeout",
                "is 0",
                "set it to how long connecting may take, e.g. 10s (the default)",
            ));
        }
        for (i, addr) in self.addresses.iter().enumerate() {
            if let Err(reason) = address::check_address(addr) {
                return Err(ConfigError::invalid(
                    format!("addresses[{i}]"),
                    reason,
                    "give each address as amqp://user:password@host:port/vhost (amqps:// for TLS)",
                ));
            }
        }
        if self
            .heartbeat
            .is_some_and(|h| h.as_secs() == 0 || h.as_secs() > u64::from(u16::MAX))
        {
            return Err(ConfigError::invalid(
                "heartbeat",
                "is below 1 s or above 65535 s",
                "give whole seconds between 1 and 65535, e.g. 30 (or leave it out for the broker's 60 s)",
            ));
        }
        if let Some(tls) = &self.tls {
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                return Err(ConfigError::invalid(
                    "tls",
                    "has one of cert_file and key_file but not the other",
                    "give both (the client certificate and its key) or neither",
                ));
            }
        }
        if self.queues.is_empty() {
            return Err(ConfigError::invalid(
                "queues",
                "is empty",
                "declare at least one queue, e.g. `queues: [{ name: shop.orders }]`",
            ));
        }
        for (i, queue) in self.queues.iter().enumerate() {
            if let Some(first) = self.queues[..i].iter().position(|q| q.name == queue.name) {
                return Err(ConfigError::invalid(
                    format!("queues[{i}].name"),
                    format!("{:?} is the same as queues[{first}].name", queue.name),
                    "give each queue one entry: merge the two or rename one",
                ));
            }
            queue.validate_at(i)?;
        }
        self.validate_routing()?;
        Ok(())
    }

    /// A one-line warning when the drain cannot finish before the host stops
    /// waiting: `shutdown_timeout + abandon_after` is not below
    /// `host_timeout`. `None` when it fits. Log it at start, before the first
    /// message is taken.
    pub fn host_deadline_warning(&self) -> Option<String> {
        let drain = self.shutdown_timeout.saturating_add(self.abandon_after);
        if drain < self.host_timeout {
            return None;
        }
        let (shutdown, abandon, host) =
            (self.shutdown_timeout, self.abandon_after, self.host_timeout);
        let fix = match self.host_timeout.checked_sub(self.abandon_after) {
            Some(room) if !room.is_zero() => format!(
                "lower shutdown_timeout below {room:?} or raise host_timeout \
                 (and terminationGracePeriodSeconds, or docker stop -t) above {drain:?}"
            ),
            _ => format!(
                "lower abandon_after below {host:?} and shutdown_timeout with it, or raise \
                 host_timeout (and terminationGracePeriodSeconds, or docker stop -t) above {drain:?}"
            ),
        };
        Some(format!(
            "shutdown_timeout ({shutdown:?}) + abandon_after ({abandon:?}) = {drain:?} is not below \
             host_timeout ({host:?}): the orchestrator stops waiting first and kills handlers \
             mid-flight; {fix}"
        ))
    }

    /// The queue named `name`, if the config has one.
    pub fn queue(&self, name: &str) -> Option<&QueueConfig> {
        self.queues.iter().find(|q| q.name == name)
    }
}

impl QueueConfig {
    /// The default `prefetch`: 32.
    pub const DEFAULT_PREFETCH: u16 = 32;
    /// The default `concurrency`: 8.
    pub const DEFAULT_CONCURRENCY: usize = 8;

    /// A queue named `name` with every other field at its default: classic,
    /// prefetch 32, concurrency 8, no dead-letter queue, no retries.
    pub fn new(name: impl Into<String>) -> Self {
        QueueConfig {
            name: name.into(),
            kind: QueueType::Classic,
            prefetch: QueueConfig::DEFAULT_PREFETCH,
            concurrency: QueueConfig::DEFAULT_CONCURRENCY,
            dead_letter: false,
            retries: None,
            ack_batch: AckBatch::default(),
            consume: true,
            passive: false,
            arguments: Arguments::new(),
            bindings: Vec::new(),
            max_redeliveries: QueueConfig::DEFAULT_MAX_REDELIVERIES,
        }
    }

    /// The default `max_redeliveries`: 50.
    pub const DEFAULT_MAX_REDELIVERIES: u32 = acemq_layers::DEFAULT_MAX_REDELIVERIES;

    fn default_consume() -> bool {
        true
    }

    fn default_max_redeliveries() -> u32 {
        QueueConfig::DEFAULT_MAX_REDELIVERIES
    }

    fn default_prefetch() -> u16 {
        QueueConfig::DEFAULT_PREFETCH
    }

    fn default_concurrency() -> usize {
        QueueConfig::DEFAULT_CONCURRENCY
    }

    /// The retry schedule: from `retries`, or [`RetryPolicy::none`] (one
    /// attempt) when there is none.
    pub fn policy(&self) -> RetryPolicy {
        self.retries
            .as_ref()
            .map_or_else(RetryPolicy::none, RetriesConfig::policy)
    }

    /// The name of the dead-letter queue: `{name}.dlq`.
    pub fn dlq_name(&self) -> String {
        format!("{}.dlq", self.name)
    }

    /// The rung queues of the schedule, one per distinct delay at or above
    /// `broker_wait_threshold`, in increasing order of delay: name
    /// (`{name}.retry.20s`) and delay (the rung's TTL). Empty without retries.
    pub fn rungs(&self) -> Vec<(String, Duration)> {
        self.policy()
            .rung_delays()
            .into_iter()
            .map(|delay| (rung_name(&self.name, delay), delay))
            .collect()
    }

    fn validate_at(&self, i: usize) -> Result<(), ConfigError> {
        let field = |name: &str| format!("queues[{i}].{name}");
        let name = &self.name;
        if name.is_empty() {
            return Err(ConfigError::invalid(
                field("name"),
                "is empty",
                "set it to the queue's name in RabbitMQ, e.g. shop.orders",
            ));
        }
        if name.chars().any(char::is_whitespace) {
            return Err(ConfigError::invalid(
                field("name"),
                format!("{name:?} contains whitespace"),
                "remove the spaces, tabs or newlines (the name is also the stem of its \
                 dead-letter and retry queue names), e.g. use dots: shop.orders",
            ));
        }
        if name.chars().any(char::is_control) {
            return Err(ConfigError::invalid(
                field("name"),
                format!("{name:?} contains a control character"),
                "use printable characters only, e.g. shop.orders",
            ));
        }
        if name.starts_with("amq.") {
            return Err(ConfigError::invalid(
                field("name"),
                format!("{name:?} starts with amq."),
                "choose another prefix: RabbitMQ reserves amq. for its own queues",
            ));
        }
        if self.prefetch == 0 {
            return Err(ConfigError::invalid(
                field("prefetch"),
                "is 0",
                "set it to at least 1 (it is the number of unacknowledged deliveries the \
                 broker may send ahead; default 32)",
            ));
        }
        if self.concurrency == 0 {
            return Err(ConfigError::invalid(
                field("concurrency"),
                "is 0",
                "set it to at least 1 (it is how many handlers may run at once; default 8)",
            ));
        }
        if let Some(retries) = &self.retries {
            retries.validate_at(i)?;
        }
        let mut derived: Vec<String> = self.rungs().into_iter().map(|(n, _)| n).collect();
        if self.dead_letter {
            derived.push(self.dlq_name());
        }
        derived.push(name.clone());
        if let Some(long) = derived.iter().find(|n| n.len() > MAX_QUEUE_NAME_BYTES) {
            return Err(ConfigError::invalid(
                field("name"),
                format!(
                    "makes the queue name {long:?} {} bytes long, above RabbitMQ's limit of \
                     {MAX_QUEUE_NAME_BYTES}",
                    long.len()
                ),
                format!(
                    "shorten the name by at least {} bytes",
                    long.len() - MAX_QUEUE_NAME_BYTES
                ),
            ));
        }
        Ok(())
    }
}

impl RetriesConfig {
    /// The default `broker_wait_threshold`: 30 s.
    pub const DEFAULT_BROKER_WAIT_THRESHOLD: Duration = Duration::from_secs(30);

    /// A schedule of `max_attempts` in all, `initial_delay` doubling up to
    /// `max_delay`, with the other fields at their defaults
    /// (`broker_wait_threshold` 30 s, no jitter, panics not retried). The
    /// struct is `#[non_exhaustive]`: set the other fields on the value this
    /// returns.
    pub fn new(max_attempts: u32, initial_delay: Duration, max_delay: Duration) -> Self {
        RetriesConfig {
            max_attempts,
            initial_delay,
            max_delay,
            broker_wait_threshold: RetriesConfig::DEFAULT_BROKER_WAIT_THRESHOLD,
            jitter: false,
            retry_panics: false,
        }
    }

    fn default_broker_wait_threshold() -> Duration {
        RetriesConfig::DEFAULT_BROKER_WAIT_THRESHOLD
    }

    /// The retry schedule this describes.
    pub fn policy(&self) -> RetryPolicy {
        let mut policy =
            RetryPolicy::exponential(self.max_attempts, self.initial_delay, self.max_delay);
        policy.broker_wait_threshold = self.broker_wait_threshold;
        policy.jitter = self.jitter;
        policy.retry_panics = self.retry_panics;
        policy
    }

    fn validate_at(&self, i: usize) -> Result<(), ConfigError> {
        let field = |name: &str| format!("queues[{i}].retries.{name}");
        if self.max_attempts == 0 {
            return Err(ConfigError::invalid(
                field("max_attempts"),
                "is 0",
                "set it to at least 1 (it counts the first attempt too; 1 means no retry)",
            ));
        }
        if self.initial_delay.is_zero() {
            return Err(ConfigError::invalid(
                field("initial_delay"),
                "is 0",
                "set it to the delay after the first failure, e.g. 1s (a zero delay retries \
                 at once, in a tight loop)",
            ));
        }
        if self.max_delay < self.initial_delay {
            return Err(ConfigError::invalid(
                field("max_delay"),
                format!(
                    "({:?}) is below initial_delay ({:?})",
                    self.max_delay, self.initial_delay
                ),
                format!(
                    "raise max_delay to at least {:?} or lower initial_delay (max_delay caps \
                     every delay, the first included)",
                    self.initial_delay
                ),
            ));
        }
        if let Some(long) = self
            .policy()
            .rung_delays()
            .into_iter()
            .find(|d| d.as_millis() > MAX_TTL_MS)
        {
            return Err(ConfigError::invalid(
                field("max_delay"),
                format!("gives a rung delay of {long:?}, above RabbitMQ's longest message TTL"),
                format!(
                    "lower max_delay to at most {:?}",
                    Duration::from_millis(u64::from(u32::MAX))
                ),
            ));
        }
        Ok(())
    }
}

/// serde helpers for [`Duration`] fields: a number of seconds (`10`, `0.5`)
/// or a string with a unit (`"400ms"`, `"10s"`, `"1.5s"`, `"2m"`, `"1h"`).
///
/// Use with `#[serde(deserialize_with = "acemq::config::duration::deserialize")]`,
/// or `duration::option::deserialize` (with `#[serde(default)]`) for an
/// `Option<Duration>`.
pub mod duration {
    use std::fmt;
    use std::time::Duration;

    use serde::de::{self, Deserializer, Visitor};
    use serde::Deserialize;

    const EXPECTING: &str = "a duration: a number of seconds (10, 0.5) or a string with a unit \
                             (\"400ms\", \"10s\", \"1.5s\", \"2m\", \"1h\")";

    /// Deserialises a [`Duration`] from a number of seconds or a string with
    /// a unit.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        deserializer.deserialize_any(DurationVisitor)
    }

    /// The same for an `Option<Duration>`: absent (with `#[serde(default)]`)
    /// or null is `None`.
    pub mod option {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer};

        /// Deserialises an `Option<Duration>`: null is `None`, anything else
        /// as [`super::deserialize`].
        pub fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<Duration>, D::Error> {
            Ok(Option::<super::Seconds>::deserialize(deserializer)?.map(|s| s.0))
        }
    }

    /// A newtype so `Option<Duration>` can be deserialised through serde's
    /// own `Option` handling.
    struct Seconds(Duration);

    impl<'de> Deserialize<'de> for Seconds {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserialize(deserializer).map(Seconds)
        }
    }

    /// Parses `"10"` (seconds), `"0.5"`, `"400ms"`, `"10s"`, `"1.5s"`, `"2m"`
    /// or `"1h"`. Whitespace around the number and unit is ignored, so
    /// `"300 ms"` is accepted as 300 ms. The error is a message for a human.
    pub fn parse(text: &str) -> Result<Duration, String> {
        let text = text.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = (&text[..split], text[split..].trim());
        let unit_nanos: u128 = match unit {
            "" | "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(format!("invalid duration {text:?}: expected {EXPECTING}")),
        };
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) {
            return Err(format!("invalid duration {text:?}: expected {EXPECTING}"));
        }
        let too_long = || format!("duration {text:?} is too long");
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| too_long())?
        };
        // Up to 18 decimal places count; nanoseconds are the resolution.
        let frac = &frac[..frac.len().min(18)];
        let frac_nanos = if frac.is_empty() {
            0
        } else {
            let value: u128 = frac.parse().map_err(|_| too_long())?;
            value * unit_nanos / 10u128.pow(frac.len() as u32)
        };
        let nanos = whole
            .checked_mul(unit_nanos)
            .and_then(|n| n.checked_add(frac_nanos))
            .ok_or_else(too_long)?;
        from_nanos(nanos).ok_or_else(too_long)
    }

    fn from_nanos(nanos: u128) -> Option<Duration> {
        let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
        Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
    }

    struct DurationVisitor;

    impl<'de> Visitor<'de> for DurationVisitor {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(EXPECTING)
        }

        fn visit_u64<E: de::Error>(self, secs: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(secs))
        }

        fn visit_i64<E: de::Error>(self, secs: i64) -> Result<Duration, E> {
            u64::try_from(secs)
                .map(Duration::from_secs)
                .map_err(|_| E::custom(format!("invalid duration {secs}: it is negative")))
        }

        fn visit_f64<E: de::Error>(self, secs: f64) -> Result<Duration, E> {
            if !secs.is_finite() || secs < 0.0 {
                return Err(E::custom(format!(
                    "invalid duration {secs}: expected a finite, non-negative number of seconds"
                )));
            }
            // Round to the nanosecond, so 0.3 is 300 ms and not 299.999999 ms.
            let nanos = (secs * 1e9).round();
            if nanos >= u128::MAX as f64 {
                return Err(E::custom(format!("duration {secs} is too long")));
            }
            from_nanos(nanos as u128)
                .ok_or_else(|| E::custom(format!("duration {secs} is too long")))
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
            parse(text).map_err(E::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The YAML of DESIGN.md's Config section, the seed's queue with the
    /// prefetch and concurrency the design gives it.
    const DESIGN_YAML: &str = "\
shutdown_timeout: 20
queues:
  - name: shop.orders
    prefetch: 20
    concurrency: 4
    dead_letter: true
    retries: { max_attempts: 5, initial_delay: 10, max_delay: 300, broker_wait_threshold: 10 }
";

    /// The YAML of seeds/ruby-shutdown-and-drain.txt, verbatim.
    const SEED_YAML: &str = "\
queues:
  - name: shop.orders
    dead_letter: true
    retries:
      max_attempts: 5
      initial_delay: 10
      max_delay: 300
      broker_wait_threshold: 10
";

    fn shop_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shop.yaml")
    }

    fn one_queue(queue: &str) -> String {
        format!("queues:\n  - {queue}\n")
    }

    fn rejected(yaml: &str) -> ConfigError {
        match Config::from_yaml_str(yaml) {
            Ok(config) => panic!("accepted {yaml:?} as {config:?}"),
            Err(e) => e,
        }
    }

    fn assert_invalid(yaml: &str, field: &str) -> String {
        let err = rejected(yaml);
        let message = err.to_string();
        assert_eq!(err.field(), Some(field), "{message}");
        assert!(
            message.starts_with(&format!("invalid config: {field} ")),
            "{message}"
        );
        message
    }

    #[test]
    fn the_designs_yaml_loads_unchanged() {
        let config = Config::from_yaml_str(DESIGN_YAML).unwrap();
        assert_eq!(config.shutdown_timeout, Duration::from_secs(20));
        assert_eq!(config.abandon_after, Duration::from_secs(5));
        assert_eq!(config.host_timeout, Duration::from_secs(30));
        assert_eq!(config.connect_timeout, Duration::from_secs(10));
        assert_eq!(config.prefetch_policy, PrefetchPolicy::HandBack);
        let q = &config.queues[0];
        assert_eq!(q.name, "shop.orders");
        assert_eq!(q.kind, QueueType::Classic);
        assert_eq!((q.prefetch, q.concurrency, q.dead_letter), (20, 4, true));
        let retries = q.retries.as_ref().unwrap();
        assert_eq!(retries.max_attempts, 5);
        assert_eq!(retries.initial_delay, Duration::from_secs(10));
        assert_eq!(retries.max_delay, Duration::from_secs(300));
        assert_eq!(retries.broker_wait_threshold, Duration::from_secs(10));
        assert!(!retries.jitter && !retries.retry_panics);
        assert_eq!(q.dlq_name(), "shop.orders.dlq");
        let rungs: Vec<(String, u64)> = q
            .rungs()
            .into_iter()
            .map(|(n, d)| (n, d.as_secs()))
            .collect();
        assert_eq!(
            rungs,
            [
                ("shop.orders.retry.10s".to_owned(), 10),
                ("shop.orders.retry.20s".to_owned(), 20),
                ("shop.orders.retry.40s".to_owned(), 40),
                ("shop.orders.retry.80s".to_owned(), 80),
            ]
        );
    }

    #[test]
    fn the_seeds_yaml_loads_unchanged_with_the_defaults_it_is_silent_on() {
        let config = Config::from_yaml_str(SEED_YAML).unwrap();
        assert_eq!(config.shutdown_timeout, Duration::from_secs(20));
        let q = config.queue("shop.orders").unwrap();
        assert_eq!((q.prefetch, q.concurrency, q.dead_letter), (32, 8, true));
        let with_design_values = Config::from_yaml_str(DESIGN_YAML).unwrap();
        assert_eq!(q.retries, with_design_values.queues[0].retries);
    }

    #[test]
    fn the_same_config_in_toml_and_json_loads_equal() {
        let yaml = Config::from_yaml_str(DESIGN_YAML).unwrap();
        let toml = Config::from_toml_str(
            r#"
shutdown_timeout = 20

[[queues]]
name = "shop.orders"
prefetch = 20
concurrency = 4
dead_letter = true
retries = { max_attempts = 5, initial_delay = 10, max_delay = 300, broker_wait_threshold = 10 }
"#,
        )
        .unwrap();
        let json = Config::from_json_str(
            r#"{
  "shutdown_timeout": 20,
  "queues": [{
    "name": "shop.orders", "prefetch": 20, "concurrency": 4, "dead_letter": true,
    "retries": { "max_attempts": 5, "initial_delay": 10, "max_delay": 300, "broker_wait_threshold": 10 }
  }]
}"#,
        )
        .unwrap();
        assert_eq!(toml, yaml);
        assert_eq!(json, yaml);
    }

    #[test]
    fn every_top_level_key_and_enum_spelling_is_read() {
        let config = Config::from_yaml_str(
            "shutdown_timeout: 6\nabandon_after: 2s\nhost_timeout: 10\nconnect_timeout: 500ms\n\
             prefetch_policy: handle_buffered\n\
             queues:\n  - { name: a, type: quorum }\n  - { name: b, type: classic }\n",
        )
        .unwrap();
        assert_eq!(config.abandon_after, Duration::from_secs(2));
        assert_eq!(config.connect_timeout, Duration::from_millis(500));
        assert_eq!(config.prefetch_policy, PrefetchPolicy::HandleBuffered);
        assert_eq!(config.queues[0].kind, QueueType::Quorum);
        assert_eq!(config.queues[0].kind.as_str(), "quorum");
        assert_eq!(config.queues[1].kind, QueueType::Classic);
        assert!(config.queue("c").is_none());
    }

    #[test]
    fn numbers_of_seconds_and_strings_with_units_parse_as_durations() {
        let cases = [
            ("10", Duration::from_secs(10)),
            ("\"10s\"", Duration::from_secs(10)),
            ("10s", Duration::from_secs(10)),
            ("\"400ms\"", Duration::from_millis(400)),
            ("0.5", Duration::from_millis(500)),
            ("0.3", Duration::from_millis(300)),
            ("\"1.5s\"", Duration::from_millis(1500)),
            ("\"0.3s\"", Duration::from_millis(300)),
            ("\"2m\"", Duration::from_secs(120)),
            ("\"1h\"", Duration::from_secs(3600)),
            ("\"10\"", Duration::from_secs(10)),
            ("\" 10 s \"", Duration::from_secs(10)),
            // A space between the number and the unit: accepted, documented.
            ("\"300 ms\"", Duration::from_millis(300)),
            ("300 ms", Duration::from_millis(300)),
        ];
        for (text, want) in cases {
            let config = Config::from_yaml_str(&format!(
                "shutdown_timeout: {text}\nqueues: [{{ name: q }}]"
            ))
            .unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(config.shutdown_timeout, want, "{text}");
        }
        let toml = Config::from_toml_str(
            "shutdown_timeout = \"400ms\"\nabandon_after = 0.5\n[[queues]]\nname = \"q\"",
        )
        .unwrap();
        assert_eq!(toml.shutdown_timeout, Duration::from_millis(400));
        assert_eq!(toml.abandon_after, Duration::from_millis(500));
    }

    #[test]
    fn a_malformed_or_negative_duration_is_rejected_naming_the_key_and_the_forms() {
        for text in ["\"10x\"", "\"ten\"", "\"1.2.3s\"", "\"s\"", "-1", "-0.5"] {
            let err = rejected(&format!("queues: [{{ name: q }}]\nabandon_after: {text}\n"));
            let message = err.to_string();
            assert!(
                matches!(
                    err,
                    ConfigError::Parse {
                        format: Format::Yaml,
                        ..
                    }
                ),
                "{message}"
            );
            assert!(message.contains("abandon_after"), "{text}: {message}");
            assert!(message.contains("duration"), "{text}: {message}");
        }
    }

    #[test]
    fn the_option_helper_reads_null_absent_and_present_durations() {
        #[derive(Deserialize)]
        struct Holder {
            #[serde(default, deserialize_with = "duration::option::deserialize")]
            wait: Option<Duration>,
        }
        let read = |yaml: &str| serde_yaml_ng::from_str::<Holder>(yaml).unwrap().wait;
        assert_eq!(read("{}"), None);
        assert_eq!(read("wait: null"), None);
        assert_eq!(read("wait: 3"), Some(Duration::from_secs(3)));
        assert_eq!(read("wait: 250ms"), Some(Duration::from_millis(250)));
    }

    #[test]
    fn examples_shop_yaml_loads_and_gives_two_rungs() {
        let config = Config::from_path(shop_path()).unwrap();
        assert_eq!(config.shutdown_timeout, Duration::from_secs(20));
        let q = config.queue("shop.orders").unwrap();
        assert_eq!((q.prefetch, q.concurrency, q.dead_letter), (20, 4, true));
        let policy = q.policy();
        assert_eq!(policy.max_attempts, 4);
        assert_eq!(policy.broker_wait_threshold, Duration::from_secs(2));
        assert_eq!(
            q.rungs(),
            [
                ("shop.orders.retry.2s".to_owned(), Duration::from_secs(2)),
                ("shop.orders.retry.4s".to_owned(), Duration::from_secs(4)),
            ]
        );
        assert!(config.host_deadline_warning().is_none());
    }

    #[test]
    fn a_queue_without_retries_has_one_attempt_and_no_rungs() {
        let config = Config::from_yaml_str(&one_queue("name: plain")).unwrap();
        let q = &config.queues[0];
        assert_eq!(q.policy(), RetryPolicy::none());
        assert!(q.rungs().is_empty());
        assert_eq!(q, &QueueConfig::new("plain"));
        assert!(!q.dead_letter);
    }

    #[test]
    fn a_prefetch_of_zero_is_rejected_naming_the_field_and_the_fix() {
        let message = assert_invalid(&one_queue("{ name: q, prefetch: 0 }"), "queues[0].prefetch");
        assert!(
            message.starts_with(
                "invalid config: queues[0].prefetch is 0: set it to at least 1 (it is the number \
                 of unacknowledged deliveries the broker may send ahead"
            ),
            "{message}"
        );
    }

    #[test]
    fn a_concurrency_of_zero_is_rejected() {
        assert_invalid(
            &one_queue("{ name: q, concurrency: 0 }"),
            "queues[0].concurrency",
        );
    }

    #[test]
    fn max_attempts_of_zero_is_rejected() {
        assert_invalid(
            &one_queue("{ name: q, retries: { max_attempts: 0, initial_delay: 1, max_delay: 2 } }"),
            "queues[0].retries.max_attempts",
        );
    }

    #[test]
    fn an_initial_delay_of_zero_is_rejected() {
        assert_invalid(
            &one_queue("{ name: q, retries: { max_attempts: 3, initial_delay: 0, max_delay: 2 } }"),
            "queues[0].retries.initial_delay",
        );
    }

    #[test]
    fn a_max_delay_below_the_initial_delay_is_rejected_naming_both() {
        let message = assert_invalid(
            &one_queue(
                "{ name: q, retries: { max_attempts: 3, initial_delay: 10, max_delay: 5 } }",
            ),
            "queues[0].retries.max_delay",
        );
        assert!(
            message.contains("(5s) is below initial_delay (10s)"),
            "{message}"
        );
    }

    #[test]
    fn a_max_delay_beyond_the_brokers_longest_ttl_is_rejected() {
        assert_invalid(
            &one_queue(
                "{ name: q, retries: { max_attempts: 3, initial_delay: 2000h, max_delay: 2000h } }",
            ),
            "queues[0].retries.max_delay",
        );
    }

    #[test]
    fn duplicate_queue_names_are_rejected_naming_both_indexes() {
        let message = assert_invalid(
            "queues:\n  - name: a\n  - name: b\n  - name: a\n",
            "queues[2].name",
        );
        assert!(message.contains("queues[0].name"), "{message}");
    }

    #[test]
    fn an_empty_queue_name_is_rejected() {
        assert_invalid(&one_queue("name: \"\""), "queues[0].name");
    }

    #[test]
    fn a_queue_name_with_whitespace_or_control_characters_is_rejected() {
        assert_invalid(&one_queue("name: \"shop orders\""), "queues[0].name");
        assert_invalid(&one_queue("name: \"shop.orders\\t\""), "queues[0].name");
        assert_invalid(&one_queue("name: \"shop\\u0007orders\""), "queues[0].name");
    }

    #[test]
    fn a_queue_name_in_the_brokers_reserved_namespace_is_rejected() {
        assert_invalid(&one_queue("name: amq.orders"), "queues[0].name");
    }

    #[test]
    fn a_queue_name_whose_derived_queues_are_too_long_is_rejected() {
        let name = "q".repeat(252);
        Config::from_yaml_str(&one_queue(&format!("name: {name}"))).unwrap();
        let message = assert_invalid(
            &one_queue(&format!("{{ name: {name}, dead_letter: true }}")),
            "queues[0].name",
        );
        assert!(message.contains("256 bytes"), "{message}");
    }

    #[test]
    fn a_queue_name_ending_in_dlq_or_with_dots_and_dashes_is_accepted() {
        Config::from_yaml_str(
            "queues:\n  - name: shop.orders.dlq\n  - name: billing-v2_invoices:eu\n",
        )
        .unwrap();
    }

    #[test]
    fn a_config_with_no_queues_is_rejected() {
        assert_invalid("queues: []\n", "queues");
        assert_invalid("shutdown_timeout: 20\n", "queues");
    }

    #[test]
    fn a_shutdown_timeout_of_zero_is_rejected() {
        assert_invalid(
            &format!("shutdown_timeout: 0\n{}", one_queue("name: q")),
            "shutdown_timeout",
        );
        assert_invalid(
            &format!("connect_timeout: 0s\n{}", one_queue("name: q")),
            "connect_timeout",
        );
    }

    #[test]
    fn an_unknown_key_is_rejected_naming_the_key() {
        let top = rejected(&format!("shutdown_timout: 20\n{}", one_queue("name: q"))).to_string();
        assert!(top.contains("shutdown_timout"), "{top}");
        let queue = rejected(&one_queue("{ name: q, prefetchh: 4 }")).to_string();
        assert!(queue.contains("prefetchh"), "{queue}");
        let retries = rejected(&one_queue(
            "{ name: q, retries: { max_attempts: 2, initial_delay: 1, max_delay: 2, jiter: true } }",
        ))
        .to_string();
        assert!(retries.contains("jiter"), "{retries}");
        let toml = Config::from_toml_str("[[queues]]\nname = \"q\"\nprefetchh = 4\n")
            .unwrap_err()
            .to_string();
        assert!(
            toml.contains("prefetchh") && toml.contains("line 3"),
            "{toml}"
        );
        let json = Config::from_json_str(r#"{"queues":[{"name":"q","prefetchh":4}]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            json.contains("prefetchh") && json.contains("line 1"),
            "{json}"
        );
    }

    #[test]
    fn a_parse_error_from_a_file_names_the_file_and_the_line() {
        let path =
            std::env::temp_dir().join(format!("acemq-config-test-{}.yaml", std::process::id()));
        std::fs::write(&path, "queues:\n  - name: q\n    prefetch: lots\n").unwrap();
        let err = Config::from_path(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("line 3"), "{message}");
        assert!(message.contains("YAML"), "{message}");
    }

    #[test]
    fn a_missing_file_or_an_unknown_extension_is_an_error_saying_what_to_do() {
        let missing = Config::from_path("/nonexistent/acemq.yaml").unwrap_err();
        assert!(matches!(missing, ConfigError::Io { .. }), "{missing}");
        assert!(missing.to_string().contains("/nonexistent/acemq.yaml"));
        let ini = Config::from_path("acemq.ini").unwrap_err().to_string();
        assert!(
            ini.contains("acemq.ini") && ini.contains(".yaml, .yml, .toml or .json"),
            "{ini}"
        );
        assert_eq!(Format::from_path(Path::new("a/B.YML")), Some(Format::Yaml));
        assert_eq!(Format::from_path(Path::new("noext")), None);
    }

    #[test]
    fn the_host_deadline_warning_fires_for_twenty_plus_five_against_twenty() {
        let config = Config::from_yaml_str(&format!(
            "shutdown_timeout: 20\nabandon_after: 5\nhost_timeout: 20\n{}",
            one_queue("name: q")
        ))
        .unwrap();
        let warning = config.host_deadline_warning().unwrap();
        assert!(!warning.contains('\n'), "{warning}");
        assert!(
            warning.starts_with(
                "shutdown_timeout (20s) + abandon_after (5s) = 25s is not below host_timeout (20s)"
            ),
            "{warning}"
        );
        assert!(
            warning.contains("lower shutdown_timeout below 15s"),
            "{warning}"
        );
        assert!(warning.contains("raise host_timeout"), "{warning}");
    }

    #[test]
    fn the_host_deadline_warning_is_silent_for_twenty_plus_five_against_thirty() {
        let config = Config::from_yaml_str(&format!(
            "shutdown_timeout: 20\nabandon_after: 5\nhost_timeout: 30\n{}",
            one_queue("name: q")
        ))
        .unwrap();
        assert_eq!(config.host_deadline_warning(), None);
    }

    #[test]
    fn addresses_heartbeat_and_tls_files_load_and_bad_ones_name_the_field() {
        let config = Config::from_yaml_str(&format!(
            "addresses: [amqp://a:5672, amqp://b:5672]\nheartbeat: 15\ntls: {{ ca_file: /etc/ca.pem }}\n{}",
            one_queue("name: q")
        ))
        .unwrap();
        assert_eq!(config.addresses.len(), 2);
        assert_eq!(config.heartbeat, Some(Duration::from_secs(15)));
        assert_eq!(
            config.tls.as_ref().and_then(|t| t.ca_file.clone()),
            Some(PathBuf::from("/etc/ca.pem"))
        );
        let bad = Config::from_yaml_str(&format!(
            "addresses: [amqp://a:5672, \"http://b\"]\n{}",
            one_queue("name: q")
        ))
        .unwrap_err()
        .to_string();
        assert!(bad.contains("addresses[1]"), "{bad}");
        let half = Config::from_yaml_str(&format!(
            "tls: {{ cert_file: /c.pem }}\n{}",
            one_queue("name: q")
        ))
        .unwrap_err()
        .to_string();
        assert!(half.contains("key_file"), "{half}");
    }

    #[test]
    fn the_host_deadline_warning_fires_when_the_sum_equals_the_host_timeout() {
        let config = Config {
            host_timeout: Duration::from_secs(25),
            queues: vec![QueueConfig::new("q")],
            ..Config::default()
        };
        config.validate().unwrap();
        assert!(config.host_deadline_warning().is_some());
        let tiny_host = Config {
            host_timeout: Duration::from_secs(3),
            ..config
        };
        let warning = tiny_host.host_deadline_warning().unwrap();
        assert!(
            warning.contains("lower abandon_after below 3s"),
            "{warning}"
        );
    }
}

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

pub(crate) mod address;
mod breaker;
mod broker_args;
pub mod duration;
mod error;
mod in_queue;
mod load;
mod ordering;
mod queue;
mod routing;
mod schema;
mod stream;
mod stream_keys;
#[cfg(test)]
mod test_support;
mod validate;
mod validate_limits;
mod validate_routing;

/// What a queue's deliveries are ordered by (a queue's `ordered_by`: the
/// partition layer's own key, read from config).
pub use acemq_layers::partition::OrderedBy;
pub use breaker::CircuitBreakerConfig;
pub use error::{ConfigError, Format};
pub use ordering::{json_key, JsonBody};
pub use queue::{AckBatch, PrefetchPolicy, QueueConfig, QueueType, RetriesConfig};
pub use routing::{ArgValue, Arguments, BindingConfig, ExchangeConfig, ExchangeKind};
pub use schema::{Config, TlsConfig};
pub use stream::{MAX_PARTITIONS, WORK_SUFFIX};
pub use stream_keys::{OffsetStore, StreamOffset, StreamsConfig};

//! One queue's config: [`QueueConfig`], its [`RetriesConfig`] and
//! [`AckBatch`], the [`QueueType`], and the drain's [`PrefetchPolicy`].

use std::time::Duration;

use acemq_layers::partition::OrderedBy;
use acemq_layers::{rung_name, RetryPolicy};
use serde::Deserialize;

use super::duration;
use super::routing::{Arguments, BindingConfig};
use super::stream_keys::{OffsetStore, StreamOffset};

/// What a drain does with deliveries buffered in the channel that no handler
/// has started. Serialised as `hand_back` or `handle_buffered`.
///
/// ```
/// use acemq::config::{Config, PrefetchPolicy};
///
/// let config = Config::from_yaml_str("prefetch_policy: handle_buffered\nqueues: [{ name: q }]").unwrap();
/// assert_eq!(config.prefetch_policy, PrefetchPolicy::HandleBuffered);
/// ```
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
///
/// ```
/// use acemq::config::{Config, QueueType};
///
/// let config = Config::from_yaml_str("queues: [{ name: q, type: quorum }]").unwrap();
/// assert_eq!(config.queues[0].kind, QueueType::Quorum);
/// assert_eq!(QueueType::Quorum.as_str(), "quorum");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum QueueType {
    /// A classic queue. The default.
    #[default]
    Classic,
    /// A quorum queue (replicated; its rungs dead-letter at least once).
    Quorum,
    /// A stream, consumed over the stream protocol (port 5552):
    /// offsets stored under the consumer's name behind settled work; its
    /// retries and dead letters leave it for classic rungs, a work queue
    /// (`{name}.work`) and `{name}.dlq`. See the stream keys of
    /// [`QueueConfig`].
    Stream,
}

impl QueueType {
    /// The value of the `x-queue-type` argument: `classic` or `quorum`.
    pub const fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
            QueueType::Stream => "stream",
        }
    }
}

/// One queue to consume, and what its failures do.
///
/// ```
/// use acemq::config::{Config, QueueConfig, QueueType};
///
/// let mut q = QueueConfig::new("shop.orders");
/// q.kind = QueueType::Quorum;
/// q.prefetch = 20;
/// q.concurrency = 4;
/// assert_eq!(q.dlq_name(), "shop.orders.dlq");
/// Config::new([q]).validate().unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct QueueConfig {
    /// The queue's name in RabbitMQ (required; not empty, no whitespace or
    /// control characters, not starting with `amq.`, not the `.dlq` or a
    /// rung acemq declares for another queue of the config).
    pub name: String,
    /// The queue type, key `type` (default [`QueueType::Classic`]).
    #[serde(rename = "type", default)]
    pub kind: QueueType,
    /// How many unacknowledged deliveries the broker may send ahead, the
    /// consumer's `basic.qos` (default 32; at least 1).
    #[serde(default = "QueueConfig::default_prefetch")]
    pub prefetch: u16,
    /// How many handlers may run at once on this queue (default 8; at least
    /// 1, at most `prefetch`: the broker sends at most `prefetch`
    /// unacknowledged deliveries, so handlers beyond it could never run. The
    /// default beside a smaller `prefetch` is accepted and runs at most
    /// `prefetch` handlers).
    #[serde(default = "QueueConfig::default_concurrency")]
    pub concurrency: usize,
    /// Declare `{name}.dlq` and dead-letter there, with the reason, what
    /// fails for good (default false).
    #[serde(default)]
    pub dead_letter: bool,
    /// The retry schedule (default none: one attempt, no retry).
    #[serde(default)]
    pub retries: Option<RetriesConfig>,
    /// Acknowledgement coalescing (default on: runs of `min(50, prefetch /
    /// 2)`, each held at most 2 ms plus one round of the consumer loop; see
    /// [`AckBatch`] for the bound and what a SIGKILL costs with and without
    /// it); `0` turns it off.
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
    /// Per-key ordering: `{ header: NAME }`, `routing_key` or `message_id`
    /// (see [`OrderedBy`]); none by default.
    #[serde(default, deserialize_with = "super::ordering::deserialize")]
    pub ordered_by: Option<OrderedBy>,
    /// How many times the broker may time out a message's acknowledgement
    /// (its `consumer_timeout`: it closes the channel, or on RabbitMQ 4.3
    /// cancels the consumer, and every unacknowledged delivery comes back)
    /// before the message is dead-lettered with reason `consumer-timeout`,
    /// without calling the handler again (default 2; 1 to 100). Any queue
    /// type. Counted in this process only: see
    /// `docs/reliability/consumer-timeout.md` for which delivery a timeout
    /// is counted against.
    #[serde(default = "QueueConfig::default_consumer_timeout_strikes")]
    pub consumer_timeout_strikes: u32,
    /// How long a handler may hold one of this queue's deliveries before
    /// the broker times out its acknowledgement (default none: the queue's
    /// `x-consumer-timeout` argument or policy, else the broker's
    /// `consumer_timeout`, 30 min by default). Set, acemq passes it on
    /// `basic.consume` as the consumer argument `x-consumer-timeout`
    /// (milliseconds) on a quorum queue, which RabbitMQ 4.3 honours above
    /// the queue's own; earlier brokers ignore it. On a classic queue it is
    /// not sent (4.3 refuses it there, and never times out a classic
    /// queue's consumer). A line at start says what each broker does with
    /// it and what to set on the broker instead. At least 1 ms.
    #[serde(default, deserialize_with = "duration::option::deserialize")]
    pub consumer_timeout: Option<Duration>,
    /// The queue's circuit breaker (default none): see
    /// [`CircuitBreakerConfig`](super::CircuitBreakerConfig).
    #[serde(default)]
    pub circuit_breaker: Option<super::CircuitBreakerConfig>,

    // -- error replies: see `acemq_layers::dead_letter::ErrorReplies` --
    /// The queue serves requests (default false): a dead-lettered delivery
    /// carrying `reply_to` and `correlation_id` gets an error reply, to a
    /// direct reply-to address (`amq.rabbitmq.reply-to.*`) or one of
    /// `reply_addresses` only. [`App::serve`](crate::App::serve) sets it in
    /// code. Off, no message's `reply_to` makes the service publish.
    #[serde(default)]
    pub serves_requests: bool,
    /// Error replies carry the handler's error text (default false: only
    /// the reason, `x-acemq-reason`, and a generic text).
    #[serde(default)]
    pub reply_error_text: bool,
    /// Further addresses (queue names, through the default exchange) an
    /// error reply may go to, besides direct reply-to ones (default none).
    #[serde(default)]
    pub reply_addresses: Vec<String>,

    /// A JSON Schema file of the queue's message bodies, relative to the
    /// config file (default none). The service does not read it: `acemq
    /// asyncapi` puts it in the document as the payload of the queue's
    /// messages, and fails (exit 78) when it is missing or not JSON.
    #[serde(default)]
    pub schema: Option<std::path::PathBuf>,

    // -- streams (`type: stream`): see `config/stream.rs` --
    /// Where a stream consumer starts when no offset is stored under its
    /// name: `first` (default), `last`, `next` or an RFC 3339 timestamp.
    #[serde(default)]
    pub offset: Option<StreamOffset>,
    /// The name a stream's offsets are stored under (default: the stream's
    /// name). Instances that share it share the offsets, and with a single
    /// active consumer take turns.
    #[serde(default)]
    pub consumer_name: Option<String>,
    /// The stream's `x-max-length-bytes` retention (default none).
    #[serde(default)]
    pub max_length_bytes: Option<u64>,
    /// The stream's `x-max-age` retention (default none; at least 1 s).
    #[serde(default, deserialize_with = "duration::option::deserialize")]
    pub max_age: Option<Duration>,
    /// The stream's `x-stream-max-segment-size-bytes` (default the broker's,
    /// 500 MB).
    #[serde(default)]
    pub stream_max_segment_size_bytes: Option<u64>,
    /// A super stream of this many partitions, `{name}-0` … bound to the
    /// exchange `{name}` with routing keys `0` … (default none: a plain
    /// stream).
    #[serde(default)]
    pub partitions: Option<u16>,
    /// A super stream with one partition per key, `{name}-{key}`, bound to
    /// the exchange `{name}` with that routing key (default none).
    #[serde(default)]
    pub binding_keys: Vec<String>,
    /// One active consumer per partition across every instance that shares
    /// `consumer_name` (default: on for a super stream, off for a plain
    /// stream; RabbitMQ 3.11 or later).
    #[serde(default)]
    pub single_active_consumer: Option<bool>,
    /// How stored offsets are coalesced (default every 1,000 settled
    /// messages or within 1 s): see [`OffsetStore`].
    #[serde(default)]
    pub offset_store: OffsetStore,
    /// The stream whose work queue this entry is (set by acemq, never
    /// read from config).
    #[serde(skip)]
    pub(crate) work_of: Option<String>,
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
            ordered_by: None,
            consumer_timeout_strikes: QueueConfig::DEFAULT_CONSUMER_TIMEOUT_STRIKES,
            consumer_timeout: None,
            circuit_breaker: None,
            serves_requests: false,
            reply_error_text: false,
            reply_addresses: Vec::new(),
            schema: None,
            offset: None,
            consumer_name: None,
            max_length_bytes: None,
            max_age: None,
            stream_max_segment_size_bytes: None,
            partitions: None,
            binding_keys: Vec::new(),
            single_active_consumer: None,
            offset_store: OffsetStore::default(),
            work_of: None,
        }
    }

    /// Which dead-lettered requests get an error reply: from
    /// `serves_requests`, `reply_error_text` and `reply_addresses`.
    pub fn error_replies(&self) -> acemq_layers::dead_letter::ErrorReplies {
        use acemq_layers::dead_letter::ErrorReplies;
        if !self.serves_requests {
            return ErrorReplies::none();
        }
        ErrorReplies::serving()
            .error_text(self.reply_error_text)
            .also_to(self.reply_addresses.iter().cloned())
    }

    /// The default `consumer_timeout_strikes`: 2.
    pub const DEFAULT_CONSUMER_TIMEOUT_STRIKES: u32 = 2;
    /// The largest `consumer_timeout_strikes` accepted: 100 (each strike
    /// costs a whole `consumer_timeout`).
    pub const MAX_CONSUMER_TIMEOUT_STRIKES: u32 = 100;

    fn default_consumer_timeout_strikes() -> u32 {
        QueueConfig::DEFAULT_CONSUMER_TIMEOUT_STRIKES
    }

    /// The default `max_redeliveries`: 50, the redelivery limit layer's
    /// default.
    pub const DEFAULT_MAX_REDELIVERIES: u32 =
        acemq_layers::RedeliveryLimitLayer::DEFAULT_MAX_REDELIVERIES;

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
        acemq_layers::dead_letter::dlq_name(&self.name)
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
}

/// A queue's retry schedule: attempt `n` that fails is followed by attempt
/// `n + 1` after `min(initial_delay · 2^(n-1), max_delay)`.
///
/// ```
/// use std::time::Duration;
/// use acemq::config::RetriesConfig;
///
/// // Five attempts, 10 s then doubling, at most 5 min between two.
/// let retries = RetriesConfig::new(5, Duration::from_secs(10), Duration::from_secs(300));
/// assert_eq!(retries.policy().max_attempts, 5);
/// ```
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RetriesConfig {
    /// Attempts in all, the first included (required; at least 1; 1 means no
    /// retry; at most [`RetriesConfig::MAX_ATTEMPTS`], 1,000,000).
    pub max_attempts: u32,
    /// The delay after the first failure (required; not zero; at most
    /// [`RetriesConfig::MAX_DELAY`], RabbitMQ's longest TTL, 49 days 17 h).
    #[serde(deserialize_with = "duration::deserialize")]
    pub initial_delay: Duration,
    /// The cap on any delay (required; at least `initial_delay`; at most
    /// [`RetriesConfig::MAX_DELAY`]).
    #[serde(deserialize_with = "duration::deserialize")]
    pub max_delay: Duration,
    /// Delays at or above this wait on a rung queue in the broker, shorter
    /// ones in this process (default 30 s; at most
    /// [`RetriesConfig::MAX_DELAY`]).
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
    /// Retries wait in the queue itself instead of on rungs (default false):
    /// the delivery is rejected with requeue and the quorum queue's own
    /// delayed retry holds it back (`x-delayed-retry-type: failed`, `-min`
    /// = `initial_delay`, `-max` = `max_delay`). Needs `type: quorum`,
    /// RabbitMQ 4.3 or later (checked at start), and a schedule the queue's
    /// straight line keeps: `max_attempts` ≤ 3 or `max_delay` ≤ 3 ×
    /// `initial_delay`. `broker_wait_threshold` and `jitter` then play no
    /// part.
    #[serde(default)]
    pub in_queue: bool,
}

impl RetriesConfig {
    /// The default `broker_wait_threshold`: 30 s, the retry policy's
    /// default.
    pub const DEFAULT_BROKER_WAIT_THRESHOLD: Duration = RetryPolicy::DEFAULT_BROKER_WAIT_THRESHOLD;

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
            in_queue: false,
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
        policy.in_queue = self.in_queue;
        policy
    }
}

impl RetriesConfig {
    /// The config form of a policy given in code.
    pub(crate) fn from_policy(p: &RetryPolicy) -> Self {
        RetriesConfig {
            max_attempts: p.max_attempts,
            initial_delay: p.initial_delay,
            max_delay: p.max_delay,
            broker_wait_threshold: p.broker_wait_threshold,
            jitter: p.jitter,
            retry_panics: p.retry_panics,
            in_queue: p.in_queue,
        }
    }
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
/// # The time bound
///
/// An acknowledgement goes on the wire at the consumer loop's first round
/// at or after the time bound: the loop reads the clock in every round that
/// holds acknowledgements (tokio's timer alone fires late on a busy
/// runtime), and its timer wakes it when it is idle. A round polls every
/// handler that is ready, so handlers that compute for long between two
/// `.await`s lengthen it: the hold is then up to the bound plus one round
/// (tokio's timer also rounds the bound up to the next millisecond).
///
/// # The cost
///
/// An acknowledgement still held when the process is killed (SIGKILL, OOM)
/// is lost, and that delivery is redelivered — a duplicate, never a loss.
/// How many depends on how many handlers finish within the bound: measured
/// with `scripts/kill-dupes.sh` (prefetch 100, concurrency 8, 5 ms of work
/// per message as an `.await`, a shared 2-core machine under load),
/// duplicates per kill:
///
/// | load | default | `ack_batch: 0` |
/// |---|---|---|
/// | saturated (5,000 queued): handlers finish in waves of 8 every 5–6 ms | median 6.5, max 16, mean 4.7 (30 kills) | median 0, max 8, mean 0.8 (30 kills) |
/// | 200 messages/s | median 0.5, max 2, mean 0.7 (10 kills) | median 0, max 1, mean 0.2 (10 kills) |
///
/// At saturation a kill that lands in the 2–3 ms a wave is held costs the
/// whole wave (`concurrency` duplicates); `ack_batch: 0` narrows that window
/// to the moment between a handler's return and its acknowledgement
/// reaching the broker, which is not zero either on a loaded machine. A
/// forced close by the broker costs the same held run, and also every
/// acknowledgement sent after the broker's `connection.close` and before
/// the client read it (the broker discards them). A SIGTERM costs nothing:
/// the drain flushes. Figures and method: `docs/reliability/coalescing.md`.
///
/// ```
/// use std::time::Duration;
/// use acemq::config::{AckBatch, QueueConfig};
///
/// let mut q = QueueConfig::new("shop.orders");
/// q.ack_batch = AckBatch::new(16, Duration::from_millis(5));
/// assert_eq!(q.ack_batch.count, Some(16));
/// assert_eq!(AckBatch::off().count, Some(0)); // every delivery acknowledged on its own
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AckBatch {
    /// The run's length; `None` for the default; `Some(0)` off.
    pub count: Option<usize>,
    /// The time bound; `None` for the default (2 ms); at most
    /// [`AckBatch::MAX_DELAY`], 1 s.
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
    #[doc(hidden)]
    pub fn bounds(&self, prefetch: u16) -> (usize, Duration) {
        let count = self
            .count
            .unwrap_or_else(|| (usize::from(prefetch) / 2).clamp(1, AckBatch::DEFAULT_MAX_COUNT));
        (count, self.delay.unwrap_or(AckBatch::DEFAULT_DELAY))
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

#[cfg(test)]
mod tests {
    use acemq_layers::RetryPolicy;

    use crate::config::test_support::one_queue;
    use crate::config::*;

    #[test]
    fn a_queue_without_retries_has_one_attempt_and_no_rungs() {
        let config = Config::from_yaml_str(&one_queue("name: plain")).unwrap();
        let q = &config.queues[0];
        assert_eq!(q.policy(), RetryPolicy::none());
        assert!(q.rungs().is_empty());
        assert_eq!(q, &QueueConfig::new("plain"));
        assert!(!q.dead_letter);
        assert!(!q.error_replies().is_serving());
    }

    #[test]
    fn error_replies_are_read_from_the_queue_keys() {
        let yaml = one_queue(
            "{ name: rpc, serves_requests: true, reply_error_text: true, \
             reply_addresses: [billing.replies] }",
        );
        let config = Config::from_yaml_str(&yaml).unwrap();
        let replies = config.queues[0].error_replies();
        assert!(replies.allows("amq.rabbitmq.reply-to.abc"));
        assert!(replies.allows("billing.replies"));
        assert!(!replies.allows("shop.orders"));
        assert!(replies.with_error_text());
        // Addresses without serves_requests send nothing.
        let yaml = one_queue("{ name: q, reply_addresses: [billing.replies] }");
        let config = Config::from_yaml_str(&yaml).unwrap();
        assert!(!config.queues[0].error_replies().allows("billing.replies"));
    }
}

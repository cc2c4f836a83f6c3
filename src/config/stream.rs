//! A stream entry's derived names (partitions, its work queue, the
//! consumer's name) and the validation of its keys.

use super::error::ConfigError;
use super::queue::{QueueConfig, QueueType};
use super::stream_keys::OffsetStore;

/// The suffix of a stream's work queue: `{stream}.work`.
pub const WORK_SUFFIX: &str = ".work";

/// The most partitions a super stream may have here.
pub const MAX_PARTITIONS: u16 = 1_000;

impl QueueConfig {
    /// Whether this entry is a stream (`type: stream`).
    pub fn is_stream(&self) -> bool {
        self.kind == QueueType::Stream
    }

    /// Whether this entry is a super stream (`partitions` or
    /// `binding_keys`).
    pub fn is_super_stream(&self) -> bool {
        self.is_stream() && (self.partitions.is_some() || !self.binding_keys.is_empty())
    }

    /// The name stored offsets are kept under: `consumer_name`, or the
    /// stream's own name.
    pub fn stream_consumer_name(&self) -> &str {
        self.consumer_name.as_deref().unwrap_or(&self.name)
    }

    /// A super stream's partitions, in order: `{name}-0` … for
    /// `partitions: N`, `{name}-{key}` for `binding_keys`, with their
    /// routing keys. A plain stream is its own one partition.
    pub fn stream_partitions(&self) -> Vec<(String, String)> {
        if let Some(n) = self.partitions {
            (0..n)
                .map(|i| (format!("{}-{i}", self.name), i.to_string()))
                .collect()
        } else if !self.binding_keys.is_empty() {
            self.binding_keys
                .iter()
                .map(|k| (format!("{}-{k}", self.name), k.clone()))
                .collect()
        } else {
            vec![(self.name.clone(), String::new())]
        }
    }

    /// Whether the stream is consumed with a single active consumer per
    /// partition: `single_active_consumer`, by default on for a super
    /// stream and off for a plain one.
    pub fn stream_single_active(&self) -> bool {
        self.single_active_consumer
            .unwrap_or_else(|| self.is_super_stream())
    }

    /// The stream's work queue, `{name}.work`: its rungs dead-letter there,
    /// and it is consumed with the stream's handler. Only a stream with
    /// rungs has one.
    pub fn work_queue_name(&self) -> Option<String> {
        (self.is_stream() && !self.rungs().is_empty())
            .then(|| format!("{}{WORK_SUFFIX}", self.name))
    }

    /// The work queue's own entry: the stream's handler settings on a
    /// classic queue whose deliveries are labelled with the stream's name
    /// (so their retries and dead letters are the stream's).
    pub(crate) fn work_queue(&self) -> Option<QueueConfig> {
        let name = self.work_queue_name()?;
        let mut w = QueueConfig::new(name);
        w.prefetch = self.prefetch;
        w.concurrency = self.concurrency;
        w.dead_letter = self.dead_letter;
        w.retries = self.retries.clone();
        w.ordered_by = self.ordered_by.clone();
        w.circuit_breaker = self.circuit_breaker.clone();
        w.passive = self.passive;
        w.work_of = Some(self.name.clone());
        Some(w)
    }

    /// The name a delivery of this queue carries: the stream's, for a
    /// stream's work queue; else the queue's own.
    pub(crate) fn delivery_label(&self) -> &str {
        self.work_of.as_deref().unwrap_or(&self.name)
    }

    /// Whether the entry subscribes with a single active consumer (a super
    /// stream, or `single_active_consumer: true`).
    fn needs_3_11(&self) -> bool {
        self.is_stream() && self.stream_single_active()
    }

    pub(super) fn validate_stream_at(&self, i: usize) -> Result<(), ConfigError> {
        let field = |name: &str| format!("queues[{i}].{name}");
        if !self.is_stream() {
            let set = [
                ("offset", self.offset.is_some()),
                ("consumer_name", self.consumer_name.is_some()),
                ("max_length_bytes", self.max_length_bytes.is_some()),
                ("max_age", self.max_age.is_some()),
                (
                    "stream_max_segment_size_bytes",
                    self.stream_max_segment_size_bytes.is_some(),
                ),
                ("partitions", self.partitions.is_some()),
                ("binding_keys", !self.binding_keys.is_empty()),
                (
                    "single_active_consumer",
                    self.single_active_consumer.is_some(),
                ),
                ("offset_store", self.offset_store != OffsetStore::default()),
            ];
            if let Some((key, _)) = set.iter().find(|(_, on)| *on) {
                return Err(ConfigError::invalid(
                    field(key),
                    format!("is set on a {} queue", self.kind.as_str()),
                    "it applies to streams only: set `type: stream`, or remove it",
                ));
            }
            return Ok(());
        }
        let refuse =
            |key: &str, why: &str| Err(ConfigError::invalid(field(key), "is set on a stream", why));
        if self.consumer_timeout.is_some() {
            return refuse(
                "consumer_timeout",
                "a stream has no acknowledgement timeout: remove it",
            );
        }
        if self.retries.as_ref().is_some_and(|r| r.in_queue) {
            return refuse(
                "retries.in_queue",
                "a stream's retries leave the stream for its rungs: remove in_queue",
            );
        }
        if !self.bindings.is_empty() {
            return refuse(
                "bindings",
                "bind a super stream with `partitions` or `binding_keys` instead",
            );
        }
        if self.partitions.is_some() && !self.binding_keys.is_empty() {
            return refuse(
                "binding_keys",
                "give `partitions: N` or `binding_keys`, not both",
            );
        }
        if self
            .partitions
            .is_some_and(|n| n == 0 || n > MAX_PARTITIONS)
        {
            return Err(ConfigError::invalid(
                field("partitions"),
                "is 0 or above 1000",
                "give the super stream's number of partitions, e.g. 3",
            ));
        }
        if self
            .binding_keys
            .iter()
            .any(|k| k.is_empty() || k.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(ConfigError::invalid(
                field("binding_keys"),
                "holds an empty key or one with whitespace",
                "give each partition's routing key, e.g. [eu, us]",
            ));
        }
        if self
            .consumer_name
            .as_deref()
            .is_some_and(|n| n.is_empty() || n.len() > 255)
        {
            return Err(ConfigError::invalid(
                field("consumer_name"),
                "is empty or longer than 255 bytes",
                "give the name offsets are stored under, e.g. shop (default: the stream's name)",
            ));
        }
        if self.offset_store.every == 0 || self.offset_store.within.is_zero() {
            return Err(ConfigError::invalid(
                field("offset_store"),
                "has every: 0 or within: 0",
                "give how many settled messages make a store and how long one may wait, e.g. { every: 1000, within: 1s }",
            ));
        }
        if self.max_age.is_some_and(|a| a.as_secs() == 0) {
            return Err(ConfigError::invalid(
                field("max_age"),
                "is below 1 s",
                "give the longest a message is kept, e.g. 7d as \"168h\"",
            ));
        }
        Ok(())
    }
}

impl super::Config {
    /// The error for a stream entry that needs RabbitMQ 3.11 or later (a
    /// single active consumer, a super stream) on an older `broker`.
    pub(crate) fn single_active_before_3_11(&self, broker: &str) -> Option<ConfigError> {
        let (i, q) = self
            .queues
            .iter()
            .enumerate()
            .find(|(_, q)| q.needs_3_11())?;
        let key = if q.is_super_stream() {
            "partitions"
        } else {
            "single_active_consumer"
        };
        Some(ConfigError::invalid(
            format!("queues[{i}].{key}"),
            format!("{:?} needs a single active consumer per partition, which RabbitMQ {broker} does not have (3.11 or later)", q.name),
            "upgrade the broker, or consume a plain stream with single_active_consumer: false (each instance then reads every message)",
        ))
    }
}

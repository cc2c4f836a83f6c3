//! Checking a config's values: [`Config::validate`] (the loaders call it)
//! and [`Config::host_deadline_warning`].

use std::time::Duration;

use super::address;
use super::error::ConfigError;
use super::queue::{QueueConfig, RetriesConfig};
use super::schema::Config;

/// The longest queue name RabbitMQ accepts, in bytes (an AMQP short string).
const MAX_QUEUE_NAME_BYTES: usize = Config::MAX_SHORT_STRING_BYTES;

/// The longest `x-message-ttl` RabbitMQ accepts, in milliseconds.
const MAX_TTL_MS: u128 = u32::MAX as u128;

impl Config {
    /// Checks every value, returning the first that is unusable as
    /// [`ConfigError::Invalid`] naming the field and the fix. The loaders call
    /// it; call it yourself on a config built in code.
    ///
    /// Rejected: no queues; `shutdown_timeout` or `connect_timeout` zero; a
    /// duration above its maximum (`shutdown_timeout`, `abandon_after`,
    /// `host_timeout` and `pause_hand_back_after` 24 h, `connect_timeout`
    /// 1 h, `heartbeat` 65535 s, the retry delays and
    /// `broker_wait_threshold` RabbitMQ's longest TTL — 2^32 − 1 ms, 49 days
    /// 17 hours — `ack_batch.delay` 1 s); an address that
    /// [`check_address`](crate::connection::check_address) refuses; a queue
    /// name that is empty, repeated, contains whitespace or control
    /// characters, starts with `amq.`, makes a derived queue name longer
    /// than 255 bytes, or is the dead-letter queue or a rung of another
    /// queue; `prefetch` or `concurrency` zero, `concurrency` above
    /// `prefetch`; `max_attempts` zero or above 1,000,000, `initial_delay`
    /// zero, `max_delay` below `initial_delay`, or a rung delay beyond the
    /// broker's longest TTL; an exchange name, routing key or argument name
    /// longer than 255 bytes.
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
        self.validate_durations()?;
        if let Some((i, _, reason)) = address::check_address_list(&self.addresses)
            .into_iter()
            .next()
        {
            return Err(ConfigError::invalid(
                format!("addresses[{i}]"),
                reason,
                "give each address as amqp://user:password@host:port/vhost (amqps:// for TLS)",
            ));
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
        if self.streams.max_chunk_bytes < 1024 * 1024 {
            return Err(ConfigError::invalid(
                "streams.max_chunk_bytes",
                "is below 1 MiB",
                "give the largest chunk a stream connection reads, above the broker's largest message (default 67108864, 64 MiB)",
            ));
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
            queue.validate_in_queue_at(i)?;
            queue.validate_stream_at(i)?;
            if let Some(ordered_by) = &queue.ordered_by {
                super::ordering::validate_at(ordered_by, i)?;
            }
        }
        self.validate_limits()?;
        self.validate_routing()?;
        self.argument_warnings()
            .iter()
            .for_each(|w| tracing::warn!("{w}"));
        self.consumer_timeout_notes()
            .iter()
            .for_each(|n| tracing::info!("{n}"));
        Ok(())
    }

    /// The longest the drain waits for handlers: `shutdown_timeout`, then
    /// `abandon_after` for those cancelled at its end. The drain's worst
    /// case adds its own grace and close bounds to it.
    pub(crate) fn longest_handler_wait(&self) -> Duration {
        self.shutdown_timeout.saturating_add(self.abandon_after)
    }

    /// A one-line warning when the drain cannot finish before the host stops
    /// waiting: `shutdown_timeout + abandon_after` is not below
    /// `host_timeout`. `None` when it fits. Log it at start, before the first
    /// message is taken.
    pub fn host_deadline_warning(&self) -> Option<String> {
        let drain = self.longest_handler_wait();
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

    /// A one-line warning naming every consumed queue whose rejected
    /// messages the broker drops: `dead_letter` off and no
    /// `x-dead-letter-exchange` of its own (a passive queue's arguments are
    /// not known here: it is left out). `None` when there is none. Log it at
    /// start.
    pub fn dropped_rejects_warning(&self) -> Option<String> {
        let dropping: Vec<&str> = self
            .queues
            .iter()
            .filter(|q| {
                q.consume
                    && !q.dead_letter
                    && !q.passive
                    && !q.arguments.contains_key("x-dead-letter-exchange")
            })
            .map(|q| q.name.as_str())
            .collect();
        if dropping.is_empty() {
            return None;
        }
        Some(format!(
            "dead_letter is off for {}: a message its handler rejects, or whose retries run \
             out, is dropped by the broker, with only a WARN naming its message id; set \
             dead_letter: true to keep it in <queue>.dlq with its reason",
            dropping.join(", ")
        ))
    }
}

impl QueueConfig {
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
        if let Some(breaker) = &self.circuit_breaker {
            breaker.validate_at(i)?;
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
    fn validate_at(&self, i: usize) -> Result<(), ConfigError> {
        let field = |name: &str| format!("queues[{i}].retries.{name}");
        if self.max_attempts == 0 {
            return Err(ConfigError::invalid(
                field("max_attempts"),
                "is 0",
                "set it to at least 1 (it counts the first attempt too; 1 means no retry)",
            ));
        }
        if self.max_attempts > RetriesConfig::MAX_ATTEMPTS {
            return Err(ConfigError::invalid(
                field("max_attempts"),
                format!(
                    "({}) is above its maximum of {}",
                    self.max_attempts,
                    RetriesConfig::MAX_ATTEMPTS
                ),
                format!(
                    "give at most {} (the attempt header counts no further; with the delays \
                     capped at max_delay, that many attempts already outlast any outage)",
                    RetriesConfig::MAX_ATTEMPTS
                ),
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use crate::config::test_support::{assert_invalid, one_queue};
    use crate::config::*;

    #[test]
    fn the_queues_whose_rejects_the_broker_drops_are_named_in_one_warning() {
        let yaml = "queues:\n  - { name: plain }\n  - { name: kept, dead_letter: true }\n  \
                    - { name: own, arguments: { x-dead-letter-exchange: dlx } }\n  \
                    - { name: also }\n  - { name: elsewhere, passive: true }\n  \
                    - { name: unconsumed, consume: false }\n";
        let config = Config::from_yaml_str(yaml).unwrap();
        let warning = config.dropped_rejects_warning().expect("a warning");
        assert!(
            warning.starts_with("dead_letter is off for plain, also: "),
            "{warning}"
        );
        let kept = Config::from_yaml_str(&one_queue("{ name: q, dead_letter: true }")).unwrap();
        assert_eq!(kept.dropped_rejects_warning(), None);
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
                "{ name: q, retries: { max_attempts: 3, initial_delay: 1, max_delay: 2000h } }",
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

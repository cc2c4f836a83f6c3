//! Retries in the queue itself (`retries: { in_queue: true }`): a quorum
//! queue's own delayed retry, RabbitMQ 4.3 and later, in place of rungs.
//!
//! The queue delays the `n`th failed return (`basic.reject` with requeue;
//! `basic.nack`, acemq's hand-backs, is not delayed under type `failed`) by
//! `min(x-delayed-retry-min · n, x-delayed-retry-max)`, `n` being the
//! message's `x-delivery-count`. acemq's doubling schedule is kept only
//! where it is that straight line: checked here, with the queue's type and
//! `max_redeliveries`, before anything connects; the broker's version at
//! start ([`Config::in_queue_before_4_3`]).

use std::time::Duration;

use super::error::ConfigError;
use super::queue::{QueueConfig, QueueType};
use super::schema::Config;
use acemq_layers::retry::delay_label;

/// The queue arguments acemq sets for retries in the queue.
pub(crate) const DELAYED_RETRY_ARGS: [&str; 3] = [
    "x-delayed-retry-type",
    "x-delayed-retry-min",
    "x-delayed-retry-max",
];

impl QueueConfig {
    /// `(min, max)` of the queue's delayed retry when its retries wait in
    /// the queue (valid config), else `None`.
    pub(crate) fn delayed_retry(&self) -> Option<(Duration, Duration)> {
        let r = self.retries.as_ref().filter(|r| r.in_queue)?;
        r.policy().in_queue_delays()
    }

    /// `retries.in_queue` on queue `i`: a quorum queue, a schedule the
    /// queue's straight line keeps, `max_redeliveries` above the retries,
    /// and none of the delayed-retry arguments in `arguments`.
    pub(crate) fn validate_in_queue_at(&self, i: usize) -> Result<(), ConfigError> {
        let Some(r) = self.retries.as_ref().filter(|r| r.in_queue) else {
            return Ok(());
        };
        let field = format!("queues[{i}].retries.in_queue");
        if self.kind != QueueType::Quorum {
            return Err(ConfigError::invalid(
                field,
                format!(
                    "is true on {:?}, a classic queue: only quorum queues hold a retry back \
                     themselves",
                    self.name
                ),
                "set `type: quorum` on the queue (a new queue: the type of an existing one \
                 cannot change), or drop in_queue to keep rung queues",
            ));
        }
        let policy = r.policy();
        if policy.in_queue_delays().is_none() {
            let shown = |d: Vec<Duration>| {
                d.into_iter()
                    .map(delay_label)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let n = r.max_attempts.clamp(1, 6) - 1;
            let doubling = shown((1..=n).map(|k| policy.delay_after(k)).collect());
            let line = shown(
                (1..=n)
                    .map(|k| r.initial_delay.saturating_mul(k).min(r.max_delay))
                    .collect(),
            );
            return Err(ConfigError::invalid(
                field,
                format!(
                    "is true on {:?}, but its schedule ({doubling}: initial_delay doubling up \
                     to max_delay) is not the straight line a quorum queue's delayed retry \
                     keeps ({line}: initial_delay times the failed returns, capped at \
                     max_delay; whole milliseconds)",
                    self.name
                ),
                "make max_attempts at most 3, or max_delay at most 3 × initial_delay; or drop \
                 in_queue to keep rung queues",
            ));
        }
        if self.max_redeliveries < r.max_attempts {
            return Err(ConfigError::invalid(
                format!("queues[{i}].max_redeliveries"),
                format!(
                    "is {} on {:?}, below retries.max_attempts ({}): with in_queue every \
                     retry is a redelivery the broker counts, so the redelivery bound would \
                     end the schedule early",
                    self.max_redeliveries, self.name, r.max_attempts
                ),
                format!(
                    "raise max_redeliveries to at least {} (the default is 50)",
                    r.max_attempts
                ),
            ));
        }
        if let Some(arg) = DELAYED_RETRY_ARGS
            .iter()
            .find(|a| self.arguments.contains_key(**a))
        {
            return Err(ConfigError::invalid(
                format!("queues[{i}].arguments.{arg}"),
                format!(
                    "is set on {:?}, whose retries.in_queue sets it from the schedule",
                    self.name
                ),
                format!("remove {arg} from the queue's arguments"),
            ));
        }
        Ok(())
    }
}

impl Config {
    /// On a broker before RabbitMQ 4.3: the first queue whose retries wait
    /// in the queue, as the config error a start ends with (exit 78) before
    /// anything is declared. Such a broker has no delayed retry: every
    /// retry would come back at once.
    pub(crate) fn in_queue_before_4_3(&self, broker: &str) -> Option<ConfigError> {
        self.queues.iter().enumerate().find_map(|(i, q)| {
            q.retries.as_ref().filter(|r| r.in_queue)?;
            Some(ConfigError::invalid(
                format!("queues[{i}].retries.in_queue"),
                format!(
                    "is true on {:?}, and the broker, {broker}, has no delayed retry in quorum \
                     queues (RabbitMQ 4.3 and later): every retry would come back at once",
                    q.name
                ),
                "drop in_queue to keep rung queues on this broker, or upgrade it to RabbitMQ \
                 4.3 or later",
            ))
        })
    }

    /// When the broker's version is unknown: one line per queue whose
    /// retries wait in the queue, logged at start as a warning.
    pub(crate) fn in_queue_unchecked(&self) -> Vec<String> {
        self.queues
            .iter()
            .filter(|q| q.retries.as_ref().is_some_and(|r| r.in_queue))
            .map(|q| {
                format!(
                    "retries.in_queue on {:?} needs RabbitMQ 4.3 or later, and the broker's \
                     version is unknown: on an older broker every retry comes back at once \
                     (max_attempts bounds it)",
                    q.name
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn rejected(yaml: &str) -> (String, String) {
        let err = Config::from_yaml_str(yaml).expect_err("rejected");
        (err.field().unwrap_or("").to_owned(), err.to_string())
    }

    #[test]
    fn a_fitting_quorum_queue_is_accepted_and_has_no_rungs() {
        let c = Config::from_yaml_str(
            "queues:\n  - { name: q, type: quorum, dead_letter: true, retries: { max_attempts: 4, \
             initial_delay: 2s, max_delay: 6s, in_queue: true } }\n",
        )
        .expect("valid");
        let q = &c.queues[0];
        assert!(q.rungs().is_empty());
        assert_eq!(
            q.delayed_retry(),
            Some((
                std::time::Duration::from_secs(2),
                std::time::Duration::from_secs(6)
            ))
        );
    }

    #[test]
    fn a_classic_queue_a_doubling_ladder_a_low_bound_and_an_own_argument_are_refused() {
        let (field, text) = rejected(
            "queues:\n  - { name: q, retries: { max_attempts: 3, initial_delay: 1, max_delay: 4, \
             in_queue: true } }\n",
        );
        assert_eq!(field, "queues[0].retries.in_queue");
        assert!(
            text.contains("classic queue") && text.contains("type: quorum"),
            "{text}"
        );

        let (field, text) = rejected(
            "queues:\n  - { name: q, type: quorum, retries: { max_attempts: 5, initial_delay: 1, \
             max_delay: 60, in_queue: true } }\n",
        );
        assert_eq!(field, "queues[0].retries.in_queue");
        assert!(
            text.contains("(1s, 2s, 4s, 8s:") && text.contains("(1s, 2s, 3s, 4s:"),
            "{text}"
        );

        let (field, _) = rejected(
            "queues:\n  - { name: q, type: quorum, max_redeliveries: 2, retries: { max_attempts: 3, \
             initial_delay: 1, max_delay: 2, in_queue: true } }\n",
        );
        assert_eq!(field, "queues[0].max_redeliveries");

        let (field, _) = rejected(
            "queues:\n  - { name: q, type: quorum, arguments: { x-delayed-retry-min: 5 }, \
             retries: { max_attempts: 3, initial_delay: 1, max_delay: 2, in_queue: true } }\n",
        );
        assert_eq!(field, "queues[0].arguments.x-delayed-retry-min");
    }

    #[test]
    fn before_4_3_the_start_is_refused_naming_the_queue() {
        let c = Config::from_yaml_str(
            "queues:\n  - { name: a }\n  - { name: b, type: quorum, retries: { max_attempts: 2, \
             initial_delay: 1, max_delay: 1, in_queue: true } }\n",
        )
        .expect("valid");
        let e = c.in_queue_before_4_3("RabbitMQ 3.10.8").expect("refused");
        assert_eq!(e.field(), Some("queues[1].retries.in_queue"));
        assert!(e.to_string().contains("RabbitMQ 3.10.8"), "{e}");
        assert_eq!(c.in_queue_unchecked().len(), 1);
    }
}

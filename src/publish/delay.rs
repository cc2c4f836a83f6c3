//! Delayed publishing without a broker plugin: TTL bucket queues.
//!
//! [`Publisher::publish_delayed`] sends a message that reaches its exchange
//! after a delay, through the same mechanism as the retry rungs: a durable
//! queue with `x-message-ttl` whose expired messages are dead-lettered into
//! the target exchange. Nothing but stock RabbitMQ is needed.
//!
//! ```no_run
//! use std::time::Duration;
//! use acemq::{Properties, Publisher};
//!
//! # async fn run(publisher: Publisher) -> Result<(), acemq::PublishError> {
//! // Reaches the `shop` exchange with routing key `orders.reminder` no
//! // earlier than 30 s from now.
//! publisher
//!     .publish_delayed("shop", "orders.reminder", b"{}", Properties::default(), Duration::from_secs(30))
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! - **Buckets.** A delay rounds *up* to the next of a fixed ladder of
//!   buckets ([`BUCKETS`]: 250 ms, 500 ms, 1 s, 2 s, 5 s, 10 s, 15 s, 30 s,
//!   1, 2, 5, 10, 15 and 30 minutes, 1, 2, 3, 6 and 12 hours, 1, 2, 4 and 7
//!   days). A message arrives no earlier than its delay and at most its
//!   bucket's width later: 3 s waits 5 s, 40 s waits 60 s. A delay of zero
//!   is an ordinary publish; one above 7 days is refused.
//! - **Per target.** Each (target exchange, bucket) pair is one queue,
//!   `acemq.delay.<bucket>` for the default exchange and
//!   `acemq.delay.<bucket>.<exchange>` otherwise (the bucket written as the
//!   rungs write delays: `5s`, `500ms`), with `x-message-ttl` = the bucket
//!   and `x-dead-letter-exchange` = the target. It has no
//!   `x-dead-letter-routing-key`, so the message reaches the target with its
//!   **own routing key**. Declared on first use, durable, and left in place.
//! - **Routing into a bucket.** Messages go to the bucket through the
//!   headers exchange `acemq.delay` (durable), never through the default
//!   exchange — which would make the bucket's name the routing key. The
//!   header `acemq-delay-bucket` names the bucket and stays on the message;
//!   the broker adds its `x-death` record on the dead-letter hop.
//! - **Queue type.** Buckets are quorum queues when the publisher's
//!   topology declares any quorum queue (a quorum deployment), with
//!   at-least-once dead-lettering (`x-dead-letter-strategy: at-least-once`,
//!   `x-overflow: reject-publish`); classic otherwise.
//!
//! # What is guaranteed
//!
//! The publish is mandatory and confirmed: `Ok` means the bucket holds the
//! message (persistent unless the properties say otherwise). On first use
//! of a target the exchange is checked to exist (passively; for the default
//! exchange, the queue named by the routing key), so a typo fails at once.
//! The dead-letter hop is the broker's: from a quorum bucket it is
//! at-least-once (a broker crash during the hop can deliver twice, never
//! lose); from a classic bucket at-most-once (a crash during the hop can
//! lose the message). If the target routes the message nowhere when it
//! expires (a binding removed during the wait), the broker drops it: there
//! is no mandatory flag on a dead-letter hop. A message's own `expiration`
//! cannot be combined with a delay (the broker removes it on the hop) and
//! is refused.

use std::time::Duration;

use acemq_layers::{delay_label, Headers, Properties, PublishError};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ExchangeKind};

use super::publisher::Publisher;
use crate::connection::close_channel;

/// The headers exchange every delayed message is published to.
pub(crate) const DELAY_EXCHANGE: &str = "acemq.delay";

/// The header that routes a delayed message into its bucket. Not `x-`
/// prefixed like acemq's other headers: a headers exchange ignores binding
/// arguments that start with `x-` (other than `x-match`), so such a binding
/// would match every message.
#[doc(hidden)]
pub const BUCKET_HEADER: &str = "acemq-delay-bucket";

/// The buckets a delay rounds up to, shortest first.
///
/// Example: a 3 s delay waits 5 s, 40 s waits 60 s (see the [module docs](crate::delay) for a delayed publish).
pub const BUCKETS: &[Duration] = &[
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(15),
    Duration::from_secs(30),
    Duration::from_secs(60),
    Duration::from_secs(2 * 60),
    Duration::from_secs(5 * 60),
    Duration::from_secs(10 * 60),
    Duration::from_secs(15 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(3600),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(3 * 3600),
    Duration::from_secs(6 * 3600),
    Duration::from_secs(12 * 3600),
    Duration::from_secs(24 * 3600),
    Duration::from_secs(2 * 24 * 3600),
    Duration::from_secs(4 * 24 * 3600),
    Duration::from_secs(7 * 24 * 3600),
];

/// The bucket `delay` rounds up to, or `None` when it is longer than the
/// longest bucket.
pub(crate) fn bucket_for(delay: Duration) -> Option<Duration> {
    BUCKETS.iter().copied().find(|b| *b >= delay)
}

/// The bucket queue's name for `exchange` (`""`: the default exchange).
#[doc(hidden)]
pub fn bucket_queue(exchange: &str, bucket: Duration) -> String {
    if exchange.is_empty() {
        format!("{DELAY_EXCHANGE}.{}", delay_label(bucket))
    } else {
        format!("{DELAY_EXCHANGE}.{}.{exchange}", delay_label(bucket))
    }
}

/// The bucket queue's arguments.
fn bucket_arguments(exchange: &str, bucket: Duration, quorum: bool) -> FieldTable {
    let ttl = i64::try_from(bucket.as_millis()).unwrap_or(i64::MAX);
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ttl));
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(exchange.into()),
    );
    if quorum {
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        args.insert(
            "x-dead-letter-strategy".into(),
            AMQPValue::LongString("at-least-once".into()),
        );
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
    }
    args
}

fn declare_error(target: &str, what: &str, e: lapin::Error) -> PublishError {
    PublishError::transport_with_source(
        target,
        format!("the delayed publish could not {what}: {e}"),
        e,
    )
}

/// Checks the target and declares the exchange, the bucket and its binding,
/// each on a channel of its own (a failed passive check closes its channel).
async fn declare_bucket(
    conn: &Connection,
    exchange: &str,
    routing_key: &str,
    bucket: Duration,
    queue: &str,
    quorum: bool,
) -> Result<(), PublishError> {
    let target = target_name(exchange, routing_key);
    let check = conn
        .create_channel()
        .await
        .map_err(|e| declare_error(&target, "open a channel", e))?;
    let checked = if exchange.is_empty() {
        check
            .queue_declare(
                routing_key.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map(|_| ())
    } else {
        check
            .exchange_declare(
                exchange.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
    };
    if let Err(e) = checked {
        let what = if exchange.is_empty() {
            format!("find the queue {routing_key:?} (a delayed publish to the default exchange needs the queue to exist; declare it first)")
        } else {
            format!(
                "find the exchange {exchange:?} (declare it before publishing to it with a delay)"
            )
        };
        return Err(declare_error(&target, &what, e));
    }
    let _ = close_channel(&check, "OK").await;

    let ch = conn
        .create_channel()
        .await
        .map_err(|e| declare_error(&target, "open a channel", e))?;
    ch.exchange_declare(
        DELAY_EXCHANGE.into(),
        ExchangeKind::Headers,
        ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .map_err(|e| {
        declare_error(
            &target,
            &format!("declare the exchange {DELAY_EXCHANGE:?}"),
            e,
        )
    })?;
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        bucket_arguments(exchange, bucket, quorum),
    )
    .await
    .map_err(|e| declare_error(&target, &format!("declare the bucket queue {queue:?}"), e))?;
    let mut binding = FieldTable::default();
    binding.insert("x-match".into(), AMQPValue::LongString("all".into()));
    binding.insert(BUCKET_HEADER.into(), AMQPValue::LongString(queue.into()));
    ch.queue_bind(
        queue.into(),
        DELAY_EXCHANGE.into(),
        "".into(),
        QueueBindOptions::default(),
        binding,
    )
    .await
    .map_err(|e| declare_error(&target, &format!("bind the bucket queue {queue:?}"), e))?;
    let _ = close_channel(&ch, "OK").await;
    Ok(())
}

fn target_name(exchange: &str, routing_key: &str) -> String {
    if exchange.is_empty() {
        routing_key.to_owned()
    } else {
        format!("{exchange}/{routing_key}")
    }
}

impl Publisher {
    /// Publishes `body` so that it reaches `exchange` with `routing_key`
    /// after `delay`, rounded up to a bucket (see the [module
    /// docs](crate::delay) for the buckets, the queues it declares and
    /// what each queue type guarantees). `Ok` once the bucket queue holds
    /// the message (mandatory, confirmed). A zero delay publishes at once.
    ///
    /// Refused, with nothing sent: a delay above 7 days, a
    /// `properties.expiration`, a target exchange (or, for `""`, a queue)
    /// that does not exist.
    pub async fn publish_delayed(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: Properties,
        delay: Duration,
    ) -> Result<(), PublishError> {
        self.publish_delayed_with_headers(
            exchange,
            routing_key,
            body,
            properties,
            &Headers::new(),
            delay,
        )
        .await
    }

    /// As [`publish_delayed`](Self::publish_delayed), with headers.
    pub async fn publish_delayed_with_headers(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: Properties,
        headers: &Headers,
        delay: Duration,
    ) -> Result<(), PublishError> {
        let target = target_name(exchange, routing_key);
        if properties.expiration.is_some() {
            return Err(PublishError::transport(
                target,
                "a delayed message cannot carry its own expiration (the broker removes it on the dead-letter hop): leave properties.expiration unset",
            ));
        }
        if delay.is_zero() {
            return self
                .publish_with_headers(exchange, routing_key, body, properties, headers)
                .await;
        }
        let Some(bucket) = bucket_for(delay) else {
            return Err(PublishError::transport(
                target,
                format!(
                    "a delay of {delay:?} is longer than the longest bucket (7 days); schedule it from a store and publish nearer the time"
                ),
            ));
        };
        let queue = bucket_queue(exchange, bucket);
        let max = crate::config::Config::MAX_SHORT_STRING_BYTES;
        if queue.len() > max {
            return Err(PublishError::transport(
                target,
                format!("the bucket queue's name for the exchange {exchange:?} would be over {max} bytes; use a shorter exchange name"),
            ));
        }
        let mut headers = headers.clone();
        headers.insert(BUCKET_HEADER, queue.as_str());
        let declared = self.delay_buckets();
        for round in 0..2 {
            if !declared.has(&queue) {
                let conn = self.open_connection(&target).await?;
                declare_bucket(
                    &conn,
                    exchange,
                    routing_key,
                    bucket,
                    &queue,
                    self.quorum_buckets(),
                )
                .await?;
                declared.insert(queue.clone());
            }
            match self
                .publish_with_headers(DELAY_EXCHANGE, routing_key, body, properties.clone(), &headers)
                .await
            {
                // The bucket was deleted since it was declared: declare it
                // again, once.
                Err(PublishError::Unroutable { .. }) if round == 0 => declared.forget(&queue),
                Err(PublishError::Unroutable { .. }) => {
                    return Err(PublishError::transport(
                        target,
                        format!("the bucket queue {queue:?} was declared but the message was returned unroutable; check that nothing deletes or unbinds it"),
                    ))
                }
                other => return other,
            }
        }
        unreachable!("the loop returns in its second round")
    }

    /// Whether delay buckets are quorum queues: when the topology declares
    /// any quorum queue.
    fn quorum_buckets(&self) -> bool {
        self.topology().is_some_and(|t| {
            t.decls().iter().any(|d| {
                matches!(
                    d.arguments.inner().get("x-queue-type"),
                    Some(lapin::types::AMQPValue::LongString(s)) if s.to_string() == "quorum"
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_rounds_up_to_the_next_bucket() {
        assert_eq!(
            bucket_for(Duration::from_millis(1)),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            bucket_for(Duration::from_secs(3)),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            bucket_for(Duration::from_secs(5)),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            bucket_for(Duration::from_secs(40)),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            bucket_for(Duration::from_secs(7 * 24 * 3600)),
            Some(Duration::from_secs(7 * 24 * 3600))
        );
        assert_eq!(bucket_for(Duration::from_secs(7 * 24 * 3600 + 1)), None);
    }

    #[test]
    fn buckets_are_strictly_increasing_and_every_delay_waits_at_least_as_asked() {
        assert!(BUCKETS.windows(2).all(|w| w[0] < w[1]));
        for ms in [1u64, 249, 250, 251, 999, 1000, 1001, 59_999, 3_600_001] {
            let d = Duration::from_millis(ms);
            assert!(bucket_for(d).unwrap() >= d, "{d:?}");
        }
    }

    #[test]
    fn bucket_queues_are_named_by_bucket_then_exchange() {
        assert_eq!(bucket_queue("", Duration::from_secs(5)), "acemq.delay.5s");
        assert_eq!(
            bucket_queue("shop", Duration::from_millis(500)),
            "acemq.delay.500ms.shop"
        );
        assert_eq!(
            bucket_queue("shop", Duration::from_secs(3600)),
            "acemq.delay.3600s.shop"
        );
    }

    #[test]
    fn quorum_buckets_dead_letter_at_least_once_without_a_routing_key() {
        let args = bucket_arguments("shop", Duration::from_secs(5), true);
        let get = |k: &str| args.inner().get(k).cloned();
        assert_eq!(get("x-message-ttl"), Some(AMQPValue::LongLongInt(5000)));
        assert_eq!(
            get("x-dead-letter-exchange"),
            Some(AMQPValue::LongString("shop".into()))
        );
        assert_eq!(get("x-dead-letter-routing-key"), None);
        assert_eq!(
            get("x-dead-letter-strategy"),
            Some(AMQPValue::LongString("at-least-once".into()))
        );
        let classic = bucket_arguments("", Duration::from_secs(5), false);
        assert!(classic.inner().get("x-queue-type").is_none());
        assert!(classic.inner().get("x-dead-letter-strategy").is_none());
    }
}

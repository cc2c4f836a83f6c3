//! Moving dead-lettered messages back to their queue once the bug is fixed.
//!
//! [`replay_dead_letters`] takes the messages in `Q.dlq` one by one and
//! publishes each back to `Q`, with the attempt count reset: the
//! `x-acemq-*` headers the retry and dead-letter layers wrote (attempt,
//! reason, error, attempts, queue, dead-lettered-at) and the broker's
//! `x-delivery-count` are removed, every other header and property is kept,
//! and so are the `x-acemq-original-*` ones (exchange, routing key, the
//! producer's trace context), so a handler that dispatches on
//! [`Delivery::original_routing_key`] still sees where the message first
//! came from: the copy carries `x-acemq-replayed`, which the consumer
//! needs to believe them ([`acemq_layers::provenance`]). A dead letter the
//! broker moved out of `Q` itself (expired, over a length limit) was never
//! handled: its `x-acemq-original-*`, the publisher's, are dropped.
//!
//! # Nothing lost
//!
//! Each message is taken with `basic.get` (unacknowledged), published to `Q`
//! with `mandatory` and a publisher confirm, and only then acknowledged in
//! `Q.dlq`. Killed at any point, the message is in `Q.dlq` (not yet
//! published, or published and not yet acknowledged: then it is in both, a
//! duplicate, never a loss), and the broker gives back what the replay held
//! when its connection closes. A publish that is refused (no queue `Q`, a
//! nack) stops the replay with an error and leaves that message in `Q.dlq`.
//!
//! Messages skipped by [`ReplayOptions::only_reason`], and with
//! [`ReplayOptions::skip_repeated`] every copy of a message id this replay
//! already moved, are held
//! unacknowledged until the replay ends, then given back to `Q.dlq` in their
//! order. The replay takes at most as many messages as `Q.dlq` held when it
//! started (or [`ReplayOptions::limit`]), so a message that fails again and
//! is dead-lettered during the replay is not replayed twice by it.
//!
//! ```no_run
//! use acemq::layers::Reason;
//! use acemq::replay::{replay_dead_letters, ReplayOptions};
//!
//! # async fn run() -> Result<(), acemq::replay::ReplayError> {
//! let addr = acemq::connection::amqp_addr_from_env();
//! let report = replay_dead_letters(&addr, "shop.orders", ReplayOptions::new().only_reason(Reason::Rejected)).await?;
//! println!("{report}"); // moved 12 from shop.orders.dlq to shop.orders; 3 left (other reasons)
//! # Ok(()) }
//! ```
//!
//! The `replay` example is the command: `cargo run --example replay --
//! shop.orders --reason rejected`.
//!
//! [`Delivery::original_routing_key`]: acemq_layers::Delivery::original_routing_key

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use acemq_layers::dead_letter::REASON_HEADER;
use acemq_layers::headers::REDELIVERY_COUNT_HEADERS;
use acemq_layers::provenance::{
    dead_lettered_by_broker_from, ORIGINAL_HEADER_PREFIX, REPLAYED_HEADER,
};
use acemq_layers::{Headers, Reason};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Confirmation, Connection};

use crate::connection::{close_channel, close_connection, connect, redact, ConnectError};
use crate::convert::{headers_from_table, properties_from_lapin, properties_to_lapin};

/// What to replay.
///
/// Example: the [module docs](crate::replay); the runnable command is `examples/replay.rs`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Only messages dead-lettered for this reason (`x-acemq-reason`);
    /// `None` (the default): all.
    pub reason: Option<Reason>,
    /// At most this many messages taken from the dead-letter queue (moved or
    /// skipped); `None` (the default): as many as it held at the start.
    pub limit: Option<usize>,
    /// Move only the first copy of each message id and leave the others
    /// (repeats, such as a copy a crash dead-lettered twice) in the
    /// dead-letter queue; `false` (the default): move every copy.
    pub skip_repeated: bool,
    /// Only messages whose message id is one of these (a selection, as the
    /// console makes one); `None` (the default): any id, or none.
    pub message_ids: Option<std::collections::BTreeSet<String>>,
}

impl ReplayOptions {
    /// Every message the dead-letter queue holds now.
    pub fn new() -> Self {
        ReplayOptions::default()
    }

    /// Only messages dead-lettered with `reason`.
    pub fn only_reason(mut self, reason: Reason) -> Self {
        self.reason = Some(reason);
        self
    }

    /// At most `n` messages taken.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }

    /// Move one copy of each message id: a message whose id this replay
    /// already moved is left in the dead-letter queue, in its place, and
    /// counted in [`ReplayReport::repeats_left`]. Messages without an id are
    /// all moved.
    pub fn skip_repeated(mut self) -> Self {
        self.skip_repeated = true;
        self
    }

    /// Only messages whose message id is in `ids`: the others (and those
    /// without an id) are left in the dead-letter queue, in order, and
    /// counted in [`ReplayReport::not_selected`].
    pub fn only_message_ids<I, S>(mut self, ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.message_ids = Some(ids.into_iter().map(Into::into).collect());
        self
    }
}

/// What a replay did.
///
/// Example: the [module docs](crate::replay); the runnable command is `examples/replay.rs`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayReport {
    /// The dead-letter queue read.
    pub from: String,
    /// The queue the messages went back to.
    pub to: String,
    /// Messages published back to the queue (confirmed) and removed from the
    /// dead-letter queue.
    pub moved: usize,
    /// Messages left in the dead-letter queue because their reason was not
    /// the one asked for.
    pub skipped: usize,
    /// With [`ReplayOptions::only_message_ids`]: messages left in the
    /// dead-letter queue because their id was not selected (or they had
    /// none).
    pub not_selected: usize,
    /// With [`ReplayOptions::skip_repeated`]: messages left in the
    /// dead-letter queue because a copy with their message id was moved
    /// before them.
    pub repeats_left: usize,
    /// Moved messages per `x-acemq-reason` (`none` when a message had none:
    /// it reached the dead-letter queue through the broker's own
    /// dead-lettering).
    pub moved_by_reason: BTreeMap<String, usize>,
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "moved {} from {} to {}", self.moved, self.from, self.to)?;
        if !self.moved_by_reason.is_empty() {
            let parts: Vec<String> = self
                .moved_by_reason
                .iter()
                .map(|(r, n)| format!("{}: {n}", acemq_layers::Escaped(r)))
                .collect();
            write!(f, " ({})", parts.join(", "))?;
        }
        if self.skipped > 0 {
            write!(
                f,
                "; {} left in {} (other reasons)",
                self.skipped, self.from
            )?;
        }
        if self.not_selected > 0 {
            write!(
                f,
                "; {} left in {} (not selected)",
                self.not_selected, self.from
            )?;
        }
        if self.repeats_left > 0 {
            write!(
                f,
                "; {} repeated message id{} left in {} (a copy of each was moved)",
                self.repeats_left,
                if self.repeats_left == 1 { "" } else { "s" },
                self.from
            )?;
        }
        Ok(())
    }
}

/// Why a replay stopped. Whatever it had not yet moved is still in the
/// dead-letter queue; [`ReplayError::report`] says what it had.
///
/// Example: the [module docs](crate::replay); the runnable command is `examples/replay.rs`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The broker could not be reached.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The dead-letter queue does not exist.
    #[error("there is no queue {dlq:?} to replay from: {message}")]
    NoDeadLetterQueue {
        /// The dead-letter queue.
        dlq: String,
        /// What the broker said.
        message: String,
    },
    /// A message could not be published back (the queue is missing, the
    /// broker nacked, the channel closed). It is still in the dead-letter
    /// queue.
    #[error("stopped after moving {}: could not publish back to {queue:?} ({why}); the message is still in the dead-letter queue", report.moved)]
    Publish {
        /// The target queue.
        queue: String,
        /// What went wrong.
        why: String,
        /// What was done before.
        report: ReplayReport,
    },
    /// Another broker failure (reading or acknowledging).
    #[error("stopped after moving {}: {message}", report.moved)]
    Broker {
        /// What the broker or client said.
        message: String,
        /// What was done before.
        report: ReplayReport,
    },
}

impl ReplayError {
    /// What the replay had done when it stopped, when it had started.
    pub fn report(&self) -> Option<&ReplayReport> {
        match self {
            ReplayError::Publish { report, .. } | ReplayError::Broker { report, .. } => {
                Some(report)
            }
            _ => None,
        }
    }
}

/// How long connecting may take for [`replay_dead_letters`].
const CONNECT_TIMEOUT: Duration = crate::config::Config::DEFAULT_CONNECT_TIMEOUT;

/// Connects to `addr` (connection name `acemq-replay@host:pid`), replays
/// `{queue}.dlq` into `queue` (see the [module docs](self)), and closes the
/// connection.
///
/// Example: the [module docs](crate::replay); the runnable command is `examples/replay.rs`.
pub async fn replay_dead_letters(
    addr: &str,
    queue: &str,
    options: ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    let name = format!("acemq-replay@{}:{}", hostname(), std::process::id());
    tracing::info!(broker = %redact(addr), queue, "connecting to replay dead letters");
    let connection = connect(addr, &name, CONNECT_TIMEOUT).await?;
    let result = replay_on(&connection, queue, options).await;
    let _ = close_connection(&connection, "OK").await;
    result
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Replays `{queue}.dlq` into `queue` on an open connection (two channels of
/// its own, closed at the end); see the [module docs](self).
///
/// ```no_run
/// use acemq::replay::{replay_on, ReplayOptions};
///
/// # async fn run(conn: acemq::lapin::Connection) -> Result<(), acemq::replay::ReplayError> {
/// // On a connection you already hold (`acemq dlq replay` does this).
/// let report = replay_on(&conn, "shop.orders", ReplayOptions::new().limit(100)).await?;
/// println!("{report}");
/// # Ok(()) }
/// ```
pub async fn replay_on(
    connection: &Connection,
    queue: &str,
    options: ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    let dlq = acemq_layers::dead_letter::dlq_name(queue);
    let mut report = ReplayReport {
        from: dlq.clone(),
        to: queue.to_owned(),
        ..ReplayReport::default()
    };
    let broker = |message: String, report: &ReplayReport| ReplayError::Broker {
        message,
        report: report.clone(),
    };
    let get = connection
        .create_channel()
        .await
        .map_err(|e| broker(e.to_string(), &report))?;
    let held = match get
        .queue_declare(
            dlq.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
    {
        Ok(q) => q.message_count() as usize,
        Err(e) => {
            return Err(ReplayError::NoDeadLetterQueue {
                dlq,
                message: e.to_string(),
            })
        }
    };
    let publish = connection
        .create_channel()
        .await
        .map_err(|e| broker(e.to_string(), &report))?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| broker(e.to_string(), &report))?;
    let budget = options.limit.map_or(held, |n| n.min(held));
    let result = run(&get, &publish, queue, &dlq, &options, budget, &mut report).await;
    // Give the skipped messages back (closing the channel requeues every
    // message it holds unacknowledged, in order).
    let _ = close_channel(&get, "OK").await;
    let _ = close_channel(&publish, "OK").await;
    result.map(|()| {
        tracing::info!("{report}");
        report
    })
}

async fn run(
    get: &Channel,
    publish: &Channel,
    queue: &str,
    dlq: &str,
    options: &ReplayOptions,
    budget: usize,
    report: &mut ReplayReport,
) -> Result<(), ReplayError> {
    let mut moved_ids = std::collections::HashSet::new();
    for _ in 0..budget {
        let Some(delivery) = take(get, dlq, report).await? else {
            break;
        };
        let (headers, reason) = headers_and_reason(&delivery);
        if let Some(wanted) = options.reason {
            if reason.as_deref() != Some(wanted.as_str()) {
                // Held unacknowledged: given back when the channel closes.
                report.skipped += 1;
                continue;
            }
        }
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.to_string());
        if let Some(wanted) = &options.message_ids {
            if !id.as_ref().is_some_and(|id| wanted.contains(id)) {
                // Not selected: held, given back when the channel closes.
                report.not_selected += 1;
                continue;
            }
        }
        if options.skip_repeated && id.as_ref().is_some_and(|id| moved_ids.contains(id)) {
            // A repeat: held unacknowledged, given back with the skipped.
            report.repeats_left += 1;
            continue;
        }
        if let Some(why) = publish_back(publish, queue, &delivery, headers).await {
            let _ = delivery
                .acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await;
            return Err(ReplayError::Publish {
                queue: queue.to_owned(),
                why,
                report: report.clone(),
            });
        }
        // Confirmed in `queue`: only now removed from the dead-letter queue.
        if let Err(e) = delivery.acker.ack(BasicAckOptions::default()).await {
            return Err(ReplayError::Broker {
                message: format!(
                    "published a message back to {queue:?} but could not acknowledge it in \
                     {dlq:?} ({e}): it is in both now (a duplicate, not a loss)"
                ),
                report: report.clone(),
            });
        }
        report.moved += 1;
        if let Some(id) = id {
            moved_ids.insert(id);
        }
        *report
            .moved_by_reason
            .entry(reason.unwrap_or_else(|| "none".to_owned()))
            .or_default() += 1;
    }
    Ok(())
}

/// Takes the next message of `dlq`, unacknowledged; `None` when it is empty.
async fn take(
    get: &Channel,
    dlq: &str,
    report: &ReplayReport,
) -> Result<Option<Delivery>, ReplayError> {
    match get
        .basic_get(dlq.into(), BasicGetOptions { no_ack: false })
        .await
    {
        Ok(Some(m)) => Ok(Some(m.delivery)),
        Ok(None) => Ok(None),
        Err(e) => Err(ReplayError::Broker {
            message: format!("could not read {dlq:?}: {e}"),
            report: report.clone(),
        }),
    }
}

/// The message's headers, and the reason it was dead-lettered for
/// (`x-acemq-reason`), if it has one.
fn headers_and_reason(delivery: &Delivery) -> (Headers, Option<String>) {
    let headers = delivery
        .properties
        .headers()
        .as_ref()
        .map(headers_from_table)
        .unwrap_or_default();
    let reason = headers
        .get(REASON_HEADER)
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    (headers, reason)
}

/// Publishes a copy of `delivery` with its attempt count [`reset`] to
/// `queue` (mandatory, confirmed); `None` when the broker confirmed it,
/// else why it was refused.
async fn publish_back(
    publish: &Channel,
    queue: &str,
    delivery: &Delivery,
    headers: Headers,
) -> Option<String> {
    let props = properties_to_lapin(
        &properties_from_lapin(&delivery.properties),
        &reset(headers, queue),
    );
    let outcome = publish
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            &delivery.data,
            props,
        )
        .await;
    let confirm = match outcome {
        Ok(pending) => pending.await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match confirm {
        Ok(Confirmation::Ack(None)) | Ok(Confirmation::NotRequested) => None,
        Ok(Confirmation::Ack(Some(_))) | Ok(Confirmation::Nack(Some(_))) => Some(format!(
            "no queue named {queue:?}: the broker returned the message (NO_ROUTE)"
        )),
        Ok(Confirmation::Nack(None)) => Some("the broker nacked it".to_owned()),
        Err(e) => Some(e),
    }
}

/// The headers of a replayed copy to `queue`: the attempt count reset
/// (every `x-acemq-*` header but the `x-acemq-original-*` ones: where the
/// message came from, the producer's trace context), no `x-delivery-count`
/// nor `x-acquired-count`, and [`REPLAYED_HEADER`], so the consumer
/// believes the provenance kept. A copy the broker dead-lettered out of
/// `queue` itself (expired, over a length limit) was never handled by
/// acemq: its `x-acemq-original-*` are whatever its publisher sent, and
/// are dropped.
#[doc(hidden)]
pub fn reset(headers: Headers, queue: &str) -> Headers {
    let provenance = !dead_lettered_by_broker_from(&headers, queue);
    let mut headers: Headers = headers
        .into_iter()
        .filter(|(name, _)| {
            if name.starts_with(ORIGINAL_HEADER_PREFIX) {
                return provenance;
            }
            !(name.starts_with("x-acemq-") || REDELIVERY_COUNT_HEADERS.contains(&name.as_str()))
        })
        .collect();
    headers.insert(REPLAYED_HEADER, true);
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_layers::Value;

    #[test]
    fn a_replayed_copy_loses_the_attempt_and_reason_headers_and_keeps_the_rest() {
        let mut h = Headers::new();
        for name in [
            "x-acemq-attempt",
            "x-acemq-reason",
            "x-acemq-error",
            "x-acemq-attempts",
            "x-acemq-queue",
            "x-acemq-dead-lettered-at",
            "x-delivery-count",
            "x-acquired-count",
            "x-acemq-original-exchange",
            "x-acemq-original-routing-key",
            "x-acemq-original-traceparent",
            "x-custom",
            "traceparent",
        ] {
            h.insert(name, Value::from(name));
        }
        let kept: Vec<String> = reset(h.clone(), "q").into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            kept,
            [
                "traceparent",
                "x-acemq-original-exchange",
                "x-acemq-original-routing-key",
                "x-acemq-original-traceparent",
                "x-acemq-replayed",
                "x-custom"
            ]
        );
        // Dead-lettered by the broker out of `q` itself: the publisher's
        // provenance headers, never checked, are dropped.
        let mut death = Headers::new();
        death.insert("queue", "q");
        h.insert("x-death", Value::Array(vec![Value::Table(death)]));
        let kept: Vec<String> = reset(h, "q").into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            kept,
            ["traceparent", "x-acemq-replayed", "x-custom", "x-death"]
        );
    }

    #[test]
    fn the_report_reads_as_a_sentence() {
        let mut r = ReplayReport {
            from: "q.dlq".into(),
            to: "q".into(),
            moved: 2,
            skipped: 1,
            ..ReplayReport::default()
        };
        r.moved_by_reason.insert("rejected".into(), 2);
        assert_eq!(
            r.to_string(),
            "moved 2 from q.dlq to q (rejected: 2); 1 left in q.dlq (other reasons)"
        );
    }

    #[test]
    fn the_report_says_how_many_repeats_it_left() {
        let r = ReplayReport {
            from: "q.dlq".into(),
            to: "q".into(),
            moved: 2,
            repeats_left: 3,
            ..ReplayReport::default()
        };
        assert_eq!(
            r.to_string(),
            "moved 2 from q.dlq to q; 3 repeated message ids left in q.dlq (a copy of each was moved)"
        );
    }

    #[test]
    fn a_forged_reason_is_shown_escaped() {
        let mut r = ReplayReport {
            from: "q.dlq".into(),
            to: "q".into(),
            moved: 1,
            ..ReplayReport::default()
        };
        r.moved_by_reason.insert("x\x1b[2J\nERROR forged".into(), 1);
        let shown = r.to_string();
        assert_eq!(
            shown,
            "moved 1 from q.dlq to q (x\\u{1b}[2J\\nERROR forged: 1)"
        );
        assert!(!shown.chars().any(char::is_control), "{shown}");
    }
}

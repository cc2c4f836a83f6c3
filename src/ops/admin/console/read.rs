//! Reading a dead-letter queue for the console without losing or
//! reordering a message: the first messages are taken with `basic.get`
//! (manual acknowledgement) on a channel of their own, never acknowledged,
//! and given back together by closing that channel, as `acemq dlq peek`
//! does (a closed channel's messages go back to the head of the queue in
//! their order, on classic and quorum queues alike; a nack with requeue
//! would put a quorum queue's at its back on RabbitMQ 3.10).

use std::collections::BTreeMap;
use std::time::Duration;

use acemq_layers::dead_letter::{
    ATTEMPTS_HEADER, DEAD_LETTERED_AT_HEADER, ERROR_HEADER, QUEUE_HEADER, REASON_HEADER,
};
use acemq_layers::headers::{ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER};
use acemq_layers::{Headers, Value};
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueuePurgeOptions};
use lapin::types::FieldTable;
use lapin::Connection;

use crate::connection::{close_channel, close_connection, connect};
use crate::convert::headers_from_table;

/// How long connecting to the broker may take for a console page.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes of a body kept for its preview.
pub(crate) const BODY_PREVIEW: usize = 4096;

/// One message as read.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    /// Its place in the queue, from 1.
    pub(crate) position: usize,
    pub(crate) message_id: Option<String>,
    /// `x-acemq-reason`; `None` when the broker dead-lettered it itself.
    pub(crate) reason: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) attempts: Option<i64>,
    /// `x-acemq-queue`: the queue it was dead-lettered from.
    pub(crate) queue: Option<String>,
    pub(crate) exchange: Option<String>,
    pub(crate) routing_key: Option<String>,
    pub(crate) dead_lettered_at_ms: Option<i64>,
    pub(crate) redelivered: bool,
    /// Every header, its value as text.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) content_type: Option<String>,
    pub(crate) body_len: usize,
    /// The first [`BODY_PREVIEW`] bytes of the body.
    pub(crate) body: Vec<u8>,
}

/// What a read of a dead-letter queue found.
#[derive(Debug, Clone, Default)]
pub(crate) struct Read {
    /// The messages ready in the queue when the read started.
    pub(crate) held: u32,
    /// The first messages, in order (at most the read's limit).
    pub(crate) messages: Vec<Message>,
}

impl Read {
    /// Counts by reason (`none` for a message without one), most first.
    pub(crate) fn by_reason(&self) -> Vec<(String, usize)> {
        most_first(
            self.messages
                .iter()
                .map(|m| m.reason.clone().unwrap_or_else(|| "none".to_owned())),
        )
    }

    /// Counts by error text, grouped: runs of digits read as `#`, so that
    /// `order 17 cannot be fulfilled` and `order 18 …` are one group.
    pub(crate) fn by_error(&self) -> Vec<(String, usize)> {
        most_first(self.messages.iter().map(|m| {
            m.error
                .as_deref()
                .map_or_else(|| "(none)".to_owned(), group)
        }))
    }

    /// The message ids that occur more than once, with how often.
    pub(crate) fn repeated_ids(&self) -> BTreeMap<String, usize> {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for id in self.messages.iter().filter_map(|m| m.message_id.clone()) {
            *seen.entry(id).or_default() += 1;
        }
        seen.retain(|_, n| *n > 1);
        seen
    }

    /// The oldest and newest `x-acemq-dead-lettered-at` among the messages
    /// read, in milliseconds since the Unix epoch.
    pub(crate) fn span_ms(&self) -> Option<(i64, i64)> {
        let times = self.messages.iter().filter_map(|m| m.dead_lettered_at_ms);
        let min = times.clone().min()?;
        Some((min, times.max()?))
    }
}

/// `text` with each run of ASCII digits as one `#`.
pub(crate) fn group(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_digits = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

fn most_first(keys: impl Iterator<Item = String>) -> Vec<(String, usize)> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for k in keys {
        *counts.entry(k).or_default() += 1;
    }
    let mut out: Vec<(String, usize)> = counts.into_iter().collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// Why a read or a purge failed, for the page.
#[derive(Debug)]
pub(crate) struct ReadError(pub(crate) String);

/// Connects to `addr` as `name`.
async fn open(addr: &str, name: &str) -> Result<Connection, ReadError> {
    connect(addr, name, CONNECT_TIMEOUT)
        .await
        .map_err(|e| ReadError(format!("could not reach the broker: {e}")))
}

/// Reads the first `limit` messages of `dlq` on a connection of its own
/// (named `name`), and gives them all back.
pub(crate) async fn read(
    addr: &str,
    name: &str,
    dlq: &str,
    limit: usize,
) -> Result<Read, ReadError> {
    let conn = open(addr, name).await?;
    let result = read_on(&conn, dlq, limit).await;
    let _ = close_connection(&conn, "OK").await;
    result
}

async fn read_on(conn: &Connection, dlq: &str, limit: usize) -> Result<Read, ReadError> {
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| ReadError(format!("could not open a channel: {e}")))?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let held = ch
        .queue_declare(dlq.into(), passive, FieldTable::default())
        .await
        .map_err(|e| ReadError(format!("there is no queue {dlq:?} ({e})")))?
        .message_count();
    let mut read = Read {
        held,
        messages: Vec::new(),
    };
    let mut failed = None;
    // At most what the queue held at the start: a queue being filled is
    // not read for ever.
    let budget = limit.min(held as usize);
    while read.messages.len() < budget {
        match ch
            .basic_get(dlq.into(), BasicGetOptions { no_ack: false })
            .await
        {
            Ok(Some(m)) => {
                let position = read.messages.len() + 1;
                read.messages.push(message(position, &m.delivery));
            }
            Ok(None) => break,
            Err(e) => {
                failed = Some(ReadError(format!(
                    "could not read {dlq:?} after {} messages ({e})",
                    read.messages.len()
                )));
                break;
            }
        }
    }
    // Every message taken goes back, in order, as the channel closes;
    // were the close to fail, the connection's close does the same.
    if ch.status().connected() {
        let _ = close_channel(&ch, "OK").await;
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(read),
    }
}

fn text(h: &Headers, name: &str) -> Option<String> {
    h.get(name).and_then(Value::as_str).map(str::to_owned)
}

fn message(position: usize, d: &lapin::message::Delivery) -> Message {
    let h = d
        .properties
        .headers()
        .as_ref()
        .map(headers_from_table)
        .unwrap_or_default();
    Message {
        position,
        message_id: d.properties.message_id().as_ref().map(|s| s.to_string()),
        reason: text(&h, REASON_HEADER),
        error: text(&h, ERROR_HEADER),
        attempts: h.get(ATTEMPTS_HEADER).and_then(Value::as_i64),
        queue: text(&h, QUEUE_HEADER),
        exchange: text(&h, ORIGINAL_EXCHANGE_HEADER),
        routing_key: text(&h, ORIGINAL_ROUTING_KEY_HEADER),
        dead_lettered_at_ms: h.get(DEAD_LETTERED_AT_HEADER).and_then(Value::as_i64),
        redelivered: d.redelivered,
        headers: h.iter().map(|(k, v)| (k.to_owned(), show(v, 0))).collect(),
        content_type: d.properties.content_type().as_ref().map(|s| s.to_string()),
        body_len: d.data.len(),
        body: d.data[..d.data.len().min(BODY_PREVIEW)].to_vec(),
    }
}

/// A header value as text (strings quoted, tables and arrays in brackets,
/// eight levels at most).
fn show(v: &Value, depth: usize) -> String {
    if depth > 8 {
        return "…".to_owned();
    }
    match v {
        Value::String(b) | Value::Bytes(b) => format!("{:?}", String::from_utf8_lossy(b)),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(|i| show(i, depth + 1)).collect();
            format!("[{}]", inner.join(", "))
        }
        Value::Table(t) => {
            let inner: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{k}: {}", show(v, depth + 1)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
        Value::Void => "void".to_owned(),
        other => match other.as_i64() {
            Some(n) => n.to_string(),
            None => format!("{other:?}"),
        },
    }
}

/// Purges `dlq` on a connection of its own: how many messages it removed.
pub(crate) async fn purge(addr: &str, name: &str, dlq: &str) -> Result<u32, ReadError> {
    let conn = open(addr, name).await?;
    let result = async {
        let ch = conn
            .create_channel()
            .await
            .map_err(|e| ReadError(format!("could not open a channel: {e}")))?;
        let n = ch
            .queue_purge(dlq.into(), QueuePurgeOptions::default())
            .await
            .map_err(|e| ReadError(format!("could not purge {dlq:?}: {e}")))?;
        let _ = close_channel(&ch, "OK").await;
        Ok(n)
    }
    .await;
    let _ = close_connection(&conn, "OK").await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_group_by_their_digits() {
        assert_eq!(
            group("order 17 cannot be fulfilled"),
            "order # cannot be fulfilled"
        );
        assert_eq!(group("o-123: 4 ms left"), "o-#: # ms left");
    }
}

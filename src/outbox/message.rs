//! The message a user writes into the outbox, and the row the relay reads
//! back.

use acemq_layers::{Headers, Properties, Value};
use bytes::Bytes;

use crate::amqp::convert::{headers_from_table, table_from_headers};

/// An outgoing message: where it goes, its body, headers and properties.
///
/// Every message gets a message id: the one you set with
/// [`message_id`](Self::message_id), else a random UUID given by the
/// database. Delivery mode defaults to 2 (persistent).
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
#[derive(Clone, Debug)]
pub struct OutboxMessage {
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) body: Bytes,
    pub(crate) headers: Headers,
    pub(crate) properties: Properties,
}

impl OutboxMessage {
    /// A message to `exchange` with `routing_key` (`""` for the default
    /// exchange, where the routing key is a queue name).
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        body: impl Into<Bytes>,
    ) -> Self {
        let mut properties = Properties::default();
        properties.delivery_mode = Some(2);
        OutboxMessage {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            body: body.into(),
            headers: Headers::new(),
            properties,
        }
    }

    /// A message to `queue` through the default exchange.
    pub fn to_queue(queue: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self::new("", queue, body)
    }

    /// Sets the message id (default: a random UUID). Use a business key
    /// (`order-42-created`) when the same fact may be enqueued twice.
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.properties.message_id = Some(id.into());
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Replaces the headers.
    pub fn headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Replaces the properties (a message id in them is kept; the
    /// timestamp and user id are not stored).
    pub fn properties(mut self, properties: Properties) -> Self {
        self.properties = properties;
        self
    }

    /// Sets the content type (`application/json`).
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.properties.content_type = Some(content_type.into());
        self
    }

    /// Sets the correlation id.
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.properties.correlation_id = Some(id.into());
        self
    }

    /// Sets the message type (AMQP `type`, e.g. `order.created`).
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.properties.kind = Some(kind.into());
        self
    }
}

/// A committed outbox row, as the relay publishes it.
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct OutboxRecord {
    /// The row id (`acemq_outbox.id`).
    pub id: i64,
    /// The exchange (`""`: the default exchange).
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
    /// The body.
    pub body: Vec<u8>,
    /// The headers.
    pub headers: Headers,
    /// The properties; `message_id` is always set.
    pub properties: Properties,
}

impl OutboxRecord {
    /// The message id (always set).
    pub fn message_id(&self) -> &str {
        self.properties.message_id.as_deref().unwrap_or_default()
    }
}

/// The columns the relay selects, in the order [`OutboxRecord::from_row`] reads.
pub(crate) const COLUMNS: &str = "id, message_id, exchange, routing_key, body, headers, \
    content_type, content_encoding, correlation_id, reply_to, expiration, priority, kind, \
    app_id, delivery_mode";

impl OutboxRecord {
    pub(crate) fn from_row(row: &tokio_postgres::Row) -> Result<Self, String> {
        let headers: Option<Vec<u8>> = row.get(5);
        let headers = match headers {
            Some(b) => decode_headers(&b)?,
            None => Headers::new(),
        };
        let mut p = Properties::default();
        p.message_id = Some(row.get(1));
        p.content_type = row.get(6);
        p.content_encoding = row.get(7);
        p.correlation_id = row.get(8);
        p.reply_to = row.get(9);
        p.expiration = row.get(10);
        p.priority = row.get::<_, Option<i16>>(11).map(|v| v.clamp(0, 255) as u8);
        p.kind = row.get(12);
        p.app_id = row.get(13);
        p.delivery_mode = Some(row.get::<_, i16>(14).clamp(1, 2) as u8);
        Ok(OutboxRecord {
            id: row.get(0),
            exchange: row.get(2),
            routing_key: row.get(3),
            body: row.get(4),
            headers,
            properties: p,
        })
    }
}

/// Headers as an AMQP field table in wire encoding; `None` when empty.
pub(crate) fn encode_headers(headers: &Headers) -> Option<Vec<u8>> {
    if headers.is_empty() {
        return None;
    }
    let table = table_from_headers(headers);
    let serialize = amq_protocol_types::generation::gen_field_table(&table);
    match serialize(Vec::new().into()) {
        Ok(ctx) => Some(ctx.write),
        // Writing to a Vec cannot run out of room; keep nothing rather than panic.
        Err(_) => None,
    }
}

fn decode_headers(bytes: &[u8]) -> Result<Headers, String> {
    match amq_protocol_types::parsing::parse_field_table(bytes) {
        Ok((_, table)) => Ok(headers_from_table(&table)),
        Err(e) => Err(format!(
            "the headers column is not an AMQP field table: {e}"
        )),
    }
}

//! The message a user writes into the outbox, and the row the relay reads
//! back.

use std::sync::Arc;

use acemq_layers::{Headers, Properties, Value};
use bytes::Bytes;

use crate::convert::{headers_from_table, table_from_headers};

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
#[derive(Clone)]
#[non_exhaustive]
pub struct OutboxRecord {
    /// The row id (`acemq_outbox.id`).
    pub id: i64,
    /// The exchange (`""`: the default exchange).
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
    /// The headers.
    pub headers: Headers,
    /// The properties; `message_id` is always set.
    pub properties: Properties,
    /// The row as the database sent it: the body is read from it in place.
    row: Arc<tokio_postgres::Row>,
}

impl OutboxRecord {
    /// The message id (always set).
    pub fn message_id(&self) -> &str {
        self.properties.message_id.as_deref().unwrap_or_default()
    }

    /// The body, read in place from the row the relay claimed (not copied
    /// out of it).
    pub fn body(&self) -> &[u8] {
        self.row.get(BODY)
    }
}

/// The body's length, never its bytes (as a `Delivery` shows it).
impl std::fmt::Debug for OutboxRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxRecord")
            .field("id", &self.id)
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("body", &format_args!("<{} bytes>", self.body().len()))
            .field("headers", &self.headers)
            .field("properties", &self.properties)
            .finish()
    }
}

/// The body's column in [`columns!`].
const BODY: usize = 4;

/// The columns the relay selects, in the order [`OutboxRecord::from_row`]
/// reads (a macro, for `concat!` into the claim's text).
macro_rules! columns {
    () => {
        "id, message_id, exchange, routing_key, body, headers, \
         content_type, content_encoding, correlation_id, reply_to, expiration, priority, kind, \
         app_id, delivery_mode"
    };
}
pub(crate) use columns;

impl OutboxRecord {
    /// The record of a claimed row; the reason when the row cannot be read
    /// (its id given back for the mark).
    pub(crate) fn from_row(row: tokio_postgres::Row) -> Result<Self, (i64, String)> {
        let id: i64 = row.get(0);
        let row = Arc::new(row);
        Self::read(row).map_err(|why| (id, why))
    }

    fn read(row: Arc<tokio_postgres::Row>) -> Result<Self, String> {
        let headers: Option<&[u8]> = row.get(5);
        let headers = match headers {
            Some(b) => decode_headers(b)?,
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
        if let Err(e) = row.try_get::<_, &[u8]>(BODY) {
            return Err(format!("the body column is not bytea: {e}"));
        }
        Ok(OutboxRecord {
            id: row.get(0),
            exchange: row.get(2),
            routing_key: row.get(3),
            headers,
            properties: p,
            row,
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

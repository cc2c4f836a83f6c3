//! Writing a message into the outbox, inside the caller's transaction.

use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Transaction};

use super::error::OutboxError;
use super::message::{encode_headers, OutboxMessage};

const INSERT: &str = "INSERT INTO acemq_outbox (message_id, exchange, routing_key, body, headers, \
    content_type, content_encoding, correlation_id, reply_to, expiration, priority, kind, \
    app_id, delivery_mode) \
    VALUES (COALESCE($1, gen_random_uuid()::text), $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
    RETURNING message_id";

/// The transactional outbox: [`Outbox::enqueue`] writes a message beside
/// your business rows, in your transaction; the [`Relay`](super::Relay)
/// publishes it once that transaction has committed.
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outbox;

impl Outbox {
    /// Writes `message` into the outbox in `tx` and returns its message id.
    ///
    /// Nothing is published now: the row becomes visible to the relay when
    /// `tx` commits, and disappears with `tx` if it rolls back — the message
    /// and your business rows are one atomic unit. A
    /// `deadpool_postgres::Transaction` derefs to the `tokio_postgres` one:
    /// pass `&tx` as it is. In a handler behind the
    /// [inbox](crate::inbox), enqueue on the inbox's transaction instead:
    /// [`InboxClient::enqueue`](crate::inbox::InboxClient::enqueue).
    ///
    /// ```no_run
    /// # async fn f(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use acemq::outbox::{Outbox, OutboxMessage};
    ///
    /// let tx = client.transaction().await?;
    /// tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&"o-1"]).await?;
    /// let id = Outbox::enqueue(
    ///     &tx,
    ///     &OutboxMessage::new("shop", "order.created", r#"{"id":"o-1"}"#)
    ///         .content_type("application/json")
    ///         .message_id("order-o-1-created"),
    /// )
    /// .await?;
    /// tx.commit().await?; // now the relay publishes it, with message id `id`
    /// # let _ = id; Ok(()) }
    /// ```
    pub async fn enqueue(
        tx: &Transaction<'_>,
        message: &OutboxMessage,
    ) -> Result<String, OutboxError> {
        insert(tx, message).await
    }
}

/// Writes `message` into the outbox on `client` (a transaction, or the
/// connection of the inbox's open transaction) and returns its message id.
pub(crate) async fn insert<C: GenericClient>(
    client: &C,
    message: &OutboxMessage,
) -> Result<String, OutboxError> {
    let p = &message.properties;
    let headers = encode_headers(&message.headers);
    let priority = p.priority.map(i16::from);
    let delivery_mode = i16::from(p.delivery_mode.unwrap_or(2));
    let body: &[u8] = &message.body;
    let params: [&(dyn ToSql + Sync); 14] = [
        &p.message_id,
        &message.exchange,
        &message.routing_key,
        &body,
        &headers,
        &p.content_type,
        &p.content_encoding,
        &p.correlation_id,
        &p.reply_to,
        &p.expiration,
        &priority,
        &p.kind,
        &p.app_id,
        &delivery_mode,
    ];
    let row = client
        .query_one(INSERT, &params)
        .await
        .map_err(|source| OutboxError::Database {
            doing: "writing a message into acemq_outbox (did you run acemq::outbox::migrate?)",
            source,
        })?;
    Ok(row.get(0))
}

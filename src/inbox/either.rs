//! One transaction type for a handler under either inbox: PostgreSQL in
//! production, memory in tests.

use std::sync::atomic::{AtomicU64, Ordering};

use acemq_layers::inbox::MemoryTransaction;
use acemq_layers::Delivery;
use tokio_postgres::types::ToSql;

use super::transaction::{NoTransaction, PgTransaction};
use crate::outbox::{OutboxError, OutboxMessage};

/// The inbox's transaction, whichever store the inbox runs on: a
/// [`PgTransaction`] under [`PgInbox`](super::PgInbox), a
/// [`MemoryTransaction`] under
/// [`MemoryInbox`](acemq_layers::inbox::MemoryInbox). Write the handler
/// against it and the same code runs in production and in a test without
/// PostgreSQL.
///
/// Under `MemoryInbox`, [`execute`](Self::execute) and
/// [`enqueue`](Self::enqueue) run nothing: each records one line (the
/// statement and its parameters; the message's destination and id), which
/// the store's
/// [`committed_writes`](acemq_layers::inbox::MemoryInbox::committed_writes)
/// shows once the layer committed, and never if it rolled back. A handler
/// that reads (`query`) needs the database: [`pg`](Self::pg).
///
/// ```
/// use acemq::inbox::InboxTransaction;
/// use acemq::outbox::OutboxMessage;
/// use acemq::{BoxError, Delivery};
///
/// async fn ship(d: Delivery) -> Result<(), BoxError> {
///     let tx = InboxTransaction::of(&d)?;
///     tx.execute("INSERT INTO shipments (order_id) VALUES ($1)", &[&"o-1"])
///         .await?;
///     tx.enqueue(&OutboxMessage::to_queue("shipped", "o-1").message_id("o-1-shipped"))
///         .await?;
///     Ok(())
/// }
/// # let _ = ship;
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum InboxTransaction {
    /// Under [`PgInbox`](super::PgInbox).
    Pg(PgTransaction),
    /// Under [`MemoryInbox`](acemq_layers::inbox::MemoryInbox).
    Memory(MemoryTransaction),
}

impl InboxTransaction {
    /// The transaction of `delivery`, put there by the inbox layer on
    /// either store.
    pub fn of(delivery: &Delivery) -> Result<InboxTransaction, NoTransaction> {
        if let Some(tx) = delivery.extensions().get::<PgTransaction>() {
            return Ok(InboxTransaction::Pg(tx.clone()));
        }
        delivery
            .extensions()
            .get::<MemoryTransaction>()
            .map(|tx| InboxTransaction::Memory(tx.clone()))
            .ok_or_else(NoTransaction::new)
    }

    /// Runs `statement` in the transaction (`InboxClient::execute`) and
    /// returns the rows it changed; under `MemoryInbox`, records it and
    /// returns 1.
    pub async fn execute(
        &self,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        match self {
            InboxTransaction::Pg(tx) => tx.client().await.execute(statement, params).await,
            InboxTransaction::Memory(tx) => {
                tx.record(format!("{statement} {params:?}"));
                Ok(1)
            }
        }
    }

    /// Writes `message` into the outbox in the transaction
    /// (`InboxClient::enqueue`) and returns its message id; under
    /// `MemoryInbox`, records `enqueue EXCHANGE ROUTING_KEY ID` (an id made
    /// up when the message has none).
    pub async fn enqueue(&self, message: &OutboxMessage) -> Result<String, OutboxError> {
        match self {
            InboxTransaction::Pg(tx) => tx.client().await.enqueue(message).await,
            InboxTransaction::Memory(tx) => {
                static NEXT: AtomicU64 = AtomicU64::new(1);
                let id =
                    message.properties.message_id.clone().unwrap_or_else(|| {
                        format!("memory-{}", NEXT.fetch_add(1, Ordering::Relaxed))
                    });
                tx.record(format!(
                    "enqueue {:?} {:?} {id}",
                    message.exchange, message.routing_key
                ));
                Ok(id)
            }
        }
    }

    /// The PostgreSQL transaction, for what only a database does
    /// (queries); `None` under `MemoryInbox`.
    pub fn pg(&self) -> Option<&PgTransaction> {
        match self {
            InboxTransaction::Pg(tx) => Some(tx),
            InboxTransaction::Memory(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use acemq_layers::inbox::{InboxLayer, InboxOutcome, MemoryInbox};
    use acemq_layers::{BoxError, Delivery, Properties};
    use tower::{Layer, Service, ServiceExt};

    use super::InboxTransaction;
    use crate::outbox::OutboxMessage;

    async fn ship(d: Delivery) -> Result<(), BoxError> {
        let tx = InboxTransaction::of(&d)?;
        let order = String::from_utf8_lossy(d.body()).into_owned();
        tx.execute("INSERT INTO shipments (order_id) VALUES ($1)", &[&order])
            .await?;
        tx.enqueue(
            &OutboxMessage::to_queue("shipped", order.clone())
                .message_id(format!("{order}-shipped")),
        )
        .await?;
        if order == "fail" {
            return Err("failed after the writes".into());
        }
        Ok(())
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_handler_on_the_inbox_transaction_runs_under_the_memory_inbox() {
        let store = MemoryInbox::new();
        let mut svc = InboxLayer::new(store.clone()).layer(tower::service_fn(ship));
        let mut outcomes = Vec::new();
        for (id, body) in [("m1", "o-1"), ("m1", "o-1"), ("m2", "fail")] {
            let mut props = Properties::default();
            props.message_id = Some(id.into());
            let d = Delivery::builder()
                .queue("orders")
                .body(body)
                .properties(props)
                .build();
            outcomes.push(svc.ready().await.unwrap().call(d).await.ok());
        }
        assert_eq!(
            outcomes,
            [
                Some(InboxOutcome::Handled(())),
                Some(InboxOutcome::Duplicate),
                None
            ]
        );
        assert_eq!(
            store.committed_writes(),
            [
                r#"INSERT INTO shipments (order_id) VALUES ($1) ["o-1"]"#,
                r#"enqueue "" "shipped" o-1-shipped"#,
            ]
        );
        let bare = Delivery::builder().build();
        let e = InboxTransaction::of(&bare).unwrap_err();
        assert!(e.to_string().contains("InboxLayer"), "{e}");
    }
}

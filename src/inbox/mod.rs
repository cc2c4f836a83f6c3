//! The inbox's PostgreSQL store (feature `postgres`): the "processed" mark
//! is written in the same transaction as the handler's own work.
//!
//! [`PgInbox`] is an [`InboxStore`](acemq_layers::inbox::InboxStore) for
//! [`InboxLayer`](acemq_layers::inbox::InboxLayer). For each delivery with a
//! message id it takes a connection from the pool, opens a transaction and
//! inserts `(queue, message_id)` into `acemq_inbox` with `ON CONFLICT DO
//! NOTHING` (one round trip: `BEGIN`, the insert and `pg_current_xact_id()`
//! are pipelined). No row inserted means the key was committed before: the
//! delivery is a duplicate and the handler is skipped. Otherwise the handler finds a
//! [`PgTransaction`] in the delivery's extensions and does its writes
//! through it; the layer commits after `Ok` and before the ack.
//!
//! # Guarantees
//!
//! - Work and mark commit together or not at all: a crash before the
//!   commit loses both (the broker redelivers; the work is done then); a
//!   crash after the commit and before the ack leaves the mark (the
//!   redelivery is skipped and acknowledged). The work is committed once.
//! - Two deliveries of one key at the same moment (two consumers of one
//!   queue): the second insert waits on the first's row lock, then sees the
//!   first's commit (duplicate) or its rollback (and does the work).
//! - Only writes through the [`PgTransaction`] get this guarantee. An HTTP
//!   call or a publish from the handler is at-least-once still (publish
//!   through the [outbox](crate::outbox) in the same transaction instead:
//!   [`InboxClient::enqueue`] — see `examples/outbox.rs`).
//! - The handler cannot end the transaction: [`InboxClient`] has statement
//!   methods and no `transaction()`. A `COMMIT` or `ROLLBACK` sent as a
//!   statement is found before the commit (the transaction's id, recorded at
//!   `BEGIN`, is compared with the open one's): the delivery is dead-lettered
//!   at once with reason `transaction-ended`, and a mark committed early is
//!   removed so that a replay is handled.
//! - Marks older than what you keep are deleted by [`PgInbox::expire`] (or
//!   [`PgInbox::spawn_expiry`]); a duplicate arriving after that is handled
//!   again.
//!
//! The tables come from [`outbox::migrate`](crate::outbox::migrate).
//!
//! A handler written against [`InboxTransaction`] instead runs under
//! either store: through PostgreSQL under `PgInbox`, and under
//! [`MemoryInbox`](acemq_layers::inbox::MemoryInbox) in a test without a
//! database, where its writes are recorded and kept at commit only.
//!
//! ```no_run
//! use acemq::inbox::{PgInbox, PgTransaction};
//! use acemq::layers::inbox::InboxLayer;
//! use acemq::outbox::OutboxMessage;
//! use acemq::{BoxError, Delivery};
//! use tower::ServiceBuilder;
//!
//! # fn f(pool: deadpool_postgres::Pool) {
//! let handler = ServiceBuilder::new()
//!     .layer(InboxLayer::new(PgInbox::new(pool)))
//!     .service_fn(|d: Delivery| async move {
//!         let tx = PgTransaction::of(&d)?;
//!         let client = tx.client().await;
//!         client
//!             .execute("INSERT INTO shipments (order_id) VALUES ($1)", &[&"o-1"])
//!             .await?;
//!         // A follow-up, published by the relay once this commits:
//!         client
//!             .enqueue(&OutboxMessage::to_queue("shipped", "o-1").message_id("o-1-shipped"))
//!             .await?;
//!         Ok::<_, BoxError>(())
//!     });
//! # let _ = handler; }
//! ```

mod client;
mod either;
mod store;
mod transaction;

pub use client::InboxClient;
pub use either::InboxTransaction;
pub use store::PgInbox;
pub use transaction::{NoTransaction, PgTransaction};

//! The inbox: an idempotent consumer that does a message's work once per
//! queue, however often the broker delivers it.
//!
//! At-least-once delivery means duplicates: a consumer killed after its
//! work but before its ack gets the message again, and a publisher (the
//! outbox relay) killed after its publish but before it marked the row
//! sent publishes it again, with the same message id. [`InboxLayer`] keys
//! each delivery by (queue, [message id](crate::Properties::message_id))
//! — per queue, so a fanout to several queues is handled once on each —
//! and skips a key it has processed. A key of your own, a function of the
//! delivery (its body included), replaces the message id:
//! [`InboxLayer::key_fn`].
//!
//! # Semantics
//!
//! For each delivery the layer asks its [`InboxStore`] to
//! [`begin`](InboxStore::begin): open a unit of work (a database
//! transaction) and write the "processed" mark into it.
//!
//! - The key was committed before: the handler is **not** called; the
//!   response is [`InboxOutcome::Duplicate`] (so the delivery is
//!   acknowledged), counted in `acemq.inbox.duplicates` {queue} and in
//!   [`duplicates`] (the runner's health snapshot and `/queues` show it),
//!   and logged at DEBUG with the queue and the message id.
//! - Otherwise the transaction is put in the delivery's extensions
//!   (`delivery.extensions().get::<St::Transaction>()`) and the handler is
//!   called. The handler does its own writes **in that transaction**.
//!   `Ok` → the layer commits (work and mark together), then answers
//!   [`InboxOutcome::Handled`]; the ack follows. `Err` (or a panic, or the
//!   future dropped) → the transaction is dropped uncommitted: work and mark
//!   roll back together and the error goes on to the retry layer.
//! - A crash before the commit loses the work and the mark: the broker
//!   redelivers and the work is done (once). A crash after the commit and
//!   before the ack: the broker redelivers, the mark is there, the handler
//!   is skipped. Either way the work is committed exactly once — provided
//!   the handler writes only through the transaction it is given (a side
//!   effect outside it, such as an HTTP call, is at-least-once still).
//! - A delivery without a key (no message id, or `key_fn` said `None`) is
//!   handled with a warning and counted in `acemq.inbox.missing_id`
//!   {queue} ([`MissingId::Handle`], the default: it still gets a
//!   transaction, but no mark), or refused with a
//!   [`Reject`](crate::Reject)ed [`MissingMessageId`]
//!   ([`MissingId::Reject`]), which the dead-letter layer dead-letters.
//!
//!   **What `MissingId::Handle` costs:** such a delivery is *at least
//!   once*, not exactly once — a redelivery of it (a crash before the ack,
//!   a publisher's retry) runs the handler and commits its work again. The
//!   first inbox built with it says so once in a warning at start. Where
//!   every message must be handled once, use [`MissingId::Reject`] (and a
//!   dead-letter queue), and give every message a key: a message id on
//!   every publish, or [`InboxLayer::key_fn`].
//! - A store error (the database unreachable) is the delivery's error: the
//!   retry layer judges it like any transient failure.
//! - A handler that ends the transaction itself (a `COMMIT` or `ROLLBACK`
//!   statement on it) breaks the guarantee: a store that can tell (the
//!   PostgreSQL one does) fails the commit with [`TransactionEnded`], and
//!   the delivery is dead-lettered at once with reason `transaction-ended`.
//!
//! Marks are kept until the store expires them; a duplicate that arrives
//! after its mark expired is handled again. Keep marks longer than any
//! redelivery can take (hours to days, not seconds).
//!
//! # Order
//!
//! Put it around your handler, inside the acemq stack (so under the
//! cancellation layer): each retry attempt opens a fresh transaction.
//!
//! # Example
//!
//! [`MemoryInbox`] keeps its marks in memory (tests); the `acemq` crate's
//! `postgres` feature has the PostgreSQL store whose transaction the handler
//! writes into.
//!
//! ```
//! use acemq_layers::inbox::{InboxLayer, InboxOutcome, MemoryInbox, MemoryTransaction};
//! use acemq_layers::{Delivery, Properties};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryInbox::new();
//! let mut svc = ServiceBuilder::new()
//!     .layer(InboxLayer::new(store.clone()))
//!     .service_fn(|d: Delivery| async move {
//!         // Do the work in this transaction (a database one with postgres).
//!         let _tx = d.extensions().get::<MemoryTransaction>().expect("the inbox's transaction");
//!         Ok::<_, std::io::Error>(())
//!     });
//! let mut props = Properties::default();
//! props.message_id = Some("order-1".into());
//! let d = Delivery::builder().queue("orders").properties(props).build();
//! let first = svc.ready().await.unwrap().call(d.clone()).await.unwrap();
//! let again = svc.ready().await.unwrap().call(d).await.unwrap();
//! assert!(matches!(first, InboxOutcome::Handled(())));
//! assert!(matches!(again, InboxOutcome::Duplicate));
//! # }
//! ```

mod count;
mod error;
pub mod future;
mod layer;
mod service;
mod store;

pub use count::duplicates;
pub use error::{MissingMessageId, TransactionEnded};
pub use layer::{InboxKey, InboxLayer};
pub use service::Inbox;
pub use store::{Begun, InboxStore, MemoryInbox, MemoryTransaction};

/// What the inbox does with a delivery that has no key: no message id, or
/// [`InboxLayer::key_fn`]'s function said `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingId {
    /// Handle it (in a transaction, with no mark) and log a warning: a
    /// duplicate of it cannot be recognised, so its work is done, and
    /// committed, once per delivery — at least once, not exactly once. The
    /// default; the first inbox built with it warns once at start.
    #[default]
    Handle,
    /// Refuse it with a permanent error ([`MissingMessageId`] in a
    /// [`Reject`](crate::Reject)): dead-lettered, or dropped without a
    /// dead-letter queue.
    Reject,
}

/// The inbox's response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InboxOutcome<R> {
    /// The handler ran and its transaction is committed.
    Handled(R),
    /// The key was processed before; the handler was not called.
    Duplicate,
}

// Not in the model-checking build: these run on tokio and std, outside loom.
#[cfg(all(test, not(acemq_loom)))]
mod tests;

//! The transactional outbox on PostgreSQL (feature `postgres`): a publish
//! that survives a restart.
//!
//! Publishing from a handler or an HTTP request after the database commit
//! loses the message if the process dies in between; publishing before it
//! sends a message about a change that may roll back. The outbox writes the
//! message **into the database, in your transaction**, beside your business
//! rows ([`Outbox::enqueue`]); the commit makes both durable or neither. A
//! [`Relay`] then publishes committed rows with publisher confirms and marks
//! them sent.
//!
//! # Guarantees
//!
//! - A committed message is published at least once, whatever crashes or
//!   outages happen in between (broker down, database down, the process
//!   killed); a rolled-back one never.
//! - Each message carries a message id (yours, or a UUID): the rare
//!   duplicate — the relay killed after the broker confirmed and before it
//!   marked the row — is recognisable, and the consumer's
//!   [inbox](crate::inbox) skips it. The relay overlaps its database work
//!   with publishing (while one batch publishes, the one before marks and
//!   the one after has claimed its rows; [`RelayStats::in_flight`]), and a
//!   batch publishes only once the batch two before it has ended: a relay
//!   killed mid-way publishes at most two batches a second time.
//! - Several relays (several instances) share one table: each batch claims
//!   its rows with `FOR UPDATE SKIP LOCKED`, so without a crash no row is
//!   published twice.
//! - A row the broker returns as unroutable is marked `failed` with the
//!   reason, counted in `acemq.outbox.failed`, and never retried; confirmed
//!   rows count in `acemq.outbox.published`. On a transport or database
//!   failure the rows stay pending and the relay backs off (capped,
//!   jittered): `acemq.outbox.transport_errors`, `acemq.outbox.database_errors`.
//! - Order: rows are claimed in id order and a batch is published all at
//!   once, so messages of one batch may be confirmed in any order, and two
//!   relays interleave. Do not rely on the order between messages.
//! - Sent rows are deleted after [`RelayConfig::retention`]; failed rows
//!   are kept for you to read (`SELECT * FROM acemq_outbox WHERE status =
//!   'failed'`).
//!
//! # Schema
//!
//! [`migrate`] applies the SQL files shipped in `migrations/` (the
//! `acemq_outbox` and `acemq_inbox` tables), once, under an advisory lock.
//! Run it at start, or apply the files with your own migration tool.
//!
//! # Why tokio-postgres
//!
//! acemq uses tokio-postgres with deadpool-postgres for the pool: small,
//! no macros and no compile-time database, on tokio like the rest of the
//! crate; its `Transaction` is what you pass to [`Outbox::enqueue`] (a
//! deadpool transaction derefs to it). sqlx would bring its own runtime
//! glue, macros and a much larger dependency tree for what is here a dozen
//! fixed statements. Connections are plain TCP (`NoTls`).
//!
//! # Lifecycle
//!
//! With an [`App`](crate::App), give the relay to the runner:
//! [`App::outbox`](crate::App::outbox) starts it once the topology is
//! declared and stops it before the consumers drain. In a handler behind the
//! [inbox](crate::inbox), enqueue on the inbox's transaction
//! ([`InboxClient::enqueue`](crate::inbox::InboxClient::enqueue)): the
//! message commits with the handler's work and the inbox's mark.
//!
//! Without an `App`, start the relay after the topology is declared; once
//! the code that enqueues has stopped (the consumers drained),
//! [`RelayHandle::finish`] publishes what was committed and stops;
//! [`RelayHandle::stop`] stops at once: it lets the batch publishing finish,
//! releases the one claimed behind it, and leaves what it did not mark
//! pending for the next start — nothing is lost either way.
//!
//! ```no_run
//! use acemq::outbox::{self, Outbox, OutboxMessage, Relay, StandalonePublisher};
//!
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = outbox::pool("host=127.0.0.1 user=postgres dbname=shop", 8)?;
//! outbox::migrate(&*pool.get().await?).await?;
//! let relay = Relay::new(
//!     pool.clone(),
//!     StandalonePublisher::new("amqp://guest:guest@127.0.0.1:5672/%2f", "shop-relay"),
//! )
//! .spawn();
//!
//! let mut client = pool.get().await?;
//! let tx = client.transaction().await?;
//! tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&"o-1"]).await?;
//! Outbox::enqueue(&tx, &OutboxMessage::new("shop", "order.created", "o-1")).await?;
//! tx.commit().await?;
//!
//! relay.finish().await; // publishes what was committed, then stops
//! # Ok(()) }
//! ```

mod batch;
pub(crate) mod enqueue;
pub(crate) mod error;
mod message;
mod pool;
mod publish;
mod relay;
mod schema;
mod sslmode;
mod stats;
#[cfg(feature = "tls")]
mod tls;

pub use enqueue::Outbox;
pub use error::OutboxError;
pub use message::{OutboxMessage, OutboxRecord};
pub use pool::pool;
pub use publish::{OutboxPublish, StandalonePublisher};
pub use relay::{Relay, RelayConfig, RelayHandle};
pub use schema::migrate;
pub use stats::RelayStats;

/// The connection pool acemq is built on.
pub use deadpool_postgres;
/// The PostgreSQL client acemq is built on (the same version: use it for
/// your own statements).
pub use tokio_postgres;

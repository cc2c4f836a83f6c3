//! [`OutboxError`]: why an outbox (or inbox store) operation failed.

/// Why an outbox (or inbox store) operation failed.
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// A statement failed.
    #[error("PostgreSQL error while {doing}: {source}")]
    Database {
        /// What was being done.
        doing: &'static str,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// No connection could be taken from the pool.
    #[error("no PostgreSQL connection from the pool: {message}")]
    Pool {
        /// The pool's error.
        message: String,
    },
    /// The handler ended the inbox's transaction itself (a `COMMIT` or
    /// `ROLLBACK` statement on it): found by the inbox's commit; the
    /// delivery is dead-lettered at once with reason `transaction-ended`.
    #[error("{0}")]
    TransactionEnded(#[source] acemq_layers::inbox::TransactionEnded),
    /// The connection settings could not be read.
    #[error("bad PostgreSQL connection settings: {message} (expected e.g. \"host=127.0.0.1 user=postgres dbname=app\" or \"postgresql://user@host/db\")")]
    Config {
        /// What was wrong.
        message: String,
    },
}

/// Maps a driver error to [`OutboxError::Database`], saying what was being
/// done.
pub(crate) fn db(doing: &'static str) -> impl FnOnce(tokio_postgres::Error) -> OutboxError {
    move |source| OutboxError::Database { doing, source }
}

//! [`InboxClient`]: the handler's way into the inbox's transaction.

use std::fmt;

use deadpool_postgres::ClientWrapper;
use tokio::sync::MappedMutexGuard;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row, SimpleQueryMessage, Statement, ToStatement};

use crate::outbox::{OutboxError, OutboxMessage};

/// The connection of the inbox's open transaction, lent to the handler by
/// [`PgTransaction::client`](super::PgTransaction::client): statements run
/// inside the transaction that holds the inbox's mark, and commit with it.
///
/// It has the statement methods of a client (`query`, `query_one`,
/// `query_opt`, `execute`, `prepare`, `prepare_cached`, `batch_execute`,
/// `simple_query`) and [`enqueue`](Self::enqueue) for the outbox, and
/// nothing that opens or ends a transaction: no `transaction()`, no mutable
/// access to the client. The inbox layer commits after the handler returns
/// `Ok`. A `COMMIT` or `ROLLBACK` sent as a statement is found at that
/// commit, and the delivery is dead-lettered with reason
/// `transaction-ended`.
///
/// ```compile_fail
/// # async fn f(tx: acemq::inbox::PgTransaction) {
/// let mut client = tx.client().await;
/// let nested = client.transaction().await; // no such method
/// # }
/// ```
///
/// Held until dropped: other clones of the [`PgTransaction`](super::PgTransaction)
/// wait for it, so do not hold it across a call that needs the transaction
/// again through another guard.
pub struct InboxClient<'a> {
    client: MappedMutexGuard<'a, ClientWrapper>,
}

impl<'a> InboxClient<'a> {
    pub(super) fn new(client: MappedMutexGuard<'a, ClientWrapper>) -> Self {
        InboxClient { client }
    }

    /// Writes `message` into the outbox in the inbox's transaction and
    /// returns its message id: it is published (by the relay,
    /// [`App::outbox`](crate::App::outbox)) only if the handler's work and
    /// the inbox mark commit, and never if they roll back.
    pub async fn enqueue(&self, message: &OutboxMessage) -> Result<String, OutboxError> {
        crate::outbox::enqueue::insert(&**self.client, message).await
    }

    /// Like `tokio_postgres::Client::query`.
    pub async fn query<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client.query(statement, params).await
    }

    /// Like `tokio_postgres::Client::query_one`.
    pub async fn query_one<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client.query_one(statement, params).await
    }

    /// Like `tokio_postgres::Client::query_opt`.
    pub async fn query_opt<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client.query_opt(statement, params).await
    }

    /// Like `tokio_postgres::Client::execute`.
    pub async fn execute<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client.execute(statement, params).await
    }

    /// Like `tokio_postgres::Client::prepare`.
    pub async fn prepare(&self, query: &str) -> Result<Statement, Error> {
        self.client.prepare(query).await
    }

    /// Like `tokio_postgres::Client::prepare_typed`.
    pub async fn prepare_typed(&self, query: &str, types: &[Type]) -> Result<Statement, Error> {
        self.client.prepare_typed(query, types).await
    }

    /// Like `deadpool_postgres::ClientWrapper::prepare_cached`: a statement
    /// prepared once per pooled connection.
    pub async fn prepare_cached(&self, query: &str) -> Result<Statement, Error> {
        self.client.prepare_cached(query).await
    }

    /// Like `tokio_postgres::Client::batch_execute`: statements without
    /// parameters, in the simple query protocol.
    pub async fn batch_execute(&self, query: &str) -> Result<(), Error> {
        self.client.batch_execute(query).await
    }

    /// Like `tokio_postgres::Client::simple_query`.
    pub async fn simple_query(&self, query: &str) -> Result<Vec<SimpleQueryMessage>, Error> {
        self.client.simple_query(query).await
    }
}

impl fmt::Debug for InboxClient<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxClient").finish_non_exhaustive()
    }
}

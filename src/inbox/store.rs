//! [`PgInbox`]: the inbox's marks in `acemq_inbox`.

use std::fmt;
use std::time::Duration;

use acemq_layers::inbox::{Begun, InboxStore, TransactionEnded};
use deadpool_postgres::Pool;
use futures::future::BoxFuture;

use super::transaction::{Committed, PgTransaction};
use crate::outbox::error::{db, OutboxError};

const MARK: &str =
    "INSERT INTO acemq_inbox (queue, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING";

/// The inbox's PostgreSQL store; see the [module docs](super).
///
/// Example: the [module docs](crate::inbox); runnable: `examples/outbox.rs`.
#[derive(Clone)]
pub struct PgInbox {
    pool: Pool,
}

impl fmt::Debug for PgInbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgInbox")
            .field("pool", &self.pool.status())
            .finish()
    }
}

impl PgInbox {
    /// A store on `pool`: each delivery in flight holds one of its
    /// connections, so size the pool for the consumers' concurrency.
    pub fn new(pool: Pool) -> Self {
        PgInbox { pool }
    }

    /// Deletes marks processed more than `keep` ago; returns how many.
    /// A duplicate arriving after its mark is gone is handled again: keep
    /// marks longer than a redelivery can take.
    pub async fn expire(&self, keep: Duration) -> Result<u64, OutboxError> {
        let client = self.pool.get().await.map_err(|e| OutboxError::Pool {
            message: e.to_string(),
        })?;
        let n = client
            .execute(
                "DELETE FROM acemq_inbox WHERE processed_at < now() - make_interval(secs => $1)",
                &[&keep.as_secs_f64()],
            )
            .await
            .map_err(db("deleting expired inbox marks"))?;
        if n > 0 {
            metrics::counter!("acemq.inbox.expired").increment(n);
        }
        Ok(n)
    }

    /// Runs [`expire`](Self::expire) every `every` on the current runtime
    /// until the returned handle is dropped.
    pub fn spawn_expiry(
        &self,
        every: Duration,
        keep: Duration,
    ) -> tokio_util::task::AbortOnDropHandle<()> {
        let store = self.clone();
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                if let Err(e) = store.expire(keep).await {
                    tracing::warn!("inbox expiry failed, trying again later: {e}");
                }
            }
        }))
    }
}

impl InboxStore for PgInbox {
    type Transaction = PgTransaction;
    type Error = OutboxError;
    type BeginFuture = BoxFuture<'static, Result<Begun<PgTransaction>, OutboxError>>;
    type CommitFuture = BoxFuture<'static, Result<(), OutboxError>>;

    fn begin(&self, key: Option<(&str, &str)>) -> Self::BeginFuture {
        let pool = self.pool.clone();
        let key = key.map(|(q, id)| (q.to_owned(), id.to_owned()));
        Box::pin(async move {
            let client = pool.get().await.map_err(|e| OutboxError::Pool {
                message: e.to_string(),
            })?;
            let mark = match key {
                Some(_) => Some(client.prepare_cached(MARK).await.map_err(db(
                    "preparing the inbox mark (did you run acemq::outbox::migrate?)",
                ))?),
                None => None,
            };
            // Pipelined: BEGIN, the mark (with a key) and the transaction's
            // id in one round trip.
            let insert = async {
                match (&mark, &key) {
                    (Some(mark), Some((queue, id))) => client.execute(mark, &[queue, id]).await,
                    _ => Ok(1),
                }
            };
            let (begun, inserted, xid) = futures::future::join3(
                client.batch_execute("BEGIN"),
                insert,
                client.simple_query(XID),
            )
            .await;
            let opened = begun.and(xid).map_err(db("opening the inbox transaction"));
            let inserted = inserted.map_err(db("writing the inbox mark"));
            let xid = match opened.map(|rows| parse_xid(&rows)) {
                Ok(Some(xid)) => xid,
                Ok(None) => {
                    // Not a transaction id: this connection cannot be trusted.
                    drop(deadpool_postgres::Object::take(client));
                    return Err(OutboxError::Pool {
                        message: "pg_current_xact_id() answered no transaction id".to_owned(),
                    });
                }
                Err(e) => {
                    drop(PgTransaction::new(client, 0, None)); // rolls back
                    return Err(e);
                }
            };
            let duplicate = matches!(inserted, Ok(0));
            let tx = PgTransaction::new(client, xid, key);
            inserted?;
            if duplicate {
                // `tx` drops here: rolled back, connection back to the pool.
                return Ok(Begun::Duplicate);
            }
            Ok(Begun::Fresh(tx))
        })
    }

    fn commit(&self, transaction: PgTransaction) -> Self::CommitFuture {
        Box::pin(async move {
            let committed = transaction
                .commit()
                .await
                .map_err(db("committing the handler's work and the inbox mark"))?;
            match committed {
                Committed::Yes => Ok(()),
                Committed::Ended { mark_removed } => {
                    let key = transaction.key();
                    tracing::error!(
                        queue = key.map(|(q, _)| q),
                        message_id = key.map(|(_, id)| id),
                        mark_removed,
                        "the handler ended the inbox's transaction itself (a COMMIT or ROLLBACK \
                         statement): its work and the mark did not commit together; dead-lettering \
                         the delivery (a mark committed early is removed, so a replay is handled)"
                    );
                    Err(OutboxError::TransactionEnded(TransactionEnded::new(key)))
                }
            }
        })
    }
}

/// `pg_current_xact_id()` in the simple query protocol: its text form.
const XID: &str = "SELECT pg_current_xact_id()";

/// The transaction id in the answer to [`XID`].
fn parse_xid(messages: &[tokio_postgres::SimpleQueryMessage]) -> Option<u64> {
    messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0)?.parse().ok(),
        _ => None,
    })
}

//! [`PgInbox`]: the inbox's marks in `acemq_inbox`.

use std::fmt;
use std::time::Duration;

use acemq_layers::inbox::{Begun, InboxStore};
use deadpool_postgres::Pool;
use futures::future::BoxFuture;

use super::transaction::PgTransaction;
use crate::outbox::error::{db, OutboxError};

const MARK: &str =
    "INSERT INTO acemq_inbox (queue, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING";

/// The inbox's PostgreSQL store; see the [module docs](super).
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
            let Some((queue, id)) = key else {
                client
                    .batch_execute("BEGIN")
                    .await
                    .map_err(db("opening the inbox transaction"))?;
                return Ok(Begun::Fresh(PgTransaction::new(client)));
            };
            let mark = client.prepare_cached(MARK).await.map_err(db(
                "preparing the inbox mark (did you run acemq::outbox::migrate?)",
            ))?;
            // Pipelined: one round trip for both.
            let (begun, inserted) = futures::future::join(
                client.batch_execute("BEGIN"),
                client.execute(&mark, &[&queue, &id]),
            )
            .await;
            let tx = PgTransaction::new(client);
            begun.map_err(db("opening the inbox transaction"))?;
            let inserted = inserted.map_err(db("writing the inbox mark"))?;
            if inserted == 0 {
                // `tx` drops here: rolled back, connection back to the pool.
                return Ok(Begun::Duplicate);
            }
            Ok(Begun::Fresh(tx))
        })
    }

    fn commit(&self, transaction: PgTransaction) -> Self::CommitFuture {
        Box::pin(async move {
            transaction
                .commit()
                .await
                .map_err(db("committing the handler's work and the inbox mark"))
        })
    }
}

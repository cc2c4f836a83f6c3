//! One relay batch: claim committed rows, publish them with confirms, mark
//! them — its turn in the relay's pipeline — and the cleanup of sent rows.

use std::sync::atomic::Ordering;
use std::time::Duration;

use acemq_layers::PublishError;
use deadpool_postgres::Pool;
use tokio::sync::oneshot;
use tokio_postgres::Row;
use tokio_util::sync::CancellationToken;

use super::error::{db, OutboxError};
use super::message::{columns, OutboxRecord};
use super::publish::OutboxPublish;
use super::stats::Stats;

/// What a batch did.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Rows claimed.
    pub(crate) claimed: usize,
    /// Publishes that failed for a transport reason (rows left pending).
    pub(crate) transport_errors: usize,
    /// The first transport error, for the log.
    pub(crate) first_error: Option<String>,
    /// Rows released unpublished because the relay was stopping.
    pub(crate) released: usize,
}

/// Rows to mark failed, with the reason for each (kept in step for the
/// `unnest` of the update).
#[derive(Debug, Default)]
struct Failed {
    ids: Vec<i64>,
    why: Vec<String>,
}

impl Failed {
    fn push(&mut self, id: i64, why: String) {
        self.ids.push(id);
        self.why.push(why);
    }
}

/// A batch's place in the relay's pipeline (see `relay::PIPELINE`):
/// batches claim one after the other, publish one at a time, and a batch
/// publishes only once the batch two before it has ended — so at most two
/// batches are ever published and not yet marked.
#[derive(Debug)]
pub(crate) struct Turn {
    /// Told how many rows were claimed; dropped unsent when the batch ended
    /// before its claim (a database error).
    pub(crate) claimed: oneshot::Sender<usize>,
    /// Closes when the batch before has finished publishing.
    pub(crate) after: Option<oneshot::Receiver<()>>,
    /// Closes when the batch two before has ended (marked, or given up).
    pub(crate) two_back: Option<oneshot::Receiver<()>>,
    /// Dropped when this batch has finished publishing, or has ended
    /// without publishing: the next batch may publish.
    pub(crate) published: oneshot::Sender<()>,
    /// Dropped when this batch has ended.
    pub(crate) ended: oneshot::Sender<()>,
}

/// Rows claimed and not yet marked or released, counted in the stats while
/// the guard lives (a batch dropped mid-way, its transaction rolled back,
/// is uncounted too).
struct Holding<'a> {
    stats: &'a Stats,
    rows: u64,
}

impl<'a> Holding<'a> {
    fn new(stats: &'a Stats, rows: usize) -> Self {
        let rows = rows as u64;
        stats.in_flight.fetch_add(rows, Ordering::Relaxed);
        Holding { stats, rows }
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.stats.in_flight.fetch_sub(self.rows, Ordering::Relaxed);
    }
}

/// Claims up to `limit` pending rows (skipping those another relay or the
/// batches before hold), waits for its turn to publish, publishes them all at once on the confirm channel, marks the confirmed
/// ones sent and the returned ones failed, and commits. A row whose publish
/// failed otherwise is left pending; so is every row when the database
/// fails before the commit (they are published again: same message id),
/// and every row of a batch whose turn to publish came after `stop`
/// (released unpublished: its transaction rolls back).
pub(crate) async fn run<P: OutboxPublish>(
    pool: &Pool,
    publisher: &P,
    limit: i64,
    publish_timeout: Duration,
    stats: &Stats,
    stop: &CancellationToken,
    turn: Turn,
) -> Result<Batch, OutboxError> {
    let Turn {
        claimed,
        after,
        two_back,
        published,
        ended: _ended,
    } = turn;
    let (tx, rows) = Open::claim(pool, limit).await?;
    let _holding = Holding::new(stats, rows.len());
    let _ = claimed.send(rows.len());
    let mut batch = Batch {
        claimed: rows.len(),
        ..Batch::default()
    };
    if rows.is_empty() {
        return Ok(batch);
    }
    let (records, mut failed) = read_records(rows);
    // Nothing is ever sent on these: they close when their batch reaches
    // that point (or ends early).
    if let Some(after) = after {
        let _ = after.await;
    }
    if let Some(two_back) = two_back {
        let _ = two_back.await;
    }
    if stop.is_cancelled() {
        // Stopping, and nothing of this batch published: release its rows
        // (the transaction rolls back as it drops) for the next start.
        batch.released = batch.claimed;
        return Ok(batch);
    }
    let results = publish_all(publisher, &records, publish_timeout).await;
    drop(published);
    let Some(results) = results else {
        // Nothing is marked: every row stays pending (a confirm that
        // did arrive means a duplicate later, recognisable by its id).
        batch.transport_errors = records.len();
        batch.first_error = Some(format!(
            "no confirm within {publish_timeout:?}: the rows stay pending"
        ));
        return Ok(batch);
    };
    let sent_ids = sort_results(&records, results, &mut failed, &mut batch);
    tx.mark_and_commit(&sent_ids, &failed).await?;
    record_stats(stats, sent_ids.len() as u64, failed.ids.len() as u64);
    Ok(batch)
}

/// The claimed rows as records (each keeps its row: the body is published
/// from it in place); a row that cannot be read is to be marked failed with
/// the reason.
fn read_records(rows: Vec<Row>) -> (Vec<OutboxRecord>, Failed) {
    let mut records = Vec::with_capacity(rows.len());
    let mut failed = Failed::default();
    for row in rows {
        match OutboxRecord::from_row(row) {
            Ok(r) => records.push(r),
            Err((id, why)) => failed.push(id, why),
        }
    }
    (records, failed)
}

/// Publishes every record at once and waits for the confirms; `None` when
/// they did not all come within `publish_timeout`.
async fn publish_all<P: OutboxPublish>(
    publisher: &P,
    records: &[OutboxRecord],
    publish_timeout: Duration,
) -> Option<Vec<Result<(), PublishError>>> {
    let publishes = futures::future::join_all(records.iter().map(|r| publisher.publish(r)));
    tokio::time::timeout(publish_timeout, publishes).await.ok()
}

/// Sorts the publish results: returns the ids confirmed (to mark sent),
/// adds the unroutable ones to `failed`, and counts the transport errors in
/// `batch` (those rows stay pending).
fn sort_results(
    records: &[OutboxRecord],
    results: Vec<Result<(), PublishError>>,
    failed: &mut Failed,
    batch: &mut Batch,
) -> Vec<i64> {
    let mut sent_ids: Vec<i64> = Vec::with_capacity(records.len());
    for (record, result) in records.iter().zip(results) {
        match result {
            Ok(()) => sent_ids.push(record.id),
            Err(e @ PublishError::Unroutable { .. }) => {
                tracing::warn!(
                    message_id = record.message_id(),
                    exchange = %record.exchange,
                    routing_key = %record.routing_key,
                    "outbox message returned unroutable: marked failed, not retried ({e})"
                );
                failed.push(
                    record.id,
                    format!(
                        "unroutable: exchange {:?} has no binding for routing key {:?} (NO_ROUTE)",
                        record.exchange, record.routing_key
                    ),
                );
            }
            Err(e) => {
                batch.transport_errors += 1;
                if batch.first_error.is_none() {
                    batch.first_error = Some(e.to_string());
                }
            }
        }
    }
    sent_ids
}

/// Selects up to `limit` pending rows in id order, locking them and
/// skipping those another relay (or the batch before) holds.
const CLAIM: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM acemq_outbox WHERE status = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
);

const MARK_SENT: &str =
    "UPDATE acemq_outbox SET status = 'sent', sent_at = now() WHERE id = ANY($1)";

const MARK_FAILED: &str = "UPDATE acemq_outbox o SET status = 'failed', error = f.error \
     FROM unnest($1::bigint[], $2::text[]) AS f(id, error) WHERE o.id = f.id";

/// A batch's transaction on a pooled connection: begun with the claim and
/// committed with the marks, each one round trip (the statements are
/// prepared once per connection, and `BEGIN` with the claim, the marks with
/// `COMMIT`, are pipelined). Dropped uncommitted (nothing to mark, an
/// error, a stop, the relay's task ending), it rolls back before the
/// connection goes back to the pool: the rows it held are pending again.
struct Open {
    client: Option<deadpool_postgres::Object>,
}

impl Open {
    /// Opens the transaction and claims up to `limit` rows in it.
    async fn claim(pool: &Pool, limit: i64) -> Result<(Open, Vec<Row>), OutboxError> {
        let client = pool.get().await.map_err(|e| OutboxError::Pool {
            message: e.to_string(),
        })?;
        let claim = client.prepare_cached(CLAIM).await.map_err(db(
            "preparing the relay's claim (did you run acemq::outbox::migrate?)",
        ))?;
        let open = Open {
            client: Some(client),
        };
        let client = open.client();
        let (begun, rows) = futures::future::join(
            client.batch_execute("BEGIN"),
            client.query(&claim, &[&limit]),
        )
        .await;
        begun.map_err(db("opening the relay's transaction"))?;
        let rows = rows.map_err(db("claiming outbox rows"))?;
        Ok((open, rows))
    }

    fn client(&self) -> &deadpool_postgres::Object {
        self.client
            .as_ref()
            .expect("open until committed or dropped")
    }

    /// Marks the confirmed rows sent and the failed ones failed, with their
    /// reasons, and commits: together or not at all.
    async fn mark_and_commit(
        mut self,
        sent_ids: &[i64],
        failed: &Failed,
    ) -> Result<(), OutboxError> {
        let client = self.client();
        let sent = match sent_ids.is_empty() {
            true => None,
            false => Some(
                client
                    .prepare_cached(MARK_SENT)
                    .await
                    .map_err(db("preparing the relay's marks"))?,
            ),
        };
        let failing = match failed.ids.is_empty() {
            true => None,
            false => Some(
                client
                    .prepare_cached(MARK_FAILED)
                    .await
                    .map_err(db("preparing the relay's marks"))?,
            ),
        };
        let (sent, failing, committed) = futures::future::join3(
            async {
                match &sent {
                    Some(s) => client.execute(s, &[&sent_ids]).await.map(drop),
                    None => Ok(()),
                }
            },
            async {
                match &failing {
                    Some(s) => client
                        .execute(s, &[&failed.ids, &failed.why])
                        .await
                        .map(drop),
                    None => Ok(()),
                }
            },
            // After a failed mark the transaction is aborted: this COMMIT
            // then rolls it back, and the error above is what is reported.
            client.batch_execute("COMMIT"),
        )
        .await;
        sent.map_err(db("marking outbox rows sent"))?;
        failing.map_err(db("marking outbox rows failed"))?;
        committed.map_err(db("committing the relay's marks"))?;
        // Committed: the connection goes back to the pool as it is.
        self.client = None;
        Ok(())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        // Roll back before the connection goes back to the pool; without a
        // runtime, or if that fails, close it (the server rolls back).
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if client.batch_execute("ROLLBACK").await.is_err() {
                        drop(deadpool_postgres::Object::take(client));
                    }
                });
            }
            Err(_) => drop(deadpool_postgres::Object::take(client)),
        }
    }
}

/// Counts a committed batch's rows in the relay's stats and the metrics.
fn record_stats(stats: &Stats, sent: u64, failed: u64) {
    stats.published.fetch_add(sent, Ordering::Relaxed);
    stats.failed.fetch_add(failed, Ordering::Relaxed);
    metrics::counter!("acemq.outbox.published").increment(sent);
    if failed > 0 {
        metrics::counter!("acemq.outbox.failed").increment(failed);
    }
}

/// Deletes sent rows older than `retention`, a chunk at a time. Failed
/// rows are kept for an operator to read (and delete).
pub(crate) async fn cleanup(pool: &Pool, retention: Duration) -> Result<u64, OutboxError> {
    let client = pool.get().await.map_err(|e| OutboxError::Pool {
        message: e.to_string(),
    })?;
    let secs = retention.as_secs_f64();
    let mut total = 0;
    loop {
        let n = client
            .execute(
                "DELETE FROM acemq_outbox WHERE id IN (SELECT id FROM acemq_outbox \
                 WHERE status = 'sent' AND sent_at < now() - make_interval(secs => $1) \
                 LIMIT 10000)",
                &[&secs],
            )
            .await
            .map_err(db("deleting sent outbox rows"))?;
        total += n;
        if n < 10_000 {
            break;
        }
    }
    if total > 0 {
        metrics::counter!("acemq.outbox.cleaned").increment(total);
    }
    Ok(total)
}

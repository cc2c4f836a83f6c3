//! One relay batch: claim committed rows, publish them with confirms, mark
//! them — and the cleanup of sent rows.

use std::sync::atomic::Ordering;
use std::time::Duration;

use acemq_layers::PublishError;
use deadpool_postgres::{Pool, Transaction};
use tokio_postgres::Row;

use super::error::{db, OutboxError};
use super::message::{OutboxRecord, COLUMNS};
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

/// Claims up to `limit` pending rows (skipping those another relay holds),
/// publishes them all at once on the confirm channel, marks the confirmed
/// ones sent and the returned ones failed, and commits. A row whose publish
/// failed otherwise is left pending; so is every row when the database
/// fails before the commit (they are published again: same message id).
pub(crate) async fn run<P: OutboxPublish>(
    pool: &Pool,
    publisher: &P,
    limit: i64,
    publish_timeout: Duration,
    stats: &Stats,
) -> Result<Batch, OutboxError> {
    let mut client = pool.get().await.map_err(|e| OutboxError::Pool {
        message: e.to_string(),
    })?;
    let tx = client
        .transaction()
        .await
        .map_err(db("opening the relay's transaction"))?;
    let rows = claim(&tx, limit).await?;
    let mut batch = Batch {
        claimed: rows.len(),
        ..Batch::default()
    };
    if rows.is_empty() {
        return Ok(batch);
    }
    let (records, mut failed) = read_records(&rows);
    let Some(results) = publish_all(publisher, &records, publish_timeout).await else {
        // Nothing is marked: every row stays pending (a confirm that
        // did arrive means a duplicate later, recognisable by its id).
        batch.transport_errors = records.len();
        batch.first_error = Some(format!(
            "no confirm within {publish_timeout:?}: the rows stay pending"
        ));
        return Ok(batch);
    };
    let sent_ids = sort_results(&records, results, &mut failed, &mut batch);
    mark(&tx, &sent_ids, &failed).await?;
    tx.commit()
        .await
        .map_err(db("committing the relay's marks"))?;
    record_stats(stats, sent_ids.len() as u64, failed.ids.len() as u64);
    Ok(batch)
}

/// Selects up to `limit` pending rows in id order, locking them and
/// skipping those another relay holds.
async fn claim(tx: &Transaction<'_>, limit: i64) -> Result<Vec<Row>, OutboxError> {
    let claim = format!(
        "SELECT {COLUMNS} FROM acemq_outbox WHERE status = 'pending' \
         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
    );
    tx.query(&claim, &[&limit])
        .await
        .map_err(db("claiming outbox rows"))
}

/// The claimed rows as records; a row that cannot be read is to be marked
/// failed with the reason.
fn read_records(rows: &[Row]) -> (Vec<OutboxRecord>, Failed) {
    let mut records = Vec::with_capacity(rows.len());
    let mut failed = Failed::default();
    for row in rows {
        match OutboxRecord::from_row(row) {
            Ok(r) => records.push(r),
            Err(why) => failed.push(row.get(0), why),
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

/// Marks the confirmed rows sent and the failed ones failed, with their
/// reasons (in the relay's transaction: committed together).
async fn mark(tx: &Transaction<'_>, sent_ids: &[i64], failed: &Failed) -> Result<(), OutboxError> {
    if !sent_ids.is_empty() {
        tx.execute(
            "UPDATE acemq_outbox SET status = 'sent', sent_at = now() WHERE id = ANY($1)",
            &[&sent_ids],
        )
        .await
        .map_err(db("marking outbox rows sent"))?;
    }
    if !failed.ids.is_empty() {
        tx.execute(
            "UPDATE acemq_outbox o SET status = 'failed', error = f.error \
             FROM unnest($1::bigint[], $2::text[]) AS f(id, error) WHERE o.id = f.id",
            &[&failed.ids, &failed.why],
        )
        .await
        .map_err(db("marking outbox rows failed"))?;
    }
    Ok(())
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

//! One relay batch: claim committed rows, publish them with confirms, mark
//! them — and the cleanup of sent rows.

use std::sync::atomic::Ordering;
use std::time::Duration;

use acemq_layers::PublishError;
use deadpool_postgres::Pool;

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
    let claim = format!(
        "SELECT {COLUMNS} FROM acemq_outbox WHERE status = 'pending' \
         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
    );
    let rows = tx
        .query(&claim, &[&limit])
        .await
        .map_err(db("claiming outbox rows"))?;
    let mut batch = Batch {
        claimed: rows.len(),
        ..Batch::default()
    };
    if rows.is_empty() {
        return Ok(batch);
    }
    let mut records = Vec::with_capacity(rows.len());
    let mut failed_ids: Vec<i64> = Vec::new();
    let mut failed_why: Vec<String> = Vec::new();
    for row in &rows {
        match OutboxRecord::from_row(row) {
            Ok(r) => records.push(r),
            Err(why) => {
                failed_ids.push(row.get(0));
                failed_why.push(why);
            }
        }
    }
    let publishes = futures::future::join_all(records.iter().map(|r| publisher.publish(r)));
    let results = match tokio::time::timeout(publish_timeout, publishes).await {
        Ok(results) => results,
        Err(_) => {
            // Nothing is marked: every row stays pending (a confirm that
            // did arrive means a duplicate later, recognisable by its id).
            batch.transport_errors = records.len();
            batch.first_error = Some(format!(
                "no confirm within {publish_timeout:?}: the rows stay pending"
            ));
            return Ok(batch);
        }
    };
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
                failed_ids.push(record.id);
                failed_why.push(format!(
                    "unroutable: exchange {:?} has no binding for routing key {:?} (NO_ROUTE)",
                    record.exchange, record.routing_key
                ));
            }
            Err(e) => {
                batch.transport_errors += 1;
                if batch.first_error.is_none() {
                    batch.first_error = Some(e.to_string());
                }
            }
        }
    }
    if !sent_ids.is_empty() {
        tx.execute(
            "UPDATE acemq_outbox SET status = 'sent', sent_at = now() WHERE id = ANY($1)",
            &[&sent_ids],
        )
        .await
        .map_err(db("marking outbox rows sent"))?;
    }
    if !failed_ids.is_empty() {
        tx.execute(
            "UPDATE acemq_outbox o SET status = 'failed', error = f.error \
             FROM unnest($1::bigint[], $2::text[]) AS f(id, error) WHERE o.id = f.id",
            &[&failed_ids, &failed_why],
        )
        .await
        .map_err(db("marking outbox rows failed"))?;
    }
    tx.commit()
        .await
        .map_err(db("committing the relay's marks"))?;
    let (sent, failed) = (sent_ids.len() as u64, failed_ids.len() as u64);
    stats.published.fetch_add(sent, Ordering::Relaxed);
    stats.failed.fetch_add(failed, Ordering::Relaxed);
    metrics::counter!("acemq.outbox.published").increment(sent);
    if failed > 0 {
        metrics::counter!("acemq.outbox.failed").increment(failed);
    }
    Ok(batch)
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

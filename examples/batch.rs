//! Batch consumption: rows into PostgreSQL, one `INSERT` per batch instead
//! of one round trip per message, each message keeping its own outcome.
//!
//! Run with:
//!
//! ```text
//! cargo run --example batch --features postgres -- [--queue NAME] [--publish N] [--keep-table] [--log-format text|json]
//! ```
//!
//! `DATABASE_URL` names the database (default
//! `host=127.0.0.1 user=postgres dbname=postgres`), `AMQP_ADDR` the broker.
//! The queue (default `batch.rows`, with `batch.rows.dlq`) is declared at
//! start. Each message is a JSON row, `{"item": "book", "quantity": 2}`,
//! with a message id; `--publish N` publishes N of them at start (every
//! tenth one invalid, to show a dead-lettered row beside a batch that
//! succeeds).
//!
//! Batches of up to 100 rows, waiting at most 50 ms for a batch to fill, two
//! batches at once (`concurrency: 2`, so `prefetch: 200`). Per batch:
//!
//! - a row that is not valid JSON is rejected alone: dead-lettered to
//!   `batch.rows.dlq` with reason `rejected`;
//! - the valid rows are written in one statement (`INSERT … SELECT FROM
//!   UNNEST(…)`), idempotent on the message id, so a batch redelivered after
//!   a crash writes nothing twice;
//! - if the statement fails, every row of the batch fails with it, and each
//!   is retried alone (in process after 200 ms, a batch of one).
//!
//! The rows go to a table of this process's own,
//! `acemq_batch_rows_<pid>`, created at start and dropped at exit (keep it
//! with `--keep-table`). It runs until a stop signal (SIGTERM, SIGINT,
//! SIGHUP or SIGQUIT), drains — the batch running finishes, the ones not
//! started go back to the queue — and prints `stored <n> rows` on stdout.

#[path = "common/logging.rs"]
mod logging;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use acemq::batch::Batch;
use acemq::config::{QueueConfig, RetriesConfig};
use acemq::outbox::deadpool_postgres::Pool;
use acemq::{App, BoxError, Config, Reject};
use serde::Deserialize;
use tracing::{error, info};

const USAGE: &str =
    "usage: batch [--queue NAME] [--publish N] [--keep-table] [--log-format text|json]";
const DEFAULT_DB: &str = "host=127.0.0.1 user=postgres dbname=postgres";
const MAX_SIZE: usize = 100;
const MAX_WAIT: Duration = Duration::from_millis(50);

/// One row, as a message's JSON body.
#[derive(Debug, Deserialize)]
struct Row {
    item: String,
    quantity: i32,
}

struct Args {
    log_format: logging::LogFormat,
    queue: String,
    publish: usize,
    keep_table: bool,
}

fn parse_args() -> Result<Args, String> {
    let (log_format, rest) = logging::take_log_format(std::env::args().skip(1).collect())?;
    let mut args = Args {
        log_format,
        queue: "batch.rows".to_owned(),
        publish: 0,
        keep_table: false,
    };
    let mut rest = rest.into_iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--queue" => args.queue = rest.next().ok_or("--queue needs a name")?,
            "--publish" => {
                args.publish = rest
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--publish needs a number")?
            }
            "--keep-table" => args.keep_table = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

/// The queue: two batches of up to 100 at once, so a prefetch of 200;
/// dead-lettering on; a failed row retried twice, 200 ms apart, in process.
fn config(queue: &str) -> Config {
    let mut q = QueueConfig::new(queue);
    q.concurrency = 2;
    q.prefetch = (MAX_SIZE * q.concurrency) as u16;
    q.dead_letter = true;
    let mut retries = RetriesConfig::new(3, Duration::from_millis(200), Duration::from_millis(200));
    retries.broker_wait_threshold = Duration::from_secs(1);
    q.retries = Some(retries);
    Config::new([q])
}

/// Writes a batch: each valid row in one `INSERT` for all of them; each
/// invalid one rejected alone. One outcome per message, in the batch's
/// order.
async fn write_batch(
    pool: &Pool,
    table: &str,
    batch: Batch,
) -> Result<Vec<Result<(), BoxError>>, BoxError> {
    let mut outcomes: Vec<Result<(), BoxError>> = Vec::with_capacity(batch.len());
    let (mut ids, mut items, mut quantities) = (Vec::new(), Vec::new(), Vec::new());
    for d in &batch {
        match serde_json::from_slice::<Row>(d.body()) {
            Ok(row) => {
                let id = d
                    .properties()
                    .message_id
                    .clone()
                    .unwrap_or_else(|| format!("tag-{}", d.delivery_tag()));
                ids.push(id);
                items.push(row.item);
                quantities.push(row.quantity);
                outcomes.push(Ok(()));
            }
            Err(e) => outcomes.push(Err(Reject::new(format!("not a row: {e}")).into())),
        }
    }
    if !ids.is_empty() {
        // A failure here (the database is down) fails the whole batch:
        // every row is retried, alone.
        let client = pool.get().await?;
        let written = client
            .execute(
                &format!(
                    "INSERT INTO {table} (message_id, item, quantity) \
                     SELECT * FROM UNNEST($1::text[], $2::text[], $3::int4[]) \
                     ON CONFLICT (message_id) DO NOTHING"
                ),
                &[&ids, &items, &quantities],
            )
            .await?;
        info!(
            rows = ids.len(),
            written,
            batch = batch.len(),
            "batch written"
        );
    }
    Ok(outcomes)
}

async fn publish_rows(running: &acemq::Running, queue: &str, n: usize) {
    let publisher = running.publisher();
    for i in 0..n {
        let body = if i % 10 == 9 {
            "not json".to_owned()
        } else {
            format!(r#"{{"item":"item-{i}","quantity":{}}}"#, i % 5 + 1)
        };
        let mut props = acemq::Properties::default();
        props.message_id = Some(format!("row-{}-{i}", std::process::id()));
        props.content_type = Some("application/json".to_owned());
        if let Err(e) = publisher.publish("", queue, body.as_bytes(), props).await {
            error!(error = %e, "could not publish a row");
        }
    }
    info!(rows = n, %queue, "published");
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    logging::init(args.log_format, acemq::log::DEFAULT_FILTER, std::io::stderr);
    let settings = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DB.to_owned());
    let pool = match acemq::outbox::pool(&settings, 4) {
        Ok(p) => p,
        Err(e) => {
            error!(error = %e, "DATABASE_URL is not usable");
            return ExitCode::from(acemq::app::EXIT_CONFIG);
        }
    };
    let table: Arc<str> = format!("acemq_batch_rows_{}", std::process::id()).into();
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {table} (message_id text PRIMARY KEY, item text NOT NULL, \
         quantity int4 NOT NULL, stored_at timestamptz NOT NULL DEFAULT now())"
    );
    if let Err(e) = run_sql(&pool, &create).await {
        error!(error = %e, "could not create the table");
        return ExitCode::from(acemq::app::EXIT_UNAVAILABLE);
    }
    info!(%table, "table created");

    let handler = tower::service_fn({
        let (pool, table) = (pool.clone(), table.clone());
        move |batch: Batch| {
            let (pool, table) = (pool.clone(), table.clone());
            async move { write_batch(&pool, &table, batch).await }
        }
    });
    let app = App::new(config(&args.queue)).consume_batch(&args.queue, MAX_SIZE, MAX_WAIT, handler);
    let code = match app.start().await {
        Ok(running) => {
            publish_rows(&running, &args.queue, args.publish).await;
            running.run().await
        }
        Err(e) => {
            error!(error = %e, "could not start");
            ExitCode::from(e.exit_code())
        }
    };

    let stored = match pool.get().await {
        Ok(client) => client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .map(|row| row.get::<_, i64>(0))
            .unwrap_or(-1),
        Err(_) => -1,
    };
    println!("stored {stored} rows");
    if !args.keep_table {
        if let Err(e) = run_sql(&pool, &format!("DROP TABLE IF EXISTS {table}")).await {
            error!(error = %e, %table, "could not drop the table");
        }
    }
    code
}

async fn run_sql(pool: &Pool, sql: &str) -> Result<(), BoxError> {
    pool.get().await?.batch_execute(sql).await?;
    Ok(())
}

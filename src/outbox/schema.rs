//! The schema, shipped as SQL migrations under `migrations/`, and
//! [`migrate`], which applies them once.

use tokio_postgres::Client;

use super::error::OutboxError;

/// The migrations, in order: (version, name, SQL). Each is idempotent on
/// its own (`IF NOT EXISTS`), and recorded in `acemq_schema_migrations`.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "outbox",
        include_str!("../../migrations/0001_outbox.sql"),
    ),
    (2, "inbox", include_str!("../../migrations/0002_inbox.sql")),
];

/// An arbitrary constant: the advisory lock that serialises concurrent
/// `migrate` calls (several instances starting at once).
const MIGRATE_LOCK: i64 = 0x6163_656d_715f_6d67; // "acemq_mg"

/// Creates (or brings up to date) the outbox and inbox tables, in the
/// database and schema (`search_path`) of `client`.
///
/// Safe to call on every start and from several instances at once: it takes
/// a transaction-scoped advisory lock, applies only the migrations not yet
/// recorded in `acemq_schema_migrations`, and commits them together.
/// Returns how many it applied. Quiet when there is nothing to do: inside
/// its transaction the server sends only warnings and errors
/// (`client_min_messages = warning`), so PostgreSQL's "already exists,
/// skipping" notices never reach the connection or your log. Needs
/// PostgreSQL 13 or later (`gen_random_uuid()`).
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
pub async fn migrate(client: &Client) -> Result<usize, OutboxError> {
    let run = async {
        // `BEGIN` and `SET LOCAL` in one round trip: the setting ends with
        // the transaction. Without it, each `IF NOT EXISTS` that finds its
        // table or index sends a NOTICE ("already exists, skipping"), which
        // tokio-postgres logs at INFO: every start but the first.
        client
            .batch_execute("BEGIN; SET LOCAL client_min_messages = warning")
            .await?;
        client
            .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
            .await?;
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS acemq_schema_migrations (
                    version    integer     PRIMARY KEY,
                    name       text        NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now()
                )",
            )
            .await?;
        let mut applied = 0;
        for (version, name, sql) in MIGRATIONS {
            let done = client
                .query_opt(
                    "SELECT 1 FROM acemq_schema_migrations WHERE version = $1",
                    &[version],
                )
                .await?
                .is_some();
            if done {
                continue;
            }
            client.batch_execute(sql).await?;
            client
                .execute(
                    "INSERT INTO acemq_schema_migrations (version, name) VALUES ($1, $2)",
                    &[version, name],
                )
                .await?;
            applied += 1;
        }
        client.batch_execute("COMMIT").await?;
        Ok::<_, tokio_postgres::Error>(applied)
    };
    match run.await {
        Ok(n) => {
            if n > 0 {
                tracing::info!(applied = n, "acemq outbox/inbox schema migrated");
            }
            Ok(n)
        }
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(OutboxError::Database {
                doing: "migrating the outbox/inbox schema",
                source: e,
            })
        }
    }
}

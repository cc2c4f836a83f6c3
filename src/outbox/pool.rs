//! [`pool`]: the PostgreSQL connection pool the outbox, the relay and the
//! inbox store work on.

use super::error::OutboxError;

/// A connection pool of at most `max_size` connections (plain TCP) from a
/// libpq-style `settings` string (`host=… user=… dbname=…` or a
/// `postgresql://` URL). The password, if any, never appears in an error.
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
pub fn pool(settings: &str, max_size: usize) -> Result<deadpool_postgres::Pool, OutboxError> {
    let config: tokio_postgres::Config =
        settings
            .parse()
            .map_err(|e: tokio_postgres::Error| OutboxError::Config {
                message: e.to_string(),
            })?;
    let manager = deadpool_postgres::Manager::from_config(
        config,
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    deadpool_postgres::Pool::builder(manager)
        .max_size(max_size.max(1))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| OutboxError::Config {
            message: e.to_string(),
        })
}

//! [`pool`]: the PostgreSQL connection pool the outbox, the relay and the
//! inbox store work on.

use super::error::OutboxError;
use super::sslmode::{self, SslMode};

/// A connection pool of at most `max_size` connections from a libpq-style
/// `settings` string (`host=… user=… dbname=…` or a `postgresql://` URL).
/// The password, if any, never appears in an error.
///
/// TLS follows libpq's `sslmode` in the string (feature `tls`, rustls with
/// the ring provider):
/// - `disable`: plain TCP;
/// - `prefer` (the default): TLS when the server offers it, else plain;
/// - `require`: TLS or no connection;
/// - `verify-full`: TLS or no connection, the server's certificate chained
///   to `sslrootcert`'s file (else the operating system's roots) and
///   naming the host (`host=` is the name checked; `hostaddr=` may give the
///   address).
///
/// `prefer` and `require` do not check the certificate (as libpq): they keep
/// a passive listener out, not one in the middle; use `verify-full` across
/// a network you do not own. Without the `tls` feature, `prefer` is plain
/// TCP and `require` or `verify-full` is a [`OutboxError::Config`] saying
/// so.
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
pub fn pool(settings: &str, max_size: usize) -> Result<deadpool_postgres::Pool, OutboxError> {
    let split = sslmode::split(settings)?;
    let mut config: tokio_postgres::Config =
        split
            .rest
            .parse()
            .map_err(|e: tokio_postgres::Error| OutboxError::Config {
                message: e.to_string(),
            })?;
    config.ssl_mode(match split.mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        SslMode::Require | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
    });
    let manager_config = deadpool_postgres::ManagerConfig {
        recycling_method: deadpool_postgres::RecyclingMethod::Fast,
    };
    #[cfg(feature = "tls")]
    let manager = deadpool_postgres::Manager::from_config(
        config,
        super::tls::connector(&split)?,
        manager_config,
    );
    #[cfg(not(feature = "tls"))]
    let manager = {
        if matches!(split.mode, SslMode::Require | SslMode::VerifyFull) {
            return Err(OutboxError::Config {
                message: "sslmode=require and verify-full need acemq's `tls` feature".into(),
            });
        }
        deadpool_postgres::Manager::from_config(config, tokio_postgres::NoTls, manager_config)
    };
    deadpool_postgres::Pool::builder(manager)
        .max_size(max_size.max(1))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| OutboxError::Config {
            message: e.to_string(),
        })
}

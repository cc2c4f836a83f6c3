//! How long the drain may take: the bounds it adds to `shutdown_timeout`
//! and `abandon_after`.

use std::time::Duration;

/// How long closing a channel or the connection may take before the drain
/// moves on (a broker that went away must not hold the process).
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_millis(1500);

/// The longest a drain can take: `shutdown_timeout`, then `abandon_after`
/// (and the grace the drain adds to it), then the close bounds: consumer
/// channels (together), the publishing connection, the consumers'
/// connection.
pub(crate) fn worst_case(config: &crate::config::Config) -> Duration {
    config.shutdown_timeout + config.abandon_after + ABANDON_GRACE + CLOSE_TIMEOUT * 3
}

/// Added to `abandon_after` before the drain stops waiting for abandoned
/// handlers to be dropped.
pub(super) const ABANDON_GRACE: Duration = Duration::from_millis(250);

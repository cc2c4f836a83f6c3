//! Closing a channel or a connection within one bound: a broker that went
//! away must not hold the process. Every close acemq makes, the `acemq`
//! command's included, goes through [`close_channel`] or
//! [`close_connection`] (clippy refuses lapin's own `close` elsewhere:
//! `clippy.toml`).

use std::future::Future;
use std::time::Duration;

use lapin::{Channel, Connection};

/// How long closing a channel or a connection, or cancelling a consumer, may
/// take before acemq moves on: a broker that went away must not hold the
/// process. The one bound for every such wait; the drain's worst case
/// ([`crate::app`]'s start-up warning) counts it once for each close the
/// drain awaits.
pub(crate) const CLOSE_BOUND: Duration = Duration::from_secs(1);

/// Why a bounded close did not end with the broker's answer.
#[doc(hidden)]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloseError {
    /// The broker did not answer within the bound (one second); acemq
    /// moved on.
    #[error("the broker did not answer {what} within {bound:?}")]
    Unanswered {
        /// `channel.close` or `connection.close`.
        what: &'static str,
        /// The bound waited.
        bound: Duration,
    },
    /// lapin refused or failed the close (it was closed already, the
    /// socket failed).
    #[error(transparent)]
    Failed(#[from] lapin::Error),
}

impl CloseError {
    /// Whether the broker did not answer in time (rather than the close
    /// failing at once).
    pub fn is_unanswered(&self) -> bool {
        matches!(self, CloseError::Unanswered { .. })
    }
}

/// Closes `channel` with reply code 200 and `reason`, waiting for the
/// broker's answer at most one second.
#[doc(hidden)]
#[allow(clippy::disallowed_methods)] // The one channel close.
pub async fn close_channel(channel: &Channel, reason: &str) -> Result<(), CloseError> {
    bounded("channel.close", channel.close(200, reason.into())).await
}

/// Closes `connection` with reply code 200 and `reason`, waiting for the
/// broker's answer at most one second.
#[doc(hidden)]
#[allow(clippy::disallowed_methods)] // The one connection close.
pub async fn close_connection(connection: &Connection, reason: &str) -> Result<(), CloseError> {
    bounded("connection.close", connection.close(200, reason.into())).await
}

/// Awaits `close` (a `what`) for at most [`CLOSE_BOUND`].
async fn bounded(
    what: &'static str,
    close: impl Future<Output = lapin::Result<()>>,
) -> Result<(), CloseError> {
    match tokio::time::timeout(CLOSE_BOUND, close).await {
        Ok(closed) => Ok(closed?),
        Err(_) => Err(CloseError::Unanswered {
            what,
            bound: CLOSE_BOUND,
        }),
    }
}

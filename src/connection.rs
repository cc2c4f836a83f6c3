//! Connecting to the broker, with the password kept out of every message.

use std::time::Duration;

use lapin::types::LongString;
use lapin::{Connection, ConnectionProperties};

/// The address used when `AMQP_ADDR` is not set.
pub const DEFAULT_AMQP_ADDR: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The broker address: `AMQP_ADDR`, or [`DEFAULT_AMQP_ADDR`].
pub fn amqp_addr_from_env() -> String {
    std::env::var("AMQP_ADDR").unwrap_or_else(|_| DEFAULT_AMQP_ADDR.to_owned())
}

/// The address with its password replaced by `***`, safe to log.
pub fn redact(addr: &str) -> String {
    match url::Url::parse(addr) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "<unparseable AMQP address>".to_owned(),
    }
}

/// Why the broker could not be reached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The address is not an AMQP URL.
    #[error("AMQP_ADDR is not a valid amqp:// or amqps:// URL ({redacted}): {reason}")]
    BadAddress {
        /// The address, password hidden.
        redacted: String,
        /// What was wrong.
        reason: String,
    },
    /// The broker refused the user name or password.
    #[error("authentication failed at {redacted}: the broker refused the user name or password; check the credentials in AMQP_ADDR")]
    Auth {
        /// The address, password hidden.
        redacted: String,
    },
    /// Nothing answered in time.
    #[error("no broker answered at {redacted} within {timeout:?} (connect_timeout): start RabbitMQ or point AMQP_ADDR at it")]
    Timeout {
        /// The address, password hidden.
        redacted: String,
        /// The connect timeout.
        timeout: Duration,
    },
    /// Another failure (refused connection, TLS, protocol).
    #[error("could not connect to {redacted}: {reason}; is RabbitMQ running there? (set AMQP_ADDR to point elsewhere)")]
    Other {
        /// The address, password hidden.
        redacted: String,
        /// What the client said, password hidden.
        reason: String,
    },
}

/// Connects to `addr` within `timeout`, naming the connection `name` (shown
/// by `rabbitmqctl list_connections client_properties`).
pub async fn connect(
    addr: &str,
    name: &str,
    timeout: Duration,
) -> Result<Connection, ConnectError> {
    let redacted = redact(addr);
    if let Err(e) = url::Url::parse(addr) {
        return Err(ConnectError::BadAddress {
            redacted,
            reason: e.to_string(),
        });
    }
    let props =
        ConnectionProperties::default().with_connection_name(LongString::from(name.to_owned()));
    match tokio::time::timeout(timeout, Connection::connect(addr, props)).await {
        Err(_) => Err(ConnectError::Timeout { redacted, timeout }),
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => {
            let mut reason = e.to_string();
            if let Some(pw) = url::Url::parse(addr)
                .ok()
                .and_then(|u| u.password().map(str::to_owned))
            {
                if !pw.is_empty() {
                    reason = reason.replace(&pw, "***");
                }
            }
            let lower = reason.to_ascii_lowercase();
            if lower.contains("access_refused")
                || lower.contains("access-refused")
                || lower.contains("auth")
                || lower.contains("login")
            {
                Err(ConnectError::Auth { redacted })
            } else {
                Err(ConnectError::Other { redacted, reason })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_replaced_in_a_redacted_address() {
        let r = redact("amqp://user:s3cret@host:5672/%2f");
        assert!(!r.contains("s3cret"), "{r}");
        assert!(r.contains("user:***@host"), "{r}");
    }
}

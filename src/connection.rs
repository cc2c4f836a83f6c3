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
    /// The broker refused the user name or password (reply code 403,
    /// ACCESS_REFUSED, during the handshake).
    #[error("authentication failed at {redacted}: the broker refused the user name or password; check the credentials in AMQP_ADDR")]
    Auth {
        /// The address, password hidden.
        redacted: String,
    },
    /// The broker has no virtual host by the name the address gives, or the
    /// user may not use it (reply code 530, NOT_ALLOWED).
    #[error("the broker at {redacted} refused the virtual host {vhost:?}: {message}. Create it and let the user in (rabbitmqctl add_vhost {vhost} && rabbitmqctl set_permissions -p {vhost} USER '.*' '.*' '.*'), or fix the vhost at the end of AMQP_ADDR (the default vhost / is written %2f)")]
    Vhost {
        /// The address, password hidden.
        redacted: String,
        /// The virtual host the address names.
        vhost: String,
        /// What the broker said.
        message: String,
    },
    /// Something answered at the address, but not an AMQP 0-9-1 broker.
    #[error("something answered at {redacted}, but it is not RabbitMQ: {what}; point AMQP_ADDR at RabbitMQ's AMQP port (5672, or 5671 for amqps://), not its management port or another service")]
    NotAmqp {
        /// The address, password hidden.
        redacted: String,
        /// What it did instead of speaking AMQP.
        what: String,
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
    check_address(addr)?;
    let props =
        ConnectionProperties::default().with_connection_name(LongString::from(name.to_owned()));
    match tokio::time::timeout(timeout, Connection::connect(addr, props)).await {
        Err(_) => Err(ConnectError::Timeout { redacted, timeout }),
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(map_connect_error(addr, e)),
    }
}

/// Checks that `addr` is an `amqp://` or `amqps://` URL before anything is
/// tried: a bad address is a config error (exit 78), not an unreachable
/// broker.
pub fn check_address(addr: &str) -> Result<(), ConnectError> {
    let bad = |reason: String| ConnectError::BadAddress {
        redacted: redact(addr),
        reason,
    };
    match url::Url::parse(addr) {
        Err(url::ParseError::RelativeUrlWithoutBase) => Err(bad(
            "it has no scheme: write it as amqp://user:password@host:5672/vhost".to_owned(),
        )),
        Err(e) => Err(bad(e.to_string())),
        Ok(u) if u.scheme() != "amqp" && u.scheme() != "amqps" => Err(bad(format!(
            "its scheme is {:?}, not amqp or amqps: write it as amqp://user:password@host:5672/vhost",
            u.scheme()
        ))),
        Ok(u) if u.host_str().is_none_or(str::is_empty) => Err(bad(
            "it names no host: write it as amqp://user:password@host:5672/vhost".to_owned(),
        )),
        Ok(_) => Ok(()),
    }
}

/// The virtual host an address names (`/` when its path is empty), decoded.
fn vhost_of(addr: &str) -> String {
    let Ok(u) = url::Url::parse(addr) else {
        return "/".to_owned();
    };
    let path = u.path().strip_prefix('/').unwrap_or(u.path());
    if path.is_empty() {
        return "/".to_owned();
    }
    url::form_urlencoded::parse(format!("v={path}").as_bytes())
        .next()
        .map_or_else(|| path.to_owned(), |(_, v)| v.into_owned())
}

/// Turns lapin's failure to connect into a [`ConnectError`] by what it is —
/// the AMQP reply code, the error kind — never by its text, with the
/// password hidden.
pub fn map_connect_error(addr: &str, e: lapin::Error) -> ConnectError {
    use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
    use lapin::ErrorKind;

    let redacted = redact(addr);
    let hide = |text: String| match url::Url::parse(addr)
        .ok()
        .and_then(|u| u.password().map(str::to_owned))
    {
        Some(pw) if !pw.is_empty() => text.replace(&pw, "***"),
        _ => text,
    };
    match e.kind() {
        ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => ConnectError::Auth { redacted },
            AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED) => ConnectError::Vhost {
                redacted,
                vhost: vhost_of(addr),
                message: hide(amqp.get_message().to_string()),
            },
            _ => ConnectError::Other {
                redacted,
                reason: hide(e.to_string()),
            },
        },
        ErrorKind::ParsingError(_) => ConnectError::NotAmqp {
            redacted,
            what: "it answered the AMQP protocol header with bytes that are not AMQP".to_owned(),
        },
        ErrorKind::InvalidProtocolVersion(version) => ConnectError::NotAmqp {
            redacted,
            what: format!("it speaks another AMQP version ({version:?}), not 0-9-1"),
        },
        ErrorKind::IOError(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            ConnectError::Other {
                redacted,
                reason: format!(
                    "the server closed the connection during the AMQP handshake ({io}): it is \
                     probably not RabbitMQ (another service on that port, or a TLS port spoken \
                     to without amqps://), or RabbitMQ refused the client (see its log)"
                ),
            }
        }
        _ => ConnectError::Other {
            redacted,
            reason: hide(e.to_string()),
        },
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

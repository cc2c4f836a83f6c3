//! Why a connection could not be opened, told by what lapin's failure is
//! (reply code, error kind), never by its text, with the password hidden.

use std::time::Duration;

use crate::config::address::{redact, vhost_of};

/// Why the broker could not be reached.
///
/// ```no_run
/// use std::time::Duration;
/// use acemq::connection::{connect, ConnectError};
///
/// # async fn run() {
/// match connect("amqp://guest:guest@127.0.0.1:5672/%2f", "shop-tools", Duration::from_secs(5)).await {
///     Ok(_conn) => {}
///     Err(e) if e.is_config() => eprintln!("fix the address: {e}"), // exit 78
///     Err(e) => eprintln!("broker unreachable: {e}"),                // exit 69
/// }
/// # let _: Option<ConnectError> = None; }
/// ```
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
    /// A TLS file could not be used.
    #[error("TLS file {path} ({field}) could not be used: {reason}")]
    Tls {
        /// The config field, e.g. `tls.ca_file`.
        field: &'static str,
        /// The file.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// Several addresses were tried and none answered; each one's failure
    /// in the order tried.
    #[error("no broker answered at any of the {} addresses tried: {}; start RabbitMQ there or fix `addresses` (or AMQP_ADDR)", .tried.len(), .tried.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    NoneAnswered {
        /// Each address's failure, in the order tried.
        tried: Vec<ConnectError>,
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

impl ConnectError {
    /// Whether the failure is the configuration's, not the broker's: an
    /// address that is not a usable AMQP URL, or a TLS file that cannot be
    /// used — or, with several addresses, every one failing so. A start
    /// that fails so exits 78 (69 for the rest).
    pub fn is_config(&self) -> bool {
        match self {
            ConnectError::BadAddress { .. } | ConnectError::Tls { .. } => true,
            ConnectError::NoneAnswered { tried } => {
                !tried.is_empty() && tried.iter().all(ConnectError::is_config)
            }
            _ => false,
        }
    }
}

/// Turns lapin's failure to connect into a [`ConnectError`] by what it is —
/// the AMQP reply code, the error kind — never by its text, with the
/// password hidden.
pub(crate) fn map_connect_error(addr: &str, e: lapin::Error) -> ConnectError {
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

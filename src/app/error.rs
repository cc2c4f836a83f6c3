//! Why the runner could not start, the exit code for it, and how a start
//! failure is told (log, stderr, exit code).

use std::process::ExitCode;

use tracing::{error, info};

use super::exit::{EXIT_CONFIG, EXIT_OK, EXIT_UNAVAILABLE};
use crate::config::ConfigError;
use crate::connection::ConnectError;
use crate::topology::TopologyError;

/// Why the runner could not start. No consumer was started.
///
/// Example: the [`app` module](crate::app)'s `main` turns it into an exit code with [`start_failed`]; see also `examples/shop/main.rs`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The config is invalid, or names a queue that has no handler (or the
    /// reverse); [`ConfigError::field`] names the offending field.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The broker could not be reached.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The topology could not be declared.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// A channel or consumer could not be opened.
    #[error("could not start consuming {queue:?}: {message}")]
    Consume {
        /// The queue.
        queue: String,
        /// What the broker said.
        message: String,
    },
    /// The publishing connection or its channel could not be opened.
    #[error("could not open the publishing connection: {message}")]
    Publisher {
        /// What the broker said.
        message: String,
    },
    /// A stop signal arrived during start-up: start-up ended at once, before
    /// any message was taken (exit 0).
    #[error("stopped by {signal} during start-up")]
    Stopped {
        /// The signal's name.
        signal: &'static str,
    },
}

impl StartError {
    /// The exit code for this failure (78 config — including an address
    /// that is not a usable `amqp://` URL and a TLS file that cannot be used —
    /// 69 broker unreachable).
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Connect(e) if e.is_config() => EXIT_CONFIG,
            StartError::Config(_)
            | StartError::Topology(
                TopologyError::Conflict { .. } | TopologyError::ExchangeConflict { .. },
            ) => EXIT_CONFIG,
            StartError::Stopped { .. } => EXIT_OK,
            _ => EXIT_UNAVAILABLE,
        }
    }
}

/// Tells a start failure once and returns its exit code (78 config, 69
/// broker unreachable, 0 for a stop signal during start-up): as an ERROR
/// event when a tracing subscriber records acemq's errors, otherwise as the
/// one line `acemq: <reason>` on stderr — never both, so a service that
/// logs to stderr does not show the reason twice.
///
/// Example: the [`app` module](crate::app)'s `main`; the whole service is `examples/shop/main.rs`.
pub fn start_failed(e: &StartError) -> ExitCode {
    if let StartError::Stopped { signal } = e {
        info!(
            signal,
            "stop signal during start-up: start-up ended before any message was taken; exiting"
        );
        return ExitCode::from(EXIT_OK);
    }
    let code = e.exit_code();
    if tracing::enabled!(tracing::Level::ERROR) {
        error!(exit_code = code, "{e}");
    } else {
        eprintln!("acemq: {e}");
    }
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls() -> ConnectError {
        ConnectError::Tls {
            field: "tls.ca_file",
            path: "/nonexistent/ca.pem".to_owned(),
            reason: "No such file or directory".to_owned(),
        }
    }

    #[test]
    fn a_tls_file_that_cannot_be_used_is_a_config_error_78() {
        assert_eq!(StartError::Connect(tls()).exit_code(), EXIT_CONFIG);
        let every = ConnectError::NoneAnswered {
            tried: vec![tls(), tls()],
        };
        assert_eq!(StartError::Connect(every).exit_code(), EXIT_CONFIG);
        let one_down = ConnectError::NoneAnswered {
            tried: vec![
                tls(),
                ConnectError::Timeout {
                    redacted: "amqp://h/".to_owned(),
                    timeout: std::time::Duration::from_secs(1),
                },
            ],
        };
        assert_eq!(StartError::Connect(one_down).exit_code(), EXIT_UNAVAILABLE);
    }
}

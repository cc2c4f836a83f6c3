//! Exit codes (sysexits) and the one-line reasons that go with them.

use std::process::ExitCode;

use tracing::{error, info};

use super::StartError;
use crate::app::drain::{DrainReport, DrainTimeout};

/// Exit code after a clean stop (also a stop signal during start-up, when
/// nothing was taken from any queue).
pub const EXIT_OK: u8 = 0;
/// Exit code when the drain deadline expired (EX_TEMPFAIL).
pub const EXIT_TEMPFAIL: u8 = 75;
/// Exit code for bad config (EX_CONFIG).
pub const EXIT_CONFIG: u8 = 78;
/// Exit code when the broker is unreachable at start (EX_UNAVAILABLE).
pub const EXIT_UNAVAILABLE: u8 = 69;

/// Logs a start failure, prints its one-line reason on stderr and returns
/// its exit code (78 config, 69 broker unreachable, 0 for a stop signal
/// during start-up).
pub fn start_failed(e: &StartError) -> ExitCode {
    if let StartError::Stopped { signal } = e {
        info!(
            signal,
            "stop signal during start-up: start-up ended before any message was taken; exiting"
        );
        return ExitCode::from(EXIT_OK);
    }
    error!("{e}");
    eprintln!("acemq: {e}");
    ExitCode::from(e.exit_code())
}

/// Logs a drain's outcome (the report, or the timeout on stderr too) and
/// returns the exit code: 0 clean, 75 when the deadline expired.
pub fn finish(result: Result<DrainReport, DrainTimeout>) -> ExitCode {
    match result {
        Ok(report) => {
            info!("{report}");
            ExitCode::from(EXIT_OK)
        }
        Err(timeout) => {
            error!("{timeout}");
            eprintln!("acemq: {timeout}");
            ExitCode::from(EXIT_TEMPFAIL)
        }
    }
}

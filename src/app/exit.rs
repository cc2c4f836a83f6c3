//! Exit codes (sysexits), and a drain's outcome turned into one with its
//! one-line reason (a start failure's is `error::start_failed`).

use std::process::ExitCode;

use tracing::{error, info};

use crate::app::drain::{DrainReport, DrainTimeout};

/// Exit code after a clean stop (also a stop signal during start-up, when
/// nothing was taken from any queue).
///
/// Example: the [`app` module](crate::app)'s `main`; the whole service is `examples/shop/main.rs`.
pub const EXIT_OK: u8 = 0;
/// Exit code when the stop was not clean (EX_TEMPFAIL): the drain deadline
/// expired, a second signal cut it short, or a channel or connection was
/// lost during it — work will be redone.
///
/// Example: the [`app` module](crate::app)'s `main`; the whole service is `examples/shop/main.rs`.
pub const EXIT_TEMPFAIL: u8 = 75;
/// Exit code for bad config (EX_CONFIG).
///
/// Example: the [`app` module](crate::app)'s `main`; the whole service is `examples/shop/main.rs`.
pub const EXIT_CONFIG: u8 = 78;
/// Exit code when the broker is unreachable at start (EX_UNAVAILABLE).
///
/// Example: the [`app` module](crate::app)'s `main`; the whole service is `examples/shop/main.rs`.
pub const EXIT_UNAVAILABLE: u8 = 69;

/// Logs a drain's outcome (the report, or the timeout on stderr too) and
/// returns the exit code: 0 clean, 75 when the stop was not clean (the
/// deadline expired, or outcomes were lost with a channel during the
/// drain).
///
/// Example: the [`app` module](crate::app)'s `main`; the whole service is `examples/shop/main.rs`.
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

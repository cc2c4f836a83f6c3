//! Exit codes (sysexits, as the library's `App` uses them) and the failure
//! that carries one.

use std::fmt;
use std::process::ExitCode;

use acemq::app::{EXIT_CONFIG, EXIT_OK, EXIT_UNAVAILABLE};

/// What the command's exit code says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// 0: done; `topology plan` found the broker as the config says.
    Ok,
    /// 1: `topology plan` found differences (or `queues --strict` a missing
    /// queue).
    Differences,
    /// 64 (EX_USAGE): the command line is wrong.
    Usage,
    /// 65 (EX_DATAERR): the queue (or exchange) named on the command line
    /// is not there, or `publish` reached no queue.
    Data,
    /// 69 (EX_UNAVAILABLE): the broker could not be reached, or failed.
    Unavailable,
    /// 75 (EX_TEMPFAIL): `publish` was refused by the broker (a nack: a
    /// queue at its length limit that rejects publishes, or a broker fault);
    /// trying again later may succeed.
    Nacked,
    /// 78 (EX_CONFIG): the config is invalid, or the broker holds something
    /// the config contradicts.
    Config,
}

impl Exit {
    /// The process exit code.
    pub(crate) const fn code(self) -> u8 {
        match self {
            Exit::Ok => EXIT_OK,
            Exit::Differences => 1,
            Exit::Usage => 64,
            Exit::Data => 65,
            Exit::Unavailable => EXIT_UNAVAILABLE,
            Exit::Nacked => 75,
            Exit::Config => EXIT_CONFIG,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit.code())
    }
}

/// A verb that could not do its work: the message for stderr (never a
/// password) and the exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) exit: Exit,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(exit: Exit, message: impl Into<String>) -> Self {
        Failure {
            exit,
            message: message.into(),
        }
    }

    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Failure::new(Exit::Usage, message)
    }

    pub(crate) fn data(message: impl Into<String>) -> Self {
        Failure::new(Exit::Data, message)
    }

    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Failure::new(Exit::Unavailable, message)
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        Failure::new(Exit::Config, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

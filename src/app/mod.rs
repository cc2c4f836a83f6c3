//! The runner: connect, declare, consume, wait for a stop signal, drain.
//!
//! - [`App`] is the builder (`builder`); `start` is its start-up sequence,
//!   [`Running`] what it returns (`running`), [`StartError`] why it could
//!   not start (`error`);
//! - `generation` builds a queue's stack and consumer loop again for each
//!   generation;
//! - `supervisor` keeps the two connections and every queue's generations
//!   alive;
//! - `signals` turns SIGTERM, SIGINT, SIGHUP and SIGQUIT into a stop at
//!   every phase;
//! - `exit` holds the exit codes and their one-line reasons.

mod builder;
pub mod drain;
mod error;
mod exit;
mod generation;
pub mod health;
mod running;
mod signals;
mod start;
mod supervisor;

pub use builder::App;
pub use error::{start_failed, StartError};
pub use exit::{finish, EXIT_CONFIG, EXIT_OK, EXIT_TEMPFAIL, EXIT_UNAVAILABLE};
pub use running::Running;
pub use signals::Signals;

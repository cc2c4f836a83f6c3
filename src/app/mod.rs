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
//!
//! A `main` that owns its signals, so a SIGTERM during start-up is a clean
//! stop too, and exits with the drain's code (the whole service:
//! `examples/shop/main.rs`):
//!
//! ```no_run
//! use std::process::ExitCode;
//! use acemq::app::{finish, start_failed, Signals};
//! use acemq::{App, Config, Delivery};
//! use tower::service_fn;
//!
//! #[tokio::main]
//! async fn main() -> ExitCode {
//!     let config = match Config::from_path("examples/shop.yaml") {
//!         Ok(c) => c,
//!         Err(e) => {
//!             eprintln!("{e}");
//!             return ExitCode::from(acemq::app::EXIT_CONFIG);
//!         }
//!     };
//!     let app = App::new(config).consume(
//!         "shop.orders",
//!         service_fn(|_d: Delivery| async { Ok::<_, acemq::BoxError>(()) }),
//!     );
//!     let mut signals = Signals::install();
//!     let running = match app.start_until(signals.stop()).await {
//!         Ok(r) => r,
//!         Err(e) => return start_failed(&e), // 78 config, 69 unreachable, 0 stopped
//!     };
//!     signals.stop().await; // the first SIGTERM, SIGINT, SIGHUP or SIGQUIT
//!     finish(running.drain_with(async move { signals.stop().await; }).await) // 0 or 75
//! }
//! ```

mod broker_check;
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

//! Log filtering for an application built on acemq: the filter directives
//! that keep a log readable, as strings for
//! `tracing_subscriber::EnvFilter` (or `RUST_LOG`).
//!
//! lapin, the AMQP client under acemq, logs its own events at ERROR when a
//! connection is lost ("error doing IO", "Connection error", "Connection
//! closed", a missed heartbeat), also when acemq reconnects a moment later,
//! and logs a returned message at WARN with its body. A library cannot lower
//! another crate's levels, and a level filter cannot keep lapin's WARN while
//! dropping its ERROR, so [`LAPIN_DIRECTIVE`] turns lapin's events off.
//! Nothing is lost to the reader: acemq reports each of those once itself —
//! a lost connection at WARN with lapin's error and that it reconnects, a
//! channel the broker closed at WARN with its reply code and text, a failed
//! start at ERROR with its one-line reason (written to stderr instead when
//! no subscriber records it: [`app::start_failed`](crate::app::start_failed)),
//! an unroutable publish
//! as [`PublishError::Unroutable`](crate::PublishError::Unroutable) — and
//! never a message body.
//!
//! ```
//! use tracing_subscriber::EnvFilter;
//!
//! // `RUST_LOG` when set, else acemq's default.
//! let filter = EnvFilter::try_from_default_env()
//!     .unwrap_or_else(|_| EnvFilter::new(acemq::log::DEFAULT_FILTER));
//! // Or a base of your own, lapin's events off.
//! let mine = EnvFilter::new(format!("warn,my_app=info,{}", acemq::log::LAPIN_DIRECTIVE));
//! # let _ = (filter, mine);
//! ```
//!
//! A `RUST_LOG` you set replaces a default filter: add
//! [`LAPIN_DIRECTIVE`] to it too (`RUST_LOG=debug,lapin=off`), unless you
//! mean to read lapin's own events.

/// The directive that turns lapin's own events off: `lapin=off`. Add it to
/// the filter of any subscriber that writes acemq's logs.
///
/// Example: the [module docs](crate::log).
pub const LAPIN_DIRECTIVE: &str = "lapin=off";

/// The filter the examples use when `RUST_LOG` is not set: INFO and above,
/// lapin's events off (`info,` followed by [`LAPIN_DIRECTIVE`]).
///
/// With it, a handled delivery's log line names the queue, the delivery tag,
/// the message id and the attempt (the fields of acemq's `acemq.process`
/// span) besides what your handler logs.
///
/// Example: the [module docs](crate::log).
pub const DEFAULT_FILTER: &str = "info,lapin=off";

/// Whether text log lines written to `stream` should carry ANSI colour
/// codes: only when it is a terminal and `NO_COLOR` is unset or empty
/// (<https://no-color.org>). A log written to a file or a pipe (a
/// collector, `kubectl logs`, a `2> log` redirect) gets none, so it reads
/// as plain text. For tracing-subscriber's formatter:
///
/// ```
/// let colour = acemq::log::use_colour(&std::io::stderr());
/// let subscriber = tracing_subscriber::fmt()
///     .with_writer(std::io::stderr)
///     .with_ansi(colour)
///     .finish();
/// # let _ = subscriber;
/// ```
pub fn use_colour(stream: &impl std::io::IsTerminal) -> bool {
    colour(stream.is_terminal(), std::env::var_os("NO_COLOR"))
}

fn colour(is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::{colour, use_colour, DEFAULT_FILTER, LAPIN_DIRECTIVE};

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        let file = std::fs::File::open("Cargo.toml").expect("a file");
        assert!(!use_colour(&file), "a file is no terminal");
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())));
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None));
    }

    #[test]
    fn the_default_filter_is_info_with_lapin_off() {
        assert_eq!(DEFAULT_FILTER, format!("info,{LAPIN_DIRECTIVE}"));
    }
}

//! `--log-format text|json` for every example: the log lines as people read
//! them (`text`, tracing-subscriber's default format, the default) or one
//! JSON object per line for a log collector (`json`, tracing-subscriber's
//! JSON formatter).
//!
//! Not an example itself: cargo builds `examples/*.rs` and
//! `examples/*/main.rs`, and this folder has no `main.rs`. Each example
//! includes it with `#[path = "../common/logging.rs"] mod logging;` (or
//! `"common/logging.rs"` from `examples/`).
//!
//! ```text
//! let (format, args) = logging::take_log_format(std::env::args().skip(1).collect())?;
//! // … the example's own parser reads `args` …
//! logging::init(format, acemq::log::DEFAULT_FILTER, std::io::stderr);
//! ```
//!
//! Every example's default filter is [`acemq::log::DEFAULT_FILTER`],
//! `info,lapin=off`: lapin logs its own ERROR events for a lost connection
//! that acemq reconnects (and acemq says so once, at WARN), and a returned
//! message at WARN with its body; neither belongs in a log a person reads.
//! A handled delivery's line is then one short line: the `acemq.process`
//! span's `queue`, `delivery_tag`, `message_id` and `attempt`, and the
//! handler's own event.

use tracing::Subscriber;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// tracing-subscriber's default format (the default).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, the event's fields
    /// (`message` included) at the top level, `target`, and `spans`, the
    /// spans the event is in (outermost first) with their fields.
    Json,
}

impl LogFormat {
    fn parse(value: &str) -> Result<Self, String> {
        match value {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "--log-format {other:?}: the accepted values are text and json"
            )),
        }
    }
}

/// Takes every `--log-format VALUE` and `--log-format=VALUE` out of `args`
/// (the arguments without the program name) and returns the format (the
/// last one given; `text` without any) and the other arguments, in their
/// order, for the example's own parser. An error names the accepted values.
pub(crate) fn take_log_format(args: Vec<String>) -> Result<(LogFormat, Vec<String>), String> {
    let mut format = LogFormat::default();
    let mut rest = Vec::with_capacity(args.len());
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        if arg == "--log-format" {
            let value = it
                .next()
                .ok_or("--log-format needs a value: text or json")?;
            format = LogFormat::parse(&value)?;
        } else if let Some(value) = arg.strip_prefix("--log-format=") {
            format = LogFormat::parse(value)?;
        } else {
            rest.push(arg);
        }
    }
    Ok((format, rest))
}

/// `RUST_LOG` if it is set (and valid), else the example's `default`
/// filter ([`acemq::log::DEFAULT_FILTER`] in every example). A `RUST_LOG`
/// replaces the default whole: add `lapin=off` to it too.
pub(crate) fn env_filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}

/// Installs the global subscriber: [`env_filter`]`(default_filter)` and the
/// lines in `format` written to `writer` (`std::io::stderr` or
/// `std::io::stdout`), in colour only when that is a terminal
/// ([`acemq::log::use_colour`]).
#[allow(
    dead_code,
    reason = "tracing_otlp composes its own registry from `layer`"
)]
pub(crate) fn init<W>(format: LogFormat, default_filter: &str, writer: W)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
    for<'w> <W as MakeWriter<'w>>::Writer: std::io::IsTerminal,
{
    tracing_subscriber::registry()
        .with(env_filter(default_filter))
        .with(layer(format, writer))
        .init();
}

/// The formatting layer alone, for a subscriber composed with other layers
/// (an OpenTelemetry layer, say): the lines in `format` written to `writer`.
/// The filter is the caller's.
pub(crate) fn layer<S, W>(format: LogFormat, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
    for<'w> <W as MakeWriter<'w>>::Writer: std::io::IsTerminal,
{
    // Colours only on a terminal: a log written to a file or a pipe reads
    // as plain text.
    let colour = acemq::log::use_colour(&writer.make_writer());
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    match format {
        LogFormat::Text => fmt.with_ansi(colour).boxed(),
        LogFormat::Json => fmt
            .json()
            // `message` and the event's other fields at the top level, where
            // collectors look for them, rather than under `fields`.
            .flatten_event(true)
            // The span list holds the current span last: `span`, a copy of
            // it, would only double the line.
            .with_current_span(false)
            .with_ansi(false)
            .boxed(),
    }
}

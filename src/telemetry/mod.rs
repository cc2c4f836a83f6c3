//! What acemq tells about a delivery beyond its logs: its `process` span
//! (`span`), the span's OpenTelemetry side and W3C trace context on the
//! wire (`otel`, feature `opentelemetry`), and the status a dead-lettered
//! delivery's span records (`status`).

mod otel;
mod span;
mod status;

pub(crate) use otel::{inject_copy, inject_properties};
pub(crate) use span::{process_span, record_decision};

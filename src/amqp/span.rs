//! The `process` span of each delivery, named and described by the
//! OpenTelemetry messaging conventions for RabbitMQ.
//!
//! One span per delivery the broker hands us: created before the delivery
//! is converted, entered around everything the stack does with it (the
//! handler, in-process retries, rung and dead-letter publishes), closed when
//! the decision is known. With the `opentelemetry` feature its parent is the
//! W3C context the message carries (see [`crate::otel`]).
//!
//! Never a body byte: the span records the body's size only.

use acemq_layers::{Decision, Delivery};
use tracing::field::Empty;
use tracing::Span;

/// The longest span status description recorded on dead-letter (the full
/// error chain is in the copy's `x-acemq-error` header).
const MAX_STATUS_LEN: usize = 512;

/// Creates the delivery's `process` span (name `acemq.process`, OTel name
/// `process {queue}`, kind consumer) with what the raw delivery says. With
/// the `opentelemetry` feature its parent and link are the message's trace
/// context, set here before the span is first entered.
pub(crate) fn process_span(queue: &str, raw: &lapin::message::Delivery) -> Span {
    let span = tracing::info_span!(
        "acemq.process",
        otel.name = %format_args!("process {queue}"),
        otel.kind = "consumer",
        otel.status_code = Empty,
        otel.status_description = Empty,
        messaging.system = "rabbitmq",
        messaging.operation.type = "process",
        messaging.destination.name = raw.exchange.as_str(),
        messaging.rabbitmq.destination.routing_key = raw.routing_key.as_str(),
        messaging.rabbitmq.message.delivery_tag = int(raw.delivery_tag),
        messaging.message.id = Empty,
        messaging.message.conversation_id = Empty,
        messaging.message.body.size = int(raw.data.len() as u64),
        acemq.queue = queue,
        acemq.attempt = Empty,
        acemq.redelivered = raw.redelivered,
        acemq.outcome = Empty,
        acemq.dead_letter.reason = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(id) = raw.properties.message_id() {
        span.record("messaging.message.id", id.as_str());
    }
    if let Some(id) = raw.properties.correlation_id() {
        span.record("messaging.message.conversation_id", id.as_str());
    }
    crate::amqp::otel::extract(&span, queue, raw);
    span
}

/// Records what is known once the delivery is converted: its attempt number.
pub(crate) fn record_delivery(span: &Span, delivery: &Delivery) {
    span.record("acemq.attempt", i64::from(delivery.attempt()));
}

/// Records the decision: the outcome, and on dead-letter the reason and an
/// error status whose description is the reason and the error.
pub(crate) fn record_decision(span: &Span, decision: &Decision) {
    if span.is_disabled() {
        return;
    }
    span.record("acemq.outcome", decision.outcome());
    if let Decision::DeadLetter(d) = decision {
        span.record("acemq.dead_letter.reason", d.reason.as_str());
        span.record("otel.status_code", "error");
        let mut description = format!("{}: {}", d.reason, d.error);
        truncate(&mut description, MAX_STATUS_LEN);
        span.record("otel.status_description", description.as_str());
    }
}

/// Integers go to spans as `i64`: tracing-opentelemetry records a `u64` as
/// text, and the conventions want integer attributes.
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Cuts `s` to at most `max` bytes on a character boundary, ending in `…`.
fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max.saturating_sub('…'.len_utf8());
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn a_long_status_is_cut_on_a_character_boundary() {
        let mut s = "é".repeat(400);
        truncate(&mut s, 512);
        assert!(s.len() <= 512);
        assert!(s.ends_with('…'));
        let mut short = String::from("max-attempts: boom");
        truncate(&mut short, 512);
        assert_eq!(short, "max-attempts: boom");
    }

    #[test]
    fn a_delivery_logged_with_debug_shows_its_body_length_not_its_bytes() {
        let delivery = acemq_layers::Delivery::builder()
            .body(bytes::Bytes::from_static(b"card 4111-1111"))
            .build();
        let shown = format!("{delivery:?}");
        assert!(shown.contains("<14 bytes>"), "{shown}");
        assert!(!shown.contains("4111"), "{shown}");
    }
}

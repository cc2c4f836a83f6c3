//! The `process` span of each delivery: what a person reading the log needs
//! as its tracing fields, the OpenTelemetry messaging conventions for
//! RabbitMQ on the OpenTelemetry span.
//!
//! One span per delivery the broker hands us: created before the delivery
//! is converted, entered around everything the stack does with it (the
//! handler, in-process retries, rung and dead-letter publishes), closed when
//! the decision is known.
//!
//! Its tracing fields are few, so every log line inside it stays short in
//! any formatter: `queue`, `delivery_tag`, `message_id` (when the message
//! has one), `attempt`, and `redelivered = true` only on a redelivery. What
//! happened to the message is on the events (the handler's, the dead-letter
//! layer's), not on the span.
//!
//! With the `opentelemetry` feature, and when a `tracing_opentelemetry`
//! layer sees the span, [`super::otel`] gives the OpenTelemetry span
//! its name (`process {queue}`), its kind (consumer), its parent and link
//! (the message's trace context) and every attribute of the conventions and
//! acemq's own (`docs/tracing.md` lists them), through
//! `OpenTelemetrySpanExt`: an exporter gets them all, a `fmt` line none of
//! them.
//!
//! Never a body byte: the OpenTelemetry span records the body's size only.

use acemq_layers::{Decision, Delivery};
use tracing::field::Empty;
use tracing::Span;

/// Creates the delivery's `process` span (`acemq.process`) with what the
/// delivery says. With the `opentelemetry` feature its OpenTelemetry name,
/// kind, parent, link and attributes are set here, before the span is first
/// entered.
pub(crate) fn process_span(queue: &str, delivery: &Delivery) -> Span {
    let span = tracing::info_span!(
        "acemq.process",
        queue = %queue,
        delivery_tag = delivery.delivery_tag(),
        message_id = Empty,
        attempt = delivery.attempt(),
        redelivered = Empty,
        // Recorded only when an OpenTelemetry layer sees the span: the
        // OpenTelemetry span's name and kind are read from these two fields.
        otel.name = Empty,
        otel.kind = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(id) = &delivery.properties().message_id {
        span.record("message_id", id.as_str());
    }
    if delivery.redelivered() {
        span.record("redelivered", true);
    }
    super::otel::describe(&span, queue, delivery);
    super::otel::record_attempt(&span, delivery.attempt());
    span
}

/// Records the decision on the OpenTelemetry span (feature
/// `opentelemetry`): the outcome, and on dead-letter the reason and an
/// error status whose description is the reason and the error, cut to
/// [`MAX_STATUS_LEN`](super::status::MAX_STATUS_LEN) bytes.
pub(crate) fn record_decision(span: &Span, decision: &Decision) {
    if span.is_disabled() {
        return;
    }
    super::otel::record_decision(span, decision);
}

#[cfg(test)]
mod tests {
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

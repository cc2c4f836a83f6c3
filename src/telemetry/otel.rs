//! The OpenTelemetry side of a delivery's `process` span, and W3C trace
//! context on the wire (feature `opentelemetry`; without it every function
//! here does nothing).
//!
//! - **Describe**: when a `tracing_opentelemetry` layer sees the span, it
//!   gets its OpenTelemetry name (`process {queue}`), kind (consumer) and
//!   attributes (the messaging conventions' and acemq's own, listed in
//!   `docs/tracing.md`) through `OpenTelemetrySpanExt`, not as tracing
//!   fields, so a `fmt` line inside the span stays short. The name and the
//!   kind can only be given as the `otel.name` and `otel.kind` fields; they
//!   are recorded only when such a layer is there.
//! - **Extract**: a delivery's `traceparent` / `tracestate` / `baggage`
//!   headers become the parent of its `process` span, so a message's life is
//!   one trace, and the creation context (the producer's, kept in
//!   `x-acemq-original-traceparent` on copies) becomes a span link, as the
//!   messaging conventions recommend. No `traceparent`: a new root. A
//!   malformed one: a new root and one warning, never a failure.
//! - **Inject**: every publish carries the current context. Rung and
//!   dead-letter copies are published inside the failed delivery's `process`
//!   span, so their `traceparent` is that span; the producer's context moves
//!   to `x-acemq-original-traceparent` (once: a copy of a copy keeps the
//!   first producer's).
//!
//! The propagator is OpenTelemetry's global one: set it once at start-up, e.g.
//! `opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new())`
//! (or a composite with `BaggagePropagator`). Spans reach OpenTelemetry
//! through `tracing_opentelemetry::layer()` in your subscriber.

#![cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]

use acemq_layers::{Decision, Delivery, Headers};
use lapin::BasicProperties;
use tracing::Span;

/// Gives the OpenTelemetry span its name, kind, parent (the message's
/// context), link (its creation context) and attributes. Called by
/// [`super::span::process_span`] before the span is first entered.
pub(crate) fn describe(span: &Span, queue: &str, delivery: &Delivery) {
    #[cfg(feature = "opentelemetry")]
    imp::describe(span, queue, delivery);
}

/// Sets `acemq.attempt` on the OpenTelemetry span.
pub(crate) fn record_attempt(span: &Span, attempt: u32) {
    #[cfg(feature = "opentelemetry")]
    imp::set_attribute(span, "acemq.attempt", i64::from(attempt));
}

/// Sets `acemq.outcome` on the OpenTelemetry span and, on dead-letter,
/// `acemq.dead_letter.reason` and an error status.
pub(crate) fn record_decision(span: &Span, decision: &Decision) {
    #[cfg(feature = "opentelemetry")]
    imp::record_decision(span, decision);
}

/// Writes the current context into `headers` (a user's publish). Without a
/// current OpenTelemetry context the headers are left as they are.
#[allow(dead_code)] // Only the tests call it: every publish path injects through `inject_properties` or `inject_copy`.
pub(crate) fn inject(headers: &mut Headers) {
    #[cfg(feature = "opentelemetry")]
    imp::inject(headers);
}

/// Like [`inject`] for a rung or dead-letter copy: keeps the producer's
/// `traceparent` in `x-acemq-original-traceparent` (unless the copy already
/// has one), then writes the current context (the failed attempt's span).
pub(crate) fn inject_copy(headers: &mut Headers) {
    #[cfg(feature = "opentelemetry")]
    imp::inject_copy(headers);
}

/// [`inject`] on lapin's properties (the publisher's `publish`).
pub(crate) fn inject_properties(properties: BasicProperties) -> BasicProperties {
    #[cfg(feature = "opentelemetry")]
    return imp::inject_properties(properties);
    #[cfg(not(feature = "opentelemetry"))]
    properties
}

#[cfg(feature = "opentelemetry")]
mod imp {
    use std::sync::atomic::{AtomicBool, Ordering};

    use acemq_layers::{Decision, Delivery, Headers, Value as HeaderValue};
    use lapin::types::{AMQPValue, FieldTable, LongString};
    use lapin::BasicProperties;
    use opentelemetry::propagation::{Extractor, Injector};
    use opentelemetry::trace::{SpanContext, Status, TraceContextExt};
    use opentelemetry::{global, Context, Value};
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    const TRACEPARENT: &str = "traceparent";
    /// Where a copy keeps the producer's `traceparent`, its own `traceparent`
    /// being the failed attempt's span.
    const ORIGINAL_TRACEPARENT_HEADER: &str = "x-acemq-original-traceparent";

    /// Reads a string header.
    fn header_str<'a>(headers: &'a Headers, key: &str) -> Option<&'a str> {
        headers.get(key)?.as_str()
    }

    /// The delivery's headers, as the propagator reads them.
    struct HeadersExtractor<'a>(&'a Headers);

    impl Extractor for HeadersExtractor<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            header_str(self.0, key)
        }
        fn keys(&self) -> Vec<&str> {
            self.0.iter().map(|(k, _)| k).collect()
        }
    }

    /// The producer's context a copy keeps, read as if it were `traceparent`.
    struct OriginalExtractor<'a>(&'a str);

    impl Extractor for OriginalExtractor<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            (key == TRACEPARENT).then_some(self.0)
        }
        fn keys(&self) -> Vec<&str> {
            vec![TRACEPARENT]
        }
    }

    struct HeadersInjector<'a>(&'a mut Headers);

    impl Injector for HeadersInjector<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key, value);
        }
    }

    struct TableInjector<'a>(&'a mut FieldTable);

    impl Injector for TableInjector<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0
                .insert(key.into(), AMQPValue::LongString(LongString::from(value)));
        }
    }

    /// Whether the global propagator reads `traceparent`; says once when not.
    fn w3c_propagator() -> bool {
        static WARNED: AtomicBool = AtomicBool::new(false);
        let w3c = global::get_text_map_propagator(|p| p.fields().any(|f| f == TRACEPARENT));
        if !w3c && !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the opentelemetry feature is on but the global text map propagator does not \
                 read `traceparent`, so deliveries start new traces: call \
                 opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new()) \
                 at start-up"
            );
        }
        w3c
    }

    /// What a delivery's headers say of its trace.
    enum Carried {
        /// No `traceparent`, or a propagator that does not read it.
        Nothing,
        /// A valid context: the parent, and the creation context to link.
        Context(Context, SpanContext),
        /// A `traceparent` that is not a W3C trace context (its first 64
        /// characters).
        Malformed(String),
    }

    fn carried(delivery: &Delivery) -> Carried {
        let table = delivery.headers();
        let Some(traceparent) = header_str(table, TRACEPARENT) else {
            return Carried::Nothing;
        };
        if !w3c_propagator() {
            return Carried::Nothing;
        }
        let parent = global::get_text_map_propagator(|p| p.extract(&HeadersExtractor(table)));
        let parent_span = parent.span().span_context().clone();
        if !parent_span.is_valid() {
            return Carried::Malformed(traceparent.chars().take(64).collect());
        }
        let creation = header_str(table, ORIGINAL_TRACEPARENT_HEADER)
            .and_then(original)
            .unwrap_or(parent_span);
        Carried::Context(parent, creation)
    }

    pub(super) fn describe(span: &Span, queue: &str, delivery: &Delivery) {
        let carried = carried(delivery);
        let parent = match &carried {
            Carried::Context(parent, _) => parent.clone(),
            // A new root.
            Carried::Nothing | Carried::Malformed(_) => Context::new(),
        };
        // `Err` when no OpenTelemetry layer is in the subscriber: then the
        // span gets no OpenTelemetry name or kind field either.
        if span.set_parent(parent).is_ok() {
            span.record(
                "otel.name",
                tracing::field::display(format_args!("process {queue}")),
            );
            span.record("otel.kind", "consumer");
            set_attributes(span, queue, delivery);
            if let Carried::Context(_, creation) = carried {
                span.add_link(creation);
                return;
            }
        }
        if let Carried::Malformed(shown) = carried {
            // Inside the span: it is a new root, and the warning is its event.
            span.in_scope(|| {
                tracing::warn!(
                    queue,
                    traceparent = %shown,
                    "the delivery's traceparent header is not a W3C trace context \
                     (version-traceid-spanid-flags); its span starts a new trace"
                )
            });
        }
    }

    /// The messaging conventions' attributes and acemq's own that the
    /// delivery gives.
    fn set_attributes(span: &Span, queue: &str, delivery: &Delivery) {
        span.set_attribute("messaging.system", "rabbitmq");
        span.set_attribute("messaging.operation.type", "process");
        span.set_attribute("messaging.destination.name", delivery.exchange().to_owned());
        span.set_attribute(
            "messaging.rabbitmq.destination.routing_key",
            delivery.routing_key().to_owned(),
        );
        span.set_attribute(
            "messaging.rabbitmq.message.delivery_tag",
            int(delivery.delivery_tag()),
        );
        let properties = delivery.properties();
        if let Some(id) = &properties.message_id {
            span.set_attribute("messaging.message.id", id.clone());
        }
        if let Some(id) = &properties.correlation_id {
            span.set_attribute("messaging.message.conversation_id", id.clone());
        }
        span.set_attribute(
            "messaging.message.body.size",
            int(delivery.body().len() as u64),
        );
        span.set_attribute("acemq.queue", queue.to_owned());
        span.set_attribute("acemq.redelivered", delivery.redelivered());
    }

    pub(super) fn set_attribute(span: &Span, key: &'static str, value: impl Into<Value>) {
        span.set_attribute(key, value);
    }

    pub(super) fn record_decision(span: &Span, decision: &Decision) {
        span.set_attribute("acemq.outcome", decision.outcome());
        if let Decision::DeadLetter(d) = decision {
            span.set_attribute("acemq.dead_letter.reason", d.reason.as_str());
            span.set_status(Status::error(crate::telemetry::status::status_description(
                d.reason.as_str(),
                &d.error,
            )));
        }
    }

    /// Integer attributes as `i64`, as the conventions want them.
    fn int(n: u64) -> i64 {
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    /// The producer's span context a copy kept, when it is valid.
    fn original(traceparent: &str) -> Option<SpanContext> {
        let cx = global::get_text_map_propagator(|p| p.extract(&OriginalExtractor(traceparent)));
        let sc = cx.span().span_context().clone();
        sc.is_valid().then_some(sc)
    }

    /// The context to inject: the current tracing span's, else OpenTelemetry's
    /// own current one; `None` when neither has a valid span.
    fn current() -> Option<Context> {
        let cx = Span::current().context();
        if cx.span().span_context().is_valid() {
            return Some(cx);
        }
        let cx = Context::current();
        cx.span().span_context().is_valid().then_some(cx)
    }

    pub(super) fn inject(headers: &mut Headers) {
        if let Some(cx) = current() {
            global::get_text_map_propagator(|p| {
                p.inject_context(&cx, &mut HeadersInjector(headers))
            });
        }
    }

    pub(super) fn inject_copy(headers: &mut Headers) {
        if headers.get(ORIGINAL_TRACEPARENT_HEADER).is_none() {
            if let Some(tp @ HeaderValue::String(_)) = headers.get(TRACEPARENT) {
                let tp = tp.clone();
                headers.insert(ORIGINAL_TRACEPARENT_HEADER, tp);
            }
        }
        inject(headers);
    }

    pub(super) fn inject_properties(properties: BasicProperties) -> BasicProperties {
        let Some(cx) = current() else {
            return properties;
        };
        let mut table = properties.headers().clone().unwrap_or_default();
        global::get_text_map_propagator(|p| p.inject_context(&cx, &mut TableInjector(&mut table)));
        properties.with_headers(table)
    }
}

#[cfg(all(test, feature = "opentelemetry"))]
mod tests {
    use acemq_layers::Headers;
    use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    use super::{inject, inject_copy};

    /// Runs `f` with a tracing-opentelemetry subscriber on this thread.
    fn with_otel(f: impl FnOnce()) {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("unit")));
        tracing::subscriber::with_default(subscriber, f);
    }

    fn traceparent_of(span: &tracing::Span) -> String {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        format!("00-{}-{}-01", sc.trace_id(), sc.span_id())
    }

    fn text(h: &Headers, k: &str) -> Option<String> {
        h.get(k).and_then(|v| v.as_str()).map(str::to_owned)
    }

    const PRODUCER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_copy_carries_the_current_span_and_keeps_the_first_producers_context() {
        with_otel(|| {
            let mut headers = Headers::new();
            headers.insert("traceparent", PRODUCER);
            let first = tracing::info_span!("attempt one");
            first.in_scope(|| inject_copy(&mut headers));
            assert_eq!(text(&headers, "traceparent"), Some(traceparent_of(&first)));
            assert_eq!(
                text(&headers, "x-acemq-original-traceparent").as_deref(),
                Some(PRODUCER)
            );
            // A copy of the copy: the producer's context stays the first one.
            let second = tracing::info_span!("attempt two");
            second.in_scope(|| inject_copy(&mut headers));
            assert_eq!(text(&headers, "traceparent"), Some(traceparent_of(&second)));
            assert_eq!(
                text(&headers, "x-acemq-original-traceparent").as_deref(),
                Some(PRODUCER)
            );
        });
    }

    #[test]
    fn without_a_current_span_a_publish_keeps_its_headers_as_they_are() {
        with_otel(|| {
            let mut headers = Headers::new();
            headers.insert("traceparent", PRODUCER);
            inject(&mut headers);
            assert_eq!(text(&headers, "traceparent").as_deref(), Some(PRODUCER));
            let mut empty = Headers::new();
            inject(&mut empty);
            assert!(empty.is_empty(), "{empty:?}");
        });
    }
}

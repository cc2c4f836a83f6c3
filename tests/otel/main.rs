//! OpenTelemetry against the real RabbitMQ (feature `opentelemetry`): the W3C
//! context a message carries is the parent of its `process` span, rung and
//! dead-letter copies carry the failed attempt's context on, and bad or
//! missing context starts a new trace without failing the delivery.
//!
//! One global subscriber (tracing-opentelemetry over the SDK's in-memory
//! exporter, plus a log capture) serves every test; each test reads only the
//! spans of its own queue.
#![allow(unreachable_pub, missing_docs, clippy::disallowed_methods)]

#[path = "../common/mod.rs"]
mod common;

#[path = "../broker/support.rs"]
mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use acemq::layers::Properties;
use acemq::{BoxError, Delivery};
use lapin::types::FieldTable;
use opentelemetry::propagation::{TextMapCompositePropagator, TextMapPropagator};
use opentelemetry::trace::{SpanId, Status, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tower::service_fn;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use support::{
    eventually, field_table, long_str, message_headers, retry_config, start_consuming,
    topology_queues, unique, Broker, CapturedLogs, QueueCleanup,
};

struct Telemetry {
    exporter: InMemorySpanExporter,
    logs: CapturedLogs,
    /// What a `fmt` layer beside the OpenTelemetry one wrote.
    fmt: FmtCapture,
}

/// A `fmt` layer's output, kept in memory.
#[derive(Clone, Default)]
struct FmtCapture(Arc<Mutex<Vec<u8>>>);

impl FmtCapture {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl std::io::Write for FmtCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for FmtCapture {
    type Writer = FmtCapture;
    fn make_writer(&'a self) -> FmtCapture {
        self.clone()
    }
}

/// Installs the global subscriber and W3C propagator once.
fn telemetry() -> &'static Telemetry {
    static T: OnceLock<Telemetry> = OnceLock::new();
    T.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let tracer = provider.tracer("acemq-otel-test");
        opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(BaggagePropagator::new()),
        ]));
        let logs = CapturedLogs::default();
        let filter = tracing_subscriber::filter::Targets::new()
            .with_target("acemq", tracing::Level::DEBUG)
            .with_target("acemq_layers", tracing::Level::DEBUG)
            .with_target("otel", tracing::Level::INFO)
            .with_target("lapin", tracing::Level::WARN);
        let fmt = FmtCapture::default();
        let subscriber = tracing_subscriber::registry()
            .with(filter)
            .with(tracing_opentelemetry::layer().with_tracer(tracer))
            .with(logs.clone())
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(fmt.clone()),
            );
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        Telemetry {
            exporter,
            logs,
            fmt,
        }
    })
}

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn attr_i64(span: &SpanData, key: &str) -> Option<i64> {
    match attr(span, key)? {
        Value::I64(n) => Some(*n),
        _ => None,
    }
}

fn attr_str(span: &SpanData, key: &str) -> Option<String> {
    match attr(span, key)? {
        Value::String(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// The finished spans of `queue` (process and attempt spans carry
/// `acemq.queue`), in start order.
fn spans_of(queue: &str) -> Vec<SpanData> {
    let mut spans: Vec<SpanData> = telemetry()
        .exporter
        .get_finished_spans()
        .expect("finished spans")
        .into_iter()
        .filter(|s| attr_str(s, "acemq.queue").as_deref() == Some(queue))
        .collect();
    spans.sort_by_key(|s| s.start_time);
    spans
}

/// Waits until `queue` has `n` finished spans named `name`.
async fn wait_spans(queue: &str, name: &str, n: usize) -> Vec<SpanData> {
    let done = eventually(Duration::from_secs(15), || async {
        spans_of(queue).iter().filter(|s| s.name == name).count() >= n
    })
    .await;
    let spans = spans_of(queue);
    assert!(
        done,
        "{n} spans {name:?} of {queue}, got: {:#?}",
        brief(&spans)
    );
    spans
}

/// A W3C `traceparent` for a span context.
fn traceparent(trace_id: TraceId, span_id: SpanId) -> String {
    format!("00-{trace_id}-{span_id}-01")
}

/// One line per span: name, ids, parent, attempt, status, links.
fn brief(spans: &[SpanData]) -> Vec<String> {
    spans
        .iter()
        .map(|s| {
            format!(
                "{name:<28} trace={trace} span={span} parent={parent} attempt={attempt:?} \
                 outcome={outcome:?} status={status:?} links={links:?}",
                name = s.name,
                trace = s.span_context.trace_id(),
                span = s.span_context.span_id(),
                parent = s.parent_span_id,
                attempt = attr_i64(s, "acemq.attempt"),
                outcome = attr_str(s, "acemq.outcome"),
                status = s.status,
                links = s
                    .links
                    .links
                    .iter()
                    .map(|l| format!("{}/{}", l.span_context.trace_id(), l.span_context.span_id()))
                    .collect::<Vec<_>>(),
            )
        })
        .collect()
}

/// A producer span of the test's own, and its `traceparent`.
fn producer(name: &str) -> (tracing::Span, String, TraceId, SpanId) {
    let span = tracing::info_span!("test.publish", otel.name = name, otel.kind = "producer");
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    assert!(sc.is_valid(), "the test's producer span has a context");
    let tp = traceparent(sc.trace_id(), sc.span_id());
    (span, tp, sc.trace_id(), sc.span_id())
}

/// Checks that no span attribute, span event or captured log line holds `needle`.
fn assert_nowhere(needle: &str, spans: &[SpanData]) {
    for s in spans {
        for kv in &s.attributes {
            assert!(
                !kv.value.as_str().contains(needle),
                "span {} attribute {} holds the body",
                s.name,
                kv.key
            );
        }
        for e in &s.events.events {
            assert!(
                !e.name.contains(needle),
                "span {} event holds the body",
                s.name
            );
            for kv in &e.attributes {
                assert!(
                    !kv.value.as_str().contains(needle),
                    "an event attribute holds the body"
                );
            }
        }
    }
    for (level, target, text) in telemetry().logs.events() {
        assert!(
            !text.contains(needle),
            "a {level} log line of {target} holds the body: {text}"
        );
    }
}

#[tokio::test]
async fn a_published_trace_context_is_the_parent_and_link_of_the_process_span() {
    telemetry();
    let q = unique("otel.one");
    let config = support::plain_config(&q);
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let seen = seen.clone();
        service_fn(move |d: Delivery| {
            let seen = seen.clone();
            async move {
                let tp = d
                    .headers()
                    .get("traceparent")
                    .and_then(|v| v.as_str().map(str::to_owned));
                seen.lock().unwrap().push(tp);
                Ok::<(), BoxError>(())
            }
        })
    };
    let running = start_consuming(config, &q, handler).await;
    let (span, tp, trace_id, span_id) = producer(&format!("send {q}"));
    // Through acemq's own publisher, inside the producer span: it injects.
    running
        .publisher()
        .publish("", &q, b"card 4111-1111-1111-1111", {
            let mut p = Properties::default();
            p.message_id = Some("order-1".to_owned());
            p.correlation_id = Some("conv-7".to_owned());
            p
        })
        .instrument(span)
        .await
        .expect("published");

    let spans = wait_spans(&q, &format!("process {q}"), 1).await;
    running.drain().await.expect("clean drain");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [Some(tp.clone())],
        "the publisher injected the producer's context"
    );
    let process = &spans[0];
    assert_eq!(
        process.span_context.trace_id(),
        trace_id,
        "one trace: {:#?}",
        brief(&spans)
    );
    assert_eq!(process.parent_span_id, span_id, "child of the producer");
    assert!(process.parent_span_is_remote);
    let links: Vec<_> = process
        .links
        .links
        .iter()
        .map(|l| l.span_context.span_id())
        .collect();
    assert_eq!(links, [span_id], "linked to the creation context");
    assert_eq!(process.span_kind, opentelemetry::trace::SpanKind::Consumer);
    assert_eq!(
        attr_str(process, "messaging.system").as_deref(),
        Some("rabbitmq")
    );
    assert_eq!(
        attr_str(process, "messaging.operation.type").as_deref(),
        Some("process")
    );
    assert_eq!(
        attr_str(process, "messaging.destination.name").as_deref(),
        Some("")
    );
    assert_eq!(
        attr_str(process, "messaging.rabbitmq.destination.routing_key").as_deref(),
        Some(q.as_str())
    );
    assert_eq!(
        attr_str(process, "messaging.message.id").as_deref(),
        Some("order-1")
    );
    assert_eq!(
        attr_str(process, "messaging.message.conversation_id").as_deref(),
        Some("conv-7")
    );
    assert_eq!(attr_i64(process, "messaging.message.body.size"), Some(24));
    assert!(attr_i64(process, "messaging.rabbitmq.message.delivery_tag").is_some());
    assert_eq!(attr_i64(process, "acemq.attempt"), Some(1));
    assert_eq!(attr_str(process, "acemq.outcome").as_deref(), Some("ack"));
    assert_eq!(process.status, Status::Unset);
    assert_nowhere("4111", &spans);
}

#[tokio::test]
async fn a_message_failing_into_the_dead_letter_queue_is_one_trace_through_every_attempt() {
    telemetry();
    let q = unique("otel.dlq");
    // Attempt 1 fails: 200ms in process. Attempt 2 fails: 400ms on the rung.
    // Attempt 3 fails: the last of 3, dead-lettered.
    let config = retry_config(
        &q,
        3,
        Duration::from_millis(200),
        Duration::from_millis(400),
        Duration::from_millis(400),
    );
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let mut broker = Broker::new().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let seen = seen.clone();
        service_fn(move |d: Delivery| {
            let seen = seen.clone();
            async move {
                let h = |k: &str| {
                    d.headers()
                        .get(k)
                        .and_then(|v| v.as_str().map(str::to_owned))
                };
                seen.lock().unwrap().push((
                    d.attempt(),
                    h("traceparent"),
                    h("x-acemq-original-traceparent"),
                ));
                Err::<(), BoxError>(format!("attempt {} fails", d.attempt()).into())
            }
        })
    };
    let running = start_consuming(config, &q, handler).await;
    let (_span, tp, trace_id, producer_id) = producer(&format!("send {q}"));
    broker
        .publish(
            &q,
            b"secret-body-5555",
            field_table(vec![("traceparent", long_str(&tp))]),
        )
        .await;

    let dlq = format!("{q}.dlq");
    let dead = broker
        .get_within(&dlq, Duration::from_secs(15))
        .await
        .expect("the message reached the dead-letter queue");
    let spans = wait_spans(&q, &format!("process {q}"), 2).await;
    running.drain().await.expect("clean drain");
    println!("trace of a message failing twice then dead-lettered ({q}):");
    println!("  producer (test)              trace={trace_id} span={producer_id}");
    for line in brief(&spans) {
        println!("  {line}");
    }

    let names: Vec<_> = spans.iter().map(|s| s.name.to_string()).collect();
    assert_eq!(
        names,
        [
            format!("process {q}"),
            format!("attempt {q}"),
            format!("process {q}")
        ],
        "{:#?}",
        brief(&spans)
    );
    let (first, retry, last) = (&spans[0], &spans[1], &spans[2]);
    for s in &spans {
        assert_eq!(
            s.span_context.trace_id(),
            trace_id,
            "one trace: {:#?}",
            brief(&spans)
        );
    }
    let attempts: Vec<_> = spans.iter().map(|s| attr_i64(s, "acemq.attempt")).collect();
    assert_eq!(attempts, [Some(1), Some(2), Some(3)]);
    // Delivery 1 (attempts 1 and 2 in process) is the producer's child; the
    // in-process retry is its child; delivery 2, off the rung, is the child
    // of delivery 1 and links to the producer (the creation context).
    assert_eq!(first.parent_span_id, producer_id);
    assert_eq!(retry.parent_span_id, first.span_context.span_id());
    assert_eq!(last.parent_span_id, first.span_context.span_id());
    let link_of = |s: &SpanData| {
        s.links
            .links
            .iter()
            .map(|l| l.span_context.span_id())
            .collect::<Vec<_>>()
    };
    assert_eq!(link_of(first), [producer_id]);
    assert_eq!(
        link_of(last),
        [producer_id],
        "the rung copy kept the creation context"
    );
    assert_eq!(
        attr_str(first, "acemq.outcome").as_deref(),
        Some("retry-broker")
    );
    assert_eq!(
        attr_str(last, "acemq.outcome").as_deref(),
        Some("dead-lettered")
    );
    assert_eq!(
        attr_str(last, "acemq.dead_letter.reason").as_deref(),
        Some("max-attempts")
    );
    match &last.status {
        Status::Error { description } => assert!(
            description.starts_with("max-attempts: ") && description.contains("attempt 3 fails"),
            "{description}"
        ),
        other => panic!("the dead-lettered delivery's span is an error, got {other:?}"),
    }
    assert_eq!(
        first.status,
        Status::Unset,
        "a retried delivery is not an error"
    );

    // On the wire: the rung copy carried delivery 1's context and the
    // producer's; the dead-letter copy carries delivery 2's and the producer's.
    let seen = seen.lock().unwrap().clone();
    let first_tp = traceparent(trace_id, first.span_context.span_id());
    assert_eq!(
        seen,
        [
            (1, Some(tp.clone()), None),
            (2, Some(tp.clone()), None),
            (3, Some(first_tp), Some(tp.clone())),
        ]
    );
    let headers = message_headers(&dead.delivery.properties);
    let h = |k: &str| headers.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    assert_eq!(
        h("traceparent"),
        Some(traceparent(trace_id, last.span_context.span_id()))
    );
    assert_eq!(h("x-acemq-original-traceparent"), Some(tp));
    assert_nowhere("secret-body", &spans);
}

#[tokio::test]
async fn a_delivery_without_traceparent_starts_a_new_trace() {
    telemetry();
    let q = unique("otel.root");
    let config = support::plain_config(&q);
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let mut broker = Broker::new().await;
    let running = start_consuming(
        config,
        &q,
        service_fn(|_d: Delivery| async { Ok::<(), BoxError>(()) }),
    )
    .await;
    broker.publish(&q, b"a", FieldTable::default()).await;
    broker.publish(&q, b"b", FieldTable::default()).await;
    let spans = wait_spans(&q, &format!("process {q}"), 2).await;
    running.drain().await.expect("clean drain");
    for s in &spans {
        assert_eq!(
            s.parent_span_id,
            SpanId::INVALID,
            "a root: {:#?}",
            brief(&spans)
        );
        assert!(s.links.links.is_empty());
        assert_eq!(attr_str(s, "acemq.outcome").as_deref(), Some("ack"));
    }
    assert_ne!(
        spans[0].span_context.trace_id(),
        spans[1].span_context.trace_id(),
        "a trace each"
    );
}

#[tokio::test]
async fn a_malformed_traceparent_starts_a_new_trace_with_one_warning_and_is_handled() {
    telemetry();
    let q = unique("otel.malformed");
    let config = support::plain_config(&q);
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let mut broker = Broker::new().await;
    let handled = Arc::new(AtomicU32::new(0));
    let handler = {
        let handled = handled.clone();
        service_fn(move |_d: Delivery| {
            handled.fetch_add(1, Ordering::Relaxed);
            async { Ok::<(), BoxError>(()) }
        })
    };
    let running = start_consuming(config, &q, handler).await;
    let bad = "00-not-a-trace-context-01";
    broker
        .publish(&q, b"x", field_table(vec![("traceparent", long_str(bad))]))
        .await;
    let spans = wait_spans(&q, &format!("process {q}"), 1).await;
    running.drain().await.expect("clean drain");
    assert_eq!(
        broker.ready(&q).await,
        Some(0),
        "acknowledged, not requeued"
    );
    assert_eq!(handled.load(Ordering::Relaxed), 1, "handled, not failed");
    let s = &spans[0];
    assert_eq!(s.parent_span_id, SpanId::INVALID, "a root");
    assert!(s.links.links.is_empty());
    assert_eq!(attr_str(s, "acemq.outcome").as_deref(), Some("ack"));
    let warnings: Vec<_> = telemetry()
        .logs
        .acemq_at_least(tracing::Level::WARN)
        .into_iter()
        .filter(|(_, _, text)| text.contains("traceparent") && text.contains(q.as_str()))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning: {warnings:#?}");
    assert!(warnings[0].2.contains(bad), "{warnings:?}");
    // The warning is also an event of the delivery's span.
    let events = s
        .events
        .events
        .iter()
        .filter(|e| e.name.contains("traceparent"))
        .count();
    assert_eq!(events, 1, "{:?}", s.events.events);
    // A propagator that reads nothing out of it says the same of its value.
    let cx = TraceContextPropagator::new().extract(&std::collections::HashMap::from([(
        "traceparent".to_owned(),
        bad.to_owned(),
    )]));
    assert!(!cx.span().span_context().is_valid());
}

#[tokio::test]
async fn lapin_logs_a_returned_message_body_and_all_under_one_target_that_the_examples_turn_off() {
    telemetry();
    let q = unique("otel.returned");
    let config = support::plain_config(&q);
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let running = start_consuming(
        config,
        &q,
        service_fn(|_d: Delivery| async { Ok::<(), BoxError>(()) }),
    )
    .await;
    let nowhere = unique("otel.no-such-queue");
    let body = format!("returned-body-{}", std::process::id());
    let result = running
        .publisher()
        .publish("", &nowhere, body.as_bytes(), Properties::default())
        .await;
    running.drain().await.expect("clean drain");
    assert!(
        matches!(result, Err(acemq::layers::PublishError::Unroutable { .. })),
        "{result:?}"
    );
    let logged: Vec<_> = telemetry()
        .logs
        .events()
        .into_iter()
        .filter(|(_, _, text)| {
            text.contains(&body) || text.contains(&format!("{:?}", body.as_bytes()))
        })
        .collect();
    // lapin-4.12.3 src/returned_messages.rs: `warn!(?message, "Server returned us a message")`.
    assert!(
        !logged.is_empty()
            && logged
                .iter()
                .all(|(l, t, _)| *l == tracing::Level::WARN && t == "lapin::returned_messages"),
        "{logged:#?}"
    );
    // The examples' default filter drops lapin's events (its ERRORs about a
    // lost connection included) and keeps acemq's.
    let filter = tracing_subscriber::EnvFilter::new(acemq::log::DEFAULT_FILTER);
    let logs = CapturedLogs::default();
    let subscriber = tracing_subscriber::registry()
        .with(filter)
        .with(logs.clone());
    tracing::subscriber::with_default(subscriber, || {
        tracing::warn!(target: "lapin::returned_messages", "returned");
        tracing::error!(target: "lapin::io_loop", "error doing IO");
        tracing::warn!(target: "acemq::app::supervisor::connection", "kept");
    });
    let kept: Vec<_> = logs.events().into_iter().map(|(_, t, _)| t).collect();
    assert_eq!(kept, ["acemq::app::supervisor::connection"]);
    for example in [
        include_str!("../../examples/shop/main.rs"),
        include_str!("../../examples/axum_side_by_side.rs"),
        include_str!("../../examples/tracing_otlp.rs"),
        include_str!("../../examples/invoices/main.rs"),
        include_str!("../../examples/outbox.rs"),
        include_str!("../../examples/replay.rs"),
        include_str!("../../examples/own_consumer.rs"),
        include_str!("../../examples/rpc.rs"),
    ] {
        assert!(example.contains("acemq::log::DEFAULT_FILTER"));
    }
}

#[tokio::test]
async fn a_handler_publishing_carries_its_delivery_span_and_the_baggage_on() {
    telemetry();
    let q = unique("otel.forward");
    let out = format!("{q}.out");
    let config = support::plain_config(&q);
    let mut queues = topology_queues(&config);
    queues.push(out.clone());
    let _cleanup = QueueCleanup::new(queues);
    let mut broker = Broker::new().await;
    broker
        .declare(&out, FieldTable::default())
        .await
        .expect("declared");
    let publisher: Arc<OnceLock<acemq::Publisher>> = Arc::new(OnceLock::new());
    let handler = {
        let publisher = publisher.clone();
        let out = out.clone();
        service_fn(move |_d: Delivery| {
            let publisher = publisher.get().cloned();
            let out = out.clone();
            async move {
                let publisher = publisher.ok_or("started")?;
                publisher
                    .publish("", &out, b"shipped", Properties::default())
                    .await?;
                Ok::<(), BoxError>(())
            }
        })
    };
    let running = start_consuming(config, &q, handler).await;
    let _ = publisher.set(running.publisher());
    let (_span, tp, trace_id, producer_id) = producer(&format!("send {q}"));
    broker
        .publish(
            &q,
            b"order",
            field_table(vec![
                ("traceparent", long_str(&tp)),
                ("baggage", long_str("tenant=acme")),
            ]),
        )
        .await;
    let forwarded = broker
        .get_within(&out, Duration::from_secs(10))
        .await
        .expect("the handler published");
    let spans = wait_spans(&q, &format!("process {q}"), 1).await;
    running.drain().await.expect("clean drain");
    let process = &spans[0];
    assert_eq!(process.parent_span_id, producer_id);
    let headers = message_headers(&forwarded.delivery.properties);
    let h = |k: &str| headers.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    assert_eq!(
        h("traceparent"),
        Some(traceparent(trace_id, process.span_context.span_id())),
        "the handler's publish is a child of the delivery's span"
    );
    assert_eq!(h("baggage").as_deref(), Some("tenant=acme"));
    assert_eq!(h("x-acemq-original-traceparent"), None, "not a copy");
}

/// The attribute names a document promises for the `process` span: the
/// backticked `messaging.*` and `acemq.*` names of `text` (between `from`
/// and the next `## ` heading), span names left out.
fn promised(text: &str, from: &str) -> Vec<String> {
    let section = text.split(from).nth(1).expect("the section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut names: Vec<String> = section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| {
            (w.starts_with("messaging.") || w.starts_with("acemq."))
                && w.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '.' || c == '_')
                && *w != "acemq.process"
        })
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[tokio::test]
async fn every_attribute_the_docs_promise_is_exported_and_none_is_in_a_fmt_line() {
    telemetry();
    let q = unique("otel.promised");
    let mut config = support::plain_config(&q);
    config.queues[0].dead_letter = true;
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let handler = service_fn(|d: Delivery| async move {
        if d.body().as_ref() == b"bad" {
            tracing::info!(outcome = "rejected", "order rejected");
            return Err::<(), BoxError>(acemq::Reject::new("not an order").into());
        }
        tracing::info!(outcome = "handled", "order handled");
        Ok(())
    });
    let running = start_consuming(config, &q, handler).await;
    for (body, id) in [(&b"good"[..], "order-good"), (&b"bad"[..], "order-bad")] {
        let mut p = Properties::default();
        p.message_id = Some(id.to_owned());
        p.correlation_id = Some("conv-1".to_owned());
        running
            .publisher()
            .publish("", &q, body, p)
            .await
            .expect("published");
    }
    let spans = wait_spans(&q, &format!("process {q}"), 2).await;
    running.drain().await.expect("clean drain");
    let process: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == format!("process {q}"))
        .collect();
    let of = |id: &str| {
        *process
            .iter()
            .find(|s| attr_str(s, "messaging.message.id").as_deref() == Some(id))
            .unwrap_or_else(|| panic!("the span of {id}: {:#?}", brief(&spans)))
    };
    let (good, bad) = (of("order-good"), of("order-bad"));
    let docs = promised(
        include_str!("../../docs/tracing.md"),
        "The process span's attributes:",
    );
    let readme = promised(
        include_str!("../../README.md"),
        "## Tracing and OpenTelemetry",
    );
    assert!(docs.len() >= 13, "docs/tracing.md's table: {docs:?}");
    for name in docs.iter().chain(&readme) {
        let on = |s: &SpanData| attr(s, name).is_some();
        if name == "acemq.dead_letter.reason" {
            assert!(
                on(bad) && !on(good),
                "{name}: only on a dead-lettered delivery"
            );
        } else {
            assert!(on(good) && on(bad), "{name} is promised and not exported");
        }
    }
    assert_eq!(good.span_kind, opentelemetry::trace::SpanKind::Consumer);
    assert_eq!(attr_str(good, "acemq.outcome").as_deref(), Some("ack"));
    assert_eq!(
        attr_str(bad, "acemq.outcome").as_deref(),
        Some("dead-lettered")
    );
    assert_eq!(
        attr_str(bad, "acemq.dead_letter.reason").as_deref(),
        Some("rejected")
    );
    assert!(
        matches!(&bad.status, Status::Error { description } if description.starts_with("rejected: "))
    );

    // The fmt layer beside the OpenTelemetry one: the person's fields, and
    // of OpenTelemetry's only the name and kind fields.
    let lines: Vec<String> = telemetry()
        .fmt
        .lines()
        .into_iter()
        .filter(|l| {
            l.contains(&format!("queue={q} "))
                && (l.contains("order handled") || l.contains("order rejected"))
        })
        .collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    for line in &lines {
        println!("{} characters: {line}", line.len());
        assert!(
            line.contains("delivery_tag=")
                && line.contains("message_id=\"order-")
                && line.contains("attempt=1"),
            "{line}"
        );
        for attribute in &docs {
            assert!(!line.contains(attribute.as_str()), "{attribute} in {line}");
        }
    }
}

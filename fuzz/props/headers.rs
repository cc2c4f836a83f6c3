//! The `headers` target's property: a delivery's headers as a broker sends
//! them (a lapin `FieldTable` of arbitrary values, with arbitrary values
//! under every header acemq gives a meaning to), read through every public
//! reader.
//!
//! Shared by `fuzz/fuzz_targets/headers.rs` and the replay test
//! (`tests/fuzz_corpus.rs`): both decode the bytes with [`decode`].

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use acemq::convert::{
    headers_from_table, properties_from_lapin, properties_to_lapin, table_from_headers,
    try_properties_to_lapin, try_table_from_headers,
};
use acemq::lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use acemq::lapin::BasicProperties;
use acemq_layers::dead_letter::{
    ATTEMPTS_HEADER, DEAD_LETTERED_AT_HEADER, ERROR_HEADER, MAX_ERROR_LEN, QUEUE_HEADER,
    REASON_HEADER,
};
use acemq_layers::headers::{
    DELIVERY_COUNT_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER,
};
use acemq_layers::{
    parse_attempt, BoxError, DeadLetter, Decision, Delivery, Headers, Outgoing, Properties,
    Publish, PublishError, Reason, RedeliveryLimit, Reject, Value, ATTEMPT_HEADER, MAX_ATTEMPT,
};
use arbitrary::{Arbitrary, Unstructured};
use tower::Service;

/// An AMQP field value as the broker can send it.
#[derive(Arbitrary, Debug)]
pub(crate) enum AValue {
    Boolean(bool),
    ShortShortInt(i8),
    ShortShortUInt(u8),
    ShortInt(i16),
    ShortUInt(u16),
    LongInt(i32),
    LongUInt(u32),
    LongLongInt(i64),
    Float(f32),
    Double(f64),
    Decimal(u8, u32),
    ShortString(String),
    LongString(Vec<u8>),
    Array(Vec<AValue>),
    Timestamp(u64),
    Table(Vec<(String, AValue)>),
    ByteArray(Vec<u8>),
    Void,
}

/// One entry of `x-death`, with the keys RabbitMQ writes (each optional and
/// of any type) and any others.
#[derive(Arbitrary, Debug)]
pub(crate) struct XDeathEntry {
    count: Option<AValue>,
    reason: Option<AValue>,
    queue: Option<AValue>,
    time: Option<AValue>,
    exchange: Option<AValue>,
    routing_keys: Option<AValue>,
    other: Vec<(String, AValue)>,
}

/// `x-death`: usually an array of tables, but a broker (or a producer) may
/// put anything there.
#[derive(Arbitrary, Debug)]
pub(crate) enum XDeath {
    Entries(Vec<XDeathEntry>),
    Other(AValue),
}

/// What the handler below the dead-letter and redelivery-limit layers does.
#[derive(Arbitrary, Debug)]
pub(crate) enum Handler {
    Ack,
    Reject(String),
    Fail(String),
}

/// The fuzzer's input: one delivery.
#[derive(Arbitrary, Debug)]
pub(crate) struct Input {
    attempt: Option<AValue>,
    original_exchange: Option<AValue>,
    original_routing_key: Option<AValue>,
    x_death: Option<XDeath>,
    delivery_count: Option<AValue>,
    acquired_count: Option<AValue>,
    traceparent: Option<AValue>,
    reason: Option<AValue>,
    other: Vec<(String, AValue)>,
    queue: String,
    exchange: String,
    routing_key: String,
    body: Vec<u8>,
    delivery_tag: u64,
    redelivered: bool,
    message_id: Option<String>,
    max_redeliveries: u32,
    handler: Handler,
    /// The message's other properties, as the broker sends them.
    broker_properties: AProperties,
    /// Headers a handler or producer adds before publishing (any name).
    user_headers: Vec<(String, AValue)>,
    /// Properties a handler or producer sets before publishing.
    user_properties: AProperties,
}

/// AMQP basic properties other than headers.
#[derive(Arbitrary, Debug)]
pub(crate) struct AProperties {
    content_type: Option<String>,
    content_encoding: Option<String>,
    delivery_mode: Option<u8>,
    priority: Option<u8>,
    correlation_id: Option<String>,
    reply_to: Option<String>,
    expiration: Option<String>,
    message_id: Option<String>,
    timestamp: Option<u64>,
    kind: Option<String>,
    user_id: Option<String>,
    app_id: Option<String>,
}

impl AProperties {
    fn to_properties(&self) -> Properties {
        let mut p = Properties::default();
        p.content_type = self.content_type.clone();
        p.content_encoding = self.content_encoding.clone();
        p.delivery_mode = self.delivery_mode;
        p.priority = self.priority;
        p.correlation_id = self.correlation_id.clone();
        p.reply_to = self.reply_to.clone();
        p.expiration = self.expiration.clone();
        p.message_id = self.message_id.clone();
        p.timestamp = self.timestamp;
        p.kind = self.kind.clone();
        p.user_id = self.user_id.clone();
        p.app_id = self.app_id.clone();
        p
    }

    /// lapin's properties for these, as a broker can send them (short
    /// strings cut to 255 bytes), with `headers`.
    fn to_lapin(&self, headers: FieldTable) -> BasicProperties {
        let s = |v: &Option<String>| v.clone().map(short);
        let mut b = BasicProperties::default().with_headers(headers);
        if let Some(v) = s(&self.content_type) {
            b = b.with_content_type(v);
        }
        if let Some(v) = s(&self.content_encoding) {
            b = b.with_content_encoding(v);
        }
        if let Some(v) = self.delivery_mode {
            b = b.with_delivery_mode(v);
        }
        if let Some(v) = self.priority {
            b = b.with_priority(v);
        }
        if let Some(v) = s(&self.correlation_id) {
            b = b.with_correlation_id(v);
        }
        if let Some(v) = s(&self.reply_to) {
            b = b.with_reply_to(v);
        }
        if let Some(v) = s(&self.expiration) {
            b = b.with_expiration(v);
        }
        if let Some(v) = s(&self.message_id) {
            b = b.with_message_id(v);
        }
        if let Some(v) = self.timestamp {
            b = b.with_timestamp(v);
        }
        if let Some(v) = s(&self.kind) {
            b = b.with_type(v);
        }
        if let Some(v) = s(&self.user_id) {
            b = b.with_user_id(v);
        }
        if let Some(v) = s(&self.app_id) {
            b = b.with_app_id(v);
        }
        b
    }
}

/// Whether every string property fits an AMQP short string:
/// `try_properties_to_lapin` refuses it otherwise, and `properties_to_lapin`
/// leaves it out.
fn properties_fit(p: &Properties) -> bool {
    [
        &p.content_type,
        &p.content_encoding,
        &p.correlation_id,
        &p.reply_to,
        &p.message_id,
        &p.kind,
        &p.user_id,
        &p.app_id,
    ]
    .into_iter()
    .flatten()
    .all(|v| v.len() <= 255)
}

/// A value as a handler builds it (names of any length).
fn value(v: AValue) -> Value {
    match v {
        AValue::Boolean(b) => Value::Bool(b),
        AValue::ShortShortInt(n) => Value::I8(n),
        AValue::ShortShortUInt(n) => Value::U8(n),
        AValue::ShortInt(n) => Value::I16(n),
        AValue::ShortUInt(n) => Value::U16(n),
        AValue::LongInt(n) => Value::I32(n),
        AValue::LongUInt(n) => Value::U32(n),
        AValue::LongLongInt(n) => Value::I64(n),
        AValue::Float(f) => Value::F32(f),
        AValue::Double(f) => Value::F64(f),
        AValue::Decimal(scale, value) => Value::Decimal { scale, value },
        AValue::ShortString(s) => Value::String(s.into_bytes()),
        AValue::LongString(b) => Value::String(b),
        AValue::Array(a) => Value::Array(a.into_iter().map(value).collect()),
        AValue::Timestamp(t) => Value::Timestamp(t),
        AValue::Table(t) => Value::Table(t.into_iter().map(|(k, v)| (k, value(v))).collect()),
        AValue::ByteArray(b) => Value::Bytes(b),
        AValue::Void => Value::Void,
    }
}

/// Decodes `data` as the fuzz target does (`fuzz_target!(|input: Input|)`
/// takes the rest of the bytes), or `None` where it would skip them.
pub(crate) fn decode(data: &[u8]) -> Option<Input> {
    Input::arbitrary_take_rest(Unstructured::new(data)).ok()
}

/// The property, on raw bytes (the replay's entry point).
pub(crate) fn check(data: &[u8]) {
    if let Some(input) = decode(data) {
        check_input(input);
    }
}

/// A header name as an AMQP short string: at most 255 bytes, cut on a
/// character boundary (a broker cannot send a longer one).
fn short(mut s: String) -> ShortString {
    let mut cut = s.len().min(255);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    ShortString::from(s)
}

fn amqp(v: AValue) -> AMQPValue {
    match v {
        AValue::Boolean(b) => AMQPValue::Boolean(b),
        AValue::ShortShortInt(n) => AMQPValue::ShortShortInt(n),
        AValue::ShortShortUInt(n) => AMQPValue::ShortShortUInt(n),
        AValue::ShortInt(n) => AMQPValue::ShortInt(n),
        AValue::ShortUInt(n) => AMQPValue::ShortUInt(n),
        AValue::LongInt(n) => AMQPValue::LongInt(n),
        AValue::LongUInt(n) => AMQPValue::LongUInt(n),
        AValue::LongLongInt(n) => AMQPValue::LongLongInt(n),
        AValue::Float(f) => AMQPValue::Float(f),
        AValue::Double(f) => AMQPValue::Double(f),
        AValue::Decimal(scale, value) => AMQPValue::DecimalValue(DecimalValue { scale, value }),
        AValue::ShortString(s) => AMQPValue::ShortString(short(s)),
        AValue::LongString(b) => AMQPValue::LongString(LongString::from(b)),
        AValue::Array(a) => AMQPValue::FieldArray(FieldArray::from(
            a.into_iter().map(amqp).collect::<Vec<_>>(),
        )),
        AValue::Timestamp(t) => AMQPValue::Timestamp(t),
        AValue::Table(t) => AMQPValue::FieldTable(table(t)),
        AValue::ByteArray(b) => AMQPValue::ByteArray(ByteArray::from(b)),
        AValue::Void => AMQPValue::Void,
    }
}

fn table(entries: Vec<(String, AValue)>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(short(k), amqp(v));
    }
    t
}

fn x_death(x: XDeath) -> AMQPValue {
    match x {
        XDeath::Other(v) => amqp(v),
        XDeath::Entries(entries) => AMQPValue::FieldArray(FieldArray::from(
            entries
                .into_iter()
                .map(|e| {
                    let mut t = table(e.other);
                    for (k, v) in [
                        ("count", e.count),
                        ("reason", e.reason),
                        ("queue", e.queue),
                        ("time", e.time),
                        ("exchange", e.exchange),
                        ("routing-keys", e.routing_keys),
                    ] {
                        if let Some(v) = v {
                            t.insert(ShortString::from(k), amqp(v));
                        }
                    }
                    AMQPValue::FieldTable(t)
                })
                .collect::<Vec<_>>(),
        )),
    }
}

/// The broker's table for `input`; the known headers are set after the
/// arbitrary ones, so they win a clash of names.
fn broker_table(input: &mut Input) -> FieldTable {
    let mut t = table(std::mem::take(&mut input.other));
    let known = [
        (ATTEMPT_HEADER, input.attempt.take()),
        (ORIGINAL_EXCHANGE_HEADER, input.original_exchange.take()),
        (
            ORIGINAL_ROUTING_KEY_HEADER,
            input.original_routing_key.take(),
        ),
        (DELIVERY_COUNT_HEADER, input.delivery_count.take()),
        ("x-acquired-count", input.acquired_count.take()),
        ("traceparent", input.traceparent.take()),
        (REASON_HEADER, input.reason.take()),
    ];
    for (k, v) in known {
        if let Some(v) = v {
            t.insert(ShortString::from(k), amqp(v));
        }
    }
    if let Some(x) = input.x_death.take() {
        t.insert(ShortString::from("x-death"), x_death(x));
    }
    t
}

/// Two header maps are the same, NaN included (`PartialEq` on floats says a
/// NaN differs from itself).
fn same(a: &Headers, b: &Headers) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// Every value, nested ones included, read through `Value`'s own readers.
fn read_values(headers: &Headers) {
    fn read(v: &Value) {
        let _ = v.as_i64();
        let _ = v.as_str();
        assert!(!v.type_name().is_empty());
        match v {
            Value::Array(a) => a.iter().for_each(read),
            Value::Table(t) => read_values(t),
            Value::String(s) => {
                if let Some(text) = v.as_str() {
                    assert_eq!(text.as_bytes(), &s[..]);
                }
            }
            _ => {}
        }
    }
    for (_, v) in headers.iter() {
        read(v);
    }
}

/// Whether every header name, nested ones included, fits an AMQP short
/// string: `try_table_from_headers` refuses it otherwise, and
/// `table_from_headers` leaves it out.
fn names_fit(headers: &Headers) -> bool {
    fn value_fits(v: &Value) -> bool {
        match v {
            Value::Array(a) => a.iter().all(value_fits),
            Value::Table(t) => names_fit(t),
            _ => true,
        }
    }
    headers.iter().all(|(k, v)| k.len() <= 255 && value_fits(v))
}

/// A publisher that records what it is asked to publish, and confirms it.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(String, Headers)>>>);

impl Publish for Recorder {
    fn publish(
        &self,
        message: Outgoing<'_>,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        self.0
            .lock()
            .unwrap()
            .push((message.queue.to_owned(), message.headers));
        std::future::ready(Ok(()))
    }

    fn redeclare(&self, _queue: &str) -> impl Future<Output = Result<(), PublishError>> + Send {
        std::future::ready(Ok(()))
    }
}

/// Polls `f` to completion: everything below is ready at once (no timer, no
/// I/O), so a `Pending` is a bug of the property, not of the code.
fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1000 {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
    }
    panic!("a future of the in-memory stack did not complete");
}

/// The property: nothing panics, and every reader keeps its promise.
pub(crate) fn check_input(mut input: Input) {
    let table = broker_table(&mut input);

    // 1. The conversion keeps every header, and converts back unchanged.
    let headers = headers_from_table(&table);
    assert_eq!(headers.len(), table.inner().len());
    read_values(&headers);
    assert!(
        names_fit(&headers),
        "a broker's header names are short strings"
    );
    let back = headers_from_table(&table_from_headers(&headers));
    assert!(same(&back, &headers), "{back:?} != {headers:?}");

    // 2. The attempt: absent is 1; otherwise an integer in 1..=MAX_ATTEMPT,
    //    or an error.
    let raw_attempt = headers.get(ATTEMPT_HEADER);
    let parsed = parse_attempt(raw_attempt);
    match (&parsed, raw_attempt) {
        (Ok(n), None) => assert_eq!(*n, 1),
        (Ok(n), Some(v)) => {
            assert!((1..=MAX_ATTEMPT).contains(n), "attempt {n}");
            assert_eq!(v.as_i64(), Some(i64::from(*n)));
        }
        (Err(why), Some(v)) => {
            assert!(!why.is_empty());
            assert!(
                v.as_i64()
                    .is_none_or(|n| n < 1 || n > i64::from(MAX_ATTEMPT)),
                "{v:?} refused: {why}"
            );
        }
        (Err(why), None) => panic!("an absent attempt header refused: {why}"),
    }

    // 3. The delivery built from them, and its accessors.
    // 3a. The broker's properties, converted and back: unchanged, but
    //     the per-message TTL, which a copy does not keep (documented).
    let lapin_props = input.broker_properties.to_lapin(table.clone());
    let mut properties = properties_from_lapin(&lapin_props);
    if input.message_id.is_some() {
        properties.message_id = input.message_id.clone();
    }
    if properties_fit(&properties) {
        let out = properties_to_lapin(&properties, &headers);
        let mut want = properties.clone();
        want.expiration = None;
        assert_eq!(properties_from_lapin(&out), want);
        let out_headers = out
            .headers()
            .as_ref()
            .map(headers_from_table)
            .unwrap_or_default();
        assert!(same(&out_headers, &headers));
    } else {
        // Too long for AMQP: an error from the fallible conversion; the
        // other leaves the property out (with a WARN), and never panics.
        assert!(try_properties_to_lapin(&properties, &headers).is_err());
        let out = properties_to_lapin(&properties, &headers);
        assert!(properties_fit(&properties_from_lapin(&out)));
    }
    let delivery = Delivery::builder()
        .queue(input.queue.as_str())
        .body(input.body.clone())
        .headers(headers.clone())
        .properties(properties.clone())
        .exchange(input.exchange.as_str())
        .routing_key(input.routing_key.as_str())
        .delivery_tag(input.delivery_tag)
        .redelivered(input.redelivered)
        .build();
    assert_eq!(delivery.attempt(), parsed.clone().unwrap_or(1));
    assert!((1..=MAX_ATTEMPT).contains(&delivery.attempt()));
    assert!(same(delivery.headers(), &headers));
    assert_eq!(delivery.properties(), &properties);
    assert_eq!(&delivery.body()[..], &input.body[..]);
    assert_eq!(delivery.queue(), input.queue);
    assert_eq!(&**delivery.queue_arc(), input.queue);
    assert_eq!(delivery.exchange(), input.exchange);
    assert_eq!(delivery.routing_key(), input.routing_key);
    assert_eq!(delivery.delivery_tag(), input.delivery_tag);
    assert_eq!(delivery.redelivered(), input.redelivered);
    assert!(!delivery.token().is_cancelled());
    assert!(!delivery.is_orphaned());
    let want_exchange = headers
        .get(ORIGINAL_EXCHANGE_HEADER)
        .and_then(Value::as_str)
        .unwrap_or(&input.exchange);
    assert_eq!(delivery.original_exchange(), want_exchange);
    let want_key = headers
        .get(ORIGINAL_ROUTING_KEY_HEADER)
        .and_then(Value::as_str)
        .unwrap_or(&input.routing_key);
    assert_eq!(delivery.original_routing_key(), want_key);
    // The body's bytes never show in the debug form, only its length.
    let debug = format!("{delivery:?}");
    assert!(debug.contains(&format!("<{} bytes>", input.body.len())));

    // 4. The reason: the header forms round-trip.
    if let Some(text) = headers.get(REASON_HEADER).and_then(Value::as_str) {
        if let Some(reason) = Reason::from_header(text) {
            assert_eq!(reason.as_str(), text);
            assert_eq!(reason.to_string(), text);
        }
    }

    // 5. A replayed copy's headers: the attempt state gone, the provenance
    //    kept unless the broker dead-lettered the copy out of the queue
    //    itself, the replay's marker added, the rest kept.
    let reset = acemq::replay::reset(headers.clone(), &input.queue);
    let broker_dead_lettered =
        acemq_layers::provenance::dead_lettered_by_broker_from(&headers, &input.queue);
    assert_eq!(
        reset.get(acemq_layers::provenance::REPLAYED_HEADER),
        Some(&Value::Bool(true))
    );
    for (name, value) in headers.iter() {
        if name == acemq_layers::provenance::REPLAYED_HEADER {
            continue;
        }
        let dropped = name == DELIVERY_COUNT_HEADER
            || name == "x-acquired-count"
            || (name.starts_with("x-acemq-")
                && (broker_dead_lettered || !name.starts_with("x-acemq-original-")));
        match reset.get(name) {
            Some(kept) => {
                assert!(!dropped, "{name} kept by reset");
                assert_eq!(format!("{kept:?}"), format!("{value:?}"));
            }
            None => assert!(dropped, "{name} dropped by reset"),
        }
    }
    assert!(reset.len() <= headers.len() + 1);

    // 6. The redelivery bound and the dead-letter copy, as the stack orders
    //    them: dead-letter, redelivery limit, handler.
    let max = input.max_redeliveries.max(1);
    // The larger of the two counts RabbitMQ sends (4.3 adds x-acquired-count).
    let read = |name: &str| headers.get(name).and_then(Value::as_i64);
    let count = match (read(DELIVERY_COUNT_HEADER), read("x-acquired-count")) {
        (Some(d), Some(a)) => Some(d.max(a)),
        (d, a) => d.or(a),
    };
    let over = count.is_some_and(|n| n > i64::from(max));
    let called = Arc::new(Mutex::new(0u32));
    let acks = matches!(input.handler, Handler::Ack);
    let rejects = matches!(input.handler, Handler::Reject(_));
    let handler = {
        let called = called.clone();
        let outcome = input.handler;
        tower::service_fn(move |_: Delivery| {
            *called.lock().unwrap() += 1;
            let result: Result<Decision, BoxError> = match &outcome {
                Handler::Ack => Ok(Decision::Ack),
                Handler::Reject(why) => Err(Reject::new(why.clone()).into()),
                Handler::Fail(why) => Err(why.clone().into()),
            };
            std::future::ready(result)
        })
    };
    let publisher = Recorder::default();
    let mut stack = DeadLetter::new(RedeliveryLimit::new(handler, max), publisher.clone());
    let ready: Result<(), BoxError> = now(std::future::poll_fn(|cx| stack.poll_ready(cx)));
    ready.expect("the in-memory stack is ready");
    let decision = now(stack.call(delivery.clone())).expect("the dead-letter layer settles");
    let calls = *called.lock().unwrap();
    assert_eq!(
        calls,
        u32::from(!over),
        "handler called {calls} times, over = {over}"
    );
    let published = publisher.0.lock().unwrap().clone();
    match &decision {
        Decision::Ack => {
            assert!(!over && acks, "acknowledged: over = {over}, acks = {acks}");
            assert!(published.is_empty());
        }
        Decision::DeadLetter(d) => {
            assert!(d.published, "{d:?}");
            assert!(!acks || over, "{d:?}");
            if over {
                assert_eq!(d.reason, Reason::Redelivered);
            } else if rejects {
                assert_eq!(d.reason, Reason::Rejected);
            }
            assert_eq!(published.len(), 1);
            let (queue, copy) = &published[0];
            assert_eq!(queue, &format!("{}.dlq", input.queue));
            check_copy(&headers, copy, &delivery, d.reason);
        }
        other => panic!("unexpected decision {other:?}"),
    }

    // 7. What a handler or producer publishes: the delivery's headers with
    //    its own added (names of any length), and properties of its own.
    let mut outgoing = headers.clone();
    for (k, v) in input.user_headers {
        outgoing.insert(k, value(v));
    }
    read_values(&outgoing);
    let user = input.user_properties.to_properties();
    if names_fit(&outgoing) && properties_fit(&user) {
        let out = properties_to_lapin(&user, &outgoing);
        let back = out
            .headers()
            .as_ref()
            .map(headers_from_table)
            .unwrap_or_default();
        assert!(same(&back, &outgoing), "{back:?} != {outgoing:?}");
    } else {
        assert!(try_properties_to_lapin(&user, &outgoing).is_err());
        let out = properties_to_lapin(&user, &outgoing);
        let back = out
            .headers()
            .as_ref()
            .map(headers_from_table)
            .unwrap_or_default();
        assert!(names_fit(&back), "a long name is left out: {back:?}");
    }
}

/// A dead-letter copy's headers: the original's, without the broker's
/// counts, with where it came from and why it was dead-lettered.
fn check_copy(original: &Headers, copy: &Headers, delivery: &Delivery, reason: Reason) {
    assert!(copy.get(DELIVERY_COUNT_HEADER).is_none());
    assert!(copy.get("x-acquired-count").is_none());
    let text = |name: &str| copy.get(name).and_then(Value::as_str);
    assert_eq!(text(REASON_HEADER), Some(reason.as_str()));
    assert_eq!(
        text(REASON_HEADER).and_then(Reason::from_header),
        Some(reason)
    );
    let error = text(ERROR_HEADER).expect("the error header is UTF-8 text");
    assert!(error.len() <= MAX_ERROR_LEN, "{} bytes", error.len());
    assert_eq!(text(QUEUE_HEADER), Some(delivery.queue()));
    assert_eq!(
        copy.get(ATTEMPTS_HEADER).and_then(Value::as_i64),
        Some(i64::from(delivery.attempt()))
    );
    assert!(copy
        .get(DEAD_LETTERED_AT_HEADER)
        .and_then(Value::as_i64)
        .is_some());
    // Where the message came from: kept if the original says, else set.
    for (name, fallback) in [
        (ORIGINAL_EXCHANGE_HEADER, delivery.exchange()),
        (ORIGINAL_ROUTING_KEY_HEADER, delivery.routing_key()),
    ] {
        match original.get(name) {
            Some(v) => assert_eq!(format!("{:?}", copy.get(name)), format!("{:?}", Some(v))),
            None => assert_eq!(text(name), Some(fallback)),
        }
    }
    // Every other header of the original is carried unchanged.
    for (name, value) in original.iter() {
        if name == DELIVERY_COUNT_HEADER
            || name == "x-acquired-count"
            || [
                REASON_HEADER,
                ERROR_HEADER,
                QUEUE_HEADER,
                ATTEMPTS_HEADER,
                DEAD_LETTERED_AT_HEADER,
            ]
            .contains(&name)
        {
            continue;
        }
        assert_eq!(
            format!("{:?}", copy.get(name)),
            format!("{:?}", Some(value)),
            "{name}"
        );
    }
    // What the publisher would hand to lapin.
    assert_eq!(try_table_from_headers(copy).is_ok(), names_fit(copy));
    let _ = table_from_headers(copy);
}

//! Conversions between lapin's types and acemq-layers' transport-agnostic ones.

use std::collections::BTreeMap;
use std::sync::Arc;

use acemq_layers::{Delivery, Headers, Properties, Value};
use lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use lapin::BasicProperties;

/// Converts a lapin field table into owned [`Headers`], at any size and
/// depth lapin delivers (amq-protocol's parser bounds the depth where it is
/// patched: `vendor/README.md`). A delivery's headers go through
/// [`try_headers_from_table`] instead, which sets aside a table over
/// [`MAX_HEADER_DEPTH`] or [`MAX_HEADER_VALUES`].
pub fn headers_from_table(table: &FieldTable) -> Headers {
    table
        .inner()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), value_from_amqp(v)))
        .collect()
}

/// The deepest a delivery's headers may nest, tables and arrays counted
/// alike (the headers table itself is level 1). RabbitMQ's own headers
/// nest 3 deep (`x-death`: an array of tables holding arrays).
pub const MAX_HEADER_DEPTH: usize = 32;

/// The most values a delivery's headers may hold, at every depth together.
/// An owned [`Value`] takes about 40 bytes, so this bounds what a
/// publisher's array of one-byte values can make the consumer allocate to
/// about 160 KiB a delivery (the frame that carries it is at most the
/// negotiated `frame_max`, 128 KiB by default).
pub const MAX_HEADER_VALUES: usize = 4_096;

/// Why a delivery's headers were set aside rather than read: a limit of
/// [`try_headers_from_table`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeadersOverLimit {
    /// Tables or arrays nested deeper than [`MAX_HEADER_DEPTH`].
    #[error("headers nested deeper than {MAX_HEADER_DEPTH} levels")]
    TooDeep,
    /// More than [`MAX_HEADER_VALUES`] values.
    #[error("headers holding more than {MAX_HEADER_VALUES} values")]
    TooMany,
}

/// [`headers_from_table`] within [`MAX_HEADER_DEPTH`] and
/// [`MAX_HEADER_VALUES`]: the consumer loop's conversion. It stops at the
/// first level or value over a limit, so its work and memory are bounded
/// whatever the table holds.
pub fn try_headers_from_table(table: &FieldTable) -> Result<Headers, HeadersOverLimit> {
    let mut budget = MAX_HEADER_VALUES;
    table_within(table, 1, &mut budget)
}

fn table_within(
    table: &FieldTable,
    depth: usize,
    budget: &mut usize,
) -> Result<Headers, HeadersOverLimit> {
    if depth > MAX_HEADER_DEPTH {
        return Err(HeadersOverLimit::TooDeep);
    }
    table
        .inner()
        .iter()
        .map(|(k, v)| Ok((k.as_str().to_owned(), value_within(v, depth, budget)?)))
        .collect()
}

fn value_within(
    v: &AMQPValue,
    depth: usize,
    budget: &mut usize,
) -> Result<Value, HeadersOverLimit> {
    *budget = budget.checked_sub(1).ok_or(HeadersOverLimit::TooMany)?;
    Ok(match v {
        AMQPValue::FieldArray(a) => {
            if depth + 1 > MAX_HEADER_DEPTH {
                return Err(HeadersOverLimit::TooDeep);
            }
            Value::Array(
                a.as_slice()
                    .iter()
                    .map(|v| value_within(v, depth + 1, budget))
                    .collect::<Result<_, _>>()?,
            )
        }
        AMQPValue::FieldTable(t) => Value::Table(table_within(t, depth + 1, budget)?),
        scalar => value_from_amqp(scalar),
    })
}

fn value_from_amqp(v: &AMQPValue) -> Value {
    match v {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(n) => Value::I8(*n),
        AMQPValue::ShortShortUInt(n) => Value::U8(*n),
        AMQPValue::ShortInt(n) => Value::I16(*n),
        AMQPValue::ShortUInt(n) => Value::U16(*n),
        AMQPValue::LongInt(n) => Value::I32(*n),
        AMQPValue::LongUInt(n) => Value::U32(*n),
        AMQPValue::LongLongInt(n) => Value::I64(*n),
        AMQPValue::Float(f) => Value::F32(*f),
        AMQPValue::Double(f) => Value::F64(*f),
        AMQPValue::DecimalValue(d) => Value::Decimal {
            scale: d.scale,
            value: d.value,
        },
        AMQPValue::ShortString(s) => Value::String(s.as_str().as_bytes().to_vec()),
        AMQPValue::LongString(s) => Value::String(s.as_bytes().to_vec()),
        AMQPValue::FieldArray(a) => {
            Value::Array(a.as_slice().iter().map(value_from_amqp).collect())
        }
        AMQPValue::Timestamp(t) => Value::Timestamp(*t),
        AMQPValue::FieldTable(t) => Value::Table(headers_from_table(t)),
        AMQPValue::ByteArray(b) => Value::Bytes(b.as_slice().to_vec()),
        AMQPValue::Void => Value::Void,
    }
}

/// The longest header name or string property AMQP carries, in bytes (a
/// short string).
pub const MAX_SHORT_STRING_BYTES: usize = crate::config::Config::MAX_SHORT_STRING_BYTES;

/// A header name or property that AMQP cannot carry: longer than
/// [`MAX_SHORT_STRING_BYTES`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the {what} {shown:?} is {len} bytes long, above AMQP's limit of {MAX_SHORT_STRING_BYTES} \
     bytes for a header name or property: shorten it (or carry the value in a header's value, \
     or in the body, which have no such limit)"
)]
#[non_exhaustive]
pub struct TooLong {
    /// What it is: `header name`, `content_type`, `message_id`, …
    pub what: String,
    /// Its first 40 characters.
    pub shown: String,
    /// Its length in bytes.
    pub len: usize,
}

impl TooLong {
    fn new(what: impl Into<String>, text: &str) -> Self {
        TooLong {
            what: what.into(),
            shown: text.chars().take(40).collect(),
            len: text.len(),
        }
    }
}

/// `text` as a short string, or the error naming it as `what`.
pub(crate) fn short_string(what: &str, text: &str) -> Result<ShortString, TooLong> {
    ShortString::try_new(text).map_err(|_| TooLong::new(what, text))
}

/// Converts owned [`Headers`] back into a lapin field table.
///
/// A header name longer than [`MAX_SHORT_STRING_BYTES`] (at any depth,
/// nested tables included) cannot be carried: it is left out with a WARN
/// naming it. Use [`try_table_from_headers`] to get an error instead.
pub fn table_from_headers(headers: &Headers) -> FieldTable {
    table_with(headers, &mut |e| {
        tracing::warn!("header left out of the message: {e}");
    })
}

/// [`table_from_headers`], failing on the first header name longer than
/// [`MAX_SHORT_STRING_BYTES`] instead of leaving it out.
pub fn try_table_from_headers(headers: &Headers) -> Result<FieldTable, TooLong> {
    let mut first = None;
    let table = table_with(headers, &mut |e| {
        first.get_or_insert(e);
    });
    first.map_or(Ok(table), Err)
}

/// The table of `headers`, every name too long for a short string given to
/// `too_long` and left out.
fn table_with(headers: &Headers, too_long: &mut dyn FnMut(TooLong)) -> FieldTable {
    let mut map: BTreeMap<ShortString, AMQPValue> = BTreeMap::new();
    for (k, v) in headers.iter() {
        match ShortString::try_new(k.to_owned()) {
            Ok(name) => {
                map.insert(name, value_to_amqp(v, too_long));
            }
            Err(_) => too_long(TooLong::new("header name", k)),
        }
    }
    FieldTable::from(map)
}

fn value_to_amqp(v: &Value, too_long: &mut dyn FnMut(TooLong)) -> AMQPValue {
    match v {
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::I8(n) => AMQPValue::ShortShortInt(*n),
        Value::U8(n) => AMQPValue::ShortShortUInt(*n),
        Value::I16(n) => AMQPValue::ShortInt(*n),
        Value::U16(n) => AMQPValue::ShortUInt(*n),
        Value::I32(n) => AMQPValue::LongInt(*n),
        Value::U32(n) => AMQPValue::LongUInt(*n),
        Value::I64(n) => AMQPValue::LongLongInt(*n),
        Value::F32(f) => AMQPValue::Float(*f),
        Value::F64(f) => AMQPValue::Double(*f),
        Value::Decimal { scale, value } => AMQPValue::DecimalValue(DecimalValue {
            scale: *scale,
            value: *value,
        }),
        Value::String(s) => AMQPValue::LongString(LongString::from(s.clone())),
        Value::Bytes(b) => AMQPValue::ByteArray(ByteArray::from(b.clone())),
        Value::Array(a) => AMQPValue::FieldArray(FieldArray::from(
            a.iter()
                .map(|v| value_to_amqp(v, too_long))
                .collect::<Vec<_>>(),
        )),
        Value::Timestamp(t) => AMQPValue::Timestamp(*t),
        Value::Table(t) => AMQPValue::FieldTable(table_with(t, too_long)),
        Value::Void => AMQPValue::Void,
        _ => AMQPValue::Void,
    }
}

fn s(v: &Option<ShortString>) -> Option<String> {
    v.as_ref().map(|s| s.as_str().to_owned())
}

/// Converts lapin's basic properties (other than headers).
pub fn properties_from_lapin(p: &BasicProperties) -> Properties {
    let mut out = Properties::default();
    out.content_type = s(p.content_type());
    out.content_encoding = s(p.content_encoding());
    out.delivery_mode = *p.delivery_mode();
    out.priority = *p.priority();
    out.correlation_id = s(p.correlation_id());
    out.reply_to = s(p.reply_to());
    out.expiration = s(p.expiration());
    out.message_id = s(p.message_id());
    out.timestamp = *p.timestamp();
    out.kind = s(p.kind());
    out.user_id = s(p.user_id());
    out.app_id = s(p.app_id());
    out
}

/// Builds lapin basic properties from [`Properties`] and headers.
///
/// A string property (content type, message id, …) or header name longer
/// than [`MAX_SHORT_STRING_BYTES`] cannot be carried: it is left out with a
/// WARN naming it. Use [`try_properties_to_lapin`] to get an error instead.
pub fn properties_to_lapin(p: &Properties, headers: &Headers) -> BasicProperties {
    properties_with(p, headers, &mut |e| {
        tracing::warn!("left out of the message: {e}");
    })
}

/// [`properties_to_lapin`], failing on the first property or header name
/// longer than [`MAX_SHORT_STRING_BYTES`] instead of leaving it out.
pub fn try_properties_to_lapin(
    p: &Properties,
    headers: &Headers,
) -> Result<BasicProperties, TooLong> {
    let mut first = None;
    let props = properties_with(p, headers, &mut |e| {
        first.get_or_insert(e);
    });
    first.map_or(Ok(props), Err)
}

fn properties_with(
    p: &Properties,
    headers: &Headers,
    too_long: &mut dyn FnMut(TooLong),
) -> BasicProperties {
    let mut short = |what: &str, v: &Option<String>| -> Option<ShortString> {
        short_string(what, v.as_ref()?).map_err(&mut *too_long).ok()
    };
    let mut b = BasicProperties::default();
    if let Some(v) = short("content_type", &p.content_type) {
        b = b.with_content_type(v);
    }
    if let Some(v) = short("content_encoding", &p.content_encoding) {
        b = b.with_content_encoding(v);
    }
    if let Some(v) = p.delivery_mode {
        b = b.with_delivery_mode(v);
    }
    if let Some(v) = p.priority {
        b = b.with_priority(v);
    }
    if let Some(v) = short("correlation_id", &p.correlation_id) {
        b = b.with_correlation_id(v);
    }
    if let Some(v) = short("reply_to", &p.reply_to) {
        b = b.with_reply_to(v);
    }
    // A per-message TTL is not copied: the copy's wait is the rung's TTL.
    if let Some(v) = short("message_id", &p.message_id) {
        b = b.with_message_id(v);
    }
    if let Some(v) = p.timestamp {
        b = b.with_timestamp(v);
    }
    if let Some(v) = short("type", &p.kind) {
        b = b.with_type(v);
    }
    if let Some(v) = short("user_id", &p.user_id) {
        b = b.with_user_id(v);
    }
    if let Some(v) = short("app_id", &p.app_id) {
        b = b.with_app_id(v);
    }
    b.with_headers(table_with(headers, too_long))
}

/// Turns a lapin delivery into an acemq [`Delivery`] (the acker stays with
/// the consumer loop), on a transport's generation: the delivery is
/// built with `lifeline` (not given one afterwards, which would touch the
/// never-lost one's count and the shared part again, per delivery).
pub(crate) fn delivery_from_lapin_on(
    queue: &Arc<str>,
    mut d: lapin::message::Delivery,
    lifeline: &acemq_layers::Lifeline,
) -> (Delivery, lapin::Acker) {
    let delivery = delivery_taken_from_lapin(queue, &mut d, lifeline);
    (delivery, d.acker)
}

/// [`delivery_from_lapin_on`] where lapin's delivery stays with the caller
/// (its exchange, routing key and body are taken; its properties are
/// read): the consumer loop's path, which does not move lapin's
/// ~430-byte delivery on its way.
pub(crate) fn delivery_taken_from_lapin(
    queue: &Arc<str>,
    d: &mut lapin::message::Delivery,
    lifeline: &acemq_layers::Lifeline,
) -> Delivery {
    let (headers, set_aside) = match d.properties.headers().as_ref() {
        Some(table) => match try_headers_from_table(table) {
            Ok(headers) => (headers, None),
            Err(over) => (Headers::default(), Some(over.to_string())),
        },
        None => (Headers::default(), skipped_by_parser(&d.properties)),
    };
    // In one step: the builder's chained calls would move the whole
    // message once each, per delivery.
    let mut delivery = Delivery::received(acemq_layers::Received {
        queue: queue.clone(),
        exchange: String::from(std::mem::take(&mut d.exchange)),
        routing_key: String::from(std::mem::take(&mut d.routing_key)),
        body: std::mem::take(&mut d.data).into(),
        headers,
        properties: properties_from_lapin(&d.properties),
        delivery_tag: d.delivery_tag,
        redelivered: d.redelivered,
        lifeline: lifeline.clone(),
    });
    if let Some(why) = set_aside {
        delivery
            .extensions_mut()
            .insert(acemq_layers::redelivery::MalformedHeaders::new(why));
    }
    delivery
}

/// Why amq-protocol's parser set this message's headers aside, where it is
/// the patched one that does (feature `patched-amq-protocol`).
#[cfg(feature = "patched-amq-protocol")]
fn skipped_by_parser(p: &BasicProperties) -> Option<String> {
    p.headers_skipped()
        .as_ref()
        .map(|skipped| skipped.to_string())
}

/// Why amq-protocol's parser set this message's headers aside: the
/// published parser never does (it fails the connection instead).
#[cfg(not(feature = "patched-amq-protocol"))]
fn skipped_by_parser(_: &BasicProperties) -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A headers table `depth` levels deep: each level holds the next
    /// under "a", alternating tables and arrays.
    fn nested(depth: usize) -> FieldTable {
        let mut value = AMQPValue::Void;
        for level in (2..=depth).rev() {
            value = if level % 2 == 0 {
                AMQPValue::FieldArray(FieldArray::from(vec![value]))
            } else {
                let mut t = FieldTable::default();
                t.insert("a".into(), value);
                AMQPValue::FieldTable(t)
            };
        }
        let mut top = FieldTable::default();
        top.insert("a".into(), value);
        top
    }

    #[test]
    fn headers_up_to_the_depth_limit_are_read_and_one_level_more_is_set_aside() {
        let at_limit = try_headers_from_table(&nested(MAX_HEADER_DEPTH)).expect("at the limit");
        assert_eq!(at_limit, headers_from_table(&nested(MAX_HEADER_DEPTH)));
        assert_eq!(
            try_headers_from_table(&nested(MAX_HEADER_DEPTH + 1)),
            Err(HeadersOverLimit::TooDeep)
        );
        assert_eq!(
            try_headers_from_table(&nested(5_000)),
            Err(HeadersOverLimit::TooDeep)
        );
    }

    #[test]
    fn headers_up_to_the_value_limit_are_read_and_one_value_more_is_set_aside() {
        let array = |n: usize| {
            let mut t = FieldTable::default();
            // The array itself is one value, its elements the rest.
            t.insert(
                "many".into(),
                AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::Void; n - 1])),
            );
            t
        };
        let read = try_headers_from_table(&array(MAX_HEADER_VALUES)).expect("at the limit");
        assert!(
            matches!(read.get("many"), Some(Value::Array(a)) if a.len() == MAX_HEADER_VALUES - 1)
        );
        let over = try_headers_from_table(&array(MAX_HEADER_VALUES + 1)).unwrap_err();
        assert_eq!(over, HeadersOverLimit::TooMany);
        assert!(over.to_string().contains("more than 4096 values"), "{over}");
        // 120 KB of one-byte values: refused after the limit, not converted.
        assert_eq!(
            try_headers_from_table(&array(120_000)),
            Err(HeadersOverLimit::TooMany)
        );
    }

    #[test]
    fn a_header_name_over_255_bytes_is_an_error_or_left_out_never_a_panic() {
        let mut nested = Headers::new();
        nested.insert("n".repeat(256), "deep");
        let mut headers = Headers::new();
        headers.insert("x".repeat(256), "v");
        headers.insert("kept", "v");
        headers.insert("table", Value::Table(nested));
        let e = try_table_from_headers(&headers).unwrap_err();
        assert_eq!((e.what.as_str(), e.len), ("header name", 256));
        assert!(e.to_string().contains("above AMQP's limit of 255"), "{e}");
        let table = table_from_headers(&headers);
        let back = headers_from_table(&table);
        assert_eq!(back.len(), 2, "the long name left out: {back:?}");
        assert!(back.get("kept").is_some());
        match back.get("table") {
            Some(Value::Table(t)) => assert!(t.is_empty(), "{t:?}"),
            other => panic!("{other:?}"),
        }
        let mut fits = Headers::new();
        fits.insert("x".repeat(255), "v");
        assert_eq!(try_table_from_headers(&fits).unwrap().inner().len(), 1);
    }

    #[test]
    fn a_property_over_255_bytes_is_an_error_or_left_out_never_a_panic() {
        let mut p = Properties::default();
        p.message_id = Some("m-1".to_owned());
        p.content_type = Some("x".repeat(256));
        let e = try_properties_to_lapin(&p, &Headers::new()).unwrap_err();
        assert_eq!((e.what.as_str(), e.len), ("content_type", 256));
        let out = properties_to_lapin(&p, &Headers::new());
        assert_eq!(out.content_type(), &None);
        assert_eq!(
            out.message_id().as_ref().map(|m| m.as_str()),
            Some("m-1"),
            "the rest is kept"
        );
    }
}

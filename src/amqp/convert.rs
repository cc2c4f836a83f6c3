//! Conversions between lapin's types and acemq-layers' transport-agnostic ones.

use std::collections::BTreeMap;
use std::sync::Arc;

use acemq_layers::{Delivery, Headers, Properties, Value};
use lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use lapin::BasicProperties;

/// Converts a lapin field table into owned [`Headers`].
pub fn headers_from_table(table: &FieldTable) -> Headers {
    table
        .inner()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), value_from_amqp(v)))
        .collect()
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

/// Converts owned [`Headers`] back into a lapin field table.
pub fn table_from_headers(headers: &Headers) -> FieldTable {
    let map: BTreeMap<ShortString, AMQPValue> = headers
        .iter()
        .map(|(k, v)| (ShortString::from(k), value_to_amqp(v)))
        .collect();
    FieldTable::from(map)
}

fn value_to_amqp(v: &Value) -> AMQPValue {
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
            a.iter().map(value_to_amqp).collect::<Vec<_>>(),
        )),
        Value::Timestamp(t) => AMQPValue::Timestamp(*t),
        Value::Table(t) => AMQPValue::FieldTable(table_from_headers(t)),
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
pub fn properties_to_lapin(p: &Properties, headers: &Headers) -> BasicProperties {
    let mut b = BasicProperties::default();
    if let Some(v) = &p.content_type {
        b = b.with_content_type(v.as_str().into());
    }
    if let Some(v) = &p.content_encoding {
        b = b.with_content_encoding(v.as_str().into());
    }
    if let Some(v) = p.delivery_mode {
        b = b.with_delivery_mode(v);
    }
    if let Some(v) = p.priority {
        b = b.with_priority(v);
    }
    if let Some(v) = &p.correlation_id {
        b = b.with_correlation_id(v.as_str().into());
    }
    if let Some(v) = &p.reply_to {
        b = b.with_reply_to(v.as_str().into());
    }
    // A per-message TTL is not copied: the copy's wait is the rung's TTL.
    if let Some(v) = &p.message_id {
        b = b.with_message_id(v.as_str().into());
    }
    if let Some(v) = p.timestamp {
        b = b.with_timestamp(v);
    }
    if let Some(v) = &p.kind {
        b = b.with_type(v.as_str().into());
    }
    if let Some(v) = &p.user_id {
        b = b.with_user_id(v.as_str().into());
    }
    if let Some(v) = &p.app_id {
        b = b.with_app_id(v.as_str().into());
    }
    b.with_headers(table_from_headers(headers))
}

/// Turns a lapin delivery into an acemq [`Delivery`] (the acker stays with
/// the consumer loop).
pub fn delivery_from_lapin(
    queue: &Arc<str>,
    d: lapin::message::Delivery,
) -> (Delivery, lapin::Acker) {
    convert_delivery(queue, d, None)
}

/// As [`delivery_from_lapin`], on a transport's generation: the delivery is
/// built with `lifeline` (not given one afterwards, which would touch the
/// never-lost one's count and the shared part again, per delivery).
pub(crate) fn delivery_from_lapin_on(
    queue: &Arc<str>,
    d: lapin::message::Delivery,
    lifeline: &acemq_layers::Lifeline,
) -> (Delivery, lapin::Acker) {
    convert_delivery(queue, d, Some(lifeline.clone()))
}

fn convert_delivery(
    queue: &Arc<str>,
    d: lapin::message::Delivery,
    lifeline: Option<acemq_layers::Lifeline>,
) -> (Delivery, lapin::Acker) {
    let headers = d
        .properties
        .headers()
        .as_ref()
        .map(headers_from_table)
        .unwrap_or_default();
    let delivery = Delivery::builder()
        .queue(queue.clone())
        .body(d.data)
        .headers(headers)
        .properties(properties_from_lapin(&d.properties))
        .exchange(String::from(d.exchange))
        .routing_key(String::from(d.routing_key))
        .delivery_tag(d.delivery_tag)
        .redelivered(d.redelivered);
    let delivery = match lifeline {
        Some(l) => delivery.lifeline(l),
        None => delivery,
    }
    .build();
    (delivery, d.acker)
}

//! A record as an AMQP 1.0 message: its sections read in order into a
//! [`StreamMessage`].

use bytes::{Bytes, BytesMut};

use acemq_layers::{Headers, Properties, Value};

use super::value::{read, skip, text_of, Budget};
use crate::stream::types::StreamMessage;
use crate::stream::wire::Reader;

const HEADER: u64 = 0x70;
const DELIVERY_ANNOTATIONS: u64 = 0x71;
const MESSAGE_ANNOTATIONS: u64 = 0x72;
const PROPERTIES: u64 = 0x73;
const APPLICATION_PROPERTIES: u64 = 0x74;
const DATA: u64 = 0x75;
const AMQP_SEQUENCE: u64 = 0x76;
const AMQP_VALUE: u64 = 0x77;
const FOOTER: u64 = 0x78;

/// Decodes the record at `offset`. Never fails: a record that is not a
/// valid AMQP 1.0 message comes back [malformed](StreamMessage::malformed)
/// with its raw bytes; one that does not start with a described type
/// (`0x00 0x53` or `0x00 0x80`) is a raw body.
pub fn decode(offset: u64, record: Bytes) -> StreamMessage {
    if !(record.len() >= 2 && record[0] == 0x00 && matches!(record[1], 0x53 | 0x80)) {
        return StreamMessage::raw(offset, record);
    }
    match sections(offset, record.clone()) {
        Ok(message) => message,
        Err(why) => StreamMessage::malformed(
            offset,
            record,
            format!("not a valid AMQP 1.0 message: {why}"),
        ),
    }
}

fn sections(offset: u64, record: Bytes) -> Result<StreamMessage, String> {
    let mut r = Reader::new(record.clone());
    let mut budget = Budget::new();
    let mut message = StreamMessage::raw(offset, Bytes::new());
    let mut body = BytesMut::new();
    while r.left() > 0 {
        let descriptor = section_descriptor(&mut r)?;
        let start = record.len() - r.left();
        match descriptor {
            HEADER => header(&mut message.properties, read(&mut r, &mut budget)?)?,
            PROPERTIES => properties(&mut message.properties, read(&mut r, &mut budget)?)?,
            MESSAGE_ANNOTATIONS => {
                let map = table(read(&mut r, &mut budget)?, "message-annotations")?;
                for (k, v) in map.into_iter().filter(|(k, _)| k.starts_with("x-")) {
                    message.headers.insert(k, v);
                }
            }
            APPLICATION_PROPERTIES => {
                let map = table(read(&mut r, &mut budget)?, "application-properties")?;
                for (k, v) in map {
                    message.headers.insert(k, v);
                }
            }
            DATA => match read_body(&mut r)? {
                Some(bytes) => body.extend_from_slice(&bytes),
                None => return Err("a data section that is not binary".into()),
            },
            AMQP_VALUE => {
                let mut peek = r.clone();
                match read_body(&mut peek)? {
                    Some(bytes) => {
                        body.extend_from_slice(&bytes);
                        r = peek;
                    }
                    None => {
                        skip(&mut r)?;
                        body.extend_from_slice(&record[start..record.len() - r.left()]);
                    }
                }
            }
            AMQP_SEQUENCE => {
                skip(&mut r)?;
                body.extend_from_slice(&record[start..record.len() - r.left()]);
            }
            DELIVERY_ANNOTATIONS | FOOTER => skip(&mut r)?,
            other => return Err(format!("an unknown section 0x{other:02x}")),
        }
    }
    message.body = body.freeze();
    basic_annotations(&mut message.properties, &mut message.headers);
    Ok(message)
}

/// RabbitMQ (3.10 at least) writes a message published over AMQP 0-9-1
/// without a header section: the 0-9-1 properties AMQP 1.0 has no field
/// for go to message annotations `x-basic-type`, `x-basic-app-id`,
/// `x-basic-delivery-mode`, `x-basic-priority` and `x-basic-expiration`.
/// They are taken back into [`Properties`] (a property set by a section
/// wins) and out of the headers, so a copy republished over AMQP 0-9-1
/// carries them as properties, not twice.
fn basic_annotations(p: &mut Properties, h: &mut Headers) {
    if let Some(v) = h.remove("x-basic-type") {
        p.kind = p.kind.take().or_else(|| text(&v));
    }
    if let Some(v) = h.remove("x-basic-app-id") {
        p.app_id = p.app_id.take().or_else(|| text(&v));
    }
    if let Some(v) = h.remove("x-basic-expiration") {
        p.expiration = p.expiration.take().or_else(|| text(&v));
    }
    if let Some(v) = h.remove("x-basic-delivery-mode") {
        p.delivery_mode = p
            .delivery_mode
            .or_else(|| v.as_i64().and_then(|n| u8::try_from(n).ok()));
    }
    if let Some(v) = h.remove("x-basic-priority") {
        p.priority = p
            .priority
            .or_else(|| v.as_i64().and_then(|n| u8::try_from(n).ok()));
    }
}

/// A section's descriptor: `0x00` then a `smallulong` or `ulong`.
fn section_descriptor(r: &mut Reader) -> Result<u64, String> {
    let cut = |_| "cut short in a section's descriptor".to_string();
    if r.u8("a section").map_err(cut)? != 0x00 {
        return Err("a section that is not a described type".into());
    }
    match r.u8("a section").map_err(cut)? {
        0x53 => Ok(r.u8("a section").map_err(cut)?.into()),
        0x80 => r.u64("a section").map_err(cut),
        other => Err(format!("a section descriptor of type 0x{other:02x}")),
    }
}

/// A binary, string or symbol value's bytes; `None` (nothing read) for
/// another type.
fn read_body(r: &mut Reader) -> Result<Option<Bytes>, String> {
    let cut = |_| "cut short in a body".to_string();
    let code = r.u8("a body").map_err(cut)?;
    let len = match code {
        0xa0 | 0xa1 | 0xa3 => r.u8("a body").map_err(cut)? as usize,
        0xb0 | 0xb1 | 0xb3 => r.u32("a body").map_err(cut)? as usize,
        _ => return Ok(None),
    };
    r.take(len, "a body").map(Some).map_err(cut)
}

fn list(v: Value, what: &str) -> Result<Vec<Value>, String> {
    match v {
        Value::Array(items) => Ok(items),
        Value::Void => Ok(Vec::new()),
        other => Err(format!("{what} as a {}, not a list", other.type_name())),
    }
}

fn table(v: Value, what: &str) -> Result<Headers, String> {
    match v {
        Value::Table(t) => Ok(t),
        Value::Void => Ok(Headers::new()),
        other => Err(format!("{what} as a {}, not a map", other.type_name())),
    }
}

fn text(v: &Value) -> Option<String> {
    (!matches!(v, Value::Void)).then(|| text_of(v))
}

/// The header section: durable (as the delivery mode, 2 when durable),
/// priority, and ttl (as the expiration, in milliseconds).
fn header(p: &mut Properties, v: Value) -> Result<(), String> {
    let fields = list(v, "the header section")?;
    if let Some(Value::Bool(durable)) = fields.first() {
        p.delivery_mode = Some(if *durable { 2 } else { 1 });
    }
    if let Some(priority) = fields.get(1).and_then(Value::as_i64) {
        p.priority = u8::try_from(priority).ok();
    }
    if let Some(ttl) = fields.get(2).and_then(Value::as_i64) {
        p.expiration = Some(ttl.to_string());
    }
    Ok(())
}

/// The properties section: message-id, user-id, subject (as the `kind`,
/// AMQP 0-9-1's type), reply-to, correlation-id, content-type,
/// content-encoding, creation-time (as the timestamp) and group-id (as the
/// app id: RabbitMQ 4 writes AMQP 0-9-1's app-id there). The ids are
/// strings whatever their AMQP type. `to`, the expiry time, the group
/// sequence and reply-to-group-id have no place in [`Properties`] and are
/// not kept.
fn properties(p: &mut Properties, v: Value) -> Result<(), String> {
    let fields = list(v, "the properties section")?;
    let at = |i: usize| fields.get(i).and_then(text);
    p.message_id = at(0);
    p.user_id = at(1);
    p.kind = at(3);
    p.reply_to = at(4).map(reply_to);
    p.correlation_id = at(5);
    p.content_type = at(6);
    p.content_encoding = at(7);
    p.app_id = at(10);
    p.timestamp = match fields.get(9) {
        Some(Value::Timestamp(secs)) => Some(*secs),
        _ => None,
    };
    Ok(())
}

/// RabbitMQ 4 writes an AMQP 0-9-1 reply-to queue as the AMQP 1.0 address
/// `/queues/<name, percent-encoded>`: the queue's name is taken back (any
/// other address is kept as it is).
fn reply_to(address: String) -> String {
    let Some(name) = address.strip_prefix("/queues/") else {
        return address;
    };
    if name.contains('/') {
        return address;
    }
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or(address)
}

//! Frames: what the client sends (encoded whole, size prefix included) and
//! what the broker sends (decoded from one frame's bytes, size prefix
//! removed). Every frame is `size:u32 key:u16 version:u16 ...`; a key with
//! its high bit set is a response.

use bytes::{BufMut, Bytes, BytesMut};

use crate::stream::error::StreamError;
use crate::stream::types::OffsetSpec;
use crate::stream::wire::{put_bytes, put_string, Reader, Short};

pub(crate) const SUBSCRIBE: u16 = 0x0007;
pub(crate) const DELIVER: u16 = 0x0008;
pub(crate) const CREDIT: u16 = 0x0009;
pub(crate) const STORE_OFFSET: u16 = 0x000a;
pub(crate) const QUERY_OFFSET: u16 = 0x000b;
pub(crate) const UNSUBSCRIBE: u16 = 0x000c;
pub(crate) const METADATA: u16 = 0x000f;
pub(crate) const METADATA_UPDATE: u16 = 0x0010;
pub(crate) const PEER_PROPERTIES: u16 = 0x0011;
pub(crate) const SASL_HANDSHAKE: u16 = 0x0012;
pub(crate) const SASL_AUTHENTICATE: u16 = 0x0013;
pub(crate) const TUNE: u16 = 0x0014;
pub(crate) const OPEN: u16 = 0x0015;
pub(crate) const CLOSE: u16 = 0x0016;
pub(crate) const HEARTBEAT: u16 = 0x0017;
pub(crate) const PARTITIONS: u16 = 0x0019;
pub(crate) const CONSUMER_UPDATE: u16 = 0x001a;
pub(crate) const STREAM_STATS: u16 = 0x001c;
/// The bit that marks a response.
pub(crate) const RESPONSE: u16 = 0x8000;

/// One request the client sends, before encoding.
#[derive(Debug, Clone)]
pub(crate) enum Request<'a> {
    PeerProperties(&'a [(String, String)]),
    SaslHandshake,
    SaslPlain {
        username: &'a str,
        password: &'a str,
    },
    Open {
        vhost: &'a str,
    },
    Subscribe {
        id: u8,
        stream: &'a str,
        offset: OffsetSpec,
        credit: u16,
        properties: &'a [(String, String)],
    },
    QueryOffset {
        reference: &'a str,
        stream: &'a str,
    },
    Unsubscribe {
        id: u8,
    },
    Metadata {
        streams: &'a [&'a str],
    },
    Partitions {
        super_stream: &'a str,
    },
    StreamStats {
        stream: &'a str,
    },
    Close {
        code: u16,
        reason: &'a str,
    },
}

impl Request<'_> {
    /// What the request is, for errors.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Request::PeerProperties(_) => "peer-properties",
            Request::SaslHandshake => "sasl-handshake",
            Request::SaslPlain { .. } => "sasl-authenticate",
            Request::Open { .. } => "open",
            Request::Subscribe { .. } => "subscribe",
            Request::QueryOffset { .. } => "query-offset",
            Request::Unsubscribe { .. } => "unsubscribe",
            Request::Metadata { .. } => "metadata",
            Request::Partitions { .. } => "partitions",
            Request::StreamStats { .. } => "stream-stats",
            Request::Close { .. } => "close",
        }
    }

    /// The frame, size prefix included.
    pub(crate) fn encode(&self, corr: u32) -> Result<Bytes, StreamError> {
        let too_long =
            || StreamError::Invalid(format!("{}: a string over 32,767 bytes", self.name()));
        let mut b = BytesMut::with_capacity(64);
        b.put_u32(0);
        let key = match self {
            Request::PeerProperties(_) => PEER_PROPERTIES,
            Request::SaslHandshake => SASL_HANDSHAKE,
            Request::SaslPlain { .. } => SASL_AUTHENTICATE,
            Request::Open { .. } => OPEN,
            Request::Subscribe { .. } => SUBSCRIBE,
            Request::QueryOffset { .. } => QUERY_OFFSET,
            Request::Unsubscribe { .. } => UNSUBSCRIBE,
            Request::Metadata { .. } => METADATA,
            Request::Partitions { .. } => PARTITIONS,
            Request::StreamStats { .. } => STREAM_STATS,
            Request::Close { .. } => CLOSE,
        };
        b.put_u16(key);
        b.put_u16(1);
        b.put_u32(corr);
        match self {
            Request::PeerProperties(props) => put_pairs(&mut b, props).ok_or_else(too_long)?,
            Request::SaslHandshake => {}
            Request::SaslPlain { username, password } => {
                put_string(&mut b, "PLAIN").ok_or_else(too_long)?;
                let mut plain = Vec::with_capacity(username.len() + password.len() + 2);
                plain.push(0);
                plain.extend_from_slice(username.as_bytes());
                plain.push(0);
                plain.extend_from_slice(password.as_bytes());
                put_bytes(&mut b, &plain).ok_or_else(too_long)?;
            }
            Request::Open { vhost } => put_string(&mut b, vhost).ok_or_else(too_long)?,
            Request::Subscribe {
                id,
                stream,
                offset,
                credit,
                properties,
            } => {
                b.put_u8(*id);
                put_string(&mut b, stream).ok_or_else(too_long)?;
                put_offset(&mut b, *offset);
                b.put_u16(*credit);
                put_pairs(&mut b, properties).ok_or_else(too_long)?;
            }
            Request::QueryOffset { reference, stream } => {
                put_string(&mut b, reference).ok_or_else(too_long)?;
                put_string(&mut b, stream).ok_or_else(too_long)?;
            }
            Request::Unsubscribe { id } => b.put_u8(*id),
            Request::Metadata { streams } => {
                b.put_i32(i32::try_from(streams.len()).map_err(|_| too_long())?);
                for s in *streams {
                    put_string(&mut b, s).ok_or_else(too_long)?;
                }
            }
            Request::Partitions { super_stream } => {
                put_string(&mut b, super_stream).ok_or_else(too_long)?
            }
            Request::StreamStats { stream } => put_string(&mut b, stream).ok_or_else(too_long)?,
            Request::Close { code, reason } => {
                b.put_u16(*code);
                put_string(&mut b, reason).ok_or_else(too_long)?;
            }
        }
        Ok(sized(b))
    }
}

fn put_pairs(b: &mut BytesMut, pairs: &[(String, String)]) -> Option<()> {
    b.put_i32(i32::try_from(pairs.len()).ok()?);
    for (k, v) in pairs {
        put_string(b, k)?;
        put_string(b, v)?;
    }
    Some(())
}

fn put_offset(b: &mut BytesMut, offset: OffsetSpec) {
    let (kind, value) = offset.wire();
    b.put_u16(kind);
    if let Some(v) = value {
        b.put_u64(v);
    }
}

/// Writes the size prefix of a frame built after a 4-byte placeholder.
fn sized(mut b: BytesMut) -> Bytes {
    let size = (b.len() - 4) as u32;
    b[..4].copy_from_slice(&size.to_be_bytes());
    b.freeze()
}

fn header(key: u16) -> BytesMut {
    let mut b = BytesMut::with_capacity(32);
    b.put_u32(0);
    b.put_u16(key);
    b.put_u16(1);
    b
}

/// Credit: no correlation id, no answer unless it failed.
pub(crate) fn credit(id: u8, credit: u16) -> Bytes {
    let mut b = header(CREDIT);
    b.put_u8(id);
    b.put_u16(credit);
    sized(b)
}

/// StoreOffset: no correlation id, no answer.
pub(crate) fn store_offset(reference: &str, stream: &str, offset: u64) -> Option<Bytes> {
    let mut b = header(STORE_OFFSET);
    put_string(&mut b, reference)?;
    put_string(&mut b, stream)?;
    b.put_u64(offset);
    Some(sized(b))
}

/// The heartbeat frame.
pub(crate) fn heartbeat() -> Bytes {
    sized(header(HEARTBEAT))
}

/// The client's answer to the broker's Tune.
pub(crate) fn tune_response(frame_max: u32, heartbeat_secs: u32) -> Bytes {
    let mut b = header(TUNE | RESPONSE);
    b.put_u32(frame_max);
    b.put_u32(heartbeat_secs);
    sized(b)
}

/// A plain "OK" answer to a broker's request (its Close).
pub(crate) fn ok_response(key: u16, corr: u32) -> Bytes {
    let mut b = header(key | RESPONSE);
    b.put_u32(corr);
    b.put_u16(1);
    sized(b)
}

/// The answer to a ConsumerUpdate: OK and where to start.
pub(crate) fn consumer_update_response(corr: u32, offset: OffsetSpec) -> Bytes {
    let mut b = header(CONSUMER_UPDATE | RESPONSE);
    b.put_u32(corr);
    b.put_u16(1);
    put_offset(&mut b, offset);
    sized(b)
}

/// One frame from the broker, decoded as far as routing it needs.
#[derive(Debug, Clone)]
pub(crate) enum ServerFrame {
    /// A response to one of our requests: its body follows the code.
    Response {
        corr: u32,
        code: u16,
        body: Reader,
    },
    /// Credit failed (the only answer Credit ever gets).
    CreditError {
        code: u16,
        subscription: u8,
    },
    /// A chunk for a subscription (the chunk's bytes, unparsed).
    Deliver {
        subscription: u8,
        chunk: Bytes,
    },
    MetadataUpdate {
        code: u16,
        stream: String,
    },
    Tune {
        frame_max: u32,
        heartbeat: u32,
    },
    Heartbeat,
    Close {
        corr: u32,
        code: u16,
        reason: String,
    },
    ConsumerUpdate {
        corr: u32,
        subscription: u8,
        active: bool,
    },
    /// A frame this client does not use (publisher confirms, ...).
    Other {
        key: u16,
    },
}

impl ServerFrame {
    /// What the frame is, for errors (never its content).
    pub(crate) fn name(&self) -> String {
        match self {
            ServerFrame::Response { corr, code, .. } => {
                format!("a response (correlation id {corr}, code {code})")
            }
            ServerFrame::CreditError { .. } => "a credit response".into(),
            ServerFrame::Deliver { .. } => "a deliver".into(),
            ServerFrame::MetadataUpdate { .. } => "a metadata-update".into(),
            ServerFrame::Tune { .. } => "a tune".into(),
            ServerFrame::Heartbeat => "a heartbeat".into(),
            ServerFrame::Close { .. } => "a close".into(),
            ServerFrame::ConsumerUpdate { .. } => "a consumer-update".into(),
            ServerFrame::Other { key } => format!("a frame of key 0x{key:04x}"),
        }
    }
}

/// Decodes one frame (without its size prefix).
pub(crate) fn decode(frame: Bytes) -> Result<ServerFrame, StreamError> {
    decode_inner(frame)
        .map_err(|Short(what)| StreamError::Protocol(format!("a frame cut short in {what}")))
}

fn decode_inner(frame: Bytes) -> Result<ServerFrame, Short> {
    let mut r = Reader::new(frame);
    let key = r.u16("the key")?;
    let version = r.u16("the version")?;
    Ok(match key {
        DELIVER => {
            let subscription = r.u8("deliver")?;
            if version >= 2 {
                r.u64("deliver's committed offset")?;
            }
            let chunk = r.take(r.left(), "deliver")?;
            ServerFrame::Deliver {
                subscription,
                chunk,
            }
        }
        k if k == CREDIT | RESPONSE => ServerFrame::CreditError {
            code: r.u16("credit's response")?,
            subscription: r.u8("credit's response")?,
        },
        METADATA_UPDATE => ServerFrame::MetadataUpdate {
            code: r.u16("metadata-update")?,
            stream: r.string("metadata-update")?,
        },
        TUNE => ServerFrame::Tune {
            frame_max: r.u32("tune")?,
            heartbeat: r.u32("tune")?,
        },
        HEARTBEAT => ServerFrame::Heartbeat,
        CLOSE => ServerFrame::Close {
            corr: r.u32("close")?,
            code: r.u16("close")?,
            reason: r.string("close")?,
        },
        CONSUMER_UPDATE => ServerFrame::ConsumerUpdate {
            corr: r.u32("consumer-update")?,
            subscription: r.u8("consumer-update")?,
            active: r.u8("consumer-update")? != 0,
        },
        // The metadata response has no code: its body follows the
        // correlation id.
        k if k == METADATA | RESPONSE => ServerFrame::Response {
            corr: r.u32("a response")?,
            code: 1,
            body: r,
        },
        k if k & RESPONSE != 0 => ServerFrame::Response {
            corr: r.u32("a response")?,
            code: r.u16("a response")?,
            body: r,
        },
        k => ServerFrame::Other { key: k },
    })
}

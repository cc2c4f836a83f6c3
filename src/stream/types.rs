//! The data a stream connection hands out: where to start reading, the
//! chunks and their messages, the events of a connection, metadata and
//! statistics.

use bytes::Bytes;

use acemq_layers::{Headers, Properties};

use super::error::StreamError;

/// Where a subscription starts reading a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The first message still in the stream.
    First,
    /// The last chunk written (its first message on).
    Last,
    /// The next message written after the subscription.
    Next,
    /// This offset (the chunk holding it is delivered whole: messages
    /// before it in that chunk come too).
    Offset(u64),
    /// The first chunk written at or after this time, in milliseconds since
    /// the Unix epoch.
    Timestamp(i64),
}

impl OffsetSpec {
    /// The offset type and value on the wire.
    pub(crate) fn wire(self) -> (u16, Option<u64>) {
        match self {
            OffsetSpec::First => (1, None),
            OffsetSpec::Last => (2, None),
            OffsetSpec::Next => (3, None),
            OffsetSpec::Offset(o) => (4, Some(o)),
            OffsetSpec::Timestamp(t) => (5, Some(t as u64)),
        }
    }
}

/// One message of a chunk.
///
/// A record that is not a valid AMQP 1.0 message is never an error of the
/// connection: it comes with [`malformed`](Self::malformed) saying why and
/// its raw bytes as the body, so the application can dead-letter it. A
/// record that does not start with an AMQP 1.0 described type
/// (`0x00 0x53`) is taken as a raw body (some publishers write bytes
/// without AMQP 1.0 framing), with no properties or headers.
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct StreamMessage {
    /// The message's offset in the stream.
    pub offset: u64,
    /// The body: the `data` sections concatenated, or an `amqp-value`'s
    /// binary or string; for any other `amqp-value` or an `amqp-sequence`,
    /// their AMQP 1.0 encoding as it was.
    pub body: Bytes,
    /// The message's properties (see [`amqp10`](super::amqp10) for the
    /// mapping).
    pub properties: Properties,
    /// The application properties, and the message annotations whose keys
    /// start with `x-`.
    pub headers: Headers,
    /// Why the record could not be read, when it could not (then `body` is
    /// the record's raw bytes).
    pub malformed: Option<String>,
}

impl StreamMessage {
    /// A message whose record could not be read: its raw bytes and why.
    pub fn malformed(offset: u64, raw: Bytes, why: impl Into<String>) -> Self {
        StreamMessage {
            offset,
            body: raw,
            properties: Properties::default(),
            headers: Headers::new(),
            malformed: Some(why.into()),
        }
    }

    /// A message of `body` alone.
    pub fn raw(offset: u64, body: Bytes) -> Self {
        StreamMessage {
            offset,
            body,
            properties: Properties::default(),
            headers: Headers::new(),
            malformed: None,
        }
    }
}

/// The body's length, never its bytes.
impl std::fmt::Debug for StreamMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamMessage")
            .field("offset", &self.offset)
            .field("body", &format_args!("<{} bytes>", self.body.len()))
            .field("properties", &self.properties)
            .field("headers", &self.headers)
            .field("malformed", &self.malformed)
            .finish()
    }
}

/// One chunk delivered to a subscription: the unit of credit.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Chunk {
    /// The subscription it was delivered to.
    pub subscription: u8,
    /// The offset of its first record.
    pub first_offset: u64,
    /// When it was written, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// Its records, in offset order; empty for a chunk that holds no user
    /// records (a tracking chunk), which still took one credit.
    pub messages: Vec<StreamMessage>,
}

/// What a stream connection reports, in the order it read it.
#[derive(Debug)]
#[non_exhaustive]
pub enum StreamEvent {
    /// A chunk for a subscription; give credit back with
    /// [`credit`](super::StreamClient::credit) to get more.
    Chunk(Chunk),
    /// The broker asks (single active consumer) whether this subscription is
    /// active now; answer with
    /// [`answer_consumer_update`](super::StreamClient::answer_consumer_update).
    ConsumerUpdate {
        /// The subscription.
        subscription: u8,
        /// The correlation id to answer with.
        correlation_id: u32,
        /// Whether it became active.
        active: bool,
    },
    /// The broker refused credit for a subscription (it answers Credit
    /// only to refuse it: an unknown subscription id, usually).
    CreditRefused {
        /// The subscription.
        subscription: u8,
        /// The broker's code.
        code: super::error::ResponseCode,
    },
    /// Something changed for a stream: with code
    /// [`StreamNotAvailable`](super::ResponseCode::StreamNotAvailable)
    /// (`0x06`) it was deleted or lost its leader, and its subscriptions on
    /// this connection are gone.
    MetadataUpdate {
        /// The stream.
        stream: String,
        /// The broker's code.
        code: u16,
    },
    /// The connection ended; the last event.
    Closed(StreamError),
}

/// A broker node as metadata names it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BrokerAddress {
    /// Its host.
    pub host: String,
    /// Its stream port.
    pub port: u32,
}

/// Where a stream lives: its leader and replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamMetadata {
    /// The stream.
    pub stream: String,
    /// The broker's code for it (`Ok`, or `StreamDoesNotExist`, ...).
    pub code: super::error::ResponseCode,
    /// Its leader, when it has one.
    pub leader: Option<BrokerAddress>,
    /// Its replicas.
    pub replicas: Vec<BrokerAddress>,
}

/// A stream's statistics (RabbitMQ 3.11 and later).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamStats {
    /// The first offset still in the stream (`first_chunk_id`), when known.
    pub first_offset: Option<i64>,
    /// The offset of the last committed chunk (`committed_chunk_id`), when
    /// known.
    pub committed_chunk_id: Option<i64>,
    /// Every statistic the broker sent, by name.
    pub all: Vec<(String, i64)>,
}

//! An osiris chunk as Deliver carries it: a 48-byte header, the bloom
//! filter (ignored), the entries, and the trailer (ignored).
//!
//! ```text
//! magic:4 version:4 | chunk type:u8 | entries:u16 | records:u32 |
//! timestamp:i64 | epoch:u64 | first offset:u64 | crc:i32 |
//! data length:u32 | trailer length:u32 | bloom size:u8 | reserved:u24
//! ```
//!
//! An entry is simple (`0:1 size:31`, then the record) or a sub-entry
//! batch (`1:1 compression:3 reserved:4 records:u16 uncompressed:u32
//! length:u32`, then `length` bytes). Uncompressed batches (compression 0)
//! hold `size:u32 record` pairs and are read; a compressed batch gives one
//! malformed message per record it announces, so every offset is still
//! accounted. The CRC32 (IEEE) of the data is checked: a chunk that fails
//! it is a protocol error, since its offsets cannot be trusted.

use bytes::Bytes;

use crate::stream::amqp10;
use crate::stream::error::StreamError;
use crate::stream::types::{Chunk, StreamMessage};
use crate::stream::wire::{Reader, Short};

/// The chunk header's size.
const HEADER: usize = 48;

/// Parses a chunk delivered to `subscription`.
pub(crate) fn parse(subscription: u8, chunk: Bytes) -> Result<Chunk, StreamError> {
    parse_inner(subscription, chunk)
        .map_err(|Short(what)| StreamError::Protocol(format!("a chunk cut short in {what}")))?
}

fn parse_inner(subscription: u8, chunk: Bytes) -> Result<Result<Chunk, StreamError>, Short> {
    let mut r = Reader::new(chunk);
    if r.left() < HEADER {
        return Err(Short("the chunk header"));
    }
    let magic = r.u8("magic")?;
    if magic >> 4 != 5 {
        return Ok(Err(StreamError::Protocol(format!(
            "a chunk with magic 0x{magic:02x}, not 0x5_"
        ))));
    }
    let chunk_type = r.u8("chunk type")?;
    let entries = r.u16("entries")?;
    let records = r.u32("records")?;
    let timestamp_ms = r.i64("timestamp")?;
    let _epoch = r.u64("epoch")?;
    let first_offset = r.u64("first offset")?;
    let crc = r.u32("crc")?;
    let data_len = r.u32("data length")? as usize;
    let _trailer = r.u32("trailer length")?;
    let bloom = r.u8("bloom size")? as usize;
    r.take(3, "reserved")?;
    r.take(bloom, "bloom filter")?;
    let data = r.take(data_len, "chunk data")?;
    if crc32(&data) != crc {
        return Ok(Err(StreamError::Protocol(format!(
            "chunk at offset {first_offset}: its CRC32 does not match its data"
        ))));
    }
    let mut out = Chunk {
        subscription,
        first_offset,
        timestamp_ms,
        messages: Vec::new(),
    };
    if chunk_type != 0 {
        // Tracking chunks: no user records.
        return Ok(Ok(out));
    }
    // Every record takes at least one byte of data: a count that lies
    // allocates nothing it cannot back.
    out.messages.reserve((records as usize).min(data.len()));
    let mut d = Reader::new(data);
    let mut offset = first_offset;
    for _ in 0..entries {
        if d.left() == 0 {
            break;
        }
        let head = d.u32("an entry's size")?;
        if head & 0x8000_0000 == 0 {
            let record = d.take(head as usize, "an entry")?;
            out.messages.push(amqp10::decode(offset, record));
            offset += 1;
            continue;
        }
        let compression = (head >> 28) & 0x7;
        // `head` is the type byte, the record count (u16) and the first
        // byte of the uncompressed length; the length's other three follow.
        let count = ((head >> 8) & 0xffff) as u16;
        d.take(3, "a batch's uncompressed length")?;
        let length = d.u32("a batch's length")? as usize;
        let batch = d.take(length, "a batch")?;
        if compression != 0 {
            let why = format!(
                "in a sub-entry batch compressed with codec {compression}, which this client does not read"
            );
            for _ in 0..count {
                out.messages
                    .push(StreamMessage::malformed(offset, batch.clone(), why.clone()));
                offset += 1;
            }
            continue;
        }
        let mut b = Reader::new(batch);
        for _ in 0..count {
            let record = match b.u32("a batch's record size") {
                Ok(size) => b.take(size as usize, "a batch's record").ok(),
                Err(_) => None,
            };
            out.messages.push(match record {
                Some(record) => amqp10::decode(offset, record),
                None => StreamMessage::malformed(
                    offset,
                    Bytes::new(),
                    "a record cut short in an uncompressed sub-entry batch",
                ),
            });
            offset += 1;
        }
    }
    Ok(Ok(out))
}

/// CRC32 (IEEE 802.3, as `erlang:crc32/1`), a byte at a time over a table
/// built at compile time.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut c = !0u32;
    for &byte in data {
        c = TABLE[((c ^ byte as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

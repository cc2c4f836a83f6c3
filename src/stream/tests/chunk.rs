//! Osiris chunks: simple entries, sub-entry batches (read when
//! uncompressed, malformed per record when compressed), the CRC, and
//! hostile chunks.

use bytes::{BufMut, Bytes, BytesMut};

use super::encode::{chunk, message, s, Entry, Rng};
use crate::stream::protocol::chunk::{crc32, parse};
use crate::stream::StreamError;

fn record(i: u32) -> Bytes {
    message(
        format!("m{i}").as_bytes(),
        vec![(s("i"), s(&i.to_string()))],
    )
}

#[test]
fn crc32_is_ieee() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc32(b""), 0);
}

#[test]
fn simple_entries_and_an_uncompressed_batch_give_contiguous_offsets() {
    let c = chunk(
        100,
        1_700_000_000_000,
        &[
            Entry::Simple(record(0)),
            Entry::Batch(0, vec![record(1), record(2), Bytes::from_static(b"raw")]),
            Entry::Simple(record(4)),
        ],
    );
    let parsed = parse(4, c).expect("a valid chunk");
    assert_eq!(parsed.subscription, 4);
    assert_eq!(parsed.first_offset, 100);
    assert_eq!(parsed.timestamp_ms, 1_700_000_000_000);
    let offsets: Vec<u64> = parsed.messages.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, vec![100, 101, 102, 103, 104]);
    assert_eq!(&parsed.messages[1].body[..], b"m1");
    assert_eq!(&parsed.messages[3].body[..], b"raw");
    assert!(parsed.messages.iter().all(|m| m.malformed.is_none()));
}

#[test]
fn a_compressed_batch_gives_one_malformed_message_per_record_and_keeps_offsets() {
    let c = chunk(
        0,
        0,
        &[
            Entry::Batch(1, vec![record(0), record(1), record(2)]),
            Entry::Simple(record(3)),
        ],
    );
    let parsed = parse(1, c).expect("a chunk");
    assert_eq!(parsed.messages.len(), 4);
    for m in &parsed.messages[..3] {
        let why = m.malformed.as_deref().expect("malformed");
        assert!(why.contains("compressed with codec 1"), "{why}");
    }
    assert_eq!(parsed.messages[3].offset, 3);
    assert_eq!(parsed.messages[3].malformed, None);
}

#[test]
fn a_chunk_whose_crc_does_not_match_is_a_protocol_error() {
    let mut c = BytesMut::from(&chunk(0, 0, &[Entry::Simple(record(0))])[..]);
    let last = c.len() - 1;
    c[last] ^= 0xff;
    assert!(
        matches!(parse(1, c.freeze()), Err(StreamError::Protocol(why)) if why.contains("CRC32"))
    );
}

#[test]
fn a_tracking_chunk_has_no_messages() {
    let mut c = BytesMut::from(&chunk(7, 0, &[Entry::Simple(record(0))])[..]);
    c[1] = 1;
    let parsed = parse(1, c.freeze()).expect("a chunk");
    assert!(parsed.messages.is_empty());
    assert_eq!(parsed.first_offset, 7);
}

#[test]
fn a_chunk_cut_short_or_with_lying_lengths_is_an_error_never_a_panic() {
    let c = chunk(0, 0, &[Entry::Simple(record(0)), Entry::Simple(record(1))]);
    for cut in 0..c.len() {
        assert!(parse(1, c.slice(..cut)).is_err(), "cut at {cut}");
    }
    // A record count of 4 billion and an entry count of 65,535 over two
    // real entries: the two are read, nothing huge allocated.
    let mut lying = BytesMut::from(&c[..]);
    lying[2..4].copy_from_slice(&u16::MAX.to_be_bytes());
    lying[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
    let parsed = parse(1, lying.freeze()).expect("read as far as the data goes");
    assert_eq!(parsed.messages.len(), 2);
    // An entry whose size is over the data.
    let mut data = BytesMut::new();
    data.put_u32(1_000_000);
    data.put_slice(b"short");
    let mut b = BytesMut::from(&c[..44]);
    b[40..44].copy_from_slice(&(data.len() as u32).to_be_bytes());
    b[32..36].copy_from_slice(&crc32(&data).to_be_bytes());
    b.put_u32(0);
    b.put_u32(0);
    b.put_slice(&data);
    assert!(parse(1, b.freeze()).is_err());
}

#[test]
fn mutated_chunks_never_panic() {
    let valid = chunk(
        10,
        5,
        &[
            Entry::Simple(record(0)),
            Entry::Batch(0, vec![record(1), record(2)]),
            Entry::Batch(3, vec![record(3)]),
        ],
    );
    assert_eq!(parse(1, valid.clone()).expect("valid").messages.len(), 4);
    let mut rng = Rng(42);
    for _ in 0..20_000 {
        let _ = parse(1, Bytes::from(rng.mutate(&valid)));
    }
}

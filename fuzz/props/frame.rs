//! The `frame` target's property: bytes as a broker's connection delivers
//! them, through amq-protocol's frame parser (the one lapin's IO loop runs),
//! then a content header's headers through acemq's conversion:
//!
//! - parsing never panics, and never descends past the nesting limit: every
//!   table it hands over is at most `MAX_NESTING_DEPTH` deep, and the replay
//!   runs on a thread with a default thread's 2 MiB stack;
//! - a content header carries its headers or says they were skipped, never
//!   both;
//! - its properties serialise, and parse back to what serialises to the same
//!   bytes, without the skipped mark (it is never sent);
//! - `convert::headers_from_table` keeps every header at the same depth, and
//!   `table_from_headers` gives a table that serialises to the same bytes.
//!
//! The bytes are read twice: as a stream of frames, parsed one after another
//! until one is incomplete or malformed (as the IO loop does), and as the
//! payload of one content header frame (wrapped in a frame's type, channel,
//! size and end), so that the fuzzer reaches the properties without first
//! having to find a frame's size.
//!
//! Shared by `fuzz/fuzz_targets/frame.rs` and the replay test
//! (`tests/fuzz_corpus.rs`).

use acemq::convert::{headers_from_table, properties_from_lapin, table_from_headers};
use acemq_layers::{Headers, Value};
use amq_protocol::frame::{gen_frame, parse_frame, AMQPContentHeader, AMQPFrame};
use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::generation::gen_field_table;
use amq_protocol::types::parsing::MAX_NESTING_DEPTH;
use amq_protocol::types::{AMQPValue, FieldTable};

/// The property, on raw bytes (the fuzz target and the replay both call
/// this).
pub(crate) fn check(data: &[u8]) {
    let mut rest = data;
    while let Ok((next, frame)) = parse_frame(rest) {
        assert!(next.len() < rest.len(), "a frame is at least one byte");
        check_frame(&frame);
        rest = next;
    }
    let size = u32::try_from(data.len()).expect("a fuzz input is under 4 GiB");
    let header_frame = [&[2, 0, 1][..], &size.to_be_bytes(), data, &[0xCE]].concat();
    match parse_frame(&header_frame[..]) {
        Ok((rest, frame)) => {
            assert!(rest.is_empty(), "the frame is read to its end");
            check_frame(&frame);
        }
        Err(e) => assert!(!e.is_incomplete(), "a whole frame is never incomplete"),
    }
}

fn check_frame(frame: &AMQPFrame) {
    if let AMQPFrame::Header(_, header) = frame {
        check_properties(&header.properties);
    }
}

fn check_properties(p: &BasicProperties) {
    assert!(
        p.headers().is_none() || p.headers_skipped().is_none(),
        "headers both parsed and skipped"
    );
    if let Some(table) = p.headers() {
        let depth = table_depth(table);
        assert!(depth <= MAX_NESTING_DEPTH, "headers {depth} levels deep");
        let headers = headers_from_table(table);
        assert_eq!(headers.len(), table.inner().len(), "a header was lost");
        assert_eq!(headers_depth(&headers), depth);
        let back = table_from_headers(&headers);
        assert_eq!(table_bytes(&back), table_bytes(table), "{headers:?}");
    }
    let _ = properties_from_lapin(p);

    let once = header_frame_bytes(p);
    let again = match parse_frame(&once[..]) {
        Ok(([], AMQPFrame::Header(_, again))) => again.properties,
        other => panic!("serialised properties do not parse back: {other:?}"),
    };
    assert_eq!(again.headers_skipped(), &None, "the skipped mark was sent");
    assert_eq!(header_frame_bytes(&again), once);
}

fn header_frame_bytes(properties: &BasicProperties) -> Vec<u8> {
    let frame = AMQPFrame::Header(
        1,
        AMQPContentHeader {
            class_id: 60,
            body_size: 0,
            properties: properties.clone(),
        },
    );
    let written = gen_frame(&frame)(Vec::new().into()).expect("properties serialise");
    written.write
}

fn table_bytes(table: &FieldTable) -> Vec<u8> {
    let written = gen_field_table(table)(Vec::new().into()).expect("a table serialises");
    written.write
}

/// A table's depth: 1, plus the deepest table or array it holds.
fn table_depth(table: &FieldTable) -> usize {
    1 + table.inner().values().map(value_depth).max().unwrap_or(0)
}

fn value_depth(value: &AMQPValue) -> usize {
    match value {
        AMQPValue::FieldTable(t) => table_depth(t),
        AMQPValue::FieldArray(a) => 1 + a.as_slice().iter().map(value_depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn headers_depth(headers: &Headers) -> usize {
    1 + headers
        .iter()
        .map(|(_, v)| acemq_depth(v))
        .max()
        .unwrap_or(0)
}

fn acemq_depth(value: &Value) -> usize {
    match value {
        Value::Table(t) => headers_depth(t),
        Value::Array(a) => 1 + a.iter().map(acemq_depth).max().unwrap_or(0),
        _ => 0,
    }
}

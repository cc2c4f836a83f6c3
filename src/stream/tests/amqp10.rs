//! The AMQP 1.0 decoder: every section, the type mapping, and hostile
//! records (deep nesting, counts that lie, cut-short and mutated records).

use bytes::{BufMut, Bytes, BytesMut};

use super::encode::{data, message, put, s, section, sym, Rng, V};
use crate::stream::amqp10::decode;
use acemq_layers::Value;

fn table(pairs: &[(&str, Value)]) -> acemq_layers::Headers {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

#[test]
fn every_section_is_read_into_body_properties_and_headers() {
    let mut b = BytesMut::new();
    section(
        &mut b,
        0x70,
        &V::List(vec![V::Bool(true), V::UByte(7), V::Long(1500)]),
    );
    section(&mut b, 0x71, &V::Map(vec![(sym("x-skipped"), s("no"))]));
    section(
        &mut b,
        0x72,
        &V::Map(vec![(sym("x-opt-a"), V::Int(1)), (sym("not-x"), V::Int(2))]),
    );
    section(
        &mut b,
        0x73,
        &V::List(vec![
            V::ULong(12),              // message-id
            V::Bin(b"alice".to_vec()), // user-id
            V::Null,                   // to
            s("order.created"),        // subject
            s("replies"),              // reply-to
            V::Uuid([0x11; 16]),       // correlation-id
            sym("application/json"),   // content-type
            sym("gzip"),               // content-encoding
            V::Null,                   // absolute-expiry-time
            V::Ts(1_700_000_000_123),  // creation-time
            s("app"),                  // group-id
        ]),
    );
    section(
        &mut b,
        0x74,
        &V::Map(vec![
            (s("str"), s("v")),
            (s("int"), V::Int(-5)),
            (s("big"), V::ULong(u64::MAX)),
            (s("f"), V::Double(1.5)),
            (s("bin"), V::Bin(vec![1, 2])),
            (s("ts"), V::Ts(2_000)),
            (s("list"), V::List(vec![V::Int(1), s("two")])),
            (s("arr"), V::IntArray(vec![3, 4])),
            (s("map"), V::Map(vec![(s("inner"), V::Bool(false))])),
            (s("null"), V::Null),
        ]),
    );
    data(&mut b, b"hello ");
    data(&mut b, b"world");
    section(&mut b, 0x78, &V::Map(vec![(sym("f"), V::Int(0))]));
    let m = decode(9, b.freeze());
    assert_eq!(m.malformed, None);
    assert_eq!(m.offset, 9);
    assert_eq!(&m.body[..], b"hello world");
    let p = &m.properties;
    assert_eq!(p.delivery_mode, Some(2));
    assert_eq!(p.priority, Some(7));
    assert_eq!(p.expiration.as_deref(), Some("1500"));
    assert_eq!(p.message_id.as_deref(), Some("12"));
    assert_eq!(p.user_id.as_deref(), Some("alice"));
    assert_eq!(p.kind.as_deref(), Some("order.created"));
    assert_eq!(p.reply_to.as_deref(), Some("replies"));
    assert_eq!(
        p.correlation_id.as_deref(),
        Some("11111111-1111-1111-1111-111111111111")
    );
    assert_eq!(p.content_type.as_deref(), Some("application/json"));
    assert_eq!(p.content_encoding.as_deref(), Some("gzip"));
    assert_eq!(p.timestamp, Some(1_700_000_000));
    assert_eq!(p.app_id.as_deref(), Some("app"));
    let h = &m.headers;
    assert_eq!(h.get("x-opt-a"), Some(&Value::I32(1)));
    assert_eq!(h.get("not-x"), None, "only x- annotations become headers");
    assert_eq!(h.get("x-skipped"), None, "delivery annotations are skipped");
    assert_eq!(h.get("str"), Some(&Value::from("v")));
    assert_eq!(h.get("int"), Some(&Value::I32(-5)));
    assert_eq!(h.get("big"), Some(&Value::from(u64::MAX.to_string())));
    assert_eq!(h.get("f"), Some(&Value::F64(1.5)));
    assert_eq!(h.get("bin"), Some(&Value::Bytes(vec![1, 2])));
    assert_eq!(h.get("ts"), Some(&Value::Timestamp(2)));
    assert_eq!(
        h.get("list"),
        Some(&Value::Array(vec![Value::I32(1), Value::from("two")]))
    );
    assert_eq!(
        h.get("arr"),
        Some(&Value::Array(vec![Value::I32(3), Value::I32(4)]))
    );
    assert_eq!(
        h.get("map"),
        Some(&Value::Table(table(&[("inner", Value::Bool(false))])))
    );
    assert_eq!(h.get("null"), Some(&Value::Void));
}

#[test]
fn amqp_value_string_or_binary_is_the_body_and_other_values_their_encoding() {
    let mut b = BytesMut::new();
    section(&mut b, 0x77, &s("text body"));
    assert_eq!(&decode(0, b.freeze()).body[..], b"text body");

    let mut b = BytesMut::new();
    section(&mut b, 0x77, &V::Bin(vec![0, 1, 2]));
    assert_eq!(&decode(0, b.freeze()).body[..], &[0, 1, 2]);

    let map = V::Map(vec![(s("a"), V::Int(1))]);
    let mut encoded = BytesMut::new();
    put(&mut encoded, &map);
    let mut b = BytesMut::new();
    section(&mut b, 0x77, &map);
    let m = decode(0, b.freeze());
    assert_eq!(m.malformed, None);
    assert_eq!(m.body, encoded.freeze());

    let list = V::List(vec![V::Int(1), V::Int(2)]);
    let mut encoded = BytesMut::new();
    put(&mut encoded, &list);
    let mut b = BytesMut::new();
    section(&mut b, 0x76, &list);
    let m = decode(0, b.freeze());
    assert_eq!(m.malformed, None);
    assert_eq!(m.body, encoded.freeze());
}

#[test]
fn a_record_without_amqp_framing_is_a_raw_body() {
    for raw in [
        &b"plain bytes"[..],
        b"",
        b"\x00",
        b"\x00\x41rest",
        b"{\"json\":1}",
    ] {
        let m = decode(3, Bytes::copy_from_slice(raw));
        assert_eq!(m.malformed, None, "{raw:?}");
        assert_eq!(&m.body[..], raw);
        assert!(m.headers.is_empty());
        assert_eq!(m.properties, Default::default());
    }
}

/// Application properties holding lists nested `depth` deep (list32s,
/// written front to back: no recursion in the test either).
fn nested_lists(depth: usize) -> Bytes {
    let mut b = BytesMut::new();
    b.put_slice(&[0x00, 0x53, 0x74]);
    // map32 of one pair: key "k", value the nested lists.
    let lists = 9 * depth + 1;
    b.put_u8(0xd1);
    b.put_u32((4 + 3 + lists) as u32);
    b.put_u32(2);
    b.put_slice(&[0xa1, 1, b'k']);
    for level in 0..depth {
        let inner = 9 * (depth - level - 1) + 1;
        b.put_u8(0xd0);
        b.put_u32((inner + 4) as u32);
        b.put_u32(1);
    }
    b.put_u8(0x45);
    b.freeze()
}

/// Maps nested `depth` deep, each `{"k": <next>}`.
fn nested_maps(depth: usize) -> Bytes {
    let mut b = BytesMut::new();
    b.put_slice(&[0x00, 0x53, 0x74]);
    for level in 0..depth {
        let inner = 12 * (depth - level - 1) + 1;
        b.put_u8(0xd1);
        b.put_u32((4 + 3 + inner) as u32);
        b.put_u32(2);
        b.put_slice(&[0xa1, 1, b'k']);
    }
    b.put_u8(0x40);
    b.freeze()
}

#[test]
fn nesting_at_the_limit_is_read_and_100000_deep_is_malformed_without_overflow() {
    let ok = decode(0, nested_lists(crate::convert::MAX_HEADER_DEPTH - 1));
    assert_eq!(ok.malformed, None);
    for record in [
        nested_lists(100_000),
        nested_maps(100_000),
        nested_lists(33),
    ] {
        let m = decode(5, record.clone());
        let why = m.malformed.expect("too deep is malformed");
        assert!(why.contains("nested deeper"), "{why}");
        assert_eq!(m.body, record, "the raw record is the body");
        assert_eq!(m.offset, 5);
    }
}

#[test]
fn a_deep_body_is_skipped_by_size_and_a_chain_of_descriptors_is_not_recursed() {
    // 100,000 nested lists as an amqp-value: the body, never walked.
    let lists = nested_lists(100_000);
    let mut b = BytesMut::new();
    b.put_slice(&[0x00, 0x53, 0x77]);
    b.put_slice(&lists[3 + 12..]);
    let m = decode(0, b.freeze());
    assert_eq!(m.malformed, None);
    // 100,000 descriptors each described: cut short, malformed.
    let mut b = BytesMut::new();
    b.put_slice(&[0x00, 0x53, 0x74]);
    b.put_slice(&vec![0x00; 100_000]);
    let m = decode(0, b.freeze());
    assert!(m.malformed.is_some());
}

#[test]
fn counts_that_lie_are_refused_before_allocating() {
    let lies: [&[u8]; 5] = [
        // list32 claiming 4 billion items in 4 bytes.
        &[0x00, 0x53, 0x74, 0xd0, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff],
        // map32 whose size is over the record.
        &[0x00, 0x53, 0x74, 0xd1, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 2],
        // array32 of 2 billion nulls: zero bytes each, over the value budget.
        &[
            0x00, 0x53, 0x74, 0xf0, 0, 0, 0, 5, 0x7f, 0xff, 0xff, 0xff, 0x40,
        ],
        // a string longer than the record.
        &[0x00, 0x53, 0x77, 0xb1, 0xff, 0xff, 0xff, 0xff, b'a'],
        // a map with an odd count.
        &[0x00, 0x53, 0x74, 0xc1, 2, 1, 0x40],
    ];
    for lie in lies {
        let m = decode(0, Bytes::copy_from_slice(lie));
        assert!(m.malformed.is_some(), "{lie:?}");
        assert_eq!(&m.body[..], lie);
    }
}

#[test]
fn more_than_the_value_budget_is_malformed() {
    let many = (0..5_000)
        .map(|i| (s(&format!("k{i}")), V::Int(i)))
        .collect();
    let m = decode(0, message(b"x", many));
    let why = m.malformed.expect("over the budget");
    assert!(why.contains("4096"), "{why}");
}

#[test]
fn every_prefix_and_mutation_of_a_valid_record_decodes_without_panicking() {
    let mut b = BytesMut::new();
    section(
        &mut b,
        0x73,
        &V::List(vec![s("id"), V::Null, V::Null, s("kind")]),
    );
    let app = vec![
        (
            s("a"),
            V::List(vec![V::Int(1), V::Map(vec![(s("b"), V::Ts(5))])]),
        ),
        (s("c"), V::IntArray(vec![1, 2, 3])),
    ];
    b.put_slice(&message(b"payload", app));
    let valid = b.freeze();
    assert_eq!(decode(0, valid.clone()).malformed, None);
    for cut in 0..valid.len() {
        let _ = decode(0, valid.slice(..cut));
    }
    let mut rng = Rng(0x5eed);
    for _ in 0..20_000 {
        let m = decode(1, Bytes::from(rng.mutate(&valid)));
        assert_eq!(m.offset, 1);
    }
}

#[test]
fn x_basic_annotations_are_properties_and_a_section_wins() {
    let mut b = BytesMut::new();
    section(
        &mut b,
        0x72,
        &V::Map(vec![
            (sym("x-basic-type"), s("kind")),
            (sym("x-basic-app-id"), s("app")),
            (sym("x-basic-delivery-mode"), V::UByte(2)),
            (sym("x-basic-priority"), V::UByte(4)),
            (sym("x-basic-expiration"), s("900")),
            (sym("x-routing-key"), s("rk")),
        ]),
    );
    section(
        &mut b,
        0x73,
        &V::List(vec![V::Null, V::Null, V::Null, s("subject")]),
    );
    data(&mut b, b"x");
    let m = decode(0, b.freeze());
    let p = &m.properties;
    assert_eq!(p.kind.as_deref(), Some("subject"), "the section wins");
    assert_eq!(p.app_id.as_deref(), Some("app"));
    assert_eq!(p.delivery_mode, Some(2));
    assert_eq!(p.priority, Some(4));
    assert_eq!(p.expiration.as_deref(), Some("900"));
    assert_eq!(m.headers.len(), 1, "{:?}", m.headers);
    assert_eq!(m.headers.get("x-routing-key"), Some(&Value::from("rk")));
}

#[test]
fn a_queue_address_as_reply_to_is_the_queue_name() {
    for (address, expected) in [
        ("/queues/rt", "rt"),
        ("/queues/a%2Fb%20c", "a/b c"),
        ("/queues/bad%zz", "bad%zz"),
        ("/exchanges/x/k", "/exchanges/x/k"),
        ("plain", "plain"),
    ] {
        let mut b = BytesMut::new();
        section(
            &mut b,
            0x73,
            &V::List(vec![V::Null, V::Null, V::Null, V::Null, s(address)]),
        );
        let m = decode(0, b.freeze());
        assert_eq!(
            m.properties.reply_to.as_deref(),
            Some(expected),
            "{address}"
        );
    }
}

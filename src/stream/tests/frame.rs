//! Frames: the bytes of what the client sends, decoding what the broker
//! sends, and frames that lie about their size.

use bytes::{BufMut, Bytes, BytesMut};

use super::encode::Rng;
use crate::stream::client::{read_frame, Limits};
use crate::stream::protocol::frame::{self, decode, Request, ServerFrame};
use crate::stream::{OffsetSpec, StreamError};

#[test]
fn subscribe_is_encoded_as_the_protocol_lays_it_out() {
    let props = vec![("name".to_string(), "x".to_string())];
    let req = Request::Subscribe {
        id: 3,
        stream: "s",
        offset: OffsetSpec::Offset(258),
        credit: 2,
        properties: &props,
    };
    let bytes = req.encode(9).expect("encodes");
    let expected: &[u8] = &[
        0, 0, 0, 37, // size
        0, 7, 0, 1, // key, version
        0, 0, 0, 9, // correlation id
        3, // subscription id
        0, 1, b's', // stream
        0, 4, 0, 0, 0, 0, 0, 0, 1, 2, // offset spec
        0, 2, // credit
        0, 0, 0, 1, 0, 4, b'n', b'a', b'm', b'e', 0, 1, b'x',
    ];
    assert_eq!(&bytes[..], expected);
    assert_eq!(&frame::credit(3, 5)[..], &[0, 0, 0, 7, 0, 9, 0, 1, 3, 0, 5]);
    assert_eq!(&frame::heartbeat()[..], &[0, 0, 0, 4, 0, 0x17, 0, 1]);
    assert_eq!(
        &frame::consumer_update_response(6, OffsetSpec::First)[..],
        &[0, 0, 0, 12, 0x80, 0x1a, 0, 1, 0, 0, 0, 6, 0, 1, 0, 1]
    );
    let long = "x".repeat(40_000);
    assert!(matches!(
        Request::QueryOffset {
            reference: &long,
            stream: "s"
        }
        .encode(1),
        Err(StreamError::Invalid(_))
    ));
}

#[test]
fn server_frames_are_decoded() {
    let mut b = BytesMut::new();
    b.put_u16(0x800b);
    b.put_u16(1);
    b.put_u32(77);
    b.put_u16(1);
    b.put_u64(5);
    match decode(b.freeze()).expect("a response") {
        ServerFrame::Response {
            corr,
            code,
            mut body,
        } => {
            assert_eq!((corr, code), (77, 1));
            assert_eq!(body.u64("offset"), Ok(5));
        }
        other => panic!("{other:?}"),
    }
    let credit = Bytes::from_static(&[0x80, 0x09, 0, 1, 0, 4, 9]);
    assert!(matches!(
        decode(credit),
        Ok(ServerFrame::CreditError {
            code: 4,
            subscription: 9
        })
    ));
    let update = Bytes::from_static(&[0, 0x10, 0, 1, 0, 6, 0, 2, b'o', b'k']);
    assert!(matches!(
        decode(update),
        Ok(ServerFrame::MetadataUpdate { code: 6, stream }) if stream == "ok"
    ));
    let close = Bytes::from_static(&[0, 0x16, 0, 1, 0, 0, 0, 3, 0, 1, 0, 3, b'b', b'y', b'e']);
    assert!(matches!(
        decode(close),
        Ok(ServerFrame::Close { corr: 3, code: 1, reason }) if reason == "bye"
    ));
    let deliver_v2 = Bytes::from_static(&[0, 8, 0, 2, 4, 0, 0, 0, 0, 0, 0, 0, 1, 0xaa]);
    assert!(matches!(
        decode(deliver_v2),
        Ok(ServerFrame::Deliver { subscription: 4, chunk }) if chunk[..] == [0xaa]
    ));
}

#[test]
fn frames_cut_short_are_errors_and_mutated_ones_never_panic() {
    let valid: [&[u8]; 4] = [
        &[0, 0x16, 0, 1, 0, 0, 0, 3, 0, 1, 0, 3, b'b', b'y', b'e'],
        &[0, 0x10, 0, 1, 0, 6, 0, 2, b'o', b'k'],
        &[0, 0x1a, 0, 1, 0, 0, 0, 3, 1, 1],
        &[0x80, 0x0f, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0],
    ];
    for v in valid {
        assert!(decode(Bytes::copy_from_slice(v)).is_ok());
        for cut in 0..v.len().min(8) {
            assert!(
                decode(Bytes::copy_from_slice(&v[..cut])).is_err(),
                "{v:?} cut at {cut}"
            );
        }
    }
    let mut rng = Rng(7);
    for _ in 0..20_000 {
        let v = valid[(rng.next() % 4) as usize];
        let _ = decode(Bytes::from(rng.mutate(v)));
    }
}

#[tokio::test]
async fn a_frame_over_the_maximum_is_refused_before_it_is_read() {
    let limits = |frame_max, chunk_max| Limits {
        frame_max,
        chunk_max,
    };
    // 4 GiB announced, 4 bytes sent: refused on the size alone.
    let mut input: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0, 0x17, 0, 1];
    let err = read_frame(&mut input, limits(1024 * 1024, 1 << 30))
        .await
        .expect_err("too large");
    assert!(matches!(
        err,
        StreamError::FrameTooLarge {
            size: u32::MAX,
            max: 1_048_576
        }
    ));
    assert!(err.to_string().contains("over the negotiated maximum"));
    // A Deliver may pass frame_max, up to chunk_max.
    let mut deliver = vec![0, 0, 0, 20, 0, 8, 0, 1];
    deliver.extend_from_slice(&[0; 16]);
    let mut input: &[u8] = &deliver;
    assert_eq!(
        read_frame(&mut input, limits(10, 20))
            .await
            .expect("a chunk")
            .len(),
        20
    );
    let mut input: &[u8] = &deliver;
    assert!(matches!(
        read_frame(&mut input, limits(10, 19)).await,
        Err(StreamError::ChunkTooLarge { size: 20, max: 19 })
    ));
    // A size that lies (more than the socket gives): the end of the stream.
    let mut input: &[u8] = &[0, 0, 0, 100, 0, 0x17, 0, 1];
    assert!(matches!(
        read_frame(&mut input, limits(1024, 1024)).await,
        Err(StreamError::Io(_))
    ));
    // Under a key and a version.
    let mut input: &[u8] = &[0, 0, 0, 2, 0, 0];
    assert!(matches!(
        read_frame(&mut input, limits(1024, 1024)).await,
        Err(StreamError::Protocol(_))
    ));
    let mut input: &[u8] = &[0, 0, 0, 4, 0, 0x17, 0, 1];
    assert_eq!(
        &read_frame(&mut input, limits(1024, 1024))
            .await
            .expect("a heartbeat")[..],
        &[0, 0x17, 0, 1]
    );
}

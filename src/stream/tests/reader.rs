//! The connection's reader on an in-memory socket: events in socket order,
//! responses to their requests, the broker's close, heartbeat silence.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::encode::{chunk, message, s, Entry};
use crate::stream::client::{reader, Limits, State};
use crate::stream::{StreamError, StreamEvent};

const LIMITS: Limits = Limits {
    frame_max: 1024 * 1024,
    chunk_max: 1024 * 1024,
};

fn deliver(subscription: u8, c: &Bytes) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u32(5 + c.len() as u32);
    b.put_u16(8);
    b.put_u16(1);
    b.put_u8(subscription);
    b.put_slice(c);
    b.freeze()
}

#[tokio::test]
async fn chunks_come_in_socket_order_and_a_malformed_record_does_not_close() {
    let (mut server, client) = tokio::io::duplex(1 << 20);
    let (out, mut out_rx) = mpsc::unbounded_channel();
    let (tx, mut events) = mpsc::unbounded_channel();
    let state = Arc::new(State::new(out, tx, 1));
    tokio::spawn(reader(client, state.clone(), LIMITS, Duration::ZERO));
    // Five chunks at once (credit 5), one record in the third malformed.
    for i in 0..5u64 {
        let record = if i == 2 {
            Bytes::from_static(&[0x00, 0x53, 0x74, 0xd1, 0xff])
        } else {
            message(b"x", vec![(s("i"), s(&i.to_string()))])
        };
        let c = chunk(i * 10, 0, &[Entry::Simple(record)]);
        server.write_all(&deliver(1, &c)).await.expect("write");
    }
    // A response for a waiting request, then the broker's close.
    let (corr, rx) = state.register();
    let mut resp = BytesMut::new();
    resp.put_u32(10);
    resp.put_slice(&[0x80, 0x0c, 0, 1]);
    resp.put_u32(corr);
    resp.put_u16(1);
    server.write_all(&resp).await.expect("write");
    let close = [
        0, 0, 0, 15, 0, 0x16, 0, 1, 0, 0, 0, 9, 0, 2, 0, 3, b'b', b'y', b'e',
    ];
    server.write_all(&close[..]).await.expect("write");
    for i in 0..5u64 {
        match events.recv().await {
            Some(StreamEvent::Chunk(c)) => {
                assert_eq!(c.first_offset, i * 10);
                assert_eq!(c.messages[0].malformed.is_some(), i == 2);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(rx.await.expect("answered").code, 1);
    match events.recv().await {
        Some(StreamEvent::Closed(StreamError::ClosedByBroker { code: 2, reason })) => {
            assert_eq!(reason, "bye")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        state.ended(),
        Some(StreamError::ClosedByBroker { .. })
    ));
    // The broker's close was answered (queued before the end was recorded).
    let answer = out_rx.try_recv().expect("the close answered");
    assert_eq!(
        &answer[..],
        &[0, 0, 0, 10, 0x80, 0x16, 0, 1, 0, 0, 0, 9, 0, 1]
    );
}

#[tokio::test(start_paused = true)]
async fn twice_the_heartbeat_of_silence_closes() {
    let (_server, client) = tokio::io::duplex(64);
    let (out, _out_rx) = mpsc::unbounded_channel();
    let (tx, mut events) = mpsc::unbounded_channel();
    let state = Arc::new(State::new(out, tx, 1));
    tokio::spawn(reader(
        client,
        state.clone(),
        LIMITS,
        Duration::from_secs(5),
    ));
    let (_, pending) = state.register();
    match events.recv().await {
        Some(StreamEvent::Closed(StreamError::HeartbeatTimeout { silent })) => {
            assert_eq!(silent, Duration::from_secs(10))
        }
        other => panic!("{other:?}"),
    }
    assert!(pending.await.is_err(), "a waiting request is failed");
}

#[tokio::test]
async fn a_frame_over_the_maximum_closes_with_its_error() {
    let (mut server, client) = tokio::io::duplex(64);
    let (out, _out_rx) = mpsc::unbounded_channel();
    let (tx, mut events) = mpsc::unbounded_channel();
    let state = Arc::new(State::new(out, tx, 1));
    tokio::spawn(reader(client, state, LIMITS, Duration::ZERO));
    server
        .write_all(&[0x7f, 0xff, 0xff, 0xff, 0, 0x10, 0, 1])
        .await
        .expect("write");
    assert!(matches!(
        events.recv().await,
        Some(StreamEvent::Closed(StreamError::FrameTooLarge { .. }))
    ));
}

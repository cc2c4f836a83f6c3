//! Whoever can append to a stream is untrusted: a message whose AMQP 1.0
//! application-properties nest 20,000 lists deep (the official Rust
//! client's decoder overflows its stack on about 5,000) is dead-lettered as
//! `malformed-headers`, and the shop handles the next order and stays up.
//!
//! The message is appended over the stream protocol itself (AMQP 0-9-1
//! cannot carry it): a minimal publisher written here, frame by frame.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::streams::{handled_counts, stream_queues, stream_yaml};
use crate::support::{message_headers, stream_port, unique, Broker, ShopProcess};

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as i16).to_be_bytes());
    b.extend_from_slice(s.as_bytes());
}

async fn send(sock: &mut TcpStream, key: u16, body: &[u8]) {
    let mut f = Vec::with_capacity(body.len() + 8);
    f.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    f.extend_from_slice(&key.to_be_bytes());
    f.extend_from_slice(&1u16.to_be_bytes());
    f.extend_from_slice(body);
    sock.write_all(&f).await.expect("write a frame");
}

/// Reads frames until one with `key`; returns its body after key and version.
async fn until(sock: &mut TcpStream, key: u16) -> Vec<u8> {
    loop {
        let size = tokio::time::timeout(Duration::from_secs(10), sock.read_u32())
            .await
            .expect("the broker answers")
            .expect("read a frame");
        let mut buf = vec![0; size as usize];
        sock.read_exact(&mut buf).await.expect("read a frame");
        let k = u16::from_be_bytes([buf[0], buf[1]]);
        assert_ne!(
            k,
            0x0016,
            "the broker closed the connection: {:?}",
            String::from_utf8_lossy(&buf[4..])
        );
        if k == 0x0014 {
            // Tune: answer with the same values.
            send(sock, 0x0014, &buf[4..]).await;
        }
        if k == key {
            return buf[4..].to_vec();
        }
    }
}

/// A publisher of raw AMQP 1.0 records to `stream`, over the stream protocol.
async fn raw_publisher(stream: &str) -> TcpStream {
    let mut sock = TcpStream::connect(("127.0.0.1", stream_port()))
        .await
        .expect("the stream plugin listens");
    let mut b = 1u32.to_be_bytes().to_vec();
    b.extend_from_slice(&0i32.to_be_bytes());
    send(&mut sock, 0x0011, &b).await;
    until(&mut sock, 0x8011).await;
    send(&mut sock, 0x0012, &2u32.to_be_bytes()).await;
    until(&mut sock, 0x8012).await;
    let mut b = 3u32.to_be_bytes().to_vec();
    string(&mut b, "PLAIN");
    let creds = b"\0guest\0guest";
    b.extend_from_slice(&(creds.len() as i32).to_be_bytes());
    b.extend_from_slice(creds);
    send(&mut sock, 0x0013, &b).await;
    until(&mut sock, 0x8013).await;
    // The broker's tune, answered before the open.
    until(&mut sock, 0x0014).await;
    let mut b = 4u32.to_be_bytes().to_vec();
    string(&mut b, "/");
    send(&mut sock, 0x0015, &b).await;
    let open = until(&mut sock, 0x8015).await;
    assert_eq!(&open[4..6], &[0, 1], "open answered OK");
    let mut b = 5u32.to_be_bytes().to_vec();
    b.push(7);
    string(&mut b, "acemq-hostile-test");
    string(&mut b, stream);
    send(&mut sock, 0x0001, &b).await;
    let declared = until(&mut sock, 0x8001).await;
    assert_eq!(&declared[4..6], &[0, 1], "publisher declared");
    sock
}

async fn publish(sock: &mut TcpStream, id: u64, record: &[u8]) {
    let mut b = vec![7u8];
    b.extend_from_slice(&1i32.to_be_bytes());
    b.extend_from_slice(&id.to_be_bytes());
    b.extend_from_slice(&(record.len() as i32).to_be_bytes());
    b.extend_from_slice(record);
    send(sock, 0x0002, &b).await;
    until(sock, 0x0003).await;
}

/// A data section holding `body`.
fn data(body: &[u8]) -> Vec<u8> {
    let mut d = vec![0x00, 0x53, 0x75, 0xb0];
    d.extend_from_slice(&(body.len() as u32).to_be_bytes());
    d.extend_from_slice(body);
    d
}

/// Application properties `{ "k": [[[…]]] }`, `depth` lists deep.
fn deep_properties(depth: usize) -> Vec<u8> {
    let mut v = vec![0x45]; // the empty list
    for _ in 0..depth {
        let mut outer = vec![0xd0];
        outer.extend_from_slice(&((v.len() + 4) as u32).to_be_bytes());
        outer.extend_from_slice(&1u32.to_be_bytes());
        outer.extend_from_slice(&v);
        v = outer;
    }
    let mut map = vec![0xa1, 1, b'k'];
    map.extend_from_slice(&v);
    let mut section = vec![0x00, 0x53, 0x74, 0xd1];
    section.extend_from_slice(&((map.len() + 4) as u32).to_be_bytes());
    section.extend_from_slice(&2u32.to_be_bytes());
    section.extend_from_slice(&map);
    section
}

#[tokio::test]
async fn a_message_nested_20000_deep_on_a_stream_is_dead_lettered_as_malformed_and_the_shop_goes_on(
) {
    let s = unique("stream-hostile");
    let mut broker = Broker::new().await;
    let mut shop = ShopProcess::spawn(&s, &stream_yaml(&s, ""), &[("RUST_LOG", "info")]);
    shop.wait_stderr("consuming the stream", Duration::from_secs(20))
        .await;
    let mut publisher = raw_publisher(&s).await;
    let mut hostile = deep_properties(20_000);
    hostile.extend(data(br#"{"id":"hostile"}"#));
    publish(&mut publisher, 1, &hostile).await;
    publish(&mut publisher, 2, &data(br#"{"id":"after"}"#)).await;

    shop.wait_stderr("order handled order=after", Duration::from_secs(20))
        .await;
    assert!(
        broker
            .wait_ready(&format!("{s}.dlq"), 1, Duration::from_secs(10))
            .await,
        "the hostile message never reached {s}.dlq; stderr:\n{}",
        shop.stderr()
    );
    let dead = broker
        .get(&format!("{s}.dlq"))
        .await
        .expect("a dead letter");
    let headers = message_headers(&dead.properties);
    assert_eq!(
        headers.get("x-acemq-reason").and_then(|v| v.as_str()),
        Some("malformed-headers")
    );
    assert!(!handled_counts(&[shop.stderr()]).contains_key("hostile"));
    assert!(
        matches!(shop.readyz().await, Some((200, _))),
        "the shop is up and ready"
    );
    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
    broker.delete(&stream_queues(&s)).await;
}

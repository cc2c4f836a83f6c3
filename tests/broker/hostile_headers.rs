//! A message whose headers nest 1,000 tables deep (7 KB), consumed with plain
//! lapin: the connection stays up, the delivery arrives without its headers
//! and marked (`headers_skipped`), so that it can be rejected, and the next
//! message is delivered too. Without the nesting limit in amq-protocol
//! (`vendor/`), `lapin-io-loop` overflows its stack parsing the header frame
//! and the whole process aborts.
//!
//! The message is published as a stranger would, as raw frames over a
//! connection driven by hand: lapin's generator serialises a table
//! recursively on the publisher's own IO thread, 1,000 levels deep, which is
//! as likely to overflow as the parse.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicRejectOptions, QueueDeclareOptions,
};
use lapin::types::{FieldTable, SkipReason, SkippedFieldTable};

use crate::support::{
    addr, connect, eventually, field_table, long_str, message_headers, start_on_ladder, unique,
    Broker, QueueCleanup,
};

/// A headers table nested `depth` tables deep (itself included): each holds
/// the next under the name "a", the innermost is empty.
fn nested_headers(depth: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(depth * 7);
    for level in 0..depth {
        let contents = ((depth - 1 - level) * 7) as u32;
        out.extend_from_slice(&contents.to_be_bytes());
        if level + 1 < depth {
            out.extend_from_slice(&[1, b'a', b'F']);
        }
    }
    out
}

fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = [
        &[kind][..],
        &channel.to_be_bytes(),
        &(payload.len() as u32).to_be_bytes(),
    ]
    .concat();
    f.extend_from_slice(payload);
    f.push(0xCE);
    f
}

/// Sends a method frame: class, method, then `args`.
fn send(s: &mut TcpStream, channel: u16, class: u16, id: u16, args: &[&[u8]]) {
    let payload = [&class.to_be_bytes()[..], &id.to_be_bytes(), &args.concat()].concat();
    s.write_all(&frame(1, channel, &payload)).unwrap();
}

fn short_str(s: &str) -> Vec<u8> {
    [&[s.len() as u8][..], s.as_bytes()].concat()
}

fn long_bytes(b: &[u8]) -> Vec<u8> {
    [&(b.len() as u32).to_be_bytes()[..], b].concat()
}

/// Reads frames until a method frame, and returns its class and method ids.
fn read_method(s: &mut TcpStream) -> (u16, u16) {
    loop {
        let mut head = [0u8; 7];
        s.read_exact(&mut head).expect("a frame from the broker");
        let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
        let mut payload = vec![0u8; size + 1];
        s.read_exact(&mut payload).expect("the frame's payload");
        if head[0] == 1 {
            let id = |i: usize| u16::from_be_bytes([payload[i], payload[i + 1]]);
            return (id(0), id(2));
        }
    }
}

fn expect(s: &mut TcpStream, class: u16, id: u16) {
    let got = read_method(s);
    assert_eq!(got, (class, id), "the broker answered another method");
}

/// Publishes `body` to `queue` through the default exchange with `header`
/// as the content header frame's payload, over a connection driven by hand,
/// and waits for the broker's confirm.
fn raw_publish(queue: &str, header: &[u8], body: &[u8]) {
    let uri: lapin::uri::AMQPUri = addr().parse().expect("AMQP_ADDR is an AMQP URI");
    let (host, port) = (uri.authority.host.as_str(), uri.authority.port);
    let mut s = TcpStream::connect((host, port)).expect("the broker");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"AMQP\x00\x00\x09\x01").unwrap();
    // connection.start, start-ok (no client properties, PLAIN), tune
    expect(&mut s, 10, 10);
    let user = &uri.authority.userinfo;
    let plain = long_bytes(format!("\0{}\0{}", user.username, user.password).as_bytes());
    let (mechanism, locale) = (short_str("PLAIN"), short_str("en_US"));
    send(&mut s, 0, 10, 11, &[&[0; 4], &mechanism, &plain, &locale]);
    expect(&mut s, 10, 30);
    // tune-ok (1 channel, frames up to 128 KiB, no heartbeat), open
    let (channels, frame_max) = (1u16.to_be_bytes(), 131_072u32.to_be_bytes());
    send(&mut s, 0, 10, 31, &[&channels, &frame_max, &[0, 0]]);
    send(&mut s, 0, 10, 40, &[&short_str(&uri.vhost), &[0, 0]]);
    expect(&mut s, 10, 41);
    // channel.open, confirm.select
    send(&mut s, 1, 20, 10, &[&[0]]);
    expect(&mut s, 20, 11);
    send(&mut s, 1, 85, 10, &[&[0]]);
    expect(&mut s, 85, 11);
    // basic.publish, the content, and basic.ack: the broker has the message
    let (exchange, routing_key) = (short_str(""), short_str(queue));
    send(&mut s, 1, 60, 40, &[&[0, 0], &exchange, &routing_key, &[0]]);
    s.write_all(&[frame(2, 1, header), frame(3, 1, body)].concat())
        .unwrap();
    expect(&mut s, 60, 80);
    // connection.close, close-ok
    send(&mut s, 0, 10, 50, &[&200u16.to_be_bytes(), &[0], &[0; 4]]);
    expect(&mut s, 10, 51);
}

async fn next_delivery(consumer: &mut lapin::Consumer) -> lapin::message::Delivery {
    tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("a delivery within 10 s")
        .expect("the consumer is open")
        .expect("a delivery, not an error")
}

#[tokio::test]
async fn a_message_with_headers_nested_1000_deep_is_delivered_marked_and_the_next_one_too() {
    let q = unique("hostile.headers");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    let conn = connect().await;
    let ch = conn.create_channel().await.expect("channel");
    ch.queue_declare(
        q.as_str().into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("declare");

    // basic content header: class 60, weight 0, body size 7; content type,
    // headers and delivery mode present.
    let headers = nested_headers(1_000);
    let header = [
        &60u16.to_be_bytes()[..],
        &[0, 0],
        &7u64.to_be_bytes(),
        &(1u16 << 15 | 1 << 13 | 1 << 12).to_be_bytes(),
        &short_str("text/plain"),
        &headers,
        &[2],
    ]
    .concat();
    let queue = q.clone();
    tokio::task::spawn_blocking(move || raw_publish(&queue, &header, b"hostile"))
        .await
        .expect("the raw publish");
    let mut broker = Broker::new().await;
    let next = field_table(vec![("x-kind", long_str("normal"))]);
    broker.publish(&q, b"normal", next.clone()).await;

    let mut consumer = ch
        .basic_consume(
            q.as_str().into(),
            "hostile-headers".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let hostile = next_delivery(&mut consumer).await;
    assert_eq!(hostile.data, b"hostile");
    assert_eq!(hostile.properties.headers(), &None);
    let size = headers.len() as u32 - 4;
    assert_eq!(
        hostile.properties.headers_skipped(),
        &Some(SkippedFieldTable::new(size, SkipReason::NestingTooDeep))
    );
    // The properties around the headers are read as sent.
    assert_eq!(
        hostile.properties.content_type(),
        &Some("text/plain".into())
    );
    assert_eq!(hostile.properties.delivery_mode(), &Some(2));
    hostile
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await
        .expect("reject");

    let normal = next_delivery(&mut consumer).await;
    assert_eq!(normal.data, b"normal");
    assert_eq!(normal.properties.headers(), &Some(next));
    assert_eq!(normal.properties.headers_skipped(), &None);
    normal
        .acker
        .ack(BasicAckOptions::default())
        .await
        .expect("ack");

    assert!(conn.status().connected() && ch.status().connected());
    assert_eq!(broker.ready(&q).await, Some(0), "nothing left or requeued");
    broker.delete(std::slice::from_ref(&q)).await;
}

/// A content header frame's payload: class 60, body of `body_len` bytes,
/// headers `headers` (a table's encoding, its size prefix included) and
/// delivery mode 2.
fn content_header(body_len: u64, headers: &[u8]) -> Vec<u8> {
    [
        &60u16.to_be_bytes()[..],
        &[0, 0],
        &body_len.to_be_bytes(),
        &(1u16 << 13 | 1 << 12).to_be_bytes(),
        headers,
        &[2],
    ]
    .concat()
}

#[tokio::test]
async fn an_app_dead_letters_headers_nested_too_deep_as_malformed_headers_and_handles_the_next() {
    use std::sync::{Arc, Mutex};

    let q = unique("hostile.app");
    let seen = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let handler = {
        let seen = seen.clone();
        tower::service_fn(move |d: acemq::Delivery| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(d.body().to_vec());
                Ok::<(), acemq::BoxError>(())
            }
        })
    };
    let (running, all) = start_on_ladder(&q, handler).await;
    let _cleanup = QueueCleanup::new(all.clone());

    // 1,000 levels: set aside by the parser (over its 64). 40 levels: read
    // by the parser, set aside by acemq's conversion (over its 32).
    for (depth, body) in [(1_000, &b"parser"[..]), (40, b"convert")] {
        let header = content_header(body.len() as u64, &nested_headers(depth));
        let (queue, body) = (q.clone(), body.to_vec());
        tokio::task::spawn_blocking(move || raw_publish(&queue, &header, &body))
            .await
            .expect("the raw publish");
    }
    let mut broker = Broker::new().await;
    broker.publish(&q, b"normal", FieldTable::default()).await;

    let dlq = acemq_layers::dead_letter::dlq_name(&q);
    assert!(
        broker.wait_ready(&dlq, 2, Duration::from_secs(15)).await,
        "both hostile messages dead-lettered: {:?} ready in {dlq}",
        broker.ready(&dlq).await
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            seen.lock().unwrap().len() == 1
        })
        .await,
        "the next message handled: {:?}",
        seen.lock().unwrap()
    );
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let copy = broker.get(&dlq).await.expect("a dead-letter copy");
        let h = message_headers(&copy.delivery.properties);
        let reason = h.get("x-acemq-reason").and_then(|v| v.as_str());
        assert_eq!(reason, Some("malformed-headers"), "{h:?}");
        let error = h
            .get("x-acemq-error")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        assert!(error.contains("nested deeper than"), "{error}");
        // The copy carries none of the hostile table.
        assert!(h.get("a").is_none(), "{h:?}");
        bodies.push(copy.delivery.data.clone());
    }
    bodies.sort();
    assert_eq!(bodies, vec![b"convert".to_vec(), b"parser".to_vec()]);
    assert_eq!(*seen.lock().unwrap(), vec![b"normal".to_vec()]);
    assert!(running.health().snapshot().ready);
    running.drain().await.expect("clean drain");
    assert_eq!(broker.ready(&q).await, Some(0), "all settled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_outlives_headers_nested_1000_deep_dead_letters_them_and_handles_the_next_order() {
    let q = unique("hostile.shop");
    let _cleanup = QueueCleanup::new(crate::support::all_queues(&q));
    let mut shop = crate::support::ShopProcess::spawn(
        &q,
        &format!("shutdown_timeout: 10\nqueues:\n  - name: {q}\n    dead_letter: true\n"),
        &[],
    );
    shop.wait_ready().await;
    let body = br#"{"id":"o-hostile"}"#;
    let header = content_header(body.len() as u64, &nested_headers(1_000));
    let queue = q.clone();
    tokio::task::spawn_blocking(move || raw_publish(&queue, &header, body))
        .await
        .expect("the raw publish");
    let mut broker = Broker::new().await;
    broker
        .publish(&q, br#"{"id":"o-next"}"#, FieldTable::default())
        .await;

    let dlq = acemq_layers::dead_letter::dlq_name(&q);
    assert!(
        broker.wait_ready(&dlq, 1, Duration::from_secs(15)).await,
        "the hostile order dead-lettered; stderr:\n{}",
        shop.stderr()
    );
    shop.wait_stderr("o-next", Duration::from_secs(15)).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            crate::support::queue_counts(&q).await == Some((0, 0))
        })
        .await,
        "every order settled: {:?}",
        crate::support::queue_counts(&q).await
    );
    let copy = broker.get(&dlq).await.expect("the dead-letter copy");
    let h = message_headers(&copy.delivery.properties);
    assert_eq!(
        h.get("x-acemq-reason").and_then(|v| v.as_str()),
        Some("malformed-headers"),
        "{h:?}"
    );
    assert_eq!(copy.delivery.data, body);
    assert_eq!(shop.readyz().await.map(|(status, _)| status), Some(200));
    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
}

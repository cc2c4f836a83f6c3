//! acemq's stream protocol client against the real broker's stream plugin
//! (`ACEMQ_STREAM_PORT`, default 5552): streams declared and fed over AMQP
//! 0-9-1, read back over the stream protocol.

use std::time::Duration;

use acemq::stream::{
    Chunk, OffsetSpec, ResponseCode, StreamClient, StreamError, StreamEvent, StreamMessage,
    StreamOptions,
};
use acemq::Value;
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::support::{field_table, long_str, unique, Broker};

const WITHIN: Duration = Duration::from_secs(10);

fn options() -> StreamOptions {
    let url = url::Url::parse(&crate::support::addr()).expect("AMQP_ADDR is a URL");
    StreamOptions {
        host: url.host_str().unwrap_or("127.0.0.1").to_string(),
        port: crate::streams::stream_port(),
        connection_name: "acemq-test-stream".into(),
        ..StreamOptions::default()
    }
}

async fn connect() -> (StreamClient, UnboundedReceiver<StreamEvent>) {
    StreamClient::connect(&options())
        .await
        .unwrap_or_else(|e| panic!("the stream plugin did not accept a connection: {e}"))
}

/// A new stream, declared over AMQP.
async fn stream(broker: &mut Broker, prefix: &str) -> String {
    let name = unique(prefix);
    broker
        .declare(
            &name,
            field_table(vec![("x-queue-type", long_str("stream"))]),
        )
        .await
        .expect("declare the stream");
    name
}

/// Publishes `body` with a message id, a content type and two headers,
/// and waits for its confirm (so each publish is a chunk of its own).
async fn publish(broker: &mut Broker, stream: &str, i: u32) {
    let mut headers = FieldTable::default();
    headers.insert("k".into(), long_str(&format!("v{i}")));
    headers.insert("n".into(), AMQPValue::LongInt(i as i32));
    let props = BasicProperties::default()
        .with_headers(headers)
        .with_message_id(format!("m{i}").into())
        .with_content_type("text/plain".into());
    broker
        .publish_props(stream, format!("body {i}").as_bytes(), props)
        .await;
}

/// The next chunk, within `within`; other events are skipped (a closed
/// connection fails the test).
async fn next_chunk(
    events: &mut UnboundedReceiver<StreamEvent>,
    within: Duration,
) -> Option<Chunk> {
    let end = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(end, events.recv()).await {
            Ok(Some(StreamEvent::Chunk(c))) => return Some(c),
            Ok(Some(StreamEvent::Closed(e))) => panic!("the connection closed: {e}"),
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the events ended"),
            Err(_) => return None,
        }
    }
}

/// `n` messages, crediting one chunk for each chunk received.
async fn messages(
    client: &StreamClient,
    events: &mut UnboundedReceiver<StreamEvent>,
    n: usize,
) -> Vec<StreamMessage> {
    let mut out = Vec::new();
    while out.len() < n {
        let chunk = next_chunk(events, WITHIN)
            .await
            .unwrap_or_else(|| panic!("only {} of {n} messages within {WITHIN:?}", out.len()));
        client.credit(chunk.subscription, 1).expect("credit");
        out.extend(chunk.messages);
    }
    out
}

#[tokio::test]
async fn stream_reads_back_bodies_headers_and_properties_published_over_amqp() {
    let mut broker = Broker::new().await;
    let s = stream(&mut broker, "stream-read").await;
    for i in 0..5 {
        publish(&mut broker, &s, i).await;
    }
    let (client, mut events) = connect().await;
    assert!(client.server_version().is_some());
    client
        .subscribe(1, &s, OffsetSpec::First, 2, &[])
        .await
        .expect("subscribe");
    let got = messages(&client, &mut events, 5).await;
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.malformed, None, "{m:?}");
        assert_eq!(m.offset, i as u64, "offsets are contiguous from 0");
        assert_eq!(&m.body[..], format!("body {i}").as_bytes());
        assert_eq!(
            m.properties.message_id.as_deref(),
            Some(format!("m{i}").as_str())
        );
        assert_eq!(m.properties.content_type.as_deref(), Some("text/plain"));
        assert_eq!(
            m.headers.get("k").and_then(Value::as_str),
            Some(format!("v{i}").as_str())
        );
        assert_eq!(
            m.headers.get("n").and_then(Value::as_i64),
            Some(i as i64),
            "{m:?}"
        );
    }
    let meta = client
        .metadata(&[&s, "acemq-test.no-such-stream"])
        .await
        .expect("metadata");
    assert_eq!(meta.len(), 2, "{meta:?}");
    let mine = meta
        .iter()
        .find(|m| m.stream == s)
        .expect("the stream's metadata");
    assert_eq!(mine.code, ResponseCode::Ok);
    assert!(mine.leader.is_some(), "{mine:?}");
    let missing = meta
        .iter()
        .find(|m| m.stream != s)
        .expect("the missing one");
    assert_eq!(missing.code, ResponseCode::StreamDoesNotExist);
    // Statistics: on 3.10 the broker has no such command (None); later, the
    // first offset is 0.
    if let Some(stats) = client.stream_stats(&s).await.expect("stream stats") {
        assert_eq!(stats.first_offset, Some(0), "{stats:?}");
    }
    assert!(matches!(
        client.subscribe(1, &s, OffsetSpec::First, 1, &[]).await,
        Err(StreamError::SubscriptionIdInUse { id: 1 })
    ));
    client.unsubscribe(1).await.expect("unsubscribe");
    client.close().await.expect("close");
    broker.delete(&[s]).await;
}

#[tokio::test]
async fn stream_credit_of_one_delivers_one_chunk_until_credited() {
    let mut broker = Broker::new().await;
    let s = stream(&mut broker, "stream-credit").await;
    for i in 0..3 {
        publish(&mut broker, &s, i).await;
    }
    let (client, mut events) = connect().await;
    client
        .subscribe(7, &s, OffsetSpec::First, 1, &[])
        .await
        .expect("subscribe");
    let first = next_chunk(&mut events, WITHIN)
        .await
        .expect("a first chunk");
    assert_eq!(first.subscription, 7);
    assert_eq!(first.first_offset, 0);
    // No credit left: nothing more comes (a bounded wait for absence).
    assert!(next_chunk(&mut events, Duration::from_millis(500))
        .await
        .is_none());
    client.credit(7, 1).expect("credit");
    let second = next_chunk(&mut events, WITHIN)
        .await
        .expect("a chunk after credit");
    assert_eq!(
        second.first_offset,
        first.first_offset + first.messages.len() as u64,
        "chunks in offset order"
    );
    client.close().await.expect("close");
    broker.delete(&[s]).await;
}

#[tokio::test]
async fn stream_store_offset_is_read_back_and_an_unknown_reference_has_none() {
    let mut broker = Broker::new().await;
    let s = stream(&mut broker, "stream-offsets").await;
    publish(&mut broker, &s, 0).await;
    let (client, _events) = connect().await;
    assert_eq!(
        client.query_offset("nobody", &s).await.expect("query"),
        None
    );
    client.store_offset("app", &s, 42).expect("store");
    let stored = crate::support::eventually(WITHIN, || async {
        client.query_offset("app", &s).await.expect("query") == Some(42)
    })
    .await;
    assert!(
        stored,
        "the stored offset was not read back within {WITHIN:?}"
    );
    client.close().await.expect("close");
    broker.delete(&[s]).await;
}

#[tokio::test]
async fn stream_subscribe_to_a_missing_stream_is_a_typed_error() {
    let (client, _events) = connect().await;
    let missing = unique("stream-missing");
    let err = client
        .subscribe(1, &missing, OffsetSpec::First, 1, &[])
        .await
        .expect_err("no such stream");
    assert!(
        matches!(&err, StreamError::StreamDoesNotExist { stream } if *stream == missing),
        "{err:?}"
    );
    assert!(err.to_string().contains("does not exist"), "{err}");
    client.close().await.expect("close");
}

#[tokio::test]
async fn stream_deleted_while_subscribed_gives_a_metadata_update() {
    let mut broker = Broker::new().await;
    let s = stream(&mut broker, "stream-deleted").await;
    let (client, mut events) = connect().await;
    client
        .subscribe(3, &s, OffsetSpec::Next, 1, &[])
        .await
        .expect("subscribe");
    broker.delete(std::slice::from_ref(&s)).await;
    let end = tokio::time::Instant::now() + WITHIN;
    let update = loop {
        match tokio::time::timeout_at(end, events.recv()).await {
            Ok(Some(StreamEvent::MetadataUpdate { stream, code })) => break (stream, code),
            Ok(Some(StreamEvent::Closed(e))) => panic!("closed instead: {e}"),
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the events ended"),
            Err(_) => panic!("no metadata update within {WITHIN:?} of deleting the stream"),
        }
    };
    assert_eq!(update.0, s);
    assert_eq!(
        ResponseCode::from_u16(update.1),
        ResponseCode::StreamNotAvailable
    );
    client.close().await.expect("close");
}

#[tokio::test]
async fn stream_wrong_password_is_an_authentication_error_without_the_password() {
    let opts = StreamOptions {
        password: "not-the-password-xyzzy".into(),
        ..options()
    };
    let err = StreamClient::connect(&opts).await.expect_err("refused");
    assert!(matches!(err, StreamError::Authentication { .. }), "{err:?}");
    assert!(!err.to_string().contains("xyzzy"), "{err}");
    assert!(!format!("{err:?}").contains("xyzzy"), "{err:?}");
    assert!(!format!("{opts:?}").contains("xyzzy"));
}

#[tokio::test]
async fn stream_unreachable_port_says_to_enable_the_plugin() {
    let opts = StreamOptions {
        port: 1,
        connect_timeout: Duration::from_secs(5),
        ..options()
    };
    let err = StreamClient::connect(&opts)
        .await
        .expect_err("nothing listens on port 1");
    assert!(
        err.to_string()
            .contains("rabbitmq-plugins enable rabbitmq_stream"),
        "{err}"
    );
}

#[tokio::test]
async fn stream_offset_specs_first_last_next_offset_and_timestamp() {
    let mut broker = Broker::new().await;
    let s = stream(&mut broker, "stream-specs").await;
    for i in 0..3 {
        publish(&mut broker, &s, i).await;
    }
    let (client, mut events) = connect().await;
    // First: everything, each chunk's timestamp kept for the timestamp spec.
    client
        .subscribe(1, &s, OffsetSpec::First, 10, &[])
        .await
        .expect("first");
    let mut chunks = Vec::new();
    let mut seen = 0;
    while seen < 3 {
        let c = next_chunk(&mut events, WITHIN)
            .await
            .expect("chunks from first");
        seen += c.messages.len();
        chunks.push(c);
    }
    assert_eq!(chunks[0].first_offset, 0);
    client.unsubscribe(1).await.expect("unsubscribe");

    // One credit each from here: one chunk per subscription, so no chunk
    // of an earlier one is still on its way.
    // Last: the last chunk.
    let last = chunks.last().expect("a chunk").first_offset;
    client
        .subscribe(2, &s, OffsetSpec::Last, 1, &[])
        .await
        .expect("last");
    let c = next_chunk(&mut events, WITHIN)
        .await
        .expect("a chunk from last");
    assert_eq!((c.subscription, c.first_offset), (2, last));
    client.unsubscribe(2).await.expect("unsubscribe");

    // Offset(1): the chunk holding offset 1, its messages from there on.
    client
        .subscribe(3, &s, OffsetSpec::Offset(1), 1, &[])
        .await
        .expect("offset");
    let c = next_chunk(&mut events, WITHIN)
        .await
        .expect("a chunk from offset 1");
    assert!(c.messages.iter().any(|m| m.offset == 1), "{c:?}");
    assert!(c.first_offset <= 1);
    client.unsubscribe(3).await.expect("unsubscribe");

    // Timestamp: the first chunk written at or after the last chunk's time.
    let t = chunks.last().expect("a chunk").timestamp_ms;
    let expected = chunks
        .iter()
        .find(|c| c.timestamp_ms >= t)
        .expect("one")
        .first_offset;
    client
        .subscribe(4, &s, OffsetSpec::Timestamp(t), 1, &[])
        .await
        .expect("timestamp");
    let c = next_chunk(&mut events, WITHIN)
        .await
        .expect("a chunk from the timestamp");
    assert_eq!((c.subscription, c.first_offset), (4, expected));
    client.unsubscribe(4).await.expect("unsubscribe");

    // Next: nothing until a new message, then that one.
    client
        .subscribe(5, &s, OffsetSpec::Next, 10, &[])
        .await
        .expect("next");
    publish(&mut broker, &s, 3).await;
    let c = next_chunk(&mut events, WITHIN)
        .await
        .expect("the new chunk");
    assert_eq!(c.subscription, 5);
    assert_eq!(c.messages.first().map(|m| m.offset), Some(3));
    client.close().await.expect("close");
    broker.delete(&[s]).await;
}

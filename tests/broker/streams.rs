//! Streams through the shop as a black box (`type: stream`): every order
//! appended is handled once, a SIGTERM stores the offset so a restart
//! handles none again, a failure leaves the stream for its rung and work
//! queue, and a permanent one lands in `<stream>.dlq` with its reason.
//!
//! Needs the `rabbitmq_stream` plugin (`rabbitmq-plugins enable
//! rabbitmq_stream`); its port is `support::stream_port()`.

use std::collections::HashMap;
use std::time::Duration;

use lapin::BasicProperties;

use crate::support::{eventually, message_headers, stream_port, unique, Broker, ShopProcess};

/// A shop config consuming stream `s`, with rungs (1 s) and a dead-letter
/// queue.
pub fn stream_yaml(s: &str, extra: &str) -> String {
    format!(
        "shutdown_timeout: 10\nstreams: {{ port: {} }}\nqueues:\n  - name: {s}\n    type: stream\n    prefetch: 200\n    concurrency: 8\n    dead_letter: true\n    retries: {{ max_attempts: 3, initial_delay: 1, max_delay: 1, broker_wait_threshold: 1 }}\n{extra}",
        stream_port()
    )
}

/// Every queue a stream entry `s` with a 1 s rung declares.
pub fn stream_queues(s: &str) -> Vec<String> {
    vec![
        s.to_owned(),
        format!("{s}.dlq"),
        format!("{s}.retry.1s"),
        format!("{s}.work"),
    ]
}

/// How many times each order id was handled, from the shop's log lines.
pub fn handled_counts(logs: &[String]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for log in logs {
        for line in log.lines().filter(|l| l.contains("order handled")) {
            if let Some(id) = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("order="))
            {
                *counts.entry(id.to_owned()).or_insert(0) += 1;
            }
        }
    }
    counts
}

fn orders(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!(r#"{{"id":"{prefix}-{i}"}}"#).into_bytes())
        .collect()
}

async fn handled_within(shop: &ShopProcess, earlier: &[String], n: usize, within: Duration) {
    let ok = eventually(within, || async {
        let mut logs = earlier.to_vec();
        logs.push(shop.stderr());
        handled_counts(&logs).len() >= n
    })
    .await;
    let mut logs = earlier.to_vec();
    logs.push(shop.stderr());
    assert!(
        ok,
        "{} distinct orders handled, wanted {n}; last stderr:\n{}",
        handled_counts(&logs).len(),
        shop.stderr()
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn stream_orders_are_handled_once_across_a_sigterm_and_failures_leave_the_stream() {
    let s = unique("stream-shop");
    let mut broker = Broker::new().await;
    let yaml = stream_yaml(&s, "");
    let envs = [("RUST_LOG", "info")];

    // 1,000 orders appended to the stream, the shop started after them.
    let mut shop = ShopProcess::spawn(&s, &yaml, &envs);
    shop.wait_stderr("consuming the stream", Duration::from_secs(20))
        .await;
    broker
        .publish_many(&s, &orders("a", 1000), BasicProperties::default())
        .await;
    handled_within(&shop, &[], 1000, Duration::from_secs(60)).await;

    // SIGTERM: exit 0, the offset stored and confirmed.
    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
    assert!(
        shop.stderr()
            .contains("offset stored and confirmed at the drain"),
        "stderr:\n{}",
        shop.stderr()
    );
    let first = shop.stderr();

    // A restart handles none again; 100 more exactly once; one order
    // that fails once is handled on its retry; a permanent failure lands
    // in the dead-letter queue.
    let mut shop = ShopProcess::spawn(&s, &yaml, &envs);
    shop.wait_stderr("consuming the stream", Duration::from_secs(20))
        .await;
    let mut more = orders("b", 100);
    more.push(br#"{"id":"once","fail_attempts":1}"#.to_vec());
    more.push(br#"{"id":"never","fail":"permanent"}"#.to_vec());
    broker
        .publish_many(&s, &more, BasicProperties::default())
        .await;
    handled_within(
        &shop,
        std::slice::from_ref(&first),
        1101,
        Duration::from_secs(60),
    )
    .await;
    assert!(
        broker
            .wait_ready(&format!("{s}.dlq"), 1, Duration::from_secs(10))
            .await,
        "the permanent failure never reached {s}.dlq"
    );
    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());

    let counts = handled_counts(&[first, shop.stderr()]);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    assert_eq!(counts.len(), 1101, "1,000 + 100 + the retried one");
    assert!(
        shop.stderr().contains("order handled order=once attempt=2"),
        "the failed order is handled on its retry; stderr:\n{}",
        shop.stderr()
    );
    let dead = broker
        .get(&format!("{s}.dlq"))
        .await
        .expect("a dead letter");
    let headers = message_headers(&dead.properties);
    assert_eq!(
        headers.get("x-acemq-reason").and_then(|v| v.as_str()),
        Some("rejected")
    );
    assert!(String::from_utf8_lossy(&dead.data).contains("never"));
    // Nothing was appended back to the stream: 1,102 messages.
    broker.delete(&stream_queues(&s)).await;
}

/// A stream entry `s` for an in-process app: dead letters on, no retries.
fn stream_config(s: &str) -> acemq::Config {
    let mut q = acemq::config::QueueConfig::new(s);
    q.kind = acemq::config::QueueType::Stream;
    q.dead_letter = true;
    q.prefetch = 50;
    q.concurrency = 4;
    q.max_redeliveries = 3;
    let mut config = acemq::Config::new([q]);
    config.streams.port = stream_port();
    config.shutdown_timeout = Duration::from_secs(10);
    config
}

#[tokio::test]
async fn a_stream_message_handed_back_again_and_again_is_dead_lettered_as_redelivered_and_the_rest_go_on(
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let s = unique("stream-requeue");
    let mut broker = Broker::new().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let handled = Arc::new(AtomicUsize::new(0));
    let (c, h) = (calls.clone(), handled.clone());
    let running = crate::support::start_consuming(
        stream_config(&s),
        &s,
        tower::service_fn(move |d: acemq::Delivery| {
            let (c, h) = (c.clone(), h.clone());
            async move {
                if d.body().as_ref() == b"poison" {
                    c.fetch_add(1, Ordering::SeqCst);
                    return Ok::<_, acemq::BoxError>(acemq::Verdict::Requeue);
                }
                h.fetch_add(1, Ordering::SeqCst);
                Ok(acemq::Verdict::Ack)
            }
        }),
    )
    .await;
    let mut bodies = vec![b"poison".to_vec()];
    bodies.extend((0..20).map(|i| format!("ok-{i}").into_bytes()));
    broker
        .publish_many(&s, &bodies, BasicProperties::default())
        .await;
    assert!(
        broker
            .wait_ready(&format!("{s}.dlq"), 1, Duration::from_secs(15))
            .await,
        "the poison message never reached {s}.dlq"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            handled.load(Ordering::SeqCst) == 20
        })
        .await,
        "the other 20 were handled: {}",
        handled.load(Ordering::SeqCst)
    );
    // The first run and 3 re-runs; the fifth is dead-lettered unhandled.
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let dead = broker
        .get(&format!("{s}.dlq"))
        .await
        .expect("a dead letter");
    let headers = message_headers(&dead.properties);
    assert_eq!(
        headers.get("x-acemq-reason").and_then(|v| v.as_str()),
        Some("redelivered")
    );
    let report = running.drain().await.expect("a clean drain");
    assert_eq!(report.lost(), 0);
    broker.delete(&[s.clone(), format!("{s}.dlq")]).await;
}

#[tokio::test]
async fn a_stream_of_large_messages_written_in_one_burst_is_read_whole() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let s = unique("stream-large");
    let mut broker = Broker::new().await;
    let mut args = lapin::types::FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        lapin::types::AMQPValue::LongString("stream".into()),
    );
    broker.declare(&s, args).await.expect("declare the stream");
    // 40 messages of 300 KB published back to back: the broker may write
    // several into one chunk, past the 1 MiB frame the client asks for.
    let bodies: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 300 * 1024]).collect();
    broker
        .publish_many(&s, &bodies, BasicProperties::default())
        .await;
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let running = crate::support::start_consuming(
        stream_config(&s),
        &s,
        tower::service_fn(move |d: acemq::Delivery| {
            let h = h.clone();
            async move {
                assert_eq!(d.body().len(), 300 * 1024);
                h.fetch_add(1, Ordering::SeqCst);
                Ok::<_, acemq::BoxError>(())
            }
        }),
    )
    .await;
    let ok = eventually(Duration::from_secs(20), || async {
        handled.load(Ordering::SeqCst) == 40
    })
    .await;
    let n = handled.load(Ordering::SeqCst);
    let _ = running.drain().await;
    broker.delete(&[s.clone(), format!("{s}.dlq")]).await;
    assert!(ok, "{n} of 40 large messages handled");
}

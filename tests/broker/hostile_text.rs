//! Text a publisher controls, in the log lines a person reads: a handler's
//! error that quotes a hostile message, through tracing-subscriber's text
//! format (what the examples write), is a field, escaped; it forges no line
//! and sends no escape to the terminal. A queue whose rejects the broker
//! drops is named at start, and each drop names the message id.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::{BoxError, Delivery};
use lapin::BasicProperties;
use tower::service_fn;

use crate::support::{eventually, retry_config, topology_queues, unique, Broker, QueueCleanup};

/// What a text subscriber wrote, shared with the test.
#[derive(Clone, Default)]
struct Written(Arc<Mutex<Vec<u8>>>);

impl Written {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Written {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const HOSTILE: &str = "card declined\x1b[2J\nERROR forged line";

// current_thread: the runner's tasks log to this thread's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_retried_then_dropped_message_is_logged_with_its_error_escaped_and_its_id() {
    let written = Written::default();
    let w = written.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let q = unique("hostile.text");
    // Two attempts, the second after 400 ms on a rung; dead_letter off.
    let mut config = retry_config(
        &q,
        2,
        Duration::from_millis(400),
        Duration::from_millis(400),
        Duration::from_millis(400),
    );
    config.queues[0].dead_letter = false;
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let handler = service_fn(|d: Delivery| async move {
        Err::<(), BoxError>(format!("{HOSTILE} ({} bytes)", d.body().len()).into())
    });
    let running = acemq::App::new(config)
        .consume(&q, handler)
        .start()
        .await
        .expect("starts");
    let mut broker = Broker::new().await;
    let id = "m-\x1b]0;owned\x07";
    broker
        .publish_props(
            &q,
            b"{}",
            BasicProperties::default().with_message_id(id.into()),
        )
        .await;
    assert!(
        eventually(Duration::from_secs(15), || async {
            written
                .text()
                .contains("the broker drops the rejected delivery")
        })
        .await,
        "no drop logged:\n{}",
        written.text()
    );
    running.drain().await.expect("a clean drain");

    let logs = written.text();
    println!("{logs}");
    assert!(!logs.contains('\x1b'), "a raw ESC in the log:\n{logs}");
    assert!(!logs.contains('\x07'), "a raw BEL in the log:\n{logs}");
    assert!(
        !logs.lines().any(|l| l.starts_with("ERROR forged")),
        "a forged line:\n{logs}"
    );
    let shown = r#"error="card declined\u{1b}[2J\nERROR forged line (2 bytes)""#;
    let retry = logs
        .lines()
        .find(|l| l.contains("retry scheduled on its rung in the broker"))
        .unwrap_or_else(|| panic!("no retry line:\n{logs}"));
    assert!(retry.contains(shown), "the retry names the error: {retry}");
    let drop = logs
        .lines()
        .find(|l| l.contains("the broker drops the rejected delivery"))
        .unwrap_or_else(|| panic!("no drop line:\n{logs}"));
    assert!(drop.contains(" WARN "), "{drop}");
    assert!(
        drop.contains(r#"message_id="m-\u{1b}]0;owned\u{7}""#),
        "the drop names the message id: {drop}"
    );
    assert!(drop.contains(shown), "the drop names the error: {drop}"); // Named at start, before any message: one WARN.
    let named = format!("dead_letter is off for {q}: ");
    let start: Vec<&str> = logs.lines().filter(|l| l.contains(&named)).collect();
    assert_eq!(start.len(), 1, "{logs}");
    assert!(start[0].contains(" WARN "), "{}", start[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_sends_nothing_to_the_reply_to_of_an_order_it_rejects() {
    let q = unique("hostile.reply");
    let victim = unique("hostile.victim");
    let yaml = format!("shutdown_timeout: 10\nqueues:\n  - name: {q}\n    dead_letter: true\n");
    let config = acemq::Config::from_yaml_str(&yaml).expect("valid");
    let mut queues = topology_queues(&config);
    queues.push(victim.clone());
    let _cleanup = QueueCleanup::new(queues.clone());
    let mut broker = Broker::new().await;
    broker
        .declare(&victim, lapin::types::FieldTable::default())
        .await
        .expect("the victim queue");
    let mut shop = crate::support::ShopProcess::spawn(&q, &yaml, &[]);
    shop.wait_ready().await;
    broker
        .publish_props(
            &q,
            br#"{"id":"o-hostile","fail":"permanent"}"#,
            BasicProperties::default()
                .with_message_id("o-hostile".into())
                .with_reply_to(victim.as_str().into())
                .with_correlation_id("c-1".into()),
        )
        .await;
    assert!(
        broker
            .wait_ready(&format!("{q}.dlq"), 1, Duration::from_secs(15))
            .await,
        "the order is dead-lettered; stderr:\n{}",
        shop.stderr()
    );
    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
    assert_eq!(
        broker.ready(&victim).await,
        Some(0),
        "nothing published to the order's reply_to"
    );
    broker.delete(&queues).await;
}

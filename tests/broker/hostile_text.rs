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

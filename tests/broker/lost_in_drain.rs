//! The consumers' connection closed by the broker (`rabbitmqctl
//! close_connection`, on this test's own connection only, found by its
//! unique name) while the drain waits for a long handler, after the drain's
//! `basic.cancel` was answered: the handler is cancelled, its outcome
//! dropped, and the drain says the stop was not clean — the outcome lost
//! and redelivered, exit code 75 — never "every handler finished".

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::config::QueueConfig;
use acemq::drain::DeadlineKind;
use acemq::{App, BoxError, Config, Delivery};
use lapin::types::FieldTable;
use tokio::sync::Notify;
use tower::service_fn;

use crate::support::{addr, all_queues, list_connections, unique, Broker};

const SECS: fn(u64) -> Duration = Duration::from_secs;

#[derive(Default)]
struct Long {
    started: Notify,
    cancelled: AtomicUsize,
    ran_out: AtomicUsize,
}

/// The pid of the connection whose client-provided name is exactly `name`.
async fn connection_pid(name: &str) -> Option<String> {
    let needle = format!("\"{name}\"");
    list_connections(&["pid", "client_properties"])
        .await
        .lines()
        .find(|l| l.contains(&needle))
        .and_then(|l| l.split('\t').next())
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumers_connection_closed_during_the_drain_cancels_the_running_handler_and_the_drain_reports_the_loss_with_exit_code_75(
) {
    let q = unique("lost-in-drain");
    let name = format!("acemq-test-{q}");
    let mut broker = Broker::new().await;
    let long = Arc::new(Long::default());
    let handler = {
        let long = long.clone();
        service_fn(move |d: Delivery| {
            let long = long.clone();
            async move {
                long.started.notify_one();
                tokio::select! {
                    () = tokio::time::sleep(SECS(10)) => {
                        long.ran_out.fetch_add(1, Ordering::SeqCst);
                    }
                    () = d.token().cancelled() => {
                        long.cancelled.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok::<(), BoxError>(())
            }
        })
    };
    let mut queue = QueueConfig::new(&q);
    queue.prefetch = 4;
    queue.concurrency = 2;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(30);
    config.abandon_after = SECS(5);
    let running = App::new(config)
        .amqp_addr(addr())
        .connection_name(name.clone())
        .consume(&q, handler)
        .start()
        .await
        .expect("starts");
    broker.publish(&q, b"long", FieldTable::default()).await;
    tokio::time::timeout(SECS(10), long.started.notified())
        .await
        .expect("the long handler started");
    let drain = tokio::spawn(running.drain());
    // The drain's basic.cancel answered: the consumer's stream has ended.
    let within = std::time::Instant::now() + SECS(10);
    while broker.consumers(&q).await != Some(0) {
        assert!(
            std::time::Instant::now() < within,
            "the drain cancelled the consumer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = connection_pid(&name)
        .await
        .expect("the consumers' connection is listed by its name");
    let out = crate::support::rabbitmqctl()
        .args([
            "close_connection",
            &pid,
            "acemq test: lost during the drain",
        ])
        .output()
        .await
        .expect(crate::support::RABBITMQCTL_RUNS);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let result = tokio::time::timeout(SECS(60), drain)
        .await
        .expect("the drain returns")
        .expect("the drain task");
    eprintln!("drain: {result:?}");
    let code = acemq::app::finish(result.clone());
    assert_eq!(
        (
            long.cancelled.load(Ordering::SeqCst),
            long.ran_out.load(Ordering::SeqCst)
        ),
        (1, 0),
        "the handler on the lost connection was cancelled: {result:?}"
    );
    assert_eq!(code, ExitCode::from(75), "{result:?}");
    let timeout = result.expect_err("a drain that lost an outcome is not clean");
    assert_eq!(timeout.kind, DeadlineKind::ChannelLost, "{timeout}");
    assert_eq!(timeout.report.lost(), 1, "{timeout}");
    assert!(
        !timeout.to_string().contains("every handler finished"),
        "{timeout}"
    );
    assert!(
        broker.wait_ready(&q, 1, SECS(10)).await,
        "the lost delivery is back in {q}"
    );
    broker.delete(&all_queues(&q)).await;
}

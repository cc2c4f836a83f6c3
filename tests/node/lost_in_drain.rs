//! A channel lost during the drain is a loss like any other: the broker
//! closes the consumers' channel (its `consumer_timeout`) while the drain
//! waits for a long handler. The handler must be cancelled, its outcome
//! dropped, and the drain must say the stop was not clean: how many
//! outcomes were lost and will be redelivered, exit code 75 — never
//! "every handler finished".

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::config::QueueConfig;
use acemq::drain::DeadlineKind;
use acemq::{App, BoxError, Config, Delivery};
use tokio::sync::Notify;
use tower::service_fn;

use crate::support::{connect_to, eventually, publish_on, unique};
use crate::ticks::{addr, messages, TicksNode, CONSUMER_TIMEOUT};

const SECS: fn(u64) -> Duration = Duration::from_secs;

#[derive(Default)]
struct Long {
    started: Notify,
    /// Calls that saw their token cancelled.
    cancelled: AtomicUsize,
    /// Calls that ran to their end without a cancellation.
    ran_out: AtomicUsize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a throwaway node: cargo test -p acemq --test node -- --ignored --test-threads=1 (.ci/run)"]
async fn a_channel_the_broker_closes_during_the_drain_cancels_its_handler_and_the_drain_reports_the_loss_with_exit_code_75(
) {
    let _node = TicksNode::up();
    let q = unique("lost-in-drain");
    let client = connect_to(&addr(), &format!("acemq-node-test-{q}"))
        .await
        .expect("the ticks node answers");
    let ch = client.create_channel().await.expect("channel");
    ch.confirm_select(Default::default())
        .await
        .expect("confirm mode");
    let long = Arc::new(Long::default());
    let handler = {
        let long = long.clone();
        service_fn(move |d: Delivery| {
            let long = long.clone();
            async move {
                long.started.notify_one();
                // Longer than consumer_timeout (the broker closes the
                // channel under it), shorter than shutdown_timeout (the
                // drain would wait for it).
                tokio::select! {
                    () = tokio::time::sleep(CONSUMER_TIMEOUT * 4) => {
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
        .connection_name(format!("acemq-node-test-{q}-app"))
        .consume(&q, handler)
        .start()
        .await
        .expect("starts on the ticks node");
    publish_on(&ch, &q, b"long")
        .await
        .expect("publish")
        .await
        .expect("confirm");
    tokio::time::timeout(SECS(10), long.started.notified())
        .await
        .expect("the long handler started");

    // The drain begins while the handler runs; the broker then closes the
    // channel (consumer_timeout 2 s, checked every second).
    let result = tokio::time::timeout(SECS(60), running.drain())
        .await
        .expect("the drain returns");
    eprintln!("drain: {result:?}");
    let code = acemq::app::finish(result.clone());
    assert_eq!(
        (
            long.cancelled.load(Ordering::SeqCst),
            long.ran_out.load(Ordering::SeqCst)
        ),
        (1, 0),
        "the handler on the lost channel was cancelled, not left to run out: {result:?}"
    );
    assert_eq!(
        code,
        ExitCode::from(75),
        "the stop was not clean (an outcome was lost): exit code 75, got {result:?}"
    );
    let timeout = result.expect_err("a drain that lost an outcome is not a clean one");
    assert_eq!(timeout.kind, DeadlineKind::ChannelLost, "{timeout}");
    assert_eq!(timeout.report.lost(), 1, "{timeout}");
    assert_eq!(timeout.report.queues[0].lost, 1, "{timeout}");
    let text = timeout.to_string();
    assert!(
        !text.contains("every handler finished")
            && text.contains("1 outcome was lost with a channel or connection")
            && text.contains("will redeliver"),
        "{text}"
    );
    // The message is back in the queue, for the next start.
    assert!(
        eventually(SECS(10), || async { messages(&q).await == Some(1) }).await,
        "the lost delivery is back in {q}: {:?}",
        messages(&q).await
    );
    let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
    let _ = client.close(200, "OK".into()).await;
}

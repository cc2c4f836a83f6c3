//! A handler that runs longer than the broker's `consumer_timeout`: the
//! broker closes the channel (`PRECONDITION_FAILED - delivery
//! acknowledgement on channel 1 timed out`, checked about once a minute),
//! and the queue must be consumed again, the message redelivered and
//! handled: nothing lost.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::config::QueueConfig;
use acemq::{App, BoxError, Config, Delivery};
use tokio_util::sync::CancellationToken;
use tower::service_fn;

use crate::freeze::Logs;
use crate::support::{addr, counts, eventually, unique, Client, Node, ReadinessLog};

const SECS: fn(u64) -> Duration = Duration::from_secs;

#[derive(Default)]
struct Calls {
    /// First deliveries of `hold` that started (and held).
    held: AtomicUsize,
    /// Redeliveries of `hold` handled.
    redelivered_handled: AtomicUsize,
    /// `after` handled.
    after_handled: AtomicUsize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a throwaway node: cargo test -p acemq --test node -- --ignored --test-threads=1 (.ci/run)"]
async fn a_handler_longer_than_consumer_timeout_gets_its_channel_closed_and_the_queue_is_consumed_again_and_the_message_redelivered_and_handled(
) {
    let _node = Node::up();
    let logs = Logs::install();
    let from = logs.now();
    let q = unique("consumer-timeout");
    let client = Client::new(&format!("acemq-node-test-{q}")).await;
    let calls = Arc::new(Calls::default());
    let release = CancellationToken::new();
    let handler = {
        let calls = calls.clone();
        let release = release.clone();
        service_fn(move |d: Delivery| {
            let calls = calls.clone();
            let release = release.clone();
            async move {
                match (&d.body()[..], d.redelivered()) {
                    (b"hold", false) => {
                        calls.held.fetch_add(1, Ordering::SeqCst);
                        // Far longer than consumer_timeout (5 s); released
                        // at the end of the test.
                        tokio::select! {
                            _ = tokio::time::sleep(SECS(100)) => {}
                            _ = release.cancelled() => {}
                        }
                    }
                    (b"hold", true) => {
                        calls.redelivered_handled.fetch_add(1, Ordering::SeqCst);
                    }
                    (b"after", _) => {
                        calls.after_handled.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {}
                }
                Ok::<(), BoxError>(())
            }
        })
    };
    let mut queue = QueueConfig::new(&q);
    queue.prefetch = 4;
    queue.concurrency = 2;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(5);
    let app = App::new(config)
        .amqp_addr(addr())
        .connection_name(format!("acemq-node-test-{q}-app"))
        .consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts on the test node");
    let readiness = ReadinessLog::start(health.clone());

    let t0 = Instant::now();
    client.publish(&q, b"hold").await;
    assert!(
        eventually(SECS(10), || async {
            calls.held.load(Ordering::SeqCst) == 1
        })
        .await,
        "the long handler started"
    );
    // The broker closes the channel holding the unacked delivery about a
    // minute after consumer_timeout (5 s) has passed: the delivery goes back
    // to the queue, and must be consumed again on a new channel.
    let redelivered = eventually(SECS(120), || async {
        calls.redelivered_handled.load(Ordering::SeqCst) >= 1
    })
    .await;
    let waited = t0.elapsed();
    let changes = readiness.changes();
    let c = counts(&q).await;
    eprintln!(
        "consumer_timeout: waited {waited:?}; readiness changes {changes:?}; queue now {c:?}; health {:?}",
        health.snapshot()
    );
    assert!(
        redelivered,
        "the message held past consumer_timeout was never redelivered and handled within {waited:?} \
         (readiness went off at {:?}, is ready now: {}; queue {c:?}): the queue was not consumed again \
         after the broker closed its channel",
        readiness.first_off(),
        health.is_ready()
    );
    // Readiness is sampled every 5 ms; the reconnect's backoff has full
    // jitter and may be a millisecond, so the off window can fall between
    // two samples. Then the log shows the recovery: the channel closed by
    // the broker, then the queue consumed again.
    let recovered_in_log = || {
        let lines = logs.since(from);
        let closed = lines
            .iter()
            .position(|l| l.3.contains("the broker closed this queue's channel"));
        closed.is_some_and(|i| {
            lines[i + 1..]
                .iter()
                .any(|l| l.3.contains("consuming") && !l.3.contains("again"))
        })
    };
    assert!(
        eventually(SECS(10), || async {
            readiness.off_then_on_after(Duration::ZERO) || recovered_in_log()
        })
        .await,
        "readiness was off while the queue's channel was down, then on again: {changes:?}; log:\n{}",
        logs.render(from)
    );
    assert!(
        eventually(SECS(10), || async { health.is_ready() }).await,
        "ready again once the queue is consumed again: {:?}",
        health.snapshot()
    );
    // Consumed again: a new message is handled too.
    client.publish(&q, b"after").await;
    assert!(
        eventually(SECS(10), || async {
            calls.after_handled.load(Ordering::SeqCst) == 1
        })
        .await,
        "a message published after the recovery is handled"
    );
    release.cancel();
    let report = tokio::time::timeout(SECS(30), running.drain())
        .await
        .expect("the drain returns");
    eprintln!("drain: {report:?}");
    assert!(
        eventually(SECS(10), || async {
            counts(&q).await.is_some_and(|c| c.messages == 0)
        })
        .await,
        "nothing left in {q}: {:?}",
        counts(&q).await
    );
    assert_eq!(calls.held.load(Ordering::SeqCst), 1, "held once");
    client.delete(std::slice::from_ref(&q)).await;
}

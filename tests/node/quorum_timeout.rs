//! A handler longer than a quorum queue's consumer timeout on RabbitMQ 4.3
//! (`x-consumer-timeout`): the broker cancels the consumer, its channel left
//! open, and takes the delivery back. acemq cancels the running handler
//! (the delivery is no longer its own), strikes the message, consumes again,
//! and does not start the message again while the old handler still runs;
//! after `consumer_timeout_strikes` it dead-letters it as
//! `consumer-timeout`. Short messages beside it are handled.
//!
//! RabbitMQ 3.x takes no `x-consumer-timeout` queue argument (its timeout
//! closes the channel: `consumer_timeout.rs`, `timeout_strikes.rs`): there
//! the test says so and returns.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::config::{ArgValue, QueueConfig, QueueType};
use acemq::{App, BoxError, Config, Delivery};
use tower::service_fn;

use crate::support::{addr, ctl_async, eventually, unique, Client, Node};
use crate::ticks::take_all;

const SECS: fn(u64) -> Duration = Duration::from_secs;
/// The queue's `x-consumer-timeout`.
const QUEUE_TIMEOUT_MS: i64 = 3000;
/// How long the long handler works.
const WORK: Duration = Duration::from_secs(8);

#[derive(Default)]
struct Calls {
    long_started: AtomicUsize,
    long_running: AtomicUsize,
    long_most_at_once: AtomicUsize,
    long_completed: AtomicUsize,
    long_cancelled: AtomicUsize,
    short: AtomicUsize,
}

/// Runs the long message's work (honouring its token, as the shop does),
/// counting how many run at once.
async fn long(calls: &Calls, d: &Delivery) {
    calls.long_started.fetch_add(1, Ordering::SeqCst);
    let now = calls.long_running.fetch_add(1, Ordering::SeqCst) + 1;
    calls.long_most_at_once.fetch_max(now, Ordering::SeqCst);
    tokio::select! {
        () = tokio::time::sleep(WORK) => {
            calls.long_completed.fetch_add(1, Ordering::SeqCst);
        }
        () = d.token().cancelled() => {
            calls.long_cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
    calls.long_running.fetch_sub(1, Ordering::SeqCst);
}

fn handler(
    calls: Arc<Calls>,
) -> impl tower::Service<Delivery, Response = (), Error = BoxError, Future: Send + 'static>
       + Clone
       + Send
       + 'static {
    service_fn(move |d: Delivery| {
        let calls = calls.clone();
        async move {
            if &d.body()[..] == b"long" {
                long(&calls, &d).await;
            } else {
                calls.short.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }
    })
}

/// The node's RabbitMQ version as (major, minor).
pub async fn broker_version() -> (u32, u32, String) {
    let out = ctl_async(&["eval", "rabbit_misc:version()."])
        .await
        .expect("the node's version");
    let text = out.trim().trim_matches('"').to_owned();
    let mut parts = text.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        text.clone(),
    )
}

/// The quorum queue of these tests: dead-lettering, the queue's consumer
/// timeout 3 s.
pub fn quorum_queue(name: &str) -> QueueConfig {
    let mut queue = QueueConfig::new(name);
    queue.kind = QueueType::Quorum;
    queue.prefetch = 4;
    queue.concurrency = 2;
    queue.dead_letter = true;
    queue
        .arguments
        .insert("x-consumer-timeout".into(), ArgValue::Int(QUEUE_TIMEOUT_MS));
    queue
}

/// Whether `queue` holds at least `n` messages (a passive declaration: the
/// broker's count at once, where `rabbitmqctl` can take seconds).
pub async fn ready_in(client: &Client, queue: &str, n: u32) -> bool {
    let Ok(ch) = client.conn.create_channel().await else {
        return false;
    };
    let declared = ch
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await;
    let _ = ch.close(200, "OK".into()).await;
    declared.is_ok_and(|d| d.message_count() >= n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a throwaway node: cargo test -p acemq --test node -- --ignored --test-threads=1 (.ci/run)"]
async fn on_rabbitmq_4_3_a_handler_longer_than_a_quorum_queues_consumer_timeout_is_cancelled_never_runs_twice_at_once_and_is_dead_lettered_as_consumer_timeout(
) {
    let _node = Node::up();
    let (major, minor, version) = broker_version().await;
    if (major, minor) < (4, 3) {
        eprintln!("RabbitMQ {version}: no x-consumer-timeout queue argument before 4.3 (the channel-close path is consumer_timeout.rs and timeout_strikes.rs); nothing to test here");
        return;
    }
    let q = unique("quorum-timeout");
    let dlq = format!("{q}.dlq");
    let client = Client::new(&format!("acemq-node-test-{q}")).await;
    let calls = Arc::new(Calls::default());
    let mut config = Config::new([quorum_queue(&q)]);
    config.shutdown_timeout = SECS(5);
    config.abandon_after = SECS(2);
    let running = App::new(config)
        .amqp_addr(addr())
        .connection_name(format!("acemq-node-test-{q}-app"))
        .consume(&q, handler(calls.clone()))
        .start()
        .await
        .expect("starts on the node");

    let t0 = Instant::now();
    client.publish(&q, b"long").await;
    for _ in 0..3 {
        client.publish(&q, b"short").await;
    }
    let dead_lettered = eventually(SECS(60), || ready_in(&client, &dlq, 1)).await;
    let took = t0.elapsed();
    let c = |n: &AtomicUsize| n.load(Ordering::SeqCst);
    eprintln!(
        "RabbitMQ {version}: dead-lettered {dead_lettered} after {took:.1?}; long started {}, completed {}, cancelled {}, most at once {}; short {}",
        c(&calls.long_started),
        c(&calls.long_completed),
        c(&calls.long_cancelled),
        c(&calls.long_most_at_once),
        c(&calls.short),
    );
    assert!(
        dead_lettered,
        "the message longer than the queue's consumer timeout was not dead-lettered within 60 s: \
         started {} times, completed {}",
        c(&calls.long_started),
        c(&calls.long_completed)
    );
    let drain = tokio::time::timeout(SECS(30), running.drain())
        .await
        .expect("the drain returns");
    eprintln!("drain: {drain:?}");
    let copies = take_all(&client.ch, &dlq).await;
    assert_eq!(
        copies,
        [("long".to_owned(), Some("consumer-timeout".to_owned()))],
        "only the long message is dead-lettered, with reason consumer-timeout"
    );
    assert!(
        c(&calls.long_completed) <= 2,
        "handled to completion at most twice: {}",
        c(&calls.long_completed)
    );
    assert_eq!(
        c(&calls.long_most_at_once),
        1,
        "the message never ran in two handlers at once"
    );
    assert_eq!(
        c(&calls.long_started),
        QueueConfig::DEFAULT_CONSUMER_TIMEOUT_STRIKES as usize,
        "the handler ran once per strike, and not after the last"
    );
    assert!(c(&calls.short) >= 3, "the short messages were handled");
    client.delete(&[q, dlq]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a throwaway node: cargo test -p acemq --test node -- --ignored --test-threads=1 (.ci/run)"]
async fn on_rabbitmq_4_3_a_queues_consumer_timeout_outlives_its_x_consumer_timeout_and_the_long_handler_runs_once_without_a_strike(
) {
    let _node = Node::up();
    let (major, minor, version) = broker_version().await;
    if (major, minor) < (4, 3) {
        eprintln!("RabbitMQ {version}: the consumer argument x-consumer-timeout is honoured from 4.3; nothing to test here");
        return;
    }
    let q = unique("quorum-long-job");
    let dlq = format!("{q}.dlq");
    let client = Client::new(&format!("acemq-node-test-{q}")).await;
    let calls = Arc::new(Calls::default());
    let mut queue = quorum_queue(&q);
    queue.consumer_timeout = Some(SECS(20));
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(5);
    config.abandon_after = SECS(2);
    let running = App::new(config)
        .amqp_addr(addr())
        .connection_name(format!("acemq-node-test-{q}-app"))
        .consume(&q, handler(calls.clone()))
        .start()
        .await
        .expect("starts on the node");
    let t0 = Instant::now();
    client.publish(&q, b"long").await;
    let c = |n: &AtomicUsize| n.load(Ordering::SeqCst);
    let completed = eventually(SECS(30), || async { c(&calls.long_completed) == 1 }).await;
    let took = t0.elapsed();
    // Past the queue's 3 s timeout again, with the message settled: any
    // late cancel or redelivery would show now.
    tokio::time::sleep(Duration::from_millis(2 * QUEUE_TIMEOUT_MS as u64)).await;
    eprintln!(
        "RabbitMQ {version}: completed after {took:.1?}; long started {}, completed {}, cancelled {}",
        c(&calls.long_started),
        c(&calls.long_completed),
        c(&calls.long_cancelled),
    );
    assert!(completed, "the 8 s handler completed within 30 s");
    assert_eq!(
        (c(&calls.long_started), c(&calls.long_cancelled)),
        (1, 0),
        "handled once, never cancelled: the consumer's 20 s outlived the queue's 3 s"
    );
    let drain = tokio::time::timeout(SECS(30), running.drain())
        .await
        .expect("the drain returns");
    assert!(drain.is_ok(), "a clean drain: {drain:?}");
    assert!(
        take_all(&client.ch, &dlq).await.is_empty(),
        "nothing dead-lettered"
    );
    assert!(
        !ready_in(&client, &q, 1).await,
        "the message was acknowledged"
    );
    client.delete(&[q, dlq]).await;
}

//! A handler longer than the broker's `consumer_timeout` on a classic
//! queue: every timeout closes the channel and the delivery comes back
//! (classic queues count nothing). acemq strikes the delivery the timeout
//! was about and dead-letters it as `consumer-timeout` when it comes back
//! after `consumer_timeout_strikes` closes; the short handlers on the same
//! channel, and one caught unsettled by a close without being the cause,
//! are handled and never dead-lettered.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::config::QueueConfig;
use acemq::{App, BoxError, Config, Delivery};
use tokio::sync::Notify;
use tower::service_fn;

use crate::support::{connect_to, eventually, publish_on, unique};
use crate::ticks::{addr, messages, take_all, TicksNode, CONSUMER_TIMEOUT};

const SECS: fn(u64) -> Duration = Duration::from_secs;
const STRIKES: u32 = 2;

#[derive(Default)]
struct Calls {
    long: AtomicUsize,
    long_started: Notify,
    /// The innocent's first run, cut by a close it did not cause.
    innocent_cut: AtomicUsize,
    innocent_handled: AtomicUsize,
    short: AtomicUsize,
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
            match &d.body()[..] {
                b"long" => {
                    calls.long.fetch_add(1, Ordering::SeqCst);
                    calls.long_started.notify_one();
                    // Far past consumer_timeout: ends only when the close
                    // cancels it.
                    tokio::select! {
                        () = tokio::time::sleep(SECS(120)) => {}
                        () = d.token().cancelled() => {}
                    }
                }
                b"innocent" if !d.redelivered() => {
                    // Runs until the close that the long one causes; it is
                    // younger than the timeout then, so it is not the cause.
                    tokio::select! {
                        () = tokio::time::sleep(SECS(120)) => {}
                        () = d.token().cancelled() => {
                            calls.innocent_cut.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                b"innocent" => {
                    calls.innocent_handled.fetch_add(1, Ordering::SeqCst);
                }
                _ => {
                    calls.short.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a throwaway node: cargo test -p acemq --test node -- --ignored --test-threads=1 (.ci/run)"]
async fn a_classic_queue_delivery_longer_than_consumer_timeout_is_dead_lettered_as_consumer_timeout_after_its_strikes_and_short_ones_beside_it_are_not(
) {
    let _node = TicksNode::up();
    let q = unique("timeout-strikes");
    let dlq = format!("{q}.dlq");
    let client = connect_to(&addr(), &format!("acemq-node-test-{q}"))
        .await
        .expect("the ticks node answers");
    let ch = client.create_channel().await.expect("channel");
    ch.confirm_select(Default::default())
        .await
        .expect("confirm mode");
    let publish = |body: &'static [u8]| {
        let ch = ch.clone();
        let q = q.clone();
        async move {
            publish_on(&ch, &q, body)
                .await
                .expect("publish")
                .await
                .expect("confirm");
        }
    };
    let calls = Arc::new(Calls::default());
    let mut queue = QueueConfig::new(&q);
    queue.prefetch = 10;
    queue.concurrency = 4;
    queue.dead_letter = true;
    queue.consumer_timeout_strikes = STRIKES;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(5);
    config.abandon_after = SECS(1);
    let running = App::new(config)
        .amqp_addr(addr())
        .connection_name(format!("acemq-node-test-{q}-app"))
        .consume(&q, handler(calls.clone()))
        .start()
        .await
        .expect("starts on the ticks node");

    publish(b"long").await;
    for _ in 0..5 {
        publish(b"short").await;
    }
    tokio::time::timeout(SECS(10), calls.long_started.notified())
        .await
        .expect("the long handler started");
    // Well past the 1 s margin after the long one, well before the
    // broker's timeout of it (2 s, checked every second).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    publish(b"innocent").await;
    for _ in 0..5 {
        publish(b"short").await;
    }

    let dead_lettered = eventually(SECS(60), || async {
        messages(&dlq).await.is_some_and(|n| n >= 1)
    })
    .await;
    let c = |n: &AtomicUsize| n.load(Ordering::SeqCst);
    eprintln!(
        "long calls {}, innocent cut {} handled {}, short {}; {q}: {:?}, {dlq}: {:?}",
        c(&calls.long),
        c(&calls.innocent_cut),
        c(&calls.innocent_handled),
        c(&calls.short),
        messages(&q).await,
        messages(&dlq).await,
    );
    assert!(
        dead_lettered,
        "the delivery longer than consumer_timeout ({CONSUMER_TIMEOUT:?}) was never dead-lettered: \
         it came back {} times",
        c(&calls.long)
    );
    assert!(
        eventually(SECS(20), || async {
            messages(&q).await == Some(0)
                && c(&calls.innocent_handled) == 1
                && c(&calls.short) >= 10
        })
        .await,
        "everything else was handled: innocent {} short {} left in {q}: {:?}",
        c(&calls.innocent_handled),
        c(&calls.short),
        messages(&q).await
    );
    let drain = tokio::time::timeout(SECS(30), running.drain())
        .await
        .expect("the drain returns");
    eprintln!("drain: {drain:?}");
    let copies = take_all(&ch, &dlq).await;
    assert_eq!(
        copies,
        [("long".to_owned(), Some("consumer-timeout".to_owned()))],
        "only the long delivery is dead-lettered, with reason consumer-timeout"
    );
    assert_eq!(
        c(&calls.long),
        STRIKES as usize,
        "the long handler ran once per strike, and not after the last"
    );
    assert_eq!(
        c(&calls.innocent_cut),
        1,
        "the innocent delivery was caught unsettled by a close (and came back, not struck)"
    );
    for name in [&q, &dlq] {
        let _ = ch
            .queue_delete(name.as_str().into(), Default::default())
            .await;
    }
    let _ = client.close(200, "OK".into()).await;
}

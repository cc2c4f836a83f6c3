//! A broker restart under a stream consumer: a steady confirmed publisher
//! appending to the stream, the App reading it, `rabbitmqctl stop_app`, 5 s,
//! `start_app`. The stream runner connects again and subscribes from the
//! stored offset: every confirmed message is handled, and duplicates stay
//! within what was settled and not yet stored (offset_store.every +
//! prefetch).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::config::{QueueConfig, QueueType};
use acemq::{App, BoxError, Config, Delivery};
use tokio_util::sync::CancellationToken;
use tower::service_fn;

use crate::broker_restart::{steady_publisher, Published};
use crate::support::{addr, ctl_async, eventually, message_number, unique, Node, STREAM_PORT};

const SECS: fn(u64) -> Duration = Duration::from_secs;
const PREFETCH: u16 = 50;
const EVERY: u32 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a throwaway node: cargo test -p acemq --test node -- --ignored --test-threads=1 (.ci/run)"]
async fn a_broker_restart_under_a_stream_consumer_resumes_from_the_stored_offset_and_loses_nothing()
{
    let _node = Node::up();
    let s = unique("stream-restart");
    let handled: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let handler = {
        let handled = handled.clone();
        service_fn(move |d: Delivery| {
            let handled = handled.clone();
            async move {
                let n = message_number(&d)?;
                *handled.lock().unwrap().entry(n).or_default() += 1;
                Ok::<(), BoxError>(())
            }
        })
    };
    let mut queue = QueueConfig::new(&s);
    queue.kind = QueueType::Stream;
    queue.prefetch = PREFETCH;
    queue.concurrency = 4;
    queue.offset_store.every = EVERY;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    config.streams.port = STREAM_PORT;
    let app = App::new(config)
        .amqp_addr(addr())
        .connection_name(format!("acemq-node-test-{s}-app"))
        .consume(&s, handler);
    let running = app.start().await.expect("starts on the test node");

    let published = Arc::new(Published::default());
    let stop = CancellationToken::new();
    let publisher = tokio::spawn(steady_publisher(s.clone(), published.clone(), stop.clone()));
    let count = |h: &Mutex<HashMap<u64, u32>>| h.lock().unwrap().len();
    assert!(
        eventually(SECS(30), || async { count(&handled) >= 200 }).await,
        "steady state before the restart"
    );
    ctl_async(&["stop_app"]).await.expect("stop_app");
    tokio::time::sleep(SECS(5)).await;
    let t1 = Instant::now();
    ctl_async(&["start_app"]).await.expect("start_app");
    let confirmed_then = published.confirmed.lock().unwrap().len();
    assert!(
        eventually(SECS(60), || async {
            published.confirmed.lock().unwrap().len() >= confirmed_then + 200
        })
        .await,
        "the publisher goes on after the restart"
    );
    stop.cancel();
    publisher.await.expect("publisher task");
    let confirmed = published.confirmed.lock().unwrap().clone();
    let all_handled = eventually(SECS(60), || async {
        let h = handled.lock().unwrap();
        confirmed.iter().all(|n| h.contains_key(n))
    })
    .await;
    let resumed = t1.elapsed();
    let h = handled.lock().unwrap().clone();
    let missing: Vec<u64> = confirmed
        .iter()
        .filter(|n| !h.contains_key(n))
        .copied()
        .collect();
    let duplicates: u32 = h.values().map(|c| c - 1).sum();
    eprintln!(
        "stream, broker restart: confirmed {}, handled {} distinct, missing {}, duplicates {duplicates} \
         (bound {}), all handled {resumed:?} after start_app",
        confirmed.len(),
        h.len(),
        missing.len(),
        EVERY + u32::from(PREFETCH)
    );
    assert!(
        all_handled,
        "{} confirmed never handled, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(
        duplicates <= EVERY + u32::from(PREFETCH),
        "{duplicates} duplicate(s), above offset_store.every + prefetch"
    );
    let report = tokio::time::timeout(SECS(30), running.drain())
        .await
        .expect("the drain returns");
    assert!(report.is_ok(), "a clean drain: {report:?}");
    let conn = crate::support::connect("acemq-node-test-cleanup")
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    let _ = ch
        .queue_delete(
            s.as_str().into(),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await;
    let _ = conn.close(200, "OK".into()).await;
}

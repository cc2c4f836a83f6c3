//! A broker restart under load: a steady publisher with confirms on its own
//! connection, the App consuming, `rabbitmqctl stop_app`, 5 s, `start_app`.
//! Readiness goes off then on, every confirmed message is handled, and
//! duplicates stay within the prefetch.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::config::QueueConfig;
use acemq::{App, BoxError, Config, Delivery};
use lapin::options::ConfirmSelectOptions;
use lapin::Confirmation;
use tokio_util::sync::CancellationToken;
use tower::service_fn;

use crate::support::{
    addr, connect, counts, ctl_async, eventually, message_number, publish_on, unique, Node,
    ReadinessLog,
};

const SECS: fn(u64) -> Duration = Duration::from_secs;
const PREFETCH: u16 = 20;

/// What the steady publisher got confirmed, and what it sent in all.
#[derive(Default)]
pub(crate) struct Published {
    pub(crate) confirmed: Mutex<BTreeSet<u64>>,
    pub(crate) sent: Mutex<u64>,
    pub(crate) reconnects: Mutex<u32>,
}

/// Publishes `m-<n>` every 10 ms to `queue` on a connection of its own,
/// awaiting each confirm; reconnects when the broker goes away.
pub(crate) async fn steady_publisher(queue: String, out: Arc<Published>, stop: CancellationToken) {
    let mut n = 0u64;
    while !stop.is_cancelled() {
        let conn = match connect(&format!("acemq-node-test-{queue}-publisher")).await {
            Ok(c) => c,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let Ok(ch) = conn.create_channel().await else {
            continue;
        };
        if ch
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .is_err()
        {
            continue;
        }
        while !stop.is_cancelled() {
            let body = format!("m-{n}");
            *out.sent.lock().unwrap() += 1;
            let confirm = match publish_on(&ch, &queue, body.as_bytes()).await {
                Ok(c) => c.await,
                Err(e) => Err(e),
            };
            n += 1;
            match confirm {
                Ok(Confirmation::Ack(None)) => {
                    out.confirmed.lock().unwrap().insert(n - 1);
                }
                Ok(_) => {}
                Err(_) => break,
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        *out.reconnects.lock().unwrap() += 1;
        let _ = conn.close(200, "OK".into()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a throwaway node: cargo test -p acemq --test node -- --ignored --test-threads=1 (.ci/run)"]
async fn a_broker_restart_under_load_turns_readiness_off_then_on_and_every_confirmed_message_is_handled_with_duplicates_within_the_prefetch(
) {
    let node = Node::up();
    let q = unique("restart");
    let handled: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let handler = {
        let handled = handled.clone();
        service_fn(move |d: Delivery| {
            let handled = handled.clone();
            async move {
                let n = message_number(&d)?;
                tokio::time::sleep(Duration::from_millis(5)).await;
                *handled.lock().unwrap().entry(n).or_default() += 1;
                Ok::<(), BoxError>(())
            }
        })
    };
    let mut queue = QueueConfig::new(&q);
    queue.prefetch = PREFETCH;
    queue.concurrency = 4;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    let app = App::new(config)
        .amqp_addr(addr())
        .connection_name(format!("acemq-node-test-{q}-app"))
        .consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts on the test node");
    let readiness = ReadinessLog::start(health.clone());

    let published = Arc::new(Published::default());
    let stop = CancellationToken::new();
    let publisher = tokio::spawn(steady_publisher(q.clone(), published.clone(), stop.clone()));
    let count = |h: &Mutex<HashMap<u64, u32>>| h.lock().unwrap().len();
    assert!(
        eventually(SECS(30), || async { count(&handled) >= 200 }).await,
        "steady state before the restart"
    );

    let t_stop = readiness.elapsed();
    let t0 = Instant::now();
    ctl_async(&["stop_app"]).await.expect("stop_app");
    let stopped_in = t0.elapsed();
    assert!(
        eventually(SECS(30), || async { !health.is_ready() }).await,
        "readiness goes off while the broker is stopped"
    );
    tokio::time::sleep(SECS(5)).await; // the outage itself
    let t1 = Instant::now();
    ctl_async(&["start_app"]).await.expect("start_app");
    let started_in = t1.elapsed();
    let back = eventually(SECS(60), || async { health.is_ready() }).await;
    let resumed_after_start = t1.elapsed();
    assert!(
        back,
        "readiness comes back after start_app: {:?}",
        health.snapshot()
    );
    // The log samples every 5 ms: give it a bounded moment to see the "on"
    // that `health.is_ready()` just reported.
    assert!(
        eventually(SECS(2), || async { readiness.off_then_on_after(t_stop) }).await,
        "readiness off then on: {:?}",
        readiness.changes()
    );
    // Keep publishing a while after the restart, then stop.
    let confirmed_then = published.confirmed.lock().unwrap().len();
    assert!(
        eventually(SECS(30), || async {
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
    let h = handled.lock().unwrap().clone();
    let missing: Vec<u64> = confirmed
        .iter()
        .filter(|n| !h.contains_key(n))
        .copied()
        .collect();
    let duplicates: u32 = h.values().map(|c| c - 1).sum();
    eprintln!(
        "broker restart: stop_app took {stopped_in:?}, start_app {started_in:?}; ready again {resumed_after_start:?} \
         after start_app returned; sent {}, confirmed {}, handled {} distinct, missing {}, duplicates {duplicates}, \
         publisher reconnects {}; readiness {:?}",
        published.sent.lock().unwrap(),
        confirmed.len(),
        h.len(),
        missing.len(),
        published.reconnects.lock().unwrap(),
        readiness.changes()
    );
    assert!(
        all_handled,
        "{} confirmed message(s) never handled, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(
        duplicates <= u32::from(PREFETCH),
        "{duplicates} duplicate(s), more than the prefetch ({PREFETCH})"
    );
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
    drop(node);
}

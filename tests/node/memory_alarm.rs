//! A memory alarm while a queue is consumed and one of its messages waits
//! on a rung: RabbitMQ blocks every connection that publishes, so a stack
//! that publishes its rung copy on the consumers' connection stops its own
//! acks. Successes must keep being acked during the alarm, the retry must
//! proceed once it clears, nothing lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::config::{QueueConfig, RetriesConfig};
use acemq::{App, BoxError, Config, Delivery};
use tokio_util::sync::CancellationToken;
use tower::service_fn;

use crate::support::{addr, counts, ctl_async, eventually, unique, Client, Node, ReadinessLog};

const SECS: fn(u64) -> Duration = Duration::from_secs;
const OK: usize = 200;

/// Calls per body, and the attempt numbers `retry` was called with.
#[derive(Default)]
struct Seen {
    calls: Mutex<HashMap<String, usize>>,
    retry_attempts: Mutex<Vec<u32>>,
}

impl Seen {
    fn ok_handled(&self) -> usize {
        self.calls
            .lock()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with("ok-"))
            .count()
    }
    fn retry_calls(&self) -> usize {
        self.retry_attempts.lock().unwrap().len()
    }
}

async fn alarm_in_force() -> bool {
    ctl_async(&["eval", "rabbit_alarm:get_alarms()."])
        .await
        .is_ok_and(|s| s.contains("memory"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a throwaway node: cargo test -p acemq --test node -- --ignored --test-threads=1 (.ci/run)"]
async fn during_a_memory_alarm_successes_keep_being_acked_while_a_retry_waits_and_after_it_clears_the_retry_proceeds_and_nothing_is_lost(
) {
    let node = Node::up();
    let q = unique("alarm");
    let rung = format!("{q}.retry.1s");
    let dlq = format!("{q}.dlq");
    let client = Client::new(&format!("acemq-node-test-{q}")).await;
    let seen = Arc::new(Seen::default());
    let go = CancellationToken::new();
    let handler = {
        let seen = seen.clone();
        let go = go.clone();
        service_fn(move |d: Delivery| {
            let seen = seen.clone();
            let go = go.clone();
            async move {
                go.cancelled().await;
                let body = String::from_utf8_lossy(d.body()).into_owned();
                *seen.calls.lock().unwrap().entry(body.clone()).or_default() += 1;
                if body == "retry" {
                    let first = {
                        let mut a = seen.retry_attempts.lock().unwrap();
                        a.push(d.attempt());
                        a.len() == 1
                    };
                    if first {
                        return Err::<(), BoxError>("transient: try again in a second".into());
                    }
                } else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(())
            }
        })
    };
    let mut queue = QueueConfig::new(&q);
    queue.prefetch = 10;
    queue.concurrency = 2;
    queue.dead_letter = true;
    queue.retries = Some({
        let mut r = RetriesConfig::new(5, SECS(1), SECS(1));
        r.broker_wait_threshold = SECS(1);
        r
    });
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    let app = App::new(config)
        .amqp_addr(addr())
        .connection_name(format!("acemq-node-test-{q}-app"))
        .consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts on the test node");
    let readiness = ReadinessLog::start(health.clone());

    // The retry first, then the successes; handlers wait for `go`.
    client.publish(&q, b"retry").await;
    for i in 0..OK {
        client.publish(&q, format!("ok-{i}").as_bytes()).await;
    }
    let before = counts(&q).await.expect("the queue exists");
    assert_eq!(before.messages, OK as u64 + 1, "{before:?}");

    ctl_async(&["set_vm_memory_high_watermark", "absolute", "1"])
        .await
        .expect("set the alarm");
    assert!(
        eventually(SECS(30), alarm_in_force).await,
        "the memory alarm is in force on {}",
        crate::support::NODE
    );
    let t_alarm = Instant::now();
    go.cancel();

    // The retry's first attempt fails; its copy goes to the 1 s rung, a
    // publish the broker blocks during the alarm. The successes behind it
    // must still be acked: the queue's message count goes down.
    let acked_during = eventually(SECS(30), || async {
        counts(&q)
            .await
            .is_some_and(|c| c.messages <= before.messages - (OK as u64 / 2))
    })
    .await;
    let during = counts(&q).await;
    let still_alarm = alarm_in_force().await;
    eprintln!(
        "memory alarm: after {:?} of alarm, handled {} of {OK} successes, retry called {} time(s) (attempts {:?}); \
         the broker holds {during:?} (was {before:?}); alarm still in force: {still_alarm}; readiness {:?}",
        t_alarm.elapsed(),
        seen.ok_handled(),
        seen.retry_calls(),
        seen.retry_attempts.lock().unwrap(),
        readiness.changes()
    );
    assert!(still_alarm, "the alarm lasted through the check");
    assert!(
        acked_during,
        "during the alarm the successes' acks did not reach the broker: {} handled by the handler, \
         but the broker still holds {during:?} of {} (the consumers' connection was blocked by a publish)",
        seen.ok_handled(),
        before.messages
    );

    ctl_async(&["set_vm_memory_high_watermark", "0.4"])
        .await
        .expect("clear the alarm");
    let t_clear = Instant::now();
    let done = eventually(SECS(60), || async {
        seen.retry_calls() >= 2 && seen.ok_handled() == OK
    })
    .await;
    eprintln!(
        "after the alarm cleared ({:?}): retry attempts {:?}, successes handled {}",
        t_clear.elapsed(),
        seen.retry_attempts.lock().unwrap(),
        seen.ok_handled()
    );
    assert!(
        done,
        "after the alarm, the retry proceeds and every success is handled"
    );
    assert!(
        eventually(SECS(30), || async {
            counts(&q).await.is_some_and(|c| c.messages == 0)
                && counts(&rung).await.is_some_and(|c| c.messages == 0)
        })
        .await,
        "everything settled: {q} {:?}, {rung} {:?}",
        counts(&q).await,
        counts(&rung).await
    );
    assert_eq!(
        counts(&dlq).await.map(|c| c.messages),
        Some(0),
        "nothing dead-lettered"
    );
    let report = tokio::time::timeout(SECS(30), running.drain())
        .await
        .expect("the drain returns");
    eprintln!("drain: {report:?}");
    client.delete(&[q.clone(), rung, dlq]).await;
    drop(node);
}

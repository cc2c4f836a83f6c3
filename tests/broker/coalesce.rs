//! Acknowledgement coalescing honestly bounded, against the real broker: on
//! a loop kept busy by a saturated queue, an acknowledgement is not held far
//! past the `ack_batch` time bound, so a forced close of the connection
//! (`rabbitmqctl close_connection`, on this test's own connection only,
//! found by its unique name) redelivers only what finished just before it.
//!
//! The runtime is single-threaded and the handlers do their work on the CPU
//! without awaiting, so the consumer loop runs round after round without
//! parking: tokio then fires timers only every few dozen task polls, long
//! after they are due. What bounds the hold is the loop reading the clock
//! in every round that holds acknowledgements.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::config::QueueConfig;
use acemq::{App, BoxError, Config, Delivery};
use lapin::BasicProperties;
use tower::service_fn;

use crate::support::{all_queues, list_connections, queue_counts, unique, Broker, QueueCleanup};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// Messages queued before the consumer starts: more than the run handles
/// before its last forced close, so the queue stays saturated throughout.
const MESSAGES: usize = 2500;
/// CPU work per handler, ms, done without awaiting.
const WORK_MS: u64 = 6;
const PREFETCH: u16 = 100;
const CONCURRENCY: usize = 2;
/// Forced closes in one run.
const CLOSES: usize = 4;
/// How long before a forced close a handler may have finished and still be
/// redelivered: far above the 2 ms time bound, to absorb the loop's round
/// (2 handlers × 6 ms, read once per round), the broker's processing and
/// the time `rabbitmqctl` takes to exit once the broker closed the
/// connection (tens of ms on a loaded machine). Without the clock read, the
/// busy loop held acknowledgements until a run of 50 (50 × 6 ms) or the
/// end of its burst: handlings that had finished 0.3–0.7 s before the
/// close were redelivered.
const MARGIN: Duration = Duration::from_millis(200);

/// When each handling of each message finished, by message index.
#[derive(Default)]
struct Finished {
    at: Mutex<Vec<Vec<Instant>>>,
}

impl Finished {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Finished {
            at: Mutex::new(vec![Vec::new(); n]),
        })
    }

    fn record(&self, i: usize) {
        self.at.lock().unwrap()[i].push(Instant::now());
    }

    /// Messages handled at least once.
    fn handled(&self) -> usize {
        self.at
            .lock()
            .unwrap()
            .iter()
            .filter(|v| !v.is_empty())
            .count()
    }

    /// Handlings in all.
    fn handlings(&self) -> usize {
        self.at.lock().unwrap().iter().map(Vec::len).sum()
    }
}

/// Spins on the CPU for `d` (a handler's work that never awaits).
fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
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

/// Closes the connection `pid` with `rabbitmqctl` on a thread of its own
/// and returns when the command returned, read on that thread (the broker
/// has sent `connection.close` by then: from that moment it discards every
/// settle the client sends).
async fn force_close(pid: String, why: String) -> Instant {
    tokio::task::spawn_blocking(move || {
        let out = crate::support::rabbitmqctl_blocking()
            .args(["close_connection", &pid, &why])
            .output()
            .expect(crate::support::RABBITMQCTL_RUNS);
        let returned = Instant::now();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        returned
    })
    .await
    .expect("the close thread")
}

/// Waits, bounded, until `cond` holds, yielding to the runtime in between.
async fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < end, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// current_thread: the consumer loop and its handlers keep the one worker
// busy, as a saturated queue with CPU-bound handlers does.
#[tokio::test(flavor = "current_thread")]
async fn on_a_busy_loop_a_forced_close_redelivers_only_what_finished_within_the_time_bound() {
    let q = unique("coalesce-close");
    let name = format!("acemq-test-{q}");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    broker
        .declare(&q, lapin::types::FieldTable::default())
        .await
        .expect("declare");
    let bodies: Vec<Vec<u8>> = (0..MESSAGES).map(|i| i.to_string().into_bytes()).collect();
    broker
        .publish_many(&q, &bodies, BasicProperties::default())
        .await;

    let finished = Finished::new(MESSAGES);
    let handler = {
        let finished = finished.clone();
        service_fn(move |d: Delivery| {
            let finished = finished.clone();
            async move {
                let i: usize = std::str::from_utf8(d.body())
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .expect("a message index");
                spin(Duration::from_millis(WORK_MS));
                finished.record(i);
                Ok::<(), BoxError>(())
            }
        })
    };
    let mut queue = QueueConfig::new(&q);
    queue.prefetch = PREFETCH;
    queue.concurrency = CONCURRENCY;
    // ack_batch: the default (runs of up to 50, 2 ms).
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    let running = App::new(config)
        .connection_name(name.clone())
        .consume(&q, handler)
        .start()
        .await
        .expect("starts");

    let mut closes = Vec::new();
    let mut requested = Vec::new();
    for c in 0..CLOSES {
        let target = (c + 1) * MESSAGES / (CLOSES + 2);
        wait_until("handling under way", SECS(60), || {
            finished.handled() >= target
        })
        .await;
        let pid = connection_pid(&name)
            .await
            .expect("the consumer's connection is listed by its name");
        requested.push(Instant::now());
        closes.push(force_close(pid, format!("acemq test: forced close of {name}")).await);
        // The consumer is back on a new connection before the next close.
        wait_until("consuming again", SECS(30), || {
            finished.handlings() > target + 200
        })
        .await;
    }
    wait_until("every message handled", SECS(120), || {
        finished.handled() == MESSAGES
    })
    .await;
    // Every redelivery handled too: nothing ready or unacknowledged.
    let end = Instant::now() + SECS(30);
    while queue_counts(&q).await != Some((0, 0)) {
        assert!(Instant::now() < end, "{q} emptied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = running.drain().await.expect("a clean drain");
    eprintln!("drain: {report:?}");

    // For each handling repeated: the forced close that redelivered it (the
    // last one before the repeat) and how long before that close's command
    // returned the earlier handling had finished (zero when it finished
    // after: its outcome was lost with the connection).
    let at = finished.at.lock().unwrap().clone();
    let mut per_close = vec![Vec::new(); CLOSES];
    for pair in at.iter().flat_map(|t| t.windows(2)) {
        let c = closes
            .iter()
            .rposition(|c| *c < pair[1])
            .expect("a redelivery follows a forced close");
        per_close[c].push(closes[c].saturating_duration_since(pair[0]));
    }
    for (c, gaps) in per_close.iter_mut().enumerate() {
        gaps.sort_unstable();
        eprintln!(
            "close {c}: rabbitmqctl took {:?}; {} redelivered; finished before it returned (ms): {:?}",
            closes[c] - requested[c],
            gaps.len(),
            gaps.iter().map(Duration::as_millis).collect::<Vec<_>>()
        );
    }
    let late: Vec<Duration> = per_close
        .iter()
        .flatten()
        .copied()
        .filter(|g| *g > MARGIN)
        .collect();
    assert!(
        late.is_empty(),
        "{} redelivered messages had finished more than {MARGIN:?} before the forced close: {late:?}",
        late.len()
    );
    for (c, gaps) in per_close.iter().enumerate() {
        assert!(
            gaps.len() <= usize::from(PREFETCH),
            "close {c} redelivered more than the prefetch window: {}",
            gaps.len()
        );
    }
    broker.delete(&all_queues(&q)).await;
}

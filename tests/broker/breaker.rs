//! The circuit breaker against the broker: a failing handler opens it; a
//! cool-down longer than `pause_hand_back_after` hands the prefetch back
//! and stops consuming until one probe per cool-down; a cool-down shorter
//! than it keeps the held messages held, so trips cost them no delivery
//! count on a quorum queue.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::layers::Circuit;
use acemq::{App, BoxError, Config, Delivery, Health};
use lapin::BasicProperties;

use crate::support::{eventually, queue_counts, topology_queues, unique, Broker, QueueCleanup};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// One call of the handler.
#[derive(Clone, Debug)]
struct Call {
    id: String,
    attempt: u32,
    /// The circuit as the call began: `half_open` only for a probe.
    circuit: Circuit,
    /// The broker's `x-delivery-count` (0 when absent: never returned).
    delivery_count: i64,
    at: Instant,
    ok: bool,
}

/// A handler with a switch: while `failing`, every call fails (a transient
/// error) after `fail_after`; it records every call.
#[derive(Clone)]
struct Recorder {
    failing: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Recorder {
    fn new() -> Self {
        Recorder {
            failing: Arc::new(AtomicBool::new(true)),
            calls: Arc::default(),
        }
    }

    fn handler(
        &self,
        health: Health,
        queue: String,
        fail_after: Duration,
    ) -> impl tower::Service<Delivery, Response = (), Error = BoxError, Future: Send + 'static>
           + Clone
           + Send
           + 'static {
        let me = self.clone();
        tower::service_fn(move |d: Delivery| {
            let me = me.clone();
            let circuit = health.circuit(&queue).expect("the queue is consumed");
            async move {
                let failing = me.failing.load(Ordering::SeqCst);
                let at = Instant::now();
                if failing {
                    tokio::time::sleep(fail_after).await;
                }
                me.calls.lock().unwrap().push(Call {
                    id: d.properties().message_id.clone().unwrap_or_default(),
                    attempt: d.attempt(),
                    circuit,
                    delivery_count: d
                        .headers()
                        .get("x-delivery-count")
                        .and_then(|v| v.as_i64())
                        .unwrap_or(0),
                    at,
                    ok: !failing,
                });
                if failing {
                    return Err::<(), BoxError>("the downstream is down".into());
                }
                Ok(())
            }
        })
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Successful calls per message id.
    fn successes(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for c in self.calls().iter().filter(|c| c.ok) {
            *out.entry(c.id.clone()).or_default() += 1;
        }
        out
    }

    fn probes(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.circuit == Circuit::HalfOpen)
            .collect()
    }
}

async fn publish_ids(broker: &mut Broker, q: &str, ids: impl IntoIterator<Item = String>) {
    for id in ids {
        broker
            .publish_props(
                q,
                id.as_bytes(),
                BasicProperties::default().with_message_id(id.as_str().into()),
            )
            .await;
    }
}

/// Waits until `queue` holds `n` ready messages and has no consumer; how
/// long that took. With `n` all the messages there are, none is
/// unacknowledged.
async fn wait_all_back(broker: &mut Broker, q: &str, n: u32, within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        if broker.ready(q).await == Some(n) && broker.consumers(q).await == Some(0) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "within {within:?}, {q} holds all {n} ready and has no consumer: \
             {:?} ready, {:?} (ready, unacked), {:?} consumers",
            broker.ready(q).await,
            queue_counts(q).await,
            broker.consumers(q).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_circuit(health: &Health, q: &str, want: Circuit, within: Duration) -> Instant {
    let ok = eventually(within, || async { health.circuit(q).unwrap() == want }).await;
    assert!(
        ok,
        "the circuit is {want} within {within:?}: {:?}",
        health.snapshot()
    );
    Instant::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_with_a_cool_down_past_the_hand_back_bound_hands_its_prefetch_back_stops_consuming_and_probes_once_per_cool_down_until_the_handler_recovers(
) {
    const N: u32 = 10;
    const COOL_DOWN: Duration = Duration::from_secs(3);
    let q = unique("breaker-handback");
    // Every failure waits on the 300 ms rung (the broker holds it, not
    // this process), so once the gate holds everything nothing is unacked.
    let config = Config::from_yaml_str(&format!(
        "shutdown_timeout: 10
pause_hand_back_after: 1s
queues:
  - name: {q}
    type: quorum
    prefetch: {N}
    concurrency: 2
    dead_letter: true
    retries: {{ max_attempts: 10, initial_delay: 300ms, max_delay: 300ms, broker_wait_threshold: 300ms }}
    circuit_breaker: {{ failure_ratio: 0.5, minimum_calls: 2, window: 30s, cool_down: 3s, max_cool_down: 6s }}
"
    ))
    .expect("a valid config");
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let mut broker = Broker::new().await;
    let rec = Recorder::new();
    let app = App::new(config);
    let health = app.health();
    let running = app
        .consume(&q, rec.handler(health.clone(), q.clone(), Duration::ZERO))
        .start()
        .await
        .expect("starts");
    publish_ids(&mut broker, &q, (0..N).map(|i| format!("m{i}"))).await;

    let opened = wait_circuit(&health, &q, Circuit::Open, SECS(10)).await;
    let first_failure = rec.calls()[0].at;
    // The prefetch handed back: all N in the queue (the failed ones back
    // from their rung), none unacked, no consumer.
    let back_after = wait_all_back(&mut broker, &q, N, SECS(10)).await;
    let before_probe = rec.calls();
    assert!(
        before_probe
            .iter()
            .all(|c| !c.ok && c.circuit != Circuit::HalfOpen),
        "{before_probe:?}"
    );
    let handed_back = health.snapshot().queues[0].handed_back;
    let unacked = queue_counts(&q).await;

    // After the cool-down, exactly one probe; it fails (the handler is still
    // down), the circuit opens again, and everything goes back again.
    let ok = eventually(COOL_DOWN + SECS(10), || async { !rec.probes().is_empty() }).await;
    assert!(
        ok,
        "a probe within the cool-down and 10 s: {:?}",
        health.snapshot()
    );
    let first_probe = rec.probes()[0].clone();
    wait_circuit(&health, &q, Circuit::Open, SECS(5)).await;
    wait_all_back(&mut broker, &q, N, SECS(10)).await;
    let after_probe = rec.calls();
    assert_eq!(
        after_probe.len(),
        before_probe.len() + 1,
        "between two trips only the probe is called: {:?}",
        &after_probe[before_probe.len()..]
    );

    // The handler recovers: the next probe (after twice the cool-down)
    // succeeds and the queue resumes by itself.
    rec.failing.store(false, Ordering::SeqCst);
    let ok = eventually(2 * COOL_DOWN + SECS(15), || async {
        rec.successes().len() == N as usize
    })
    .await;
    assert!(
        ok,
        "every message handled after the recovery: {:?}; {:?}",
        rec.successes(),
        health.snapshot()
    );
    assert_eq!(health.circuit(&q).unwrap(), Circuit::Closed);
    let successes = rec.successes();
    assert!(
        successes.values().all(|n| *n == 1),
        "each message handled once: {successes:?}"
    );
    let probes = rec.probes();
    assert_eq!(probes.len(), 2, "one probe per cool-down: {probes:?}");
    let first_wait = first_probe.at - first_failure;
    let second_wait = probes[1].at - first_probe.at;
    assert!(
        first_wait >= COOL_DOWN && first_wait < COOL_DOWN + SECS(5),
        "the first probe a cool-down after the trip: {first_wait:?}"
    );
    assert!(
        second_wait >= 2 * COOL_DOWN && second_wait < 2 * COOL_DOWN + SECS(5),
        "the second probe twice the cool-down after the first: {second_wait:?}"
    );
    let mut counts: Vec<(String, i64)> = rec
        .calls()
        .iter()
        .filter(|c| c.ok)
        .map(|c| (c.id.clone(), c.delivery_count))
        .collect();
    counts.sort();
    let failed_calls = rec.calls().iter().filter(|c| !c.ok).count();
    eprintln!(
        "--- breaker hand-back: open {:?} after the first failure; all {N} back in the queue {back_after:?} after it opened \
         ({handed_back} handed back by the gate; then {unacked:?} (ready, unacked)); first probe {first_wait:?} after the first failure, second {second_wait:?} \
         after the first; {failed_calls} failed calls in all; x-delivery-count at the successful call: {counts:?}",
        opened - first_failure,
    );
    // Each hand-back is a redelivery on a quorum queue: two trips with a
    // cool-down past the bound, at most two.
    assert!(
        counts.iter().all(|(_, n)| *n <= 2),
        "at most one redelivery per trip: {counts:?}"
    );
    running.drain().await.expect("a clean drain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trips_with_a_cool_down_below_the_hand_back_bound_keep_the_held_messages_held_and_leave_their_delivery_count_unchanged(
) {
    const TRIPS: usize = 3;
    const HELD: usize = 10;
    let q = unique("breaker-held");
    // Failures retry in process (every wait below the threshold), so no
    // message leaves this process before it succeeds.
    let config = Config::from_yaml_str(&format!(
        "shutdown_timeout: 10
pause_hand_back_after: 10s
queues:
  - name: {q}
    type: quorum
    prefetch: 20
    concurrency: 4
    dead_letter: true
    retries: {{ max_attempts: 100, initial_delay: 50ms, max_delay: 100ms, broker_wait_threshold: 30s }}
    circuit_breaker: {{ failure_ratio: 0.5, minimum_calls: 2, window: 30s, cool_down: 300ms, max_cool_down: 1200ms }}
"
    ))
    .expect("a valid config");
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let mut broker = Broker::new().await;
    let rec = Recorder::new();
    let app = App::new(config);
    let health = app.health();
    let running = app
        .consume(
            &q,
            // A failing call takes 100 ms, so each half-open phase lasts
            // long enough to be seen.
            rec.handler(health.clone(), q.clone(), Duration::from_millis(100)),
        )
        .start()
        .await
        .expect("starts");
    publish_ids(&mut broker, &q, ["t0".to_owned(), "t1".to_owned()]).await;
    wait_circuit(&health, &q, Circuit::Open, SECS(10)).await;
    // Published while the circuit is open: held at the gate.
    publish_ids(&mut broker, &q, (0..HELD).map(|i| format!("h{i}"))).await;

    // Watch the circuit through TRIPS open phases (the trip, then a failed
    // probe each), then let the handler recover.
    let mut phases: Vec<(Circuit, Instant)> = vec![(Circuit::Open, Instant::now())];
    let t0 = Instant::now();
    while phases.iter().filter(|(c, _)| *c == Circuit::Open).count() < TRIPS {
        assert!(
            t0.elapsed() < SECS(20),
            "{TRIPS} open phases within 20 s: {phases:?}"
        );
        let now = health.circuit(&q).unwrap();
        if phases.last().map(|(c, _)| *c) != Some(now) {
            phases.push((now, Instant::now()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rec.failing.store(false, Ordering::SeqCst);
    let ok = eventually(SECS(15), || async { rec.successes().len() == 2 + HELD }).await;
    assert!(
        ok,
        "every message handled after the recovery: {:?}; {:?}",
        rec.successes(),
        health.snapshot()
    );
    wait_circuit(&health, &q, Circuit::Closed, SECS(5)).await;
    let snapshot = health.snapshot().queues[0].clone();
    let consumers = broker.consumers(&q).await;
    running.drain().await.expect("a clean drain");

    let calls = rec.calls();
    let successes = rec.successes();
    assert!(
        successes.values().all(|n| *n == 1),
        "each message handled once: {successes:?}"
    );
    let counts: Vec<(String, i64)> = calls
        .iter()
        .filter(|c| c.ok)
        .map(|c| (c.id.clone(), c.delivery_count))
        .collect();
    let open_times: Vec<Duration> = phases
        .windows(2)
        .filter(|w| w[0].0 == Circuit::Open)
        .map(|w| w[1].1 - w[0].1)
        .collect();
    // A probe is a held message let through: its first attempt (in-process
    // retries of others run at a half-open circuit too).
    let probes: Vec<Call> = rec
        .probes()
        .into_iter()
        .filter(|c| c.attempt == 1)
        .collect();
    eprintln!(
        "--- breaker held: phases {:?}; open for {open_times:?}; {} probes ({} failed); \
         handed back {}, consumers at the end {consumers:?}; x-delivery-count at the successful call: {counts:?}",
        phases.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(),
        probes.len(),
        probes.iter().filter(|c| !c.ok).count(),
        snapshot.handed_back,
    );
    assert!(
        probes.len() >= TRIPS && probes.iter().filter(|c| !c.ok).count() >= TRIPS - 1,
        "a probe after each cool-down, the failed ones among them: {probes:?}"
    );
    // Usually an `h` message; a `t` message too when the broker was slow
    // enough that the other one tripped the circuit before it arrived.
    assert!(
        probes
            .iter()
            .all(|p| p.attempt == 1 && !calls.iter().any(|c| c.id == p.id && c.at < p.at)),
        "each probe is a held message's first call: {probes:?}; all calls: {calls:?}"
    );
    assert_eq!(snapshot.handed_back, 0, "nothing handed back: {snapshot:?}");
    assert_eq!(consumers, Some(1), "the consumer was never cancelled");
    assert!(
        counts.iter().all(|(_, n)| *n == 0),
        "{TRIPS} trips with a cool-down below pause_hand_back_after leave x-delivery-count unchanged: {counts:?}"
    );
}

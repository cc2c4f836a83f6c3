//! The circuit breaker's state machine under tokio's paused clock: the
//! window and its minimum of calls, what counts, the cool-down and its
//! growth, the one probe, and the operator's pause and resume beside it.

#![allow(missing_docs)]

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_layers::{
    BoxError, BreakerPolicy, Circuit, CircuitBreakerLayer, Decision, Delivery, PauseHandle,
    PauseLayer, Reject, RetryLayer, RetryPolicy,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder, ServiceExt};

mod common;
use common::FakePublisher;

const OK: u8 = 0;
const FAIL: u8 = 1;
const REJECT: u8 = 2;

/// The handler's downstream: what it answers, how long it takes, and how
/// many attempts it saw.
#[derive(Clone, Default)]
struct Downstream {
    mode: Arc<AtomicU8>,
    delay_ms: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
}

impl Downstream {
    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    fn slow(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    fn service(
        &self,
    ) -> impl Service<Delivery, Response = Decision, Error = BoxError, Future: Send>
           + Clone
           + Send
           + 'static {
        let this = self.clone();
        tower::service_fn(move |_d: Delivery| {
            let this = this.clone();
            async move {
                this.calls.fetch_add(1, Ordering::SeqCst);
                let delay = this.delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                match this.mode.load(Ordering::SeqCst) {
                    OK => Ok(Decision::Ack),
                    FAIL => Err::<Decision, BoxError>("database unavailable".into()),
                    _ => Err(Reject::new("not an order").into()),
                }
            }
        })
    }
}

fn policy(minimum_calls: u32, failure_ratio: f64) -> BreakerPolicy {
    let mut p = BreakerPolicy::default();
    p.minimum_calls = minimum_calls;
    p.failure_ratio = failure_ratio;
    p.window = Duration::from_secs(10);
    p.cool_down = Duration::from_secs(1);
    p.max_cool_down = Duration::from_secs(3);
    p
}

type Svc = tower::util::BoxCloneSyncService<Delivery, Decision, BoxError>;

/// Gate → breaker → the downstream's handler.
fn stack(gate: &PauseHandle, policy: BreakerPolicy, down: &Downstream) -> Svc {
    let svc = ServiceBuilder::new()
        .layer(PauseLayer::new(gate.clone()))
        .layer(CircuitBreakerLayer::new(gate.clone(), policy))
        .service(down.service());
    tower::util::BoxCloneSyncService::new(svc)
}

fn delivery() -> Delivery {
    Delivery::builder().queue("breaker.orders").build()
}

async fn send(svc: &mut Svc) -> Result<Decision, BoxError> {
    svc.ready().await.unwrap().call(delivery()).await
}

async fn send_n(svc: &mut Svc, n: usize) {
    for _ in 0..n {
        let _ = send(svc).await;
    }
}

/// Sends a delivery on a task of its own (it may be held).
async fn spawn_send(svc: &mut Svc) -> JoinHandle<Result<Decision, BoxError>> {
    let fut = svc.ready().await.unwrap().call(delivery());
    let task = tokio::spawn(fut);
    settle().await;
    task
}

/// Lets every other task run (timers that fired, woken waiters).
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

/// Advances the paused clock by `ms` and lets the tasks run.
async fn advance(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    settle().await;
}

/// Trips the circuit with `minimum_calls` failures.
async fn trip(svc: &mut Svc, down: &Downstream, minimum_calls: usize, gate: &PauseHandle) {
    down.set(FAIL);
    send_n(svc, minimum_calls).await;
    assert_eq!(
        gate.circuit(),
        Circuit::Open,
        "the failures trip the circuit"
    );
}

#[tokio::test(start_paused = true)]
async fn the_ratio_is_not_judged_before_the_minimum_of_calls() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(5, 0.5), &down);
    down.set(FAIL);
    send_n(&mut svc, 4).await;
    assert_eq!(gate.circuit(), Circuit::Closed, "4 failures, 4 calls of 5");
    send_n(&mut svc, 1).await;
    assert_eq!(gate.circuit(), Circuit::Open, "5 failures of 5 calls");
    assert!(gate.is_paused(), "an open circuit holds the gate");
    assert!(!gate.is_paused_by_operator());
}

#[tokio::test(start_paused = true)]
async fn successes_count_against_the_ratio() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(4, 0.5), &down);
    send_n(&mut svc, 6).await;
    down.set(FAIL);
    send_n(&mut svc, 5).await;
    assert_eq!(gate.circuit(), Circuit::Closed, "5 failures of 11 calls");
    send_n(&mut svc, 1).await;
    assert_eq!(gate.circuit(), Circuit::Open, "6 failures of 12 calls");
}

#[tokio::test(start_paused = true)]
async fn successes_slide_out_of_the_window_as_failures_do() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(2, 0.5), &down);
    send_n(&mut svc, 6).await;
    advance(5_000).await;
    send_n(&mut svc, 4).await;
    // 11 s: the first six successes have left the 10 s window; the four of
    // 5 s are in it.
    advance(6_000).await;
    down.set(FAIL);
    send_n(&mut svc, 3).await;
    assert_eq!(
        gate.circuit(),
        Circuit::Closed,
        "3 failures of 7 calls within the window"
    );
    send_n(&mut svc, 1).await;
    assert_eq!(
        gate.circuit(),
        Circuit::Open,
        "4 failures of 8 calls: the six older successes no longer count"
    );
}

#[tokio::test(start_paused = true)]
async fn failures_older_than_the_window_do_not_count() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(3, 1.0), &down);
    down.set(FAIL);
    send_n(&mut svc, 2).await;
    // The window is 10 s (10 buckets of 1 s): the two failures leave it.
    advance(11_000).await;
    send_n(&mut svc, 2).await;
    assert_eq!(
        gate.circuit(),
        Circuit::Closed,
        "2 failures within the window"
    );
    advance(8_000).await;
    send_n(&mut svc, 1).await;
    assert_eq!(gate.circuit(), Circuit::Open, "3 failures within 10 s");
}

#[tokio::test(start_paused = true)]
async fn permanent_rejections_count_for_nothing() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(3, 0.5), &down);
    down.set(REJECT);
    send_n(&mut svc, 20).await;
    assert_eq!(
        gate.circuit(),
        Circuit::Closed,
        "rejections are not failures"
    );
    down.set(FAIL);
    send_n(&mut svc, 3).await;
    // Had the rejections counted as successes, 3 of 23 would not trip.
    assert_eq!(gate.circuit(), Circuit::Open, "nor successes");
}

#[tokio::test(start_paused = true)]
async fn in_process_retries_count_each_attempt() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut retries =
        RetryPolicy::exponential(10, Duration::from_millis(100), Duration::from_millis(100));
    retries.broker_wait_threshold = Duration::from_secs(60);
    let svc = ServiceBuilder::new()
        .layer(PauseLayer::new(gate.clone()))
        .layer(RetryLayer::new(
            retries,
            FakePublisher::default(),
            CancellationToken::new(),
        ))
        .layer(CircuitBreakerLayer::new(gate.clone(), policy(3, 1.0)))
        .service(down.service());
    let mut svc = tower::util::BoxCloneSyncService::new(svc);
    down.set(FAIL);
    let one = spawn_send(&mut svc).await;
    advance(150).await;
    assert_eq!(gate.circuit(), Circuit::Closed, "two attempts so far");
    advance(100).await;
    assert_eq!(down.calls(), 3);
    assert_eq!(
        gate.circuit(),
        Circuit::Open,
        "one delivery's three attempts trip it while it is still being retried"
    );
    // The delivery let through before the trip goes on retrying; new ones
    // are held.
    let held = spawn_send(&mut svc).await;
    assert_eq!(gate.held(), 1);
    advance(200).await;
    assert!(down.calls() >= 5, "the retries went on");
    one.abort();
    held.abort();
}

#[tokio::test(start_paused = true)]
async fn open_holds_then_exactly_one_probe_passes_and_its_success_closes() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(3, 0.5), &down);
    trip(&mut svc, &down, 3, &gate).await;
    let before = down.calls();
    let mut waiting = Vec::new();
    for _ in 0..5 {
        waiting.push(spawn_send(&mut svc).await);
    }
    assert_eq!(gate.held(), 5, "an open circuit holds every delivery");
    assert_eq!(down.calls(), before, "none reaches the handler");

    down.set(OK);
    down.slow(500);
    advance(999).await;
    assert_eq!(gate.circuit(), Circuit::Open, "within the cool-down");
    advance(2).await;
    assert_eq!(
        gate.circuit(),
        Circuit::HalfOpen,
        "the cool-down has passed"
    );
    assert_eq!(down.calls(), before + 1, "exactly one probe");
    assert_eq!(gate.held(), 4, "the others stay held");
    // Another delivery arriving now is held too.
    waiting.push(spawn_send(&mut svc).await);
    assert_eq!(gate.held(), 5);
    assert_eq!(down.calls(), before + 1);

    advance(500).await;
    assert_eq!(gate.circuit(), Circuit::Closed, "the probe succeeded");
    advance(500).await;
    for task in waiting {
        assert_eq!(task.await.unwrap().unwrap(), Decision::Ack);
    }
    assert_eq!(down.calls(), before + 6);
    assert_eq!(gate.held(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_opens_again_for_a_doubled_cool_down_up_to_the_max() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(3, 0.5), &down);
    trip(&mut svc, &down, 3, &gate).await;
    // cool_down 1 s, max 3 s: 1 s, then 2 s, 3 s, 3 s.
    for cool_ms in [1_000, 2_000, 3_000, 3_000] {
        advance(cool_ms - 1).await;
        assert_eq!(gate.circuit(), Circuit::Open, "within {cool_ms} ms");
        advance(2).await;
        assert_eq!(gate.circuit(), Circuit::HalfOpen, "after {cool_ms} ms");
        assert!(send(&mut svc).await.is_err(), "the probe fails");
        assert_eq!(gate.circuit(), Circuit::Open);
    }
    // The probe succeeds: closed, and the next trip starts from 1 s again.
    advance(3_001).await;
    down.set(OK);
    assert_eq!(send(&mut svc).await.unwrap(), Decision::Ack);
    assert_eq!(gate.circuit(), Circuit::Closed);
    trip(&mut svc, &down, 3, &gate).await;
    advance(1_001).await;
    assert_eq!(gate.circuit(), Circuit::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn the_window_starts_empty_after_the_circuit_closes() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(3, 0.5), &down);
    trip(&mut svc, &down, 3, &gate).await;
    advance(1_001).await;
    down.set(OK);
    send(&mut svc).await.unwrap();
    assert_eq!(gate.circuit(), Circuit::Closed);
    down.set(FAIL);
    send_n(&mut svc, 2).await;
    assert_eq!(
        gate.circuit(),
        Circuit::Closed,
        "the failures before the trip are forgotten"
    );
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_tells_nothing_lets_the_next_delivery_probe() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(3, 0.5), &down);
    trip(&mut svc, &down, 3, &gate).await;
    advance(1_001).await;
    // Rejected: neither a success nor a failure.
    down.set(REJECT);
    assert!(send(&mut svc).await.is_err());
    assert_eq!(gate.circuit(), Circuit::HalfOpen);
    // Dropped before its attempt ended: the gate frees the probe.
    down.set(OK);
    down.slow(1_000);
    let dropped = spawn_send(&mut svc).await;
    let held = spawn_send(&mut svc).await;
    assert_eq!(gate.held(), 1, "the second waits for the first probe");
    let calls = down.calls();
    dropped.abort();
    settle().await;
    assert_eq!(down.calls(), calls + 1, "the held one is the next probe");
    assert_eq!(gate.held(), 0);
    advance(1_000).await;
    assert_eq!(held.await.unwrap().unwrap(), Decision::Ack);
    assert_eq!(gate.circuit(), Circuit::Closed);
}

#[tokio::test(start_paused = true)]
async fn the_operators_pause_holds_whatever_the_breaker_says() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(3, 0.5), &down);
    trip(&mut svc, &down, 3, &gate).await;
    assert!(gate.pause(), "the operator pauses an open circuit's gate");
    advance(1_001).await;
    assert_eq!(gate.circuit(), Circuit::HalfOpen);
    let calls = down.calls();
    let held = spawn_send(&mut svc).await;
    assert_eq!(gate.held(), 1, "no probe passes the operator's pause");
    assert_eq!(down.calls(), calls);
    assert!(gate.is_paused() && gate.is_paused_by_operator());

    // The operator's resume overrides the half-open circuit: closed.
    down.set(OK);
    assert!(gate.resume());
    assert_eq!(gate.circuit(), Circuit::Closed);
    assert_eq!(held.await.unwrap().unwrap(), Decision::Ack);
    assert!(!gate.is_paused());
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_succeeds_does_not_lift_the_operators_pause() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(3, 0.5), &down);
    trip(&mut svc, &down, 3, &gate).await;
    advance(1_001).await;
    down.set(OK);
    down.slow(500);
    let probe = spawn_send(&mut svc).await;
    assert!(gate.pause(), "paused while the probe runs");
    advance(500).await;
    assert_eq!(probe.await.unwrap().unwrap(), Decision::Ack);
    assert_eq!(gate.circuit(), Circuit::Closed);
    assert!(gate.is_paused(), "the operator's pause holds");
    let held = spawn_send(&mut svc).await;
    assert_eq!(gate.held(), 1);
    assert!(gate.resume());
    advance(500).await;
    assert_eq!(held.await.unwrap().unwrap(), Decision::Ack);
}

#[tokio::test(start_paused = true)]
async fn an_operators_resume_overrides_an_open_circuit_until_the_next_trip() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(3, 0.5), &down);
    trip(&mut svc, &down, 3, &gate).await;
    down.set(OK);
    let held = [spawn_send(&mut svc).await, spawn_send(&mut svc).await];
    assert_eq!(gate.held(), 2);
    assert!(gate.resume(), "the operator resumes an open circuit");
    assert_eq!(gate.circuit(), Circuit::Closed);
    for task in held {
        assert_eq!(task.await.unwrap().unwrap(), Decision::Ack);
    }
    // The cool-down's end does nothing to the overridden circuit.
    advance(1_001).await;
    assert_eq!(gate.circuit(), Circuit::Closed);
    assert!(!gate.resume(), "nothing left to resume");
    // The breaker trips again on new failures (2 successes, 2 failures).
    down.set(FAIL);
    send_n(&mut svc, 2).await;
    assert_eq!(gate.circuit(), Circuit::Open);
}

#[tokio::test(start_paused = true)]
async fn the_drain_hands_back_what_an_open_circuit_holds() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut svc = stack(&gate, policy(3, 0.5), &down);
    trip(&mut svc, &down, 3, &gate).await;
    let held = spawn_send(&mut svc).await;
    assert!(gate.close());
    assert_eq!(held.await.unwrap().unwrap(), Decision::HandBack);
    // The cool-down's end leaves a closed gate closed.
    advance(1_001).await;
    assert!(gate.is_closed());
    assert_eq!(
        send(&mut svc).await.unwrap(),
        Decision::HandBack,
        "closed: everything handed back"
    );
}

#[tokio::test(start_paused = true)]
async fn paused_for_runs_while_the_circuit_is_open() {
    let (gate, down) = (PauseHandle::new(), Downstream::default());
    let mut policy = policy(3, 0.5);
    policy.cool_down = Duration::from_secs(60);
    policy.max_cool_down = Duration::from_secs(60);
    let mut svc = stack(&gate, policy, &down);
    let watcher = {
        let gate = gate.clone();
        tokio::spawn(async move { gate.paused_for(Duration::from_secs(30)).await })
    };
    settle().await;
    trip(&mut svc, &down, 3, &gate).await;
    advance(29_000).await;
    assert!(!watcher.is_finished());
    advance(1_001).await;
    assert!(
        watcher.is_finished(),
        "an open circuit counts as paused for the hand-back bound"
    );
}

//! Heap allocations per delivery on the success path, per layer and for the
//! full stack, counted for the thread that runs them (`allocation-counter`
//! counts per thread: what the test harness's other threads allocate
//! meanwhile — printing another test's result — cannot land in a
//! measurement).
//!
//! The handler itself allocates nothing (its future lives on the stack of
//! the loop), so what is counted is what each layer adds. The bounds are
//! what was measured (see BENCHMARKS.md); a change that adds an allocation
//! on the hot path fails here. Run with `--nocapture` to see the figures:
//!
//! `cargo test -p acemq-layers --test allocations -- --nocapture`
//!
//! The whole stack (in the order `acemq::App::consume` builds it, without
//! the redelivery limit, which only reads a header on the success path) is
//! measured three ways: with the handler returning at once, with a handler
//! that yields once (the cancellation layer's "handler returned `Pending`"
//! path), and with that handler 8 at a time in the consumer loop's
//! container (`Slots`). The last test asserts that none of them allocates
//! per delivery.

#![allow(missing_docs)]

use std::hint::black_box;

use acemq_layers::{
    BoxError, BreakerPolicy, CancelLayer, Cancellation, CircuitBreakerLayer, DeadLetterLayer,
    Delivery, InFlightCounter, InFlightLayer, Lifeline, PauseHandle, PauseLayer, RetryLayer,
};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder, ServiceExt};

#[path = "../benches/support/success_path.rs"]
mod success_path;
use success_path::{handle, handle_decision, policy, run_in, NoopPublish};

/// The tests of this file take turns, so that their printed tables do not
/// interleave (the count is per thread: it needs no turns).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `f` with a fresh `current_thread` runtime (so every task the
/// services spawn runs on the thread that counts), alone.
fn alone<T>(f: impl FnOnce(&Runtime) -> T) -> T {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _context = rt.enter();
    f(&rt)
}

/// Deliveries per measurement; the count is divided by it.
const N: usize = 1_000;

/// Measurements per service; the most allocations counts.
const TRIES: usize = 3;

/// The success path's handler, yielding once to the runtime first.
async fn handle_yielding(d: Delivery) -> Result<(), BoxError> {
    tokio::task::yield_now().await;
    black_box(d.body().len());
    Ok(())
}

/// The stack in `acemq::App::consume`'s order (pause → claim →
/// dead-letter → retry → cancel; `App` also has the redelivery limit between
/// dead-letter and retry), around `handler`.
macro_rules! whole_stack {
    ($handler:expr) => {
        ServiceBuilder::new()
            .layer(PauseLayer::new(PauseHandle::new()))
            .layer(
                acemq_layers::ClaimLayer::new(InFlightCounter::new())
                    .concurrency(std::sync::Arc::new(tokio::sync::Semaphore::new(8))),
            )
            .layer(DeadLetterLayer::new(NoopPublish))
            .layer(RetryLayer::new(
                policy(),
                NoopPublish,
                CancellationToken::new(),
            ))
            .layer(CancelLayer::from_cancellation(generation_token()).woken_by_transport())
            .service_fn($handler)
    };
}

/// The generation the deliveries belong to, as the consumer loop makes one:
/// its lifeline carries the handlers' token, which the cancellation layer
/// is given too.
fn generation() -> &'static Lifeline {
    static GENERATION: std::sync::OnceLock<Lifeline> = std::sync::OnceLock::new();
    GENERATION
        .get_or_init(|| Lifeline::with_cancellation(Cancellation::new(CancellationToken::new())))
}

fn generation_token() -> Cancellation {
    generation().cancellation().expect("made with one").clone()
}

/// Allocations per delivery through the whole stack: (handler returns at
/// once, handler yields once, handler yields once and runs in the consumer
/// loop's container, 8 at a time).
fn whole_stack_allocations(rt: &Runtime) -> (f64, f64, f64) {
    let ready = allocations_per_delivery(rt, whole_stack!(handle));
    let yielding = allocations_per_delivery(rt, whole_stack!(handle_yielding));
    let in_slots = allocations_in_slots(rt, whole_stack!(handle_yielding));
    println!(
        "allocations per delivery, the whole stack on the success path ({N} deliveries each):"
    );
    println!("  handler returns at once {ready:>5.2}");
    println!("  handler yields once     {yielding:>5.2}");
    println!("  yields, in Slots ×8     {in_slots:>5.2}");
    (ready, yielding, in_slots)
}

/// The same as [`allocations_per_delivery`], the requests run as acemq's
/// consumer loop runs them: 8 at a time in a `Slots` (the loop's container
/// of running handlers), the next started as one finishes.
fn allocations_in_slots<S>(rt: &Runtime, mut svc: S) -> f64
where
    S: Service<Delivery>,
    S::Error: std::fmt::Debug,
{
    use acemq_layers::cancel::Slots;
    const AT_ONCE: u64 = 8;
    let d = alloc_delivery();
    // One container for every measurement, as the loop keeps one per
    // generation: what is counted is what a delivery costs in it.
    let mut running = Slots::with_capacity(AT_ONCE as usize);
    let deliver = |n: usize| {
        rt.block_on(run_in(
            &mut svc,
            &d,
            n as u64,
            AT_ONCE,
            &mut running,
            Slots::push,
        ));
    };
    per_delivery_beyond_warm_up(deliver)
}

/// Allocations (and reallocations) per delivery through `svc`, after a warm-up (first-use
/// registrations: the in-flight slot, the token's child list, ...).
fn allocations_per_delivery<S>(rt: &Runtime, mut svc: S) -> f64
where
    S: Service<Delivery>,
    S::Error: std::fmt::Debug,
{
    let d = alloc_delivery();
    let deliver = |n: usize| {
        rt.block_on(async {
            for _ in 0..n {
                let r = svc.ready().await.unwrap().call(d.clone()).await;
                let _ = black_box(r);
            }
        })
    };
    per_delivery_beyond_warm_up(deliver)
}

/// The delivery every measurement sends, of the generation.
fn alloc_delivery() -> Delivery {
    Delivery::builder()
        .queue("alloc.orders")
        .delivery_tag(1)
        .body(vec![7u8; 256])
        .lifeline(generation().clone())
        .build()
}

/// Allocations per delivery of `deliver(n)` (which sends `n`), after a
/// warm-up (first-use registrations: the in-flight slot, the token's child
/// list, ...).
fn per_delivery_beyond_warm_up(mut deliver: impl FnMut(usize)) -> f64 {
    deliver(16);
    // The count is this thread's, where the services and the tasks they
    // spawn run. Entering `block_on` costs the runtime an allocation of its
    // own the first time a task yields in it (its list of deferred wakers),
    // once per call whatever the number of deliveries: what 2N deliveries
    // cost beyond N is what N deliveries cost, without it. Every try sees
    // the same; the most of them is the figure. (A reallocation — a growing
    // buffer — is counted as an allocation.)
    let mut most = 0;
    for _ in 0..TRIES {
        let once = allocation_counter::measure(|| deliver(N)).count_total;
        let twice = allocation_counter::measure(|| deliver(2 * N)).count_total;
        most = most.max(twice.saturating_sub(once));
    }
    most as f64 / N as f64
}

#[test]
fn each_layer_allocates_no_more_than_measured_on_the_success_path() {
    alone(each_layer);
}

fn each_layer(rt: &Runtime) {
    let bare = allocations_per_delivery(rt, tower::service_fn(handle_decision));
    let in_flight = allocations_per_delivery(
        rt,
        ServiceBuilder::new()
            .layer(InFlightLayer::new(InFlightCounter::new()))
            .service_fn(handle_decision),
    );
    let claim = allocations_per_delivery(
        rt,
        ServiceBuilder::new()
            .layer(
                acemq_layers::ClaimLayer::new(InFlightCounter::new())
                    .concurrency(std::sync::Arc::new(tokio::sync::Semaphore::new(8))),
            )
            .service_fn(handle_decision),
    );
    // Every delivery's key free (a new key each).
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let partition = allocations_per_delivery(
        rt,
        ServiceBuilder::new()
            .layer(acemq_layers::PartitionLayer::new(move |_: &Delivery| {
                Some(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
            }))
            .service_fn(handle_decision),
    );
    let pause = allocations_per_delivery(
        rt,
        ServiceBuilder::new()
            .layer(PauseLayer::new(PauseHandle::new()))
            .service_fn(handle_decision),
    );
    let cancel = allocations_per_delivery(
        rt,
        ServiceBuilder::new()
            .layer(CancelLayer::new(CancellationToken::new()))
            .service_fn(handle),
    );
    let cancel_waiting = allocations_per_delivery(
        rt,
        ServiceBuilder::new()
            .layer(CancelLayer::new(CancellationToken::new()))
            .service_fn(handle_yielding),
    );
    let cancel_woken = allocations_per_delivery(
        rt,
        ServiceBuilder::new()
            .layer(CancelLayer::from_cancellation(generation_token()).woken_by_transport())
            .service_fn(handle_yielding),
    );
    let retry = allocations_per_delivery(
        rt,
        ServiceBuilder::new()
            .layer(RetryLayer::new(
                policy(),
                NoopPublish,
                CancellationToken::new(),
            ))
            .service_fn(handle_decision),
    );
    let dead_letter = allocations_per_delivery(
        rt,
        ServiceBuilder::new()
            .layer(DeadLetterLayer::new(NoopPublish))
            .service_fn(handle_decision),
    );
    // Closed, its window ring counting every success.
    let breaker = allocations_per_delivery(
        rt,
        ServiceBuilder::new()
            .layer(CircuitBreakerLayer::new(
                PauseHandle::new(),
                BreakerPolicy::default(),
            ))
            .service_fn(handle_decision),
    );
    let full = allocations_per_delivery(rt, whole_stack!(handle));
    let full_yielding = allocations_per_delivery(rt, whole_stack!(handle_yielding));

    let rows = [
        ("bare service_fn", bare, 0.0),
        ("in-flight", in_flight, 0.0),
        ("claim", claim, 0.0),
        ("partition (a free key)", partition, 0.0),
        ("pause (open)", pause, 0.0),
        ("cancel", cancel, 0.0),
        ("cancel, yields once", cancel_waiting, 0.0),
        ("cancel woken, yields", cancel_woken, 0.0),
        ("retry (success)", retry, 0.0),
        ("dead-letter (success)", dead_letter, 0.0),
        ("breaker (closed)", breaker, 0.0),
        ("full stack", full, 0.0),
        ("full stack, yields once", full_yielding, 0.0),
    ];
    println!("allocations per delivery (success path, {N} deliveries each):");
    for (name, measured, bound) in rows {
        println!("  {name:<24} {measured:>5.2}  (bound {bound})");
    }
    for (name, measured, bound) in rows {
        assert!(
            measured <= bound,
            "{name}: {measured} allocations per delivery, more than the measured bound {bound}"
        );
    }
}

#[test]
fn the_whole_stack_allocates_nothing_per_delivery_on_the_success_path() {
    let (ready, yielding, in_slots) = alone(whole_stack_allocations);
    assert_eq!(
        ready, 0.0,
        "the whole stack allocates {ready} times per delivery when the handler returns at once"
    );
    assert_eq!(
        yielding, 0.0,
        "the whole stack allocates {yielding} times per delivery when the handler yields once"
    );
    assert_eq!(
        in_slots, 0.0,
        "the whole stack allocates {in_slots} times per delivery in the consumer loop's container (Slots), 8 at a time"
    );
}

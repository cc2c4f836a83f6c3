//! The cases the layer benches time, and how they time them: shared by the
//! criterion bench (`layers.rs`) and the interleaved ratio runner
//! (`layer_ratios.rs`). Included by path.
//!
//! **Time is this thread's CPU time** (`CLOCK_THREAD_CPUTIME_ID`), not the
//! wall clock: the runtime is `current_thread`, so every delivery, the 8
//! tasks' too, runs on the timing thread, and the time the thread spends
//! preempted on a busy shared machine is not counted.

use std::fmt::Debug;
use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Duration;

use acemq_layers::{BoxError, Cancellation, Decision, Delivery, Lifeline};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};

use crate::success_path::{handle, handle_decision};

/// The success path's handler, yielding once to the runtime first (the
/// 8-task group).
pub(crate) async fn handle_yielding(d: Delivery) -> Result<Decision, BoxError> {
    tokio::task::yield_now().await;
    black_box(d.body().len());
    Ok(Decision::Ack)
}

/// The same, answering `Ok(())` as a handler does (for the cases with the
/// cancellation layer, which turns it into a decision).
pub(crate) async fn handle_yielding_unit(d: Delivery) -> Result<(), BoxError> {
    tokio::task::yield_now().await;
    black_box(d.body().len());
    Ok(())
}

/// The generation every case's deliveries belong to, as acemq's consumer
/// loop makes one: its lifeline carries the handlers' token, which the
/// cancellation layer is given too (`CancelLayer::from_cancellation`).
pub(crate) fn generation() -> &'static Lifeline {
    static GENERATION: OnceLock<Lifeline> = OnceLock::new();
    GENERATION
        .get_or_init(|| Lifeline::with_cancellation(Cancellation::new(CancellationToken::new())))
}

/// The generation's handlers' token, for the cancellation layer.
pub(crate) fn generation_token() -> Cancellation {
    generation().cancellation().expect("made with one").clone()
}

pub(crate) fn delivery() -> Delivery {
    Delivery::builder()
        .queue("bench.orders")
        .routing_key("bench.orders")
        .delivery_tag(1)
        .body(vec![7u8; 256])
        .lifeline(generation().clone())
        .build()
}

pub(crate) fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// This thread's CPU time so far.
pub(crate) fn thread_cpu() -> Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// What a bench does with each case.
pub(crate) trait Visit {
    fn case<S>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Delivery> + Clone + Send + 'static,
        S::Future: Send,
        S::Error: Debug;
}

/// Permits of the yardstick's `ConcurrencyLimit`: the concurrency default,
/// never exhausted here (one delivery at a time, or one per task of 8).
pub(crate) const YARDSTICK_PERMITS: usize = 8;

/// Every case around `$handler`, in order: bare, the yardstick (tower's
/// `ConcurrencyLimit`), each layer alone, and the full stack in
/// `acemq::App::consume`'s order (pause → claim → dead-letter, redelivery
/// limit and retry as one service → cancel; the cancel layer woken by the
/// loop, which runs each request in
/// a slot of its `Slots` with a waker made once per slot — nothing per
/// request; its own cost is measured apart, `layer_ratios`' container
/// group — and given the generation's token that the deliveries' lifeline
/// carries).
macro_rules! each_case {
    ($visit:expr, $handler:expr, $unit:expr) => {{
        use acemq_layers::{
            CancelLayer, DeadLetterLayer, InFlightCounter, InFlightLayer, PauseHandle, PauseLayer,
            RetryLayer,
        };
        use tokio_util::sync::CancellationToken;
        use tower::limit::ConcurrencyLimitLayer;
        use tower::ServiceBuilder;
        use $crate::cases::YARDSTICK_PERMITS;
        use $crate::success_path::{policy, NoopPublish};
        let v = $visit;
        v.case("bare", tower::service_fn($handler));
        v.case(
            "yardstick",
            ServiceBuilder::new()
                .layer(ConcurrencyLimitLayer::new(YARDSTICK_PERMITS))
                .service_fn($handler),
        );
        v.case(
            "in_flight",
            ServiceBuilder::new()
                .layer(InFlightLayer::new(InFlightCounter::new()))
                .service_fn($handler),
        );
        // The claim point as App runs it: the queue's permits taken at the
        // claim (never exhausted here).
        v.case(
            "claim",
            ServiceBuilder::new()
                .layer(
                    acemq_layers::ClaimLayer::new(InFlightCounter::new()).concurrency(
                        std::sync::Arc::new(tokio::sync::Semaphore::new(YARDSTICK_PERMITS)),
                    ),
                )
                .service_fn($handler),
        );
        // Per-key ordering on its pass-through path: every delivery's key
        // is free (a new key each: the running keys' map takes one in and
        // out per delivery).
        v.case("partition", {
            let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            ServiceBuilder::new()
                .layer(acemq_layers::PartitionLayer::new(move |_: &Delivery| {
                    Some(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                }))
                .service_fn($handler)
        });
        v.case(
            "pause_open",
            ServiceBuilder::new()
                .layer(PauseLayer::new(PauseHandle::new()))
                .service_fn($handler),
        );
        // As acemq's consumer loop runs it: woken by its transport (which
        // registers nothing per request: its slots' wakers are made once),
        // the token the one the deliveries' lifeline carries.
        v.case(
            "cancel",
            ServiceBuilder::new()
                .layer(
                    CancelLayer::from_cancellation($crate::cases::generation_token())
                        .woken_by_transport(),
                )
                .service_fn($unit),
        );
        // The layer's default: it wakes itself (a waiter per request that
        // waits), and its token is its own (set on each request: one
        // reference count more).
        v.case(
            "cancel_self_waking",
            ServiceBuilder::new()
                .layer(CancelLayer::new(CancellationToken::new()))
                .service_fn($unit),
        );
        v.case(
            "retry",
            ServiceBuilder::new()
                .layer(RetryLayer::new(
                    policy(),
                    NoopPublish,
                    CancellationToken::new(),
                ))
                .service_fn($handler),
        );
        v.case(
            "dead_letter",
            ServiceBuilder::new()
                .layer(DeadLetterLayer::new(NoopPublish))
                .service_fn($handler),
        );
        // Dead-letter, redelivery limit and retry: the three layers
        // stacked, and the one service that does what they do (App's).
        v.case(
            "dl_limit_retry_stacked",
            ServiceBuilder::new()
                .layer(DeadLetterLayer::new(NoopPublish))
                .layer(acemq_layers::RedeliveryLimitLayer::default())
                .layer(RetryLayer::new(
                    policy(),
                    NoopPublish,
                    CancellationToken::new(),
                ))
                .service_fn($handler),
        );
        v.case(
            "dead_letter_retry",
            ServiceBuilder::new()
                .layer(acemq_layers::DeadLetterRetryLayer::new(
                    DeadLetterLayer::new(NoopPublish),
                    acemq_layers::RedeliveryLimitLayer::default(),
                    RetryLayer::new(policy(), NoopPublish, CancellationToken::new()),
                ))
                .service_fn($handler),
        );
        // Closed: every success counted in its window's ring.
        v.case(
            "breaker_closed",
            ServiceBuilder::new()
                .layer(acemq_layers::CircuitBreakerLayer::new(
                    PauseHandle::new(),
                    acemq_layers::BreakerPolicy::default(),
                ))
                .service_fn($handler),
        );
        v.case(
            "full_stack",
            ServiceBuilder::new()
                .layer(PauseLayer::new(PauseHandle::new()))
                .layer(
                    acemq_layers::ClaimLayer::new(InFlightCounter::new()).concurrency(
                        std::sync::Arc::new(tokio::sync::Semaphore::new(YARDSTICK_PERMITS)),
                    ),
                )
                .layer(acemq_layers::DeadLetterRetryLayer::new(
                    DeadLetterLayer::new(NoopPublish),
                    acemq_layers::RedeliveryLimitLayer::default(),
                    RetryLayer::new(policy(), NoopPublish, CancellationToken::new()),
                ))
                .layer(
                    CancelLayer::from_cancellation($crate::cases::generation_token())
                        .woken_by_transport(),
                )
                .service_fn($unit),
        );
    }};
}

/// Every case of the `per_delivery` group (the handler returns at once).
pub(crate) fn per_delivery(v: &mut impl Visit) {
    each_case!(v, handle_decision, handle);
}

/// Every case of the `concurrent_8_tasks` group (the handler yields once).
pub(crate) fn concurrent_8_tasks(v: &mut impl Visit) {
    each_case!(v, handle_yielding, handle_yielding_unit);
}

/// Times (thread CPU) `iters` deliveries through `svc`, one after another.
pub(crate) fn time_sequential<S>(rt: &Runtime, svc: &mut S, d: &Delivery, iters: u64) -> Duration
where
    S: Service<Delivery>,
    S::Error: Debug,
{
    rt.block_on(async {
        // One turn of the runtime before the clock starts: its timers fire
        // and its spawned tasks run (a layer's own task — the breaker's
        // ticker — keeps up, as it does between deliveries on any
        // transport, which waits for the broker). The timed deliveries
        // themselves never yield.
        tokio::task::yield_now().await;
        let start = thread_cpu();
        for _ in 0..iters {
            let r = svc.ready().await.unwrap().call(d.clone()).await;
            let _ = black_box(r);
        }
        thread_cpu() - start
    })
}

/// Tasks of the concurrent group.
pub(crate) const TASKS: u64 = 8;

/// Times (thread CPU) `iters` deliveries through `svc`, spread over 8
/// spawned tasks (a clone each).
pub(crate) fn time_concurrent<S>(rt: &Runtime, svc: &S, d: &Delivery, iters: u64) -> Duration
where
    S: Service<Delivery> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Debug,
{
    let per = iters.div_ceil(TASKS);
    let tasks: Vec<_> = (0..TASKS).map(|_| (svc.clone(), d.clone())).collect();
    let elapsed = rt.block_on(async move {
        let start = thread_cpu();
        let handles: Vec<_> = tasks
            .into_iter()
            .map(|(mut svc, d)| {
                tokio::spawn(async move {
                    for _ in 0..per {
                        let r = svc.ready().await.unwrap().call(d.clone()).await;
                        let _ = black_box(r);
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
        thread_cpu() - start
    });
    // Scale back to exactly `iters` deliveries.
    elapsed.mul_f64(iters as f64 / (per * TASKS) as f64)
}

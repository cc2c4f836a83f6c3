//! Per-delivery overhead of each acemq layer, in memory.
//!
//! One [`Delivery`] (256-byte body) goes through a bare `service_fn` handler,
//! through each layer alone around the same handler, and through the full
//! stack as `acemq`'s runner builds it (pause → in-flight → dead-letter →
//! retry → cancel → handler). Every case is on the success path: the handler
//! returns `Ok`, the gate is open, the no-op publisher is never called.
//!
//! The runtime (`current_thread`) is built once, outside the timed loop; each
//! sample runs `iters` deliveries inside one `block_on`, so the figure is the
//! cost of `ready().await` + `call(delivery.clone()).await` per delivery. The
//! overhead of a layer is its figure minus `bare`.
//!
//! The `concurrent_8_tasks` group shares one stack between 8 spawned tasks
//! (a clone each) whose handler yields once per delivery, as a handler that
//! awaits anything does: the tasks interleave, and the cancellation layer
//! takes its "handler returned `Pending`" path.
//!
//! Run with: `cargo bench -p acemq-layers --bench layers`

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use acemq_layers::{
    BoxError, CancelLayer, DeadLetterLayer, Delivery, InFlightCounter, InFlightLayer, PauseHandle,
    PauseLayer, RetryLayer,
};
use criterion::{criterion_group, criterion_main, Bencher, Criterion};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder, ServiceExt};

#[path = "support/success_path.rs"]
mod success_path;
use success_path::{handle, handle_decision, policy, NoopPublish};

/// The same, yielding once to the runtime first (used by the 8-task group).
async fn handle_yielding(d: Delivery) -> Result<(), BoxError> {
    tokio::task::yield_now().await;
    black_box(d.body().len());
    Ok(())
}

fn delivery() -> Delivery {
    Delivery::builder()
        .queue("bench.orders")
        .routing_key("bench.orders")
        .delivery_tag(1)
        .body(vec![7u8; 256])
        .build()
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Times `iters` deliveries through `svc`, one after another.
fn sequential<S>(b: &mut Bencher<'_>, rt: &Runtime, svc: &S, d: &Delivery)
where
    S: Service<Delivery> + Clone,
    S::Error: std::fmt::Debug,
{
    b.iter_custom(|iters| {
        let mut svc = svc.clone();
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..iters {
                let r = svc.ready().await.unwrap().call(d.clone()).await;
                let _ = black_box(r);
            }
            start.elapsed()
        })
    });
}

const TASKS: u64 = 8;

/// Times `iters` deliveries through `svc`, spread over 8 spawned tasks.
fn concurrent<S>(b: &mut Bencher<'_>, rt: &Runtime, svc: &S, d: &Delivery)
where
    S: Service<Delivery> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
{
    b.iter_custom(|iters| {
        let per = iters.div_ceil(TASKS);
        let tasks: Vec<_> = (0..TASKS).map(|_| (svc.clone(), d.clone())).collect();
        let elapsed = rt.block_on(async move {
            let start = Instant::now();
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
            start.elapsed()
        });
        // Scale back to exactly `iters` deliveries.
        elapsed.mul_f64(iters as f64 / (per * TASKS) as f64)
    });
}

/// The stack `acemq::App::consume` builds, around `handler`.
macro_rules! full_stack {
    ($handler:expr) => {
        ServiceBuilder::new()
            .layer(PauseLayer::new(PauseHandle::new()))
            .layer(InFlightLayer::new(InFlightCounter::new()))
            .layer(DeadLetterLayer::new(NoopPublish))
            .layer(RetryLayer::new(
                policy(),
                NoopPublish,
                CancellationToken::new(),
            ))
            .layer(CancelLayer::new(CancellationToken::new()))
            .service_fn($handler)
    };
}

fn per_layer(c: &mut Criterion) {
    let rt = runtime();
    let d = delivery();
    let mut g = c.benchmark_group("per_delivery");

    let bare = tower::service_fn(handle_decision);
    g.bench_function("bare", |b| sequential(b, &rt, &bare, &d));

    let in_flight = ServiceBuilder::new()
        .layer(InFlightLayer::new(InFlightCounter::new()))
        .service_fn(handle_decision);
    g.bench_function("in_flight", |b| sequential(b, &rt, &in_flight, &d));

    let pause = ServiceBuilder::new()
        .layer(PauseLayer::new(PauseHandle::new()))
        .service_fn(handle_decision);
    g.bench_function("pause_open", |b| sequential(b, &rt, &pause, &d));

    let cancel = ServiceBuilder::new()
        .layer(CancelLayer::new(CancellationToken::new()))
        .service_fn(handle);
    g.bench_function("cancel", |b| sequential(b, &rt, &cancel, &d));

    let retry = ServiceBuilder::new()
        .layer(RetryLayer::new(
            policy(),
            NoopPublish,
            CancellationToken::new(),
        ))
        .service_fn(handle_decision);
    g.bench_function("retry", |b| sequential(b, &rt, &retry, &d));

    let dead_letter = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(NoopPublish))
        .service_fn(handle_decision);
    g.bench_function("dead_letter", |b| sequential(b, &rt, &dead_letter, &d));

    let full = full_stack!(handle);
    g.bench_function("full_stack", |b| sequential(b, &rt, &full, &d));
    g.finish();
}

fn concurrent_8_tasks(c: &mut Criterion) {
    let rt = runtime();
    let d = delivery();
    let mut g = c.benchmark_group("concurrent_8_tasks");

    let bare = tower::service_fn(handle_yielding);
    g.bench_function("bare", |b| concurrent(b, &rt, &bare, &d));

    let full = full_stack!(handle_yielding);
    g.bench_function("full_stack", |b| concurrent(b, &rt, &full, &d));
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = per_layer, concurrent_8_tasks
}
criterion_main!(benches);

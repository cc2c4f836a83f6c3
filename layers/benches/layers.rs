//! Per-delivery overhead of each acemq layer, in memory.
//!
//! One [`Delivery`] (256-byte body) goes through a bare `service_fn` handler,
//! through each layer alone around the same handler, and through the full
//! stack in the order `acemq`'s runner builds it (pause → in-flight →
//! dead-letter → retry → cancel → handler; the runner also has the
//! redelivery limit between dead-letter and retry, not measured here). Every case is on the success path: the handler
//! returns `Ok`, the gate is open, the no-op publisher is never called.
//!
//! The runtime (`current_thread`) is built once, outside the timed loop; each
//! sample runs `iters` deliveries inside one `block_on`, so the figure is the
//! cost of `ready().await` + `call(delivery.clone()).await` per delivery. The
//! overhead of a layer is its figure minus `bare`. The time is the timing
//! thread's CPU time, not the wall clock (everything runs on that thread:
//! see `support/cases.rs`), so preemption on a busy machine is not counted.
//!
//! **The yardstick.** Absolute nanoseconds do not carry from one machine to
//! another (the same bench ran 2.5–2.9× slower on another box of the same
//! kind), so each group also measures `yardstick`: tower's own
//! [`ConcurrencyLimit`](tower::limit::ConcurrencyLimit) (a semaphore permit
//! taken in `poll_ready`, held by the response future, released on drop)
//! around the same handler. Each layer is reported as its added cost over
//! `bare` divided by the yardstick's added cost over `bare`, all from one run:
//! `python3 scripts/layer_chart.py` reads criterion's JSON and prints the
//! table (and redraws `docs/layer-overhead.png`). Target: ≤ 1.0× for each
//! layer. Criterion times one case after the other (4 s each), so on a
//! shared machine a change of load between two cases moves their ratio; the
//! `layer_ratios` bench times the same cases interleaved in short slices
//! and is the one to read when the machine is busy.
//!
//! The `concurrent_8_tasks` group shares one stack between 8 spawned tasks
//! (a clone each) whose handler yields once per delivery, as a handler that
//! awaits anything does: the tasks interleave, and the cancellation layer
//! takes its "handler returned `Pending`" path. It measures the same cases
//! as the sequential group (bare, yardstick, each layer, full stack).
//!
//! Run with: `cargo bench -p acemq-layers --bench layers`

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

use std::fmt::Debug;
use std::time::Duration;

use acemq_layers::Delivery;
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use tokio::runtime::Runtime;
use tower::Service;

#[path = "support/success_path.rs"]
mod success_path;

#[path = "support/cases.rs"]
mod cases;
use cases::{delivery, runtime, time_concurrent, time_sequential, Visit};

/// Benches each case in a criterion group.
struct Bench<'a, 'g> {
    g: &'a mut BenchmarkGroup<'g, WallTime>,
    rt: &'a Runtime,
    d: &'a Delivery,
    concurrent: bool,
}

impl Visit for Bench<'_, '_> {
    fn case<S>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Delivery> + Clone + Send + 'static,
        S::Future: Send,
        S::Error: Debug,
    {
        let (rt, d, concurrent) = (self.rt, self.d, self.concurrent);
        self.g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                if concurrent {
                    time_concurrent(rt, &svc, d, iters)
                } else {
                    time_sequential(rt, &mut svc.clone(), d, iters)
                }
            })
        });
    }
}

fn per_layer(c: &mut Criterion) {
    let rt = runtime();
    let d = delivery();
    let mut g = c.benchmark_group("per_delivery");
    cases::per_delivery(&mut Bench {
        g: &mut g,
        rt: &rt,
        d: &d,
        concurrent: false,
    });
    g.finish();
}

fn concurrent_8_tasks(c: &mut Criterion) {
    let rt = runtime();
    let d = delivery();
    let mut g = c.benchmark_group("concurrent_8_tasks");
    cases::concurrent_8_tasks(&mut Bench {
        g: &mut g,
        rt: &rt,
        d: &d,
        concurrent: true,
    });
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

//! Heap allocations per delivery on the success path, per layer and for the
//! full stack, counted by a global allocator inside a region.
//!
//! The handler itself allocates nothing (its future lives on the stack of
//! the loop), so what is counted is what each layer adds. The bounds are
//! what was measured (see BENCHMARKS.md); a change that adds an allocation
//! on the hot path fails here. Run with `--nocapture` to see the figures:
//!
//! `cargo test -p acemq-layers --test allocations -- --nocapture`

#![allow(missing_docs)]

use std::alloc::System;
use std::hint::black_box;

use acemq_layers::{
    CancelLayer, DeadLetterLayer, Delivery, InFlightCounter, InFlightLayer, PauseHandle,
    PauseLayer, RetryLayer,
};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder, ServiceExt};

#[path = "../benches/support/success_path.rs"]
mod success_path;
use success_path::{handle, handle_decision, policy, NoopPublish};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Deliveries per measurement; the count is divided by it.
const N: usize = 1_000;

/// Allocations (and reallocations) per delivery through `svc`, after a warm-up (first-use
/// registrations: the in-flight slot, the token's child list, ...).
async fn allocations_per_delivery<S>(mut svc: S) -> f64
where
    S: Service<Delivery>,
    S::Error: std::fmt::Debug,
{
    let d = Delivery::builder()
        .queue("alloc.orders")
        .delivery_tag(1)
        .body(vec![7u8; 256])
        .build();
    for _ in 0..16 {
        let r = svc.ready().await.unwrap().call(d.clone()).await;
        let _ = black_box(r);
    }
    let region = Region::new(GLOBAL);
    for _ in 0..N {
        let r = svc.ready().await.unwrap().call(d.clone()).await;
        let _ = black_box(r);
    }
    let stats = region.change();
    // A reallocation (a growing or shrinking buffer) costs as much as an
    // allocation: both count.
    (stats.allocations + stats.reallocations) as f64 / N as f64
}

#[tokio::test(flavor = "current_thread")]
async fn each_layer_allocates_no_more_than_measured_on_the_success_path() {
    let bare = allocations_per_delivery(tower::service_fn(handle_decision)).await;
    let in_flight = allocations_per_delivery(
        ServiceBuilder::new()
            .layer(InFlightLayer::new(InFlightCounter::new()))
            .service_fn(handle_decision),
    )
    .await;
    let pause = allocations_per_delivery(
        ServiceBuilder::new()
            .layer(PauseLayer::new(PauseHandle::new()))
            .service_fn(handle_decision),
    )
    .await;
    let cancel = allocations_per_delivery(
        ServiceBuilder::new()
            .layer(CancelLayer::new(CancellationToken::new()))
            .service_fn(handle),
    )
    .await;
    let retry = allocations_per_delivery(
        ServiceBuilder::new()
            .layer(RetryLayer::new(
                policy(),
                NoopPublish,
                CancellationToken::new(),
            ))
            .service_fn(handle_decision),
    )
    .await;
    let dead_letter = allocations_per_delivery(
        ServiceBuilder::new()
            .layer(DeadLetterLayer::new(NoopPublish))
            .service_fn(handle_decision),
    )
    .await;
    let full = allocations_per_delivery(
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
            .service_fn(handle),
    )
    .await;

    let rows = [
        ("bare service_fn", bare, 0.0),
        ("in-flight", in_flight, 0.0),
        ("pause (open)", pause, 0.0),
        ("cancel", cancel, 1.0),
        ("retry (success)", retry, 0.0),
        ("dead-letter (success)", dead_letter, 0.0),
        ("full stack", full, 1.0),
    ];
    println!("allocations per delivery (success path, {N} deliveries each):");
    for (name, measured, bound) in rows {
        println!("  {name:<22} {measured:>5.2}  (bound {bound})");
    }
    for (name, measured, bound) in rows {
        assert!(
            measured <= bound,
            "{name}: {measured} allocations per delivery, more than the measured bound {bound}"
        );
    }
}

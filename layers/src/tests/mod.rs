//! Model checking with loom: every interleaving (up to the preemption
//! bound) of the threads each model runs, through the loom types and shims
//! `crate::sync` switches to under `--cfg acemq_loom`. See the crate docs'
//! "Verification" for what is checked and how to run it.

mod loom_breaker;
mod loom_cancellation;
mod loom_in_flight;
mod loom_partition;
mod loom_pause;
mod loom_slots;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Runs `f` under loom with at most two preemptions per execution (what CI
/// runs), unless `LOOM_MAX_PREEMPTIONS` says otherwise; prints how many
/// executions it explored (seen with `--nocapture`).
fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    let executions = Arc::new(AtomicUsize::new(0));
    let counted = executions.clone();
    builder.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        f();
    });
    eprintln!(
        "{}: {} executions (preemption bound {:?})",
        std::thread::current().name().unwrap_or("model"),
        executions.load(Ordering::Relaxed),
        builder.preemption_bound,
    );
}

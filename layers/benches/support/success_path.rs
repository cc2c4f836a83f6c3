//! What the layer bench and the allocation test share: a publisher that the
//! success path never reaches, the trivial handler, the retry schedule, and
//! a transport's way of running requests in a container of them.
//! Included by path from `benches/layers.rs` and `tests/allocations.rs`.

use std::future::Future;
use std::hint::black_box;
use std::time::Duration;

use acemq_layers::{BoxError, Decision, Delivery, Outgoing, Publish, PublishError, RetryPolicy};
use futures::{Stream, StreamExt};
use tower::{Service, ServiceExt};

/// A publisher that is never reached on the success path.
#[derive(Clone, Debug)]
pub(crate) struct NoopPublish;

impl Publish for NoopPublish {
    fn publish(
        &self,
        _message: Outgoing<'_>,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        std::future::ready(Ok(()))
    }

    fn redeclare(&self, _queue: &str) -> impl Future<Output = Result<(), PublishError>> + Send {
        std::future::ready(Ok(()))
    }
}

/// The trivial handler: reads the body, succeeds.
pub(crate) async fn handle(d: Delivery) -> Result<(), BoxError> {
    black_box(d.body().len());
    Ok(())
}

/// The same as a service that already answers a [`Decision`], for the retry
/// and dead-letter layers measured alone (without the cancellation layer
/// that turns a handler's `Ok(())` into one).
pub(crate) async fn handle_decision(d: Delivery) -> Result<Decision, BoxError> {
    black_box(d.body().len());
    Ok(Decision::Ack)
}

/// The retry schedule of the shop example: 5 attempts.
pub(crate) fn policy() -> RetryPolicy {
    let mut p = RetryPolicy::exponential(5, Duration::from_secs(1), Duration::from_secs(300));
    p.broker_wait_threshold = Duration::from_secs(10);
    p
}

/// Sends `n` deliveries through `svc` as a transport runs them: `at_once`
/// at a time in `running` (a `Slots`, or a `FuturesUnordered`), each
/// request put in with `push`, the next started as one finishes.
#[allow(dead_code)] // not every includer drives a container
pub(crate) async fn run_in<S, C>(
    svc: &mut S,
    d: &Delivery,
    n: u64,
    at_once: u64,
    running: &mut C,
    mut push: impl FnMut(&mut C, S::Future),
) where
    S: Service<Delivery>,
    S::Error: std::fmt::Debug,
    C: Stream + Unpin,
{
    let mut started = 0;
    while started < n.min(at_once) {
        push(running, svc.ready().await.unwrap().call(d.clone()));
        started += 1;
    }
    while let Some(r) = running.next().await {
        let _ = black_box(r);
        if started < n {
            push(running, svc.ready().await.unwrap().call(d.clone()));
            started += 1;
        }
    }
}

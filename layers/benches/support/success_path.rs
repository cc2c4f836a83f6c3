//! What the layer bench and the allocation test share: a publisher that the
//! success path never reaches, the trivial handler, and the retry schedule.
//! Included by path from `benches/layers.rs` and `tests/allocations.rs`.

use std::future::Future;
use std::hint::black_box;
use std::time::Duration;

use acemq_layers::{BoxError, Decision, Delivery, Outgoing, Publish, PublishError, RetryPolicy};

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

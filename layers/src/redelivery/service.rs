use std::task::{Context, Poll};

use tower::Service;

use super::future::ResponseFuture;
use super::{ConsumerTimeoutStrikes, RedeliveryLimitLayer};
use crate::decision::{DeadLetterDecision, Decision, Reason};
use crate::delivery::Delivery;
use crate::headers::DELIVERY_COUNT_HEADER;

/// Dead-letters a delivery redelivered more than `max` times instead of
/// calling `S`; see the [module docs](super).
///
/// # Clone
///
/// A clone is a clone of the inner service with the same bound.
#[derive(Clone, Debug)]
pub struct RedeliveryLimit<S> {
    inner: S,
    max: u32,
}

impl<S> RedeliveryLimit<S> {
    /// Wraps `inner` with a bound of `max` redeliveries.
    pub const fn new(inner: S, max: u32) -> Self {
        RedeliveryLimit { inner, max }
    }

    /// A [`RedeliveryLimitLayer`] of `max`.
    pub const fn layer(max: u32) -> RedeliveryLimitLayer {
        RedeliveryLimitLayer::new(max)
    }

    /// The bound.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutable.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<Delivery> for RedeliveryLimit<S>
where
    S: Service<Delivery, Response = Decision>,
{
    type Response = Decision;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, delivery: Delivery) -> Self::Future {
        if let Some(decision) = struck_out(&delivery) {
            return ResponseFuture::limited(decision);
        }
        let count = delivery
            .headers()
            .get(DELIVERY_COUNT_HEADER)
            .and_then(|v| v.as_i64());
        match count {
            Some(n) if n > i64::from(self.max) => {
                tracing::warn!(
                    queue = %delivery.queue(),
                    message_id = delivery.properties().message_id.as_deref().unwrap_or(""),
                    delivery_count = n,
                    max_redeliveries = self.max,
                    "delivery redelivered {n} times, above max_redeliveries ({}); \
                     dead-lettering it without calling the handler",
                    self.max
                );
                ResponseFuture::limited(Decision::DeadLetter(DeadLetterDecision {
                    reason: Reason::Redelivered,
                    error: format!(
                        "redelivered {n} times (x-delivery-count), above max_redeliveries ({}): \
                         the handler was not called; a message that crashes the process, or \
                         one handed back again and again",
                        self.max
                    ),
                    attempts: delivery.attempt(),
                    published: false,
                }))
            }
            _ => ResponseFuture::inner(self.inner.call(delivery)),
        }
    }
}

/// The dead-letter decision for a delivery whose acknowledgement the broker
/// timed out `limit` times already (the transport's
/// [`ConsumerTimeoutStrikes`]), if it has struck out.
fn struck_out(delivery: &Delivery) -> Option<Decision> {
    let s = delivery.extensions().get::<ConsumerTimeoutStrikes>()?;
    s.struck_out().then(|| {
        Decision::DeadLetter(DeadLetterDecision {
            reason: Reason::ConsumerTimeout,
            error: format!(
                "the broker timed out this message's acknowledgement {} times (consumer_timeout), \
                 the queue's consumer_timeout_strikes is {}: the handler was not called again; \
                 raise the broker's consumer_timeout above the handler's longest run, bound \
                 the handler's time below it (a timeout layer), and keep shutdown_timeout + \
                 abandon_after below it",
                s.strikes, s.limit
            ),
            attempts: delivery.attempt(),
            published: false,
        })
    })
}

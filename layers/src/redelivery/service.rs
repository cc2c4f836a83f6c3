use std::task::{Context, Poll};

use tower::Service;

use super::future::ResponseFuture;
use super::{ConsumerTimeoutStrikes, MalformedHeaders, RedeliveryLimitLayer};
use crate::decision::{DeadLetterDecision, Decision, Reason};
use crate::delivery::Delivery;
use crate::headers::{Headers, ACQUIRED_COUNT_HEADER, DELIVERY_COUNT_HEADER};

/// Dead-letters a delivery redelivered more than `max` times instead of
/// calling `S`; see the [module docs](super).
///
/// # Clone
///
/// A clone is a clone of the inner service with the same bound.
#[derive(Clone, Debug)]
pub struct RedeliveryLimit<S> {
    inner: S,
    limit: RedeliveryLimitLayer,
}

impl<S> RedeliveryLimit<S> {
    /// Wraps `inner` with a bound of `max` redeliveries.
    pub const fn new(inner: S, max: u32) -> Self {
        RedeliveryLimit::with_limit(inner, RedeliveryLimitLayer::new(max))
    }

    pub(crate) const fn with_limit(inner: S, limit: RedeliveryLimitLayer) -> Self {
        RedeliveryLimit { inner, limit }
    }

    /// A [`RedeliveryLimitLayer`] of `max`.
    pub const fn layer(max: u32) -> RedeliveryLimitLayer {
        RedeliveryLimitLayer::new(max)
    }

    /// The bound.
    pub fn max(&self) -> u32 {
        self.limit.max()
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
        match limited(&delivery, self.limit) {
            Some(decision) => ResponseFuture::limited(decision),
            None => ResponseFuture::inner(self.inner.call(delivery)),
        }
    }
}

/// The dead-letter decision for a delivery that has struck out or was
/// redelivered more than `max` times (logged here), if it is one: the
/// service below is not to be called.
pub(crate) fn limited(delivery: &Delivery, limit: RedeliveryLimitLayer) -> Option<Decision> {
    if let Some(decision) = malformed(delivery) {
        return Some(decision);
    }
    if let Some(decision) = struck_out(delivery) {
        return Some(decision);
    }
    if !limit.reads_counts() {
        return None;
    }
    let max = limit.max();
    let (n, header) = redeliveries(delivery.headers())?;
    if n <= i64::from(max) {
        return None;
    }
    tracing::warn!(
        queue = %delivery.queue(),
        message_id = delivery.properties().message_id.as_deref().unwrap_or(""),
        redeliveries = n,
        header,
        max_redeliveries = max,
        "delivery redelivered {n} times ({header}), above max_redeliveries ({max}); \
         dead-lettering it without calling the handler"
    );
    Some(Decision::DeadLetter(DeadLetterDecision {
        reason: Reason::Redelivered,
        error: format!(
            "redelivered {n} times ({header}), above max_redeliveries ({max}): \
             the handler was not called; a message that crashes the process, or \
             one handed back again and again"
        ),
        attempts: delivery.attempt(),
        published: false,
    }))
}

/// The dead-letter decision for a delivery whose headers the transport set
/// aside ([`MalformedHeaders`]), if it is one.
fn malformed(delivery: &Delivery) -> Option<Decision> {
    let m = delivery.extensions().get::<MalformedHeaders>()?;
    tracing::warn!(
        queue = %delivery.queue(),
        message_id = ?delivery.properties().message_id.as_deref().unwrap_or(""),
        why = ?m.why(),
        "a delivery's headers were set aside as malformed; dead-lettering it without \
         calling the handler"
    );
    Some(Decision::DeadLetter(DeadLetterDecision {
        reason: Reason::MalformedHeaders,
        error: format!(
            "the message's headers were set aside ({}): the handler was not called; the \
             publisher must send a headers table the consumer can read",
            m.why()
        ),
        attempts: delivery.attempt(),
        published: false,
    }))
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

/// How many times the broker says this message came back, and the header
/// that says so: the larger of `x-delivery-count` and `x-acquired-count`
/// (RabbitMQ 4.3 counts every return in the latter, only failures in the
/// former; earlier versions send only the former, counting every return).
/// `None` without either header (classic queues, first deliveries).
pub(crate) fn redeliveries(headers: &Headers) -> Option<(i64, &'static str)> {
    let read = |name: &'static str| {
        headers
            .get(name)
            .and_then(|v| v.as_i64())
            .map(|n| (n, name))
    };
    match (read(DELIVERY_COUNT_HEADER), read(ACQUIRED_COUNT_HEADER)) {
        (Some(d), Some(a)) => Some(if a.0 > d.0 { a } else { d }),
        (d, a) => d.or(a),
    }
}

// Not in the model-checking build: these run on tokio and std, outside loom.
#[cfg(all(test, not(acemq_loom)))]
mod tests {
    //! The RabbitMQ 4.3 headers are synthetic here: taken from its release
    //! notes and quorum queue guide (`x-acquired-count` counts every return,
    //! `x-delivery-count` only failures); only 4.0 runs on this machine.

    use super::*;
    use crate::headers::Value;

    fn headers(entries: &[(&str, Value)]) -> Headers {
        let mut h = Headers::new();
        for (k, v) in entries {
            h.insert(*k, v.clone());
        }
        h
    }

    #[test]
    fn without_either_header_there_is_no_count() {
        assert_eq!(redeliveries(&Headers::new()), None);
    }

    #[test]
    fn before_4_3_the_delivery_count_alone_is_read() {
        let h = headers(&[(DELIVERY_COUNT_HEADER, Value::I64(7))]);
        assert_eq!(redeliveries(&h), Some((7, DELIVERY_COUNT_HEADER)));
    }

    #[test]
    fn on_4_3_nacked_returns_are_seen_through_the_acquired_count() {
        // Six hand-backs by nack (not counted as failures on 4.3) and one
        // reject: x-delivery-count 1, x-acquired-count 7.
        let h = headers(&[
            (DELIVERY_COUNT_HEADER, Value::I64(1)),
            (ACQUIRED_COUNT_HEADER, Value::I64(7)),
        ]);
        assert_eq!(redeliveries(&h), Some((7, ACQUIRED_COUNT_HEADER)));
        // Only nacks: 4.3 sends no x-delivery-count at all.
        let h = headers(&[(ACQUIRED_COUNT_HEADER, Value::I32(3))]);
        assert_eq!(redeliveries(&h), Some((3, ACQUIRED_COUNT_HEADER)));
    }

    #[test]
    fn the_larger_count_wins_whichever_header_carries_it() {
        let h = headers(&[
            (DELIVERY_COUNT_HEADER, Value::I64(9)),
            (ACQUIRED_COUNT_HEADER, Value::I64(4)),
        ]);
        assert_eq!(redeliveries(&h), Some((9, DELIVERY_COUNT_HEADER)));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_4_3_delivery_past_the_bound_by_its_acquired_count_is_dead_lettered() {
        use tower::{ServiceBuilder, ServiceExt};
        let svc = ServiceBuilder::new()
            .layer(RedeliveryLimitLayer::new(3))
            .service_fn(|_: Delivery| async { Ok::<_, std::io::Error>(Decision::Ack) });
        let h = headers(&[
            (DELIVERY_COUNT_HEADER, Value::I64(0)),
            (ACQUIRED_COUNT_HEADER, Value::I64(4)),
        ]);
        let d = Delivery::builder().queue("q").headers(h).build();
        let Decision::DeadLetter(dl) = svc.oneshot(d).await.unwrap() else {
            panic!("not dead-lettered")
        };
        assert_eq!(dl.reason, Reason::Redelivered);
        assert!(dl.error.contains("x-acquired-count"), "{}", dl.error);
        let at_bound = headers(&[(ACQUIRED_COUNT_HEADER, Value::I64(3))]);
        let svc = ServiceBuilder::new()
            .layer(RedeliveryLimitLayer::new(3))
            .service_fn(|_: Delivery| async { Ok::<_, std::io::Error>(Decision::Ack) });
        let d = Delivery::builder().queue("q").headers(at_bound).build();
        assert_eq!(
            svc.oneshot(d).await.unwrap(),
            Decision::Ack,
            "at the bound: called"
        );
    }
}

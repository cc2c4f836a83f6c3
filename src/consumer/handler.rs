//! One handler: the stack called with a delivery, and the future that
//! yields its decision.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use acemq_layers::{BoxError, Decision, Delivery};
use pin_project_lite::pin_project;
use tower::Service;
use tracing::Span;

/// What a handler's future yields: its decision, the delivery tag, when
/// the handler started, and whether the delivery was handed back while
/// held (before the claim: no handler ran, and the decision is `HandBack`).
pub(super) type Finished = (Decision, u64, Instant, bool);

/// The stack's outermost future says when the pause gate let a held
/// delivery through (`acemq.handler.duration` starts there).
pub(crate) trait Released {
    fn released_at(&self) -> Option<tokio::time::Instant>;
}

impl<S, F> Released for acemq_layers::pause::future::ResponseFuture<S, F> {
    fn released_at(&self) -> Option<tokio::time::Instant> {
        acemq_layers::pause::future::ResponseFuture::released_at(self)
    }
}

/// Calls the stack with a delivery (converted from lapin's on arrival) and
/// returns the future that yields the decision with the delivery tag
/// (inside the delivery's span). The queue's concurrency permit is taken at the claim
/// and held until the stack below it returns, not until the settle.
///
/// While the delivery is held (not claimed), the future resolves at once
/// when the generation hands back what is held
/// ([`Lifeline::hand_back_held`]) and it wins the race with the claim:
/// whatever an outer layer still does with the request is dropped, and a
/// claim that comes later is refused.
pub(super) fn start_handler<S>(
    service: &mut S,
    queue: &Arc<str>,
    delivery: Delivery,
    dead_letter: bool,
) -> Handling<S::Future>
where
    S: Service<Delivery, Response = Decision, Error = BoxError>,
    S::Future: Released + Send + 'static,
{
    let span = crate::telemetry::process_span(queue, &delivery);
    let started = Instant::now();
    let held = delivery.clone();
    let fut = span.in_scope(|| service.call(delivery));
    Handling {
        fut,
        held,
        span,
        started,
        dead_letter,
    }
}

pin_project! {
    /// One handler's future: the stack's, raced with the hand-back of a
    /// held delivery, polled inside the delivery's span. Written out
    /// rather than as an `async` block, which would keep the stack's future
    /// twice (captured, then pinned) and so be moved at twice the size on
    /// its way into the loop's slot.
    pub(super) struct Handling<F> {
        #[pin]
        fut: F,
        held: Delivery,
        span: Span,
        started: Instant,
        // The queue's `dead_letter`: when off, a rejected delivery is
        // dropped by the broker (unless its own dead-letter exchange takes
        // it), and that is said here, with the message id.
        dead_letter: bool,
    }
}

impl<F> Future for Handling<F>
where
    F: Future<Output = Result<Decision, BoxError>> + Released,
{
    type Output = Finished;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Finished> {
        let mut this = self.project();
        let _entered = this.span.enter();
        let held = &*this.held;
        let tag = held.delivery_tag();
        if held.is_handed_back() || (held.lifeline().hands_back_held() && held.hand_back_if_held())
        {
            return Poll::Ready((Decision::HandBack, tag, *this.started, true));
        }
        let output = ready!(this.fut.as_mut().poll(cx));
        // A delivery the pause gate held is timed from its release: the
        // time held is not handler time.
        let started = this
            .fut
            .as_ref()
            .get_ref()
            .released_at()
            .map_or(*this.started, tokio::time::Instant::into_std);
        let decision = match output {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "the handler stack returned an error instead of a decision; rejecting the delivery without requeue");
                Decision::DeadLetter(acemq_layers::DeadLetterDecision {
                    reason: acemq_layers::Reason::Rejected,
                    error: e.to_string(),
                    attempts: 0,
                    published: false,
                })
            }
        };
        if let Decision::DeadLetter(d) = &decision {
            if !d.published && !*this.dead_letter {
                tracing::warn!(
                    queue = %held.queue(),
                    message_id = held.properties().message_id.as_deref().unwrap_or(""),
                    reason = %d.reason,
                    error = d.error.as_str(),
                    "dead_letter is off for this queue: the broker drops the rejected delivery \
                     (unless the queue has its own dead-letter exchange); set dead_letter: true \
                     to keep it in the dead-letter queue with its reason"
                );
            }
        }
        crate::telemetry::record_decision(this.span, &decision);
        Poll::Ready((decision, tag, started, false))
    }
}

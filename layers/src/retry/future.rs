//! The response future of [`Retry`](super::Retry).

use std::collections::hash_map::RandomState;
use std::error::Error as StdError;
use std::fmt;
use std::future::{poll_fn, Future};
use std::hash::BuildHasher;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::future::{BoxFuture, Either};
use pin_project_lite::pin_project;
use tower::Service;
use tracing::Instrument;

use super::layer::Config;
use super::policy::rung_name;
use crate::dead_letter::MAX_ERROR_LEN;
use crate::decision::{DeadLetterDecision, Decision, Reason, RetryDecision, RetryVia};
use crate::delivery::{Delivery, ATTEMPT_HEADER};
use crate::error::{display_chain, BoxError, Class, Classify};
use crate::headers::Value;
use crate::publish::{Outgoing, Publish, PublishError};

pin_project! {
    /// Response future of [`Retry`](super::Retry).
    ///
    /// While the handler's first attempt runs this is that attempt's future,
    /// unboxed; only a failure switches to a boxed future that carries out
    /// the retry schedule.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<S, P, C>
    where
        S: Service<Delivery>,
    {
        #[pin]
        state: State<S::Future>,
        retry: Option<Pending<S, P, C>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The first attempt is running.
        Attempt {
            #[pin]
            future: F,
        },
        // It failed: waits, rung publishes and further attempts.
        Failing {
            future: BoxFuture<'static, Result<Decision, BoxError>>,
        },
    }
}

/// What a retry needs, kept from the call.
struct Pending<S, P, C> {
    service: S,
    delivery: Delivery,
    config: Arc<Config<P, C>>,
}

impl<S, P, C> ResponseFuture<S, P, C>
where
    S: Service<Delivery>,
{
    pub(crate) fn new(
        future: S::Future,
        service: S,
        delivery: Delivery,
        config: Arc<Config<P, C>>,
    ) -> Self {
        ResponseFuture {
            state: State::Attempt { future },
            retry: Some(Pending {
                service,
                delivery,
                config,
            }),
        }
    }
}

impl<S, P, C> Future for ResponseFuture<S, P, C>
where
    S: Service<Delivery, Response = Decision, Error = BoxError> + Send + 'static,
    S::Future: Send,
    P: Publish,
    C: Classify,
{
    type Output = Result<Decision, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Attempt { future } => {
                    let error = match ready!(future.poll(cx)) {
                        Ok(decision) => return Poll::Ready(Ok(decision)),
                        Err(error) => error,
                    };
                    let Some(pending) = this.retry.take() else {
                        // Unreachable: the state leaves `Attempt` when this is taken.
                        return Poll::Ready(Err(error));
                    };
                    let future = Box::pin(failure_path(
                        pending.service,
                        pending.delivery,
                        pending.config,
                        error,
                    ));
                    this.state.set(State::Failing { future });
                }
                StateProj::Failing { future } => return future.as_mut().poll(cx),
            }
        }
    }
}

impl<S, P, C> fmt::Debug for ResponseFuture<S, P, C>
where
    S: Service<Delivery>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Attempt { .. } => "attempt",
            State::Failing { .. } => "failing",
        };
        let mut d = f.debug_struct("ResponseFuture");
        d.field("state", &state);
        if let Some(pending) = &self.retry {
            d.field("queue", &pending.delivery.queue())
                .field("attempt", &pending.delivery.attempt());
        }
        d.finish()
    }
}

/// Carries out the schedule after a failure: dead-letter, publish to a rung,
/// or wait here and call the inner service again, until a decision.
async fn failure_path<S, P, C>(
    mut service: S,
    mut delivery: Delivery,
    config: Arc<Config<P, C>>,
    mut error: BoxError,
) -> Result<Decision, BoxError>
where
    S: Service<Delivery, Response = Decision, Error = BoxError>,
    P: Publish,
    C: Classify,
{
    let policy = &config.policy;
    loop {
        if delivery.is_orphaned() {
            return Ok(orphaned(&delivery));
        }
        let attempt = delivery.attempt();
        let reason = match config.classifier.classify(&*error) {
            Class::Panic if !policy.retry_panics => Some(Reason::Panic),
            Class::Permanent => Some(Reason::Rejected),
            Class::Timeout if attempt >= policy.max_attempts => Some(Reason::Timeout),
            _ if attempt >= policy.max_attempts => Some(Reason::MaxAttempts),
            _ => None,
        };
        if let Some(reason) = reason {
            tracing::debug!(
                queue = %delivery.queue(),
                attempt,
                %reason,
                "delivery failed; not retrying: {error}"
            );
            return Ok(dead_letter(reason, &*error, attempt));
        }

        let next = attempt.saturating_add(1);
        let delay = policy.delay_after(attempt);
        let rung = rung_name(delivery.queue(), delay);
        let broker = policy.is_broker_wait(delay);

        if config.draining.is_cancelled() {
            // No in-process wait once the drain has begun.
            return Ok(leave_for_drain(&config, &delivery, next, delay, rung, broker).await);
        }

        let mut rung_missing = false;
        if broker {
            match publish_to_rung(&config, &delivery, &rung, next).await {
                Ok(()) => return Ok(scheduled_on_rung(&delivery, next, delay, rung)),
                Err(PublishError::Unroutable { .. }) => {
                    report_missing_rung(&config, &delivery, &rung);
                    rung_missing = true;
                }
                Err(e) => {
                    // Nacked, or the publisher's channel is gone: wait here
                    // instead. Handing the delivery back would have the
                    // broker redeliver it at once, and a rung that keeps
                    // refusing would turn that into a hot loop.
                    tracing::warn!(
                        queue = %delivery.queue(),
                        attempt,
                        rung = %rung,
                        "could not schedule the retry on its rung ({e}); waiting here instead"
                    );
                    rung_missing = true;
                }
            }
        }

        let wait = if policy.jitter {
            jittered(delay, &delivery)
        } else {
            delay
        };
        metrics::counter!(
            "acemq.retry.scheduled",
            "queue" => delivery.queue_arc().clone(),
            "where" => "process"
        )
        .increment(1);
        tracing::info!(
            queue = %delivery.queue(),
            message_id = delivery.properties().message_id.as_deref().unwrap_or(""),
            attempt,
            next,
            ?wait,
            "retry scheduled here (in process): {error}"
        );

        let drained = {
            let _guard = config.shared.wait_guard();
            let sleep = pin!(tokio::time::sleep(wait));
            let lifeline = delivery.lifeline().clone();
            let draining = pin!(config.draining.cancelled());
            let lost = pin!(lifeline.lost());
            let stop = futures::future::select(draining, lost);
            matches!(futures::future::select(sleep, stop).await, Either::Right(_))
        };
        if delivery.is_orphaned() {
            return Ok(orphaned(&delivery));
        }
        if drained {
            if rung_missing {
                tracing::debug!(
                    queue = %delivery.queue(),
                    attempt,
                    "drain began during an in-process retry wait and the rung is missing; handing the delivery back"
                );
                return Ok(Decision::HandBack);
            }
            return Ok(leave_for_drain(&config, &delivery, next, delay, rung, broker).await);
        }

        delivery.set_attempt(next);
        poll_fn(|cx| service.poll_ready(cx)).await?;
        // The in-process attempt's own span, a child of the delivery's.
        let span = tracing::info_span!(
            "acemq.attempt",
            otel.name = %format_args!("attempt {}", delivery.queue()),
            acemq.queue = %delivery.queue(),
            acemq.attempt = i64::from(next),
        );
        let call = span.in_scope(|| service.call(delivery.clone()));
        match call.instrument(span).await {
            Ok(decision) => return Ok(decision),
            Err(e) => error = e,
        }
    }
}

/// The drain has begun: move the retry to the rung of `delay` if there is
/// one, otherwise hand the delivery back (redelivered at the attempt number
/// its headers carry).
async fn leave_for_drain<P: Publish, C>(
    config: &Config<P, C>,
    delivery: &Delivery,
    next: u32,
    delay: Duration,
    rung: String,
    broker: bool,
) -> Decision {
    match publish_to_rung(config, delivery, &rung, next).await {
        Ok(()) => scheduled_on_rung(delivery, next, delay, rung),
        Err(PublishError::Unroutable { .. }) => {
            if broker {
                report_missing_rung(config, delivery, &rung);
            }
            tracing::debug!(
                queue = %delivery.queue(),
                rung = %rung,
                "draining and no rung for the retry; handing the delivery back"
            );
            Decision::HandBack
        }
        Err(e) => {
            tracing::warn!(
                queue = %delivery.queue(),
                rung = %rung,
                "draining and could not move the retry to its rung ({e}); handing the delivery back"
            );
            Decision::HandBack
        }
    }
}

/// The delivery's channel is gone: the broker redelivers it, so this copy
/// neither waits nor publishes any more.
fn orphaned(delivery: &Delivery) -> Decision {
    tracing::debug!(
        queue = %delivery.queue(),
        attempt = delivery.attempt(),
        "not retrying an orphaned delivery (its channel is gone; the broker redelivers it)"
    );
    Decision::HandBack
}

/// Publishes a copy with the original headers and `x-acemq-attempt = next`.
async fn publish_to_rung<P: Publish, C>(
    config: &Config<P, C>,
    delivery: &Delivery,
    rung: &str,
    next: u32,
) -> Result<(), PublishError> {
    let mut headers = crate::publish::copy_headers(delivery);
    headers.insert(ATTEMPT_HEADER, Value::I64(next.into()));
    config
        .publisher
        .publish(Outgoing {
            queue: rung,
            delivery,
            headers,
        })
        .await
}

fn scheduled_on_rung(delivery: &Delivery, next: u32, delay: Duration, rung: String) -> Decision {
    metrics::counter!(
        "acemq.retry.scheduled",
        "queue" => delivery.queue_arc().clone(),
        "where" => "broker"
    )
    .increment(1);
    tracing::info!(
        queue = %delivery.queue(),
        message_id = delivery.properties().message_id.as_deref().unwrap_or(""),
        next,
        rung = %rung,
        "retry scheduled on its rung in the broker"
    );
    Decision::Retry(RetryDecision {
        attempt: next,
        delay,
        via: RetryVia::Rung(rung),
    })
}

fn report_missing_rung<P, C>(config: &Config<P, C>, delivery: &Delivery, rung: &str) {
    metrics::counter!("acemq.retry.rung.missing", "queue" => delivery.queue_arc().clone())
        .increment(1);
    if config.shared.first_missing(rung) {
        tracing::warn!(
            queue = %delivery.queue(),
            rung = %rung,
            "retry rung queue {rung:?} is missing; waiting in process instead, which holds the \
             delivery and can slow the drain (declare the topology; counted in acemq.retry.rung.missing)"
        );
    }
}

fn dead_letter(reason: Reason, error: &(dyn StdError + 'static), attempts: u32) -> Decision {
    Decision::DeadLetter(DeadLetterDecision {
        reason,
        error: display_chain(error, MAX_ERROR_LEN),
        attempts,
        published: false,
    })
}

/// `delay` ± 20 %.
fn jittered(delay: Duration, delivery: &Delivery) -> Duration {
    let r = RandomState::new().hash_one((delivery.delivery_tag(), delivery.attempt()));
    // 53 random bits as a fraction in [0, 1).
    let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
    delay.mul_f64(0.8 + 0.4 * unit)
}

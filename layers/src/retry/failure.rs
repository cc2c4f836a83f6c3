//! What follows a failed attempt: the retry schedule carried out, until a
//! decision (see the [module docs](super) for the behaviour).

use std::collections::hash_map::RandomState;
use std::error::Error as StdError;
use std::future::poll_fn;
use std::hash::BuildHasher;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::future::Either;
use tower::Service;
use tracing::instrument::Instrumented;
use tracing::Instrument;

use super::layer::Config;
use super::policy::{rung_name, RetryPolicy};
use crate::dead_letter::MAX_ERROR_LEN;
use crate::decision::{DeadLetterDecision, Decision, Reason, RetryDecision, RetryVia};
use crate::delivery::{Delivery, ATTEMPT_HEADER};
use crate::error::{display_chain, BoxError, Class, Classify};
use crate::headers::Value;
use crate::inbox::TransactionEnded;
use crate::publish::{Outgoing, Publish, PublishError};

/// Carries out the schedule after a failure: dead-letter, publish to a rung,
/// or wait here and call the inner service again, until a decision.
pub(crate) async fn failure_path<S, P, C>(
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
    loop {
        if delivery.is_orphaned() {
            return Ok(orphaned(&delivery));
        }
        let attempt = delivery.attempt();
        if let Some(decision) = give_up(&config, &delivery, attempt, &*error) {
            return Ok(decision);
        }

        let next = NextAttempt::after(&config.policy, &delivery, attempt);
        if config.policy.in_queue {
            // The queue holds it back itself, drain or not.
            return Ok(scheduled_in_queue(&delivery, next, &*error));
        }

        if config.draining.is_cancelled() {
            // No in-process wait once the drain has begun.
            return Ok(leave_for_drain(&config, &delivery, next, &*error).await);
        }

        let rung_missing = if next.broker {
            match publish_to_rung(&config, &delivery, &next.rung, next.number).await {
                Ok(()) => return Ok(scheduled_on_rung(&delivery, next, &*error)),
                Err(e) => {
                    rung_refused(&config, &delivery, attempt, &next.rung, e);
                    take_permit_back(&config, &delivery).await;
                    true
                }
            }
        } else {
            false
        };

        let wait = schedule_in_process(&config, &delivery, attempt, &next, &*error);
        let drained = wait_in_process(&config, &delivery, wait).await;
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
            return Ok(leave_for_drain(&config, &delivery, next, &*error).await);
        }

        delivery.set_attempt(next.number);
        poll_fn(|cx| service.poll_ready(cx)).await?;
        match call_attempt(&mut service, &delivery, next.number).await {
            Ok(decision) => return Ok(decision),
            Err(e) => error = e,
        }
    }
}

/// Classifies the failure of `attempt`: the dead-letter decision when it is
/// not to be retried (permanent, a panic not retried, or the last attempt),
/// `None` when it is.
fn give_up<P, C: Classify>(
    config: &Config<P, C>,
    delivery: &Delivery,
    attempt: u32,
    error: &(dyn StdError + Send + Sync + 'static),
) -> Option<Decision> {
    let policy = &config.policy;
    let reason = match config.classifier.classify(error) {
        // A programming error whatever the classifier says: no retry fixes it.
        _ if TransactionEnded::is_in(error) => Some(Reason::TransactionEnded),
        Class::Panic if !policy.retry_panics => Some(Reason::Panic),
        Class::Permanent => Some(Reason::Rejected),
        Class::Timeout if attempt >= policy.max_attempts => Some(Reason::Timeout),
        _ if attempt >= policy.max_attempts => Some(Reason::MaxAttempts),
        _ => None,
    };
    let reason = reason?;
    tracing::debug!(
        queue = %delivery.queue(),
        attempt,
        %reason,
        error = display_chain(error, MAX_ERROR_LEN).as_str(),
        "delivery failed; not retrying"
    );
    Some(dead_letter(reason, error, attempt))
}

/// The attempt after a failed one: its number, the delay before it, the
/// rung of that delay, and whether the wait is spent in the broker.
struct NextAttempt {
    number: u32,
    delay: Duration,
    rung: String,
    broker: bool,
}

impl NextAttempt {
    fn after(policy: &RetryPolicy, delivery: &Delivery, attempt: u32) -> Self {
        let number = attempt.saturating_add(1);
        let delay = policy.delay_after(attempt);
        let rung = rung_name(delivery.queue(), delay);
        let broker = policy.is_broker_wait(delay);
        NextAttempt {
            number,
            delay,
            rung,
            broker,
        }
    }
}

/// The rung refused the copy: it is waited out here instead.
fn rung_refused<P, C>(
    config: &Config<P, C>,
    delivery: &Delivery,
    attempt: u32,
    rung: &str,
    error: PublishError,
) {
    match error {
        PublishError::Unroutable { .. } => report_missing_rung(config, delivery, rung),
        e => {
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
        }
    }
}

/// Counts and logs a wait in this process; returns how long it is
/// (jittered if the policy says so).
fn schedule_in_process<P, C>(
    config: &Config<P, C>,
    delivery: &Delivery,
    attempt: u32,
    next: &NextAttempt,
    error: &(dyn StdError + Send + Sync + 'static),
) -> Duration {
    let wait = if config.policy.jitter {
        jittered(next.delay, delivery)
    } else {
        next.delay
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
        next = next.number,
        ?wait,
        error = display_chain(error, MAX_ERROR_LEN).as_str(),
        "retry scheduled here (in process)"
    );
    wait
}

/// Waits `wait` here, counted in [`RetryWaits`](super::RetryWaits); `true`
/// when the drain began or the delivery's channel was lost first.
async fn wait_in_process<P, C>(config: &Config<P, C>, delivery: &Delivery, wait: Duration) -> bool {
    let _guard = config.shared.wait_guard();
    let sleep = pin!(tokio::time::sleep(wait));
    let lifeline = delivery.lifeline().clone();
    let draining = pin!(config.draining.cancelled());
    let lost = pin!(lifeline.lost());
    let stop = futures::future::select(draining, lost);
    matches!(futures::future::select(sleep, stop).await, Either::Right(_))
}

/// A refused rung copy may have been queued before it failed, and the
/// delivery then gave up its concurrency permit ([`Outgoing::queued`]): it
/// takes one back before it waits here, since in-process waits and the next
/// attempt run holding one. Unless the drain begins or the channel is lost
/// first: no attempt follows then (the wait after this ends at once).
async fn take_permit_back<P, C>(config: &Config<P, C>, delivery: &Delivery) {
    let back = pin!(delivery.take_permit_back());
    let lifeline = delivery.lifeline().clone();
    let draining = pin!(config.draining.cancelled());
    let lost = pin!(lifeline.lost());
    let stop = futures::future::select(draining, lost);
    futures::future::select(back, stop).await;
}

/// Calls the inner service again for attempt `next`, in the attempt's own
/// span.
fn call_attempt<S>(service: &mut S, delivery: &Delivery, next: u32) -> Instrumented<S::Future>
where
    S: Service<Delivery>,
{
    // The in-process attempt's own span, a child of the delivery's.
    let span = tracing::info_span!(
        "acemq.attempt",
        otel.name = %format_args!("attempt {}", delivery.queue()),
        acemq.queue = %delivery.queue(),
        acemq.attempt = i64::from(next),
    );
    let call = span.in_scope(|| service.call(delivery.clone()));
    call.instrument(span)
}

/// The drain has begun: move the retry to the rung of its delay if there is
/// one, otherwise hand the delivery back (redelivered at the attempt number
/// its headers carry).
async fn leave_for_drain<P: Publish, C>(
    config: &Config<P, C>,
    delivery: &Delivery,
    next: NextAttempt,
    error: &(dyn StdError + Send + Sync + 'static),
) -> Decision {
    match publish_to_rung(config, delivery, &next.rung, next.number).await {
        Ok(()) => scheduled_on_rung(delivery, next, error),
        Err(PublishError::Unroutable { .. }) => {
            if next.broker {
                report_missing_rung(config, delivery, &next.rung);
            }
            tracing::debug!(
                queue = %delivery.queue(),
                rung = %next.rung,
                "draining and no rung for the retry; handing the delivery back"
            );
            Decision::HandBack
        }
        Err(e) => {
            tracing::warn!(
                queue = %delivery.queue(),
                rung = %next.rung,
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

fn scheduled_on_rung(
    delivery: &Delivery,
    next: NextAttempt,
    error: &(dyn StdError + Send + Sync + 'static),
) -> Decision {
    let NextAttempt {
        number: next,
        delay,
        rung,
        ..
    } = next;
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
        error = display_chain(error, MAX_ERROR_LEN).as_str(),
        "retry scheduled on its rung in the broker"
    );
    Decision::Retry(RetryDecision {
        attempt: next,
        delay,
        via: RetryVia::Rung(rung),
    })
}

/// The retry waits in the queue itself: the loop rejects the delivery with
/// requeue, and the quorum queue's delayed retry holds it back.
fn scheduled_in_queue(
    delivery: &Delivery,
    next: NextAttempt,
    error: &(dyn StdError + Send + Sync + 'static),
) -> Decision {
    metrics::counter!(
        "acemq.retry.scheduled",
        "queue" => delivery.queue_arc().clone(),
        "where" => "queue"
    )
    .increment(1);
    tracing::info!(
        queue = %delivery.queue(),
        message_id = delivery.properties().message_id.as_deref().unwrap_or(""),
        next = next.number,
        delay = ?next.delay,
        error = display_chain(error, MAX_ERROR_LEN).as_str(),
        "retry scheduled in the queue (rejected with requeue; the queue's delayed retry holds it back)"
    );
    Decision::Retry(RetryDecision {
        attempt: next.number,
        delay: next.delay,
        via: RetryVia::Queue,
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

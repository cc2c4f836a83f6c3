//! The response future of [`DeadLetter`](super::DeadLetter).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use pin_project_lite::pin_project;

use super::service::Config;
use super::{
    ATTEMPTS_HEADER, DEAD_LETTERED_AT_HEADER, ERROR_HEADER, MAX_ERROR_LEN, QUEUE_HEADER,
    REASON_HEADER,
};
use crate::decision::{DeadLetterDecision, Decision, Reason};
use crate::delivery::Delivery;
use crate::error::{display_chain, BoxError, Class, Classify};
use crate::headers::{Headers, Value};
use crate::inbox::TransactionEnded;
use crate::publish::{ErrorReply, Outgoing, Publish, PublishError};

pin_project! {
    /// Response future of [`DeadLetter`](super::DeadLetter).
    ///
    /// The inner future, unboxed, until it yields something to dead-letter;
    /// only then a boxed future that publishes it.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<F, P, C> {
        #[pin]
        state: State<F>,
        // `None` when the layer has nothing to do for this delivery (or
        // once used).
        pending: Option<Pending<P, C>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Inner {
            #[pin]
            future: F,
        },
        Publishing {
            future: BoxFuture<'static, Decision>,
        },
    }
}

/// What the layer keeps of a delivery it may have to act on.
pub(crate) struct Pending<P, C> {
    pub(crate) delivery: Delivery,
    pub(crate) config: Arc<Config<P, C>>,
    /// `true`: the layer is enabled and publishes the copy. `false`: the
    /// layer is disabled and the delivery is a request (it carries
    /// `reply_to`), so only its caller's error reply is sent.
    pub(crate) copy: bool,
}

impl<F, P, C> ResponseFuture<F, P, C> {
    pub(crate) fn new(future: F, pending: Option<Pending<P, C>>) -> Self {
        ResponseFuture {
            state: State::Inner { future },
            pending,
        }
    }
}

impl<F, P, C> Future for ResponseFuture<F, P, C>
where
    F: Future<Output = Result<Decision, BoxError>>,
    P: Publish,
    C: Classify,
{
    type Output = Result<Decision, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Inner { future } => {
                    let result = ready!(future.poll(cx));
                    let Some(Pending {
                        delivery,
                        config,
                        copy,
                    }) = this.pending.take()
                    else {
                        return Poll::Ready(result);
                    };
                    match act(result, delivery, &config, copy) {
                        Act::Done(result) => return Poll::Ready(result),
                        Act::Publish(future) => this.state.set(State::Publishing { future }),
                    }
                }
                StateProj::Publishing { future } => {
                    return Poll::Ready(Ok(ready!(future.as_mut().poll(cx))));
                }
            }
        }
    }
}

/// What the layer does with a result.
pub(crate) enum Act {
    /// Nothing to publish: the result as it is.
    Done(Result<Decision, BoxError>),
    /// The copy (or, disabled, a request's error reply) to publish; the
    /// decision once it is done.
    Publish(BoxFuture<'static, Decision>),
}

/// What the layer does with `result` for `delivery`: a dead-letter
/// decision not yet carried out, or an error, is published (`copy`: the
/// layer is enabled) or only told to a request's caller (disabled); the
/// rest passes through.
pub(crate) fn act<P: Publish, C: Classify>(
    result: Result<Decision, BoxError>,
    delivery: Delivery,
    config: &Arc<Config<P, C>>,
    copy: bool,
) -> Act {
    if !copy {
        // Disabled: the loop rejects what is dead-lettered; a request's
        // caller still hears why.
        return match result {
            Ok(Decision::DeadLetter(d))
                if !d.published && super::service::owed_reply(&config.replies, &delivery) =>
            {
                Act::Publish(Box::pin(reply_only(delivery, config.clone(), d)))
            }
            other => Act::Done(other),
        };
    }
    let decision = match result {
        Ok(Decision::DeadLetter(d)) if !d.published => d,
        Err(error) => {
            let reason = match config.classifier.classify(&*error) {
                _ if TransactionEnded::is_in(&*error) => Reason::TransactionEnded,
                Class::Panic => Reason::Panic,
                Class::Permanent => Reason::Rejected,
                Class::Timeout => Reason::Timeout,
                _ => Reason::MaxAttempts,
            };
            DeadLetterDecision {
                reason,
                error: display_chain(&*error, MAX_ERROR_LEN),
                attempts: delivery.attempt(),
                published: false,
            }
        }
        other => return Act::Done(other),
    };
    Act::Publish(Box::pin(publish(delivery, config.clone(), decision)))
}

impl<F, P, C> fmt::Debug for ResponseFuture<F, P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Inner { .. } => "inner",
            State::Publishing { .. } => "publishing",
        };
        let mut d = f.debug_struct("ResponseFuture");
        d.field("state", &state);
        if let Some(pending) = &self.pending {
            d.field("queue", &pending.delivery.queue());
        }
        d.finish()
    }
}

/// Publishes the copy with the reason headers; redeclares the dead-letter
/// queue once if it is missing.
async fn publish<P: Publish, C>(
    delivery: Delivery,
    config: Arc<Config<P, C>>,
    mut decision: DeadLetterDecision,
) -> Decision {
    if delivery.is_orphaned() {
        // The broker took the delivery back with its channel and will
        // redeliver it: a copy now would be a second lineage.
        tracing::debug!(
            queue = %delivery.queue(),
            reason = %decision.reason,
            "not dead-lettering an orphaned delivery (its channel is gone; the broker redelivers it)"
        );
        return Decision::HandBack;
    }
    truncate(&mut decision.error, MAX_ERROR_LEN);
    let dlq = super::dlq_name(delivery.queue());
    let headers = headers(&delivery, &decision);
    let publisher = &config.publisher;
    let first = publisher
        .publish(Outgoing {
            queue: &dlq,
            delivery: &delivery,
            headers: headers.clone(),
        })
        .await;
    let result = match first {
        Err(PublishError::Unroutable { .. }) => {
            tracing::warn!(
                queue = %delivery.queue(),
                dlq = %dlq,
                "dead-letter queue {dlq:?} is missing; declaring it again"
            );
            if let Err(e) = publisher.redeclare(&dlq).await {
                tracing::warn!(queue = %delivery.queue(), dlq = %dlq, "could not declare {dlq:?} again: {e}");
            }
            publisher
                .publish(Outgoing {
                    queue: &dlq,
                    delivery: &delivery,
                    headers,
                })
                .await
        }
        other => other,
    };
    match result {
        Ok(()) => {
            decision.published = true;
            metrics::counter!(
                "acemq.dead_lettered",
                "queue" => delivery.queue_arc().clone(),
                "reason" => decision.reason.as_str()
            )
            .increment(1);
            tracing::info!(
                queue = %delivery.queue(),
                message_id = delivery.properties().message_id.as_deref().unwrap_or(""),
                dlq = %dlq,
                reason = %decision.reason,
                attempts = decision.attempts,
                error = decision.error.as_str(),
                "delivery dead-lettered"
            );
        }
        Err(e) => {
            tracing::error!(
                queue = %delivery.queue(),
                dlq = %dlq,
                reason = %decision.reason,
                attempts = decision.attempts,
                error = decision.error.as_str(),
                "could not publish to the dead-letter queue ({e}); rejecting the delivery, so the \
                 queue's own dead-letter exchange takes it and the reason ({}) is lost",
                decision.reason
            );
        }
    }
    reply(&delivery, &config, &decision).await;
    Decision::DeadLetter(decision)
}

/// A disabled layer's only work: the error reply to a request's caller.
async fn reply_only<P: Publish, C>(
    delivery: Delivery,
    config: Arc<Config<P, C>>,
    mut decision: DeadLetterDecision,
) -> Decision {
    if !delivery.is_orphaned() {
        truncate(&mut decision.error, MAX_ERROR_LEN);
        reply(&delivery, &config, &decision).await;
    }
    Decision::DeadLetter(decision)
}

/// Sends the error reply if the delivery is a request (it carries
/// `reply_to` and a `correlation_id`) on a queue that serves requests, to
/// an address the queue allows; a failure is logged, never the delivery's:
/// the request is settled as decided either way.
async fn reply<P: Publish, C>(
    delivery: &Delivery,
    config: &Config<P, C>,
    decision: &DeadLetterDecision,
) {
    if !super::service::owed_reply(&config.replies, delivery) {
        return;
    }
    let Some(mut reply) = ErrorReply::of(delivery, decision) else {
        return;
    };
    reply.error_text = config.replies.with_error_text();
    let reply_to = reply.reply_to;
    if let Err(e) = config.publisher.reply_error(reply).await {
        tracing::warn!(
            queue = %delivery.queue(),
            reply_to,
            reason = %decision.reason,
            "could not send the dead-lettered request's error reply ({e}); its caller waits until its deadline"
        );
    }
}

/// The original headers plus the five dead-letter headers.
fn headers(delivery: &Delivery, decision: &DeadLetterDecision) -> Headers {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let mut headers = crate::publish::copy_headers(delivery);
    headers.insert(REASON_HEADER, decision.reason.as_str());
    headers.insert(ERROR_HEADER, decision.error.as_str());
    headers.insert(ATTEMPTS_HEADER, Value::I64(decision.attempts.into()));
    headers.insert(QUEUE_HEADER, delivery.queue());
    headers.insert(DEAD_LETTERED_AT_HEADER, Value::I64(now_ms));
    headers
}

/// Cuts `s` to at most `max` bytes on a character boundary, ending in `…`.
fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max.saturating_sub('…'.len_utf8());
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
}

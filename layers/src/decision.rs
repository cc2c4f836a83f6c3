//! What happens to a delivery: the one type every layer and the consumer
//! loop share.

use std::fmt;
use std::time::Duration;

/// What the consumer loop does with a delivery once the stack has finished
/// with it. The loop carries out each decision exactly once.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Decision {
    /// The handler succeeded: acknowledge.
    Ack,
    /// The delivery is retried as attempt `attempt` after `delay`.
    ///
    /// With [`RetryVia::Rung`] the copy is already in the broker (published
    /// with a confirm) and the loop acknowledges the original. With
    /// [`RetryVia::Process`] the wait happens in this process; the loop
    /// only sees it if no retry layer carried it out and then hands the
    /// delivery back.
    Retry(RetryDecision),
    /// The delivery cannot be handled.
    DeadLetter(DeadLetterDecision),
    /// Leave the delivery to the broker, unsettled by this handler: the
    /// broker redelivers it at the same attempt number. The loop requeues it
    /// while its channel is open (`basic.nack` with requeue: a drain, the
    /// pause gate, a handler cancelled by the drain — not the message's
    /// doing, and RabbitMQ 4.3's quorum queues do not count it in
    /// `x-delivery-count`); on a closed channel the broker already has.
    HandBack,
    /// The handler gave the delivery back ([`Verdict::Requeue`](crate::Verdict::Requeue)):
    /// requeued at the same attempt number like [`HandBack`](Decision::HandBack),
    /// but as `basic.reject` with requeue, which every version of RabbitMQ's
    /// quorum queues counts in `x-delivery-count` (4.3 no longer counts a
    /// `basic.nack`), so a handler that always requeues reaches
    /// `max_redeliveries` and the broker's delivery limit on every version.
    /// Counted as `handed-back` in the metrics.
    Requeue,
    /// The handler ignored cancellation past the grace period and was
    /// dropped. The loop settles nothing; closing the connection returns
    /// the delivery to the broker.
    Abandoned,
}

impl Decision {
    /// A short name for logs and the `outcome` metric label.
    pub fn outcome(&self) -> &'static str {
        match self {
            Decision::Ack => "ack",
            Decision::Retry(r) if r.via == RetryVia::Process => "retry-process",
            Decision::Retry(r) if r.via == RetryVia::Queue => "retry-queue",
            Decision::Retry(_) => "retry-broker",
            Decision::DeadLetter(d) if d.published => "dead-lettered",
            Decision::DeadLetter(_) => "rejected-to-dlx",
            Decision::HandBack => "handed-back",
            Decision::Requeue => "requeued",
            Decision::Abandoned => "abandoned",
        }
    }
}

/// Where a retry waits.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryVia {
    /// In this process, holding the delivery.
    Process,
    /// On a rung queue in the broker (named here).
    Rung(String),
    /// In the queue itself: `basic.reject` with requeue, held back by the
    /// quorum queue's own delayed retry (RabbitMQ 4.3 and later,
    /// `x-delayed-retry-type: failed`), which delays it by
    /// `min · x-delivery-count`, capped.
    Queue,
}

/// A retry: the next attempt and its delay.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryDecision {
    /// The attempt number the copy carries.
    pub attempt: u32,
    /// How long it waits before that attempt.
    pub delay: Duration,
    /// Where it waits.
    pub via: RetryVia,
}

/// A dead-lettering: why, the last error, and whether the copy carrying the
/// reason is already in the dead-letter queue.
#[derive(Clone, Debug, PartialEq)]
pub struct DeadLetterDecision {
    /// Why the delivery is dead-lettered.
    pub reason: Reason,
    /// The last error's display chain.
    pub error: String,
    /// How many attempts were made.
    pub attempts: u32,
    /// `true`: a copy with the reason headers is in the dead-letter queue
    /// (confirmed) and the loop acknowledges the original. `false`: the loop
    /// rejects without requeue and the queue's own dead-letter exchange
    /// takes it, without the reason.
    pub published: bool,
}

/// Why a delivery was dead-lettered; written to `x-acemq-reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Every attempt of the retry schedule failed.
    MaxAttempts,
    /// The handler marked the failure permanent.
    Rejected,
    /// The handler panicked.
    Panic,
    /// The handler did not finish in time.
    Timeout,
    /// The broker redelivered the message more often than the queue's
    /// `max_redeliveries` (its `x-delivery-count` header, quorum queues):
    /// dead-lettered without calling the handler, which breaks a crash loop.
    Redelivered,
    /// The handler ended the inbox's transaction itself (a `COMMIT` or
    /// `ROLLBACK` statement): its work and the inbox mark did not commit
    /// together, a programming error that no retry fixes
    /// ([`TransactionEnded`](crate::inbox::TransactionEnded)).
    TransactionEnded,
    /// The broker timed out the message's acknowledgement (`consumer_timeout`)
    /// more often than the queue's `consumer_timeout_strikes`: each time it
    /// closed the channel (or cancelled the consumer) and the message came
    /// back; dead-lettered without calling the handler again.
    ConsumerTimeout,
    /// The transport set the message's headers aside: nested too deep,
    /// too many values, or not a valid table
    /// ([`MalformedHeaders`](crate::redelivery::MalformedHeaders));
    /// dead-lettered without the headers and without calling the handler.
    MalformedHeaders,
}

impl Reason {
    /// The header form: `max-attempts`, `rejected`, `panic`, `timeout`,
    /// `redelivered`, `transaction-ended`, `consumer-timeout`,
    /// `malformed-headers`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::MaxAttempts => "max-attempts",
            Reason::Rejected => "rejected",
            Reason::Panic => "panic",
            Reason::Timeout => "timeout",
            Reason::Redelivered => "redelivered",
            Reason::TransactionEnded => "transaction-ended",
            Reason::ConsumerTimeout => "consumer-timeout",
            Reason::MalformedHeaders => "malformed-headers",
        }
    }

    /// The reason whose header form is `s`, if any.
    pub fn from_header(s: &str) -> Option<Reason> {
        Some(match s {
            "max-attempts" => Reason::MaxAttempts,
            "rejected" => Reason::Rejected,
            "panic" => Reason::Panic,
            "timeout" => Reason::Timeout,
            "redelivered" => Reason::Redelivered,
            "transaction-ended" => Reason::TransactionEnded,
            "consumer-timeout" => Reason::ConsumerTimeout,
            "malformed-headers" => Reason::MalformedHeaders,
            _ => return None,
        })
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Reason;

    #[test]
    fn every_reason_reads_back_from_its_header_form() {
        for r in [
            Reason::MaxAttempts,
            Reason::Rejected,
            Reason::Panic,
            Reason::Timeout,
            Reason::Redelivered,
            Reason::ConsumerTimeout,
            Reason::TransactionEnded,
            Reason::MalformedHeaders,
        ] {
            assert_eq!(Reason::from_header(r.as_str()), Some(r), "{r}");
        }
        assert_eq!(Reason::ConsumerTimeout.as_str(), "consumer-timeout");
        assert_eq!(Reason::from_header("consumer_timeout"), None);
    }
}

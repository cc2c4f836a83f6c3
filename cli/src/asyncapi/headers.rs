//! The headers acemq sets, as the JSON Schemas of the messages' `headers`:
//! on a delivery (the attempt), on a rung's copy (the attempt and where the
//! message was first published) and on a dead-letter copy (the reason, the
//! error, the attempts, the queue, when).

use acemq::layers::dead_letter::{
    ATTEMPTS_HEADER, DEAD_LETTERED_AT_HEADER, ERROR_HEADER, MAX_ERROR_LEN, QUEUE_HEADER,
    REASON_HEADER,
};
use acemq::layers::headers::{ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER};
use acemq::layers::ATTEMPT_HEADER;
use acemq::Reason;
use serde_json::{json, Map, Value};

/// Where a copy keeps the producer's `traceparent` (the `opentelemetry`
/// feature; the copy's own `traceparent` is the failed attempt's span).
const ORIGINAL_TRACEPARENT_HEADER: &str = "x-acemq-original-traceparent";

/// Every reason acemq writes to `x-acemq-reason`.
pub(crate) const REASONS: [Reason; 8] = [
    Reason::MaxAttempts,
    Reason::Rejected,
    Reason::Panic,
    Reason::Timeout,
    Reason::Redelivered,
    Reason::TransactionEnded,
    Reason::ConsumerTimeout,
    Reason::MalformedHeaders,
];

fn attempt() -> (&'static str, Value) {
    (
        ATTEMPT_HEADER,
        json!({
            "type": "integer",
            "minimum": 1,
            "description": "The attempt this delivery is, 1 for the first; absent on a message \
                            as its publisher sent it. acemq sets it on every copy it sends to a \
                            retry rung or back to the queue.",
        }),
    )
}

fn originals() -> Vec<(&'static str, Value)> {
    vec![
        (
            ORIGINAL_EXCHANGE_HEADER,
            json!({
                "type": "string",
                "description": "The exchange the message was first published to (empty for the \
                                default exchange). Set on a copy's first hop, kept after.",
            }),
        ),
        (
            ORIGINAL_ROUTING_KEY_HEADER,
            json!({
                "type": "string",
                "description": "The routing key the message was first published with. Set on a \
                                copy's first hop, kept after.",
            }),
        ),
        (
            ORIGINAL_TRACEPARENT_HEADER,
            json!({
                "type": "string",
                "description": "The publisher's W3C traceparent, kept on a copy whose own \
                                traceparent is the failed attempt's span (the opentelemetry \
                                feature).",
            }),
        ),
    ]
}

fn object(description: &str, properties: Vec<(&'static str, Value)>) -> Value {
    let properties: Map<String, Value> = properties
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    json!({
        "type": "object",
        "description": description,
        "properties": properties,
    })
}

/// The headers of a delivery of a work queue: acemq's own that a retried
/// copy carries (the publisher's headers besides).
pub(crate) fn delivery() -> Value {
    let mut props = vec![attempt()];
    props.extend(originals());
    object(
        "Headers acemq reads and sets; a first delivery carries none of them, a retried one \
         carries them all. Any other header is the publisher's, passed through.",
        props,
    )
}

/// The headers of a copy waiting on a retry rung.
pub(crate) fn rung() -> Value {
    let mut props = vec![attempt()];
    props.extend(originals());
    object(
        "Headers of a copy waiting on a retry rung: the attempt it will be when the rung's TTL \
         dead-letters it back to the work queue, and where it was first published.",
        props,
    )
}

/// The headers of a dead-letter copy.
pub(crate) fn dead_letter() -> Value {
    let reasons: Vec<&str> = REASONS.iter().map(|r| r.as_str()).collect();
    let mut props = vec![
        (
            REASON_HEADER,
            json!({
                "type": "string",
                "enum": reasons,
                "description": "Why the message was dead-lettered. Absent on a message the \
                                broker dead-lettered itself (x-death says why).",
            }),
        ),
        (
            ERROR_HEADER,
            json!({
                "type": "string",
                "description": format!(
                    "The last error's display chain, at most {MAX_ERROR_LEN} bytes."
                ),
            }),
        ),
        (
            ATTEMPTS_HEADER,
            json!({
                "type": "integer",
                "minimum": 1,
                "description": "How many attempts were made.",
            }),
        ),
        (
            QUEUE_HEADER,
            json!({
                "type": "string",
                "description": "The queue the message was consumed from.",
            }),
        ),
        (
            DEAD_LETTERED_AT_HEADER,
            json!({
                "type": "integer",
                "description": "When the message was dead-lettered, in milliseconds since the \
                                Unix epoch.",
            }),
        ),
    ];
    props.push(attempt());
    props.extend(originals());
    object(
        "Headers acemq sets on a dead-letter copy, besides the publisher's. `acemq dlq replay` \
         removes the reason, error, attempts, queue, time and attempt headers.",
        props,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reasons_are_the_ones_acemq_reads_back() {
        for r in REASONS {
            assert_eq!(Reason::from_header(r.as_str()), Some(r));
        }
        let schema = dead_letter();
        let listed = &schema["properties"][REASON_HEADER]["enum"];
        assert_eq!(listed.as_array().map(Vec::len), Some(REASONS.len()));
        assert_eq!(listed[1], "rejected");
    }
}

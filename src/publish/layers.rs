//! What the layers publish through the [`Publisher`]: rung and dead-letter
//! copies, the error reply of a request being dead-lettered (the wire
//! format [`crate::rpc`] documents), and a deleted queue declared again.

use acemq_layers::dead_letter::{ATTEMPTS_HEADER, ERROR_HEADER, QUEUE_HEADER, REASON_HEADER};
use acemq_layers::{ErrorReply, Headers, Outgoing, Properties, Publish, PublishError, Value};
use tracing::warn;

use super::publisher::Publisher;
use crate::convert::properties_to_lapin;
use crate::topology::declare_one;

impl Publish for Publisher {
    async fn publish(&self, mut message: Outgoing<'_>) -> Result<(), PublishError> {
        let mut headers = std::mem::take(&mut message.headers);
        // The broker's own redelivery counts are not the copy's.
        for name in acemq_layers::headers::REDELIVERY_COUNT_HEADERS {
            headers.remove(name);
        }
        crate::telemetry::inject_copy(&mut headers);
        let props = properties_to_lapin(message.delivery.properties(), &headers);
        // Sent: the delivery's concurrency permit is free for the next handler
        // while this copy's confirm is outstanding (it is confirming).
        let delivery = message.delivery;
        self.send_then("", message.queue, delivery.body(), props, true, || {
            message.queued()
        })
        .await
    }

    async fn reply_error(&self, reply: ErrorReply<'_>) -> Result<(), PublishError> {
        send_error_reply(self, reply).await
    }

    async fn redeclare(&self, queue: &str) -> Result<(), PublishError> {
        let Some(decl) = self.topology().and_then(|t| t.get(queue)) else {
            return Err(PublishError::transport(
                queue,
                "the topology does not name this queue",
            ));
        };
        warn!(
            queue,
            "declaring the queue again: it was deleted while the consumer was running"
        );
        let conn = self.connection(queue).await?;
        declare_one(&conn, decl)
            .await
            .map_err(|e| PublishError::transport_with_source(queue, e.to_string(), e))
    }
}

/// The text of an error reply from a queue that did not opt in to the
/// handler's error text (`reply_error_text`).
pub(crate) const GENERIC_ERROR_TEXT: &str = "the request could not be handled";

/// Publishes the error reply of a request being dead-lettered, in the wire
/// format of [rpc's docs](crate::rpc#error-replies): to `reply_to`
/// through the default exchange with the request's `correlation_id`,
/// confirmed, not mandatory; the reason and the error in headers, the
/// error's text as the body — or, unless the queue opted in to the error
/// text (`reply_error_text`), [`GENERIC_ERROR_TEXT`] in its place and no
/// queue name.
async fn send_error_reply(
    publisher: &Publisher,
    reply: ErrorReply<'_>,
) -> Result<(), PublishError> {
    let decision = reply.decision;
    let text = if reply.error_text {
        decision.error.as_str()
    } else {
        GENERIC_ERROR_TEXT
    };
    let mut headers = Headers::new();
    headers.insert(REASON_HEADER, decision.reason.as_str());
    headers.insert(ERROR_HEADER, text);
    headers.insert(ATTEMPTS_HEADER, Value::I64(decision.attempts.into()));
    if reply.error_text {
        headers.insert(QUEUE_HEADER, reply.delivery.queue());
    }
    let mut properties = Properties::default();
    properties.correlation_id = Some(reply.correlation_id.to_owned());
    properties.content_type = Some("text/plain; charset=utf-8".to_owned());
    let properties = properties_to_lapin(&properties, &headers);
    publisher
        .send_with("", reply.reply_to, text.as_bytes(), properties, false)
        .await
}

//! The serving side: a handler that returns a reply.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use acemq_layers::dead_letter::{ATTEMPTS_HEADER, ERROR_HEADER, QUEUE_HEADER, REASON_HEADER};
use acemq_layers::{BoxError, Delivery, ErrorReply, Headers, Properties, PublishError, Value};
use lapin::BasicProperties;
use tower::Service;
use tracing::debug;

use crate::amqp::publisher::Publisher;

/// Wraps a service that answers a [`Delivery`] with a reply body into one
/// that [`App::consume`](crate::App::consume) takes: on success the reply is
/// published to the request's `reply_to` with its `correlation_id`
/// (confirmed, not mandatory) before the service returns, so before the
/// request is acknowledged. A request without `reply_to` is handled and
/// nothing is published. An error is returned as is (retries and
/// dead-lettering apply) and publishes nothing. See [`crate::rpc`].
///
/// Example: the [module docs](crate::rpc); runnable: `examples/rpc.rs`.
#[derive(Clone, Debug)]
pub struct Responder<S> {
    publisher: Publisher,
    inner: S,
}

impl<S> Responder<S> {
    /// Replies through `publisher` with what `inner` returns.
    pub fn new(publisher: Publisher, inner: S) -> Self {
        Responder { publisher, inner }
    }
}

impl<S> Service<Delivery> for Responder<S>
where
    S: Service<Delivery, Error = BoxError>,
    S::Response: Into<Vec<u8>>,
    S::Future: Send + 'static,
{
    type Response = ();
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, delivery: Delivery) -> Self::Future {
        let reply_to = delivery.properties().reply_to.clone();
        let correlation_id = delivery.properties().correlation_id.clone();
        let publisher = self.publisher.clone();
        let answer = self.inner.call(delivery);
        Box::pin(async move {
            let body: Vec<u8> = answer.await?.into();
            let Some(reply_to) = reply_to.filter(|r| !r.is_empty()) else {
                debug!("a request without reply_to: handled, no reply sent");
                return Ok(());
            };
            let mut properties = BasicProperties::default();
            if let Some(id) = correlation_id {
                properties = properties.with_correlation_id(id.as_str().into());
            }
            publisher
                .send_with("", &reply_to, &body, properties, false)
                .await?;
            Ok(())
        })
    }
}

/// Publishes the error reply of a request being dead-lettered, in the wire
/// format of the [module docs](crate::rpc#error-replies): to `reply_to`
/// through the default exchange with the request's `correlation_id`,
/// confirmed, not mandatory; the reason and the error in headers, the
/// error's text as the body.
pub(crate) async fn send_error_reply(
    publisher: &Publisher,
    reply: ErrorReply<'_>,
) -> Result<(), PublishError> {
    let decision = reply.decision;
    let mut headers = Headers::new();
    headers.insert(REASON_HEADER, decision.reason.as_str());
    headers.insert(ERROR_HEADER, decision.error.as_str());
    headers.insert(ATTEMPTS_HEADER, Value::I64(decision.attempts.into()));
    headers.insert(QUEUE_HEADER, reply.delivery.queue());
    let mut properties = Properties::default();
    properties.correlation_id = Some(reply.correlation_id.to_owned());
    properties.content_type = Some("text/plain; charset=utf-8".to_owned());
    let properties = crate::amqp::convert::properties_to_lapin(&properties, &headers);
    publisher
        .send_with(
            "",
            reply.reply_to,
            decision.error.as_bytes(),
            properties,
            false,
        )
        .await
}

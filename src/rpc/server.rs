//! The serving side: a handler that returns a reply.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use acemq_layers::{BoxError, Delivery};
use lapin::BasicProperties;
use tower::Service;
use tracing::debug;

use crate::publisher::Publisher;

/// Wraps a service that answers a [`Delivery`] with a reply body into one
/// that [`App::consume`](crate::App::consume) takes: on success the reply is
/// published to the request's `reply_to` with its `correlation_id`
/// (confirmed, not mandatory) before the service returns, so before the
/// request is acknowledged. A request without `reply_to` is handled and
/// nothing is published. An error is returned as is (retries and
/// dead-lettering apply) and publishes nothing. See [`crate::rpc`].
///
/// [`App::serve`](crate::App::serve) consumes a queue with one and marks
/// the queue as serving requests, so its dead-lettered requests get error
/// replies; under plain `consume` they get none unless the config sets
/// `serves_requests: true`.
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

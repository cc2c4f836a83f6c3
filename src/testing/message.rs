//! [`TestMessage`]: a delivery shaped before it runs through a
//! [`TestQueue`] — the exchange and routing key it came by, its message id,
//! headers and other properties.

use acemq_layers::{Delivery, Headers, Properties, Value, ATTEMPT_HEADER};
use bytes::Bytes;

use super::{Report, TestQueue};

/// A message arriving on a [`TestQueue`]'s queue, to shape before it is
/// delivered: from [`TestQueue::message`].
///
/// Unless told otherwise it arrives as a fresh message published to the
/// default exchange with the queue's name as routing key, no headers, no
/// properties, attempt 1, not redelivered, with the queue's next delivery
/// tag.
///
/// ```
/// use acemq::testing::{Fate, TestQueue};
/// use acemq::{Config, Delivery};
/// use tower::service_fn;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let config = Config::from_yaml_str("queues: [{ name: billing.invoices }]").unwrap();
/// let mut harness = TestQueue::new(
///     config.queues[0].clone(),
///     service_fn(|d: Delivery| async move {
///         assert_eq!(d.exchange(), "billing");
///         assert_eq!(d.routing_key(), "invoices.eu");
///         assert_eq!(d.properties().message_id.as_deref(), Some("inv-1"));
///         assert_eq!(d.headers().get("tenant").and_then(|v| v.as_str()), Some("acme"));
///         Ok::<_, acemq::BoxError>(())
///     }),
/// );
/// let report = harness
///     .message(r#"{"id":"inv-1","amount":120}"#)
///     .exchange("billing")
///     .routing_key("invoices.eu")
///     .message_id("inv-1")
///     .content_type("application/json")
///     .header("tenant", "acme")
///     .deliver()
///     .await;
/// assert_eq!(report.fate, Fate::Acked);
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a message does nothing until it is built or delivered"]
pub struct TestMessage<'a> {
    harness: &'a mut TestQueue,
    body: Bytes,
    exchange: String,
    routing_key: Option<String>,
    headers: Headers,
    properties: Properties,
    redelivered: bool,
}

impl<'a> TestMessage<'a> {
    pub(super) fn new(harness: &'a mut TestQueue, body: Bytes) -> Self {
        TestMessage {
            harness,
            body,
            exchange: String::new(),
            routing_key: None,
            headers: Headers::new(),
            properties: Properties::default(),
            redelivered: false,
        }
    }

    /// The exchange it was published to (default: `""`, the default
    /// exchange).
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// The routing key it was published with (default: the queue's name).
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.routing_key = Some(routing_key.into());
        self
    }

    /// Its `message_id` property.
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.properties.message_id = Some(id.into());
        self
    }

    /// Its `correlation_id` property.
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.properties.correlation_id = Some(id.into());
        self
    }

    /// Its `content_type` property.
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.properties.content_type = Some(content_type.into());
        self
    }

    /// Its `type` property.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.properties.kind = Some(kind.into());
        self
    }

    /// Every property at once, replacing those set so far (set the ones
    /// above after this one to change a field of `properties`).
    pub fn properties(mut self, properties: Properties) -> Self {
        self.properties = properties;
        self
    }

    /// One header (replacing a header of that name set before).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Every header at once, replacing those set so far (including the
    /// attempt from [`attempt`](Self::attempt)).
    pub fn headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Arrives as attempt `attempt`, as a copy from a retry rung does: its
    /// `x-acemq-attempt` header says so.
    pub fn attempt(self, attempt: u32) -> Self {
        self.header(ATTEMPT_HEADER, attempt)
    }

    /// The broker's redelivered flag (a delivery handed back before).
    pub fn redelivered(mut self, redelivered: bool) -> Self {
        self.redelivered = redelivered;
        self
    }

    /// The [`Delivery`], with the queue's next delivery tag, to pass to
    /// [`TestQueue::deliver`] (or to look at).
    pub fn build(self) -> Delivery {
        self.into_parts().1
    }

    /// Runs it through the stack; see [`TestQueue::deliver`].
    pub async fn deliver(self) -> Report {
        let (harness, delivery) = self.into_parts();
        harness.deliver(delivery).await
    }

    fn into_parts(self) -> (&'a mut TestQueue, Delivery) {
        let TestMessage {
            harness,
            body,
            exchange,
            routing_key,
            headers,
            properties,
            redelivered,
        } = self;
        harness.next_tag += 1;
        let queue = harness.queue.name.as_str();
        let delivery = Delivery::builder()
            .queue(queue)
            .exchange(exchange)
            .routing_key(routing_key.unwrap_or_else(|| queue.to_owned()))
            .delivery_tag(harness.next_tag)
            .redelivered(redelivered)
            .headers(headers)
            .properties(properties)
            .body(body)
            .build();
        (harness, delivery)
    }
}

//! [`PublishOptions`]: a message id, a correlation id, headers and the other
//! properties of a message you publish, for
//! [`Publisher::publish_json_with`](crate::Publisher::publish_json_with) and
//! [`Publisher::publish_with`](crate::Publisher::publish_with).

use std::time::Duration;

use acemq_layers::{Headers, Properties, Value};

/// What a published message carries besides its body: its properties
/// (message id, correlation id, content type, …) and headers. Built with
/// the methods below, each replacing what was set before for its field.
///
/// The message id is what an idempotent consumer (the inbox) keys on: set
/// it to a business key (`order-42-created`) so that a message published
/// twice is recognised as one.
///
/// ```no_run
/// use acemq::publisher::PublishOptions;
///
/// # async fn run(publisher: acemq::Publisher) -> Result<(), acemq::PublishError> {
/// let order = serde_json::json!({ "id": "o-42", "item": "book" });
/// publisher
///     .publish_json_with(
///         "shop",
///         "order.created",
///         &order,
///         PublishOptions::new()
///             .message_id("order-o-42-created")
///             .correlation_id("req-7f3a")
///             .kind("order.created")
///             .header("tenant", "acme"),
///     )
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PublishOptions {
    properties: Properties,
    headers: Headers,
}

impl PublishOptions {
    /// No properties, no headers: persistent, and for
    /// [`publish_json_with`](crate::Publisher::publish_json_with)
    /// `content_type: application/json`.
    pub fn new() -> Self {
        PublishOptions::default()
    }

    /// The `message_id` property.
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.properties.message_id = Some(id.into());
        self
    }

    /// The `correlation_id` property.
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.properties.correlation_id = Some(id.into());
        self
    }

    /// The `content_type` property (for JSON, instead of
    /// `application/json`).
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.properties.content_type = Some(content_type.into());
        self
    }

    /// The `type` property: what kind of message this is.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.properties.kind = Some(kind.into());
        self
    }

    /// The `reply_to` property.
    pub fn reply_to(mut self, queue: impl Into<String>) -> Self {
        self.properties.reply_to = Some(queue.into());
        self
    }

    /// The `app_id` property.
    pub fn app_id(mut self, app_id: impl Into<String>) -> Self {
        self.properties.app_id = Some(app_id.into());
        self
    }

    /// The `priority` property (a priority queue's `x-max-priority` bounds
    /// it).
    pub fn priority(mut self, priority: u8) -> Self {
        self.properties.priority = Some(priority);
        self
    }

    /// The `timestamp` property, in seconds since the Unix epoch.
    pub fn timestamp(mut self, unix_seconds: u64) -> Self {
        self.properties.timestamp = Some(unix_seconds);
        self
    }

    /// A per-message TTL (the `expiration` property, in whole
    /// milliseconds).
    pub fn expiration(mut self, ttl: Duration) -> Self {
        self.properties.expiration = Some(ttl.as_millis().to_string());
        self
    }

    /// Transient (`delivery_mode: 1`) instead of persistent: lost if the
    /// broker restarts before it is consumed.
    pub fn transient(mut self) -> Self {
        self.properties.delivery_mode = Some(1);
        self
    }

    /// Every property at once, replacing those set so far.
    pub fn properties(mut self, properties: Properties) -> Self {
        self.properties = properties;
        self
    }

    /// One header (replacing a header of that name set before).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Every header at once, replacing those set so far.
    pub fn headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }
}

impl PublishOptions {
    /// The properties and the headers, for the publisher.
    pub(super) fn into_parts(self) -> (Properties, Headers) {
        (self.properties, self.headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_option_sets_its_field_and_a_later_one_replaces_an_earlier_one() {
        let o = PublishOptions::new()
            .message_id("m-1")
            .message_id("m-2")
            .correlation_id("c")
            .kind("order.created")
            .expiration(Duration::from_millis(1500))
            .transient()
            .header("tenant", "acme")
            .header("tenant", "globex");
        assert_eq!(o.properties.message_id.as_deref(), Some("m-2"));
        assert_eq!(o.properties.correlation_id.as_deref(), Some("c"));
        assert_eq!(o.properties.kind.as_deref(), Some("order.created"));
        assert_eq!(o.properties.expiration.as_deref(), Some("1500"));
        assert_eq!(o.properties.delivery_mode, Some(1));
        assert_eq!(
            o.headers.get("tenant").and_then(|v| v.as_str()),
            Some("globex")
        );
        let replaced = o.properties(Properties::default());
        assert_eq!(replaced.properties, Properties::default());
        assert_eq!(replaced.headers.len(), 1, "headers are left alone");
    }
}

//! Publishing with confirms, on a connection of its own.
//!
//! The retry and dead-letter layers publish copies through it; your code
//! publishes its own messages with [`Publisher::publish`] (or
//! [`publish_json`](Publisher::publish_json)), and with a message id,
//! headers and other properties through [`PublishOptions`]
//! ([`publish_json_with`](Publisher::publish_json_with),
//! [`publish_with`](Publisher::publish_with)). Every publish is `mandatory`
//! and waits for the broker's confirm: an unroutable message comes back as
//! [`PublishError::Unroutable`], never as success.
//!
//! The publishing connection is never the consumers': during a memory or
//! disk alarm RabbitMQ blocks every connection that publishes, and lapin
//! then writes no frame at all on it, acknowledgements included. With
//! publishing apart, the consumers keep acknowledging — and so keep draining
//! the queue that would end the alarm — while publishes wait.
//!
//! ```no_run
//! use acemq::{App, Config, Delivery, Properties};
//! use tower::service_fn;
//!
//! # async fn run() -> std::process::ExitCode {
//! let config = Config::from_path("examples/shop.yaml").expect("valid config");
//! let app = App::new(config);
//! // A handle before start, cloned into the handler.
//! let publisher = app.publisher();
//! app.consume("shop.orders", service_fn(move |d: Delivery| {
//!     let publisher = publisher.clone();
//!     async move {
//!         let receipt = serde_json::json!({ "order": d.properties().message_id });
//!         publisher.publish_json("", "shop.receipts", &receipt).await?;
//!         Ok::<_, acemq::BoxError>(())
//!     }
//! }))
//! .run()
//! .await
//! # }
//! ```

use crate::sync::Locked;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use acemq_layers::{Headers, Properties, PublishError};
use futures::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection, Event};

pub use super::options::PublishOptions;
use crate::connection::{close_channel, Live};
use crate::convert::{short_string, try_properties_to_lapin, TooLong};
use crate::topology::Topology;

/// A confirm-mode publisher on the publishing connection (an example is in
/// the [module docs](crate::publisher)). Cheap to clone;
/// clones share the channel.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Live,
    channel: Mutex<Option<Channel>>,
    topology: OnceLock<Topology>,
    /// The delay buckets declared so far (see [`crate::delay`]).
    delay_buckets: Declared,
    /// How long a publish waits for a connection, or for the broker to
    /// unblock one.
    wait: Duration,
}

/// The delay bucket queues (and targets) a publisher has declared or
/// checked (see [`crate::delay`]).
#[derive(Debug, Default)]
pub(super) struct Declared {
    buckets: Mutex<HashSet<String>>,
}

impl Declared {
    pub(super) fn has(&self, queue: &str) -> bool {
        self.buckets.locked().contains(queue)
    }

    pub(super) fn insert(&self, queue: String) {
        self.buckets.locked().insert(queue);
    }

    pub(super) fn forget(&self, queue: &str) {
        self.buckets.locked().remove(queue);
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("wait", &self.inner.wait)
            .finish_non_exhaustive()
    }
}

async fn confirm_channel(conn: &Connection) -> lapin::Result<Channel> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(ch)
}

impl Publisher {
    /// A publisher on `connection`. `topology` is what the dead-letter layer
    /// re-declares from when its queue was deleted.
    pub async fn new(connection: Arc<Connection>, topology: Topology) -> lapin::Result<Self> {
        let channel = confirm_channel(&connection).await?;
        let p = Publisher::detached(
            Live::fixed(connection),
            crate::config::Config::DEFAULT_CONNECT_TIMEOUT,
        );
        *p.inner.channel.locked() = Some(channel);
        p.set_topology(topology);
        Ok(p)
    }

    /// A publisher whose connection the runner provides (and replaces after
    /// a reconnect) through `connection`.
    pub(crate) fn detached(connection: Live, wait: Duration) -> Self {
        Publisher {
            inner: Arc::new(Inner {
                connection,
                channel: Mutex::new(None),
                topology: OnceLock::new(),
                delay_buckets: Default::default(),
                wait,
            }),
        }
    }

    pub(crate) fn set_topology(&self, topology: Topology) {
        let _ = self.inner.topology.set(topology);
    }

    /// The topology, once set.
    pub(super) fn topology(&self) -> Option<&Topology> {
        self.inner.topology.get()
    }

    /// The open connection, waiting up to `wait` for one.
    pub(super) async fn connection(&self, target: &str) -> Result<Arc<Connection>, PublishError> {
        match tokio::time::timeout(self.inner.wait, self.inner.connection.wait()).await {
            Ok(Some(c)) => Ok(c),
            _ => Err(PublishError::transport(
                target,
                format!(
                    "the publishing connection is not open (not started yet, reconnecting, or closed); waited {:?}",
                    self.inner.wait
                ),
            )),
        }
    }

    /// The open connection, once not blocked (for the delay buckets'
    /// declarations).
    pub(super) async fn open_connection(
        &self,
        target: &str,
    ) -> Result<Arc<Connection>, PublishError> {
        let conn = self.connection(target).await?;
        self.unblocked(&conn, target).await?;
        Ok(conn)
    }

    /// The connection cell and the wait, for a client that rides the
    /// publishing connection.
    pub(crate) fn connection_watch(&self) -> (Live, Duration) {
        (self.inner.connection.clone(), self.inner.wait)
    }

    pub(super) fn delay_buckets(&self) -> &Declared {
        &self.inner.delay_buckets
    }

    /// Waits (within `wait`) while the broker blocks `conn`. Checked before
    /// sending: lapin writes no frame on a blocked connection, and a publish
    /// that timed out while blocked would still go out after unblock (a
    /// duplicate). So a publish is only sent once the connection is not
    /// blocked.
    async fn unblocked(&self, conn: &Connection, target: &str) -> Result<(), PublishError> {
        if !conn.status().blocked() {
            return Ok(());
        }
        // The listener first, then the status: an unblock in between is
        // not missed.
        let mut events = conn.events_listener();
        if !conn.status().blocked() {
            return Ok(());
        }
        let unblocked = async {
            while let Some(ev) = events.next().await {
                if matches!(ev, Event::ConnectionUnblocked) || !conn.status().blocked() {
                    return;
                }
                if !conn.status().connected() {
                    // lapin hands each event to one listener: this one may
                    // have taken the loss from the supervisor's.
                    self.inner.connection.suspect();
                }
            }
        };
        if tokio::time::timeout(self.inner.wait, unblocked)
            .await
            .is_ok()
            && !conn.status().blocked()
        {
            return Ok(());
        }
        Err(PublishError::Blocked {
            queue: target.to_owned(),
            message: format!(
                "the broker has blocked the publishing connection (a memory or disk alarm) for more than {:?}; nothing was sent. Free memory or disk on the broker, or let the alarm clear",
                self.inner.wait
            ),
        })
    }

    async fn usable_channel(&self, conn: &Connection) -> Result<Channel, lapin::Error> {
        let current = self.inner.channel.locked().clone();
        if let Some(ch) = current {
            if ch.status().connected() {
                return Ok(ch);
            }
        }
        let fresh = confirm_channel(conn).await?;
        *self.inner.channel.locked() = Some(fresh.clone());
        Ok(fresh)
    }

    /// Publishes `body` to `exchange` with `routing_key`, mandatory, and
    /// waits for the confirm. Use `""` as the exchange to address a queue by
    /// name. Persistent unless `properties.delivery_mode` says otherwise.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: Properties,
    ) -> Result<(), PublishError> {
        self.publish_with_headers(exchange, routing_key, body, properties, &Headers::new())
            .await
    }

    /// As [`publish`](Self::publish), with headers.
    pub async fn publish_with_headers(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        mut properties: Properties,
        headers: &Headers,
    ) -> Result<(), PublishError> {
        if properties.delivery_mode.is_none() {
            properties.delivery_mode = Some(2);
        }
        let too_long =
            |e: TooLong| PublishError::transport_with_source(routing_key, e.to_string(), e);
        let mut props = try_properties_to_lapin(&properties, headers).map_err(too_long)?;
        if let Some(e) = &properties.expiration {
            props = props.with_expiration(short_string("expiration", e).map_err(too_long)?);
        }
        self.send(exchange, routing_key, body, props).await
    }

    /// Publishes `value` as JSON (`content_type: application/json`,
    /// persistent). For a message id, headers or other properties,
    /// [`publish_json_with`](Self::publish_json_with).
    pub async fn publish_json<T: serde::Serialize + ?Sized>(
        &self,
        exchange: &str,
        routing_key: &str,
        value: &T,
    ) -> Result<(), PublishError> {
        self.publish_json_with(exchange, routing_key, value, PublishOptions::new())
            .await
    }

    /// As [`publish`](Self::publish), with [`PublishOptions`]: a message id,
    /// headers and other properties. Persistent unless the options say
    /// [`transient`](PublishOptions::transient).
    pub async fn publish_with(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        options: PublishOptions,
    ) -> Result<(), PublishError> {
        let (properties, headers) = options.into_parts();
        self.publish_with_headers(exchange, routing_key, body, properties, &headers)
            .await
    }

    /// As [`publish_json`](Self::publish_json), with [`PublishOptions`]: a
    /// message id, headers and other properties. `content_type` is
    /// `application/json` unless the options set another.
    pub async fn publish_json_with<T: serde::Serialize + ?Sized>(
        &self,
        exchange: &str,
        routing_key: &str,
        value: &T,
        options: PublishOptions,
    ) -> Result<(), PublishError> {
        let body = serde_json::to_vec(value).map_err(|e| {
            PublishError::transport_with_source(
                routing_key,
                format!("the value could not be serialised as JSON: {e}"),
                e,
            )
        })?;
        let (mut properties, headers) = options.into_parts();
        if properties.content_type.is_none() {
            properties.content_type = Some("application/json".to_owned());
        }
        self.publish_with_headers(exchange, routing_key, &body, properties, &headers)
            .await
    }

    /// Publishes with lapin's own properties, as given (no persistent
    /// default).
    pub async fn publish_lapin(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        self.send(exchange, routing_key, body, properties).await
    }

    async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        self.send_with(exchange, routing_key, body, properties, true)
            .await
    }

    /// Publishes and waits for the confirm; `mandatory: false` only where
    /// a return would mean nothing (a reply to a direct reply-to address:
    /// before RabbitMQ 4.2 returned when its caller has gone, from 4.2 never).
    pub(crate) async fn send_with(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<(), PublishError> {
        self.send_then(exchange, routing_key, body, properties, mandatory, || ())
            .await
    }

    /// [`send_with`](Self::send_with), calling `queued` once the message is
    /// sent on the channel, before its confirm is awaited.
    pub(super) async fn send_then(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
        queued: impl FnOnce(),
    ) -> Result<(), PublishError> {
        let target = if exchange.is_empty() {
            routing_key.to_owned()
        } else {
            format!("{exchange}/{routing_key}")
        };
        let transport =
            |e: lapin::Error| PublishError::transport_with_source(&*target, e.to_string(), e);
        let too_long = |e: TooLong| PublishError::transport_with_source(&*target, e.to_string(), e);
        let exchange = short_string("exchange name", exchange).map_err(too_long)?;
        let routing_key = short_string("routing key", routing_key).map_err(too_long)?;
        let properties = crate::telemetry::inject_properties(properties);
        let conn = self.connection(&target).await?;
        self.unblocked(&conn, &target).await?;
        let ch = self.usable_channel(&conn).await.map_err(transport)?;
        let confirm = ch
            .basic_publish(
                exchange,
                routing_key,
                BasicPublishOptions {
                    mandatory,
                    ..BasicPublishOptions::default()
                },
                body,
                properties,
            )
            .await
            .map_err(transport)?;
        queued();
        let confirm = confirm.await.map_err(transport)?;
        match confirm {
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
            Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) => {
                Err(PublishError::Unroutable { queue: target })
            }
            Confirmation::Nack(None) => {
                // Seen on RabbitMQ 3.10 after a quorum leader moved: every
                // publish on the old channel was nacked for a minute, while a
                // fresh channel was accepted at once. The next publish opens
                // a new one.
                self.close();
                Err(PublishError::Nacked { queue: target })
            }
        }
    }

    /// Forgets the publisher's channel (the runner closes the connection).
    pub(crate) fn close(&self) {
        self.inner.channel.locked().take();
    }

    /// Closes the publisher's channel (the drain, before it closes the
    /// publishing connection).
    pub(crate) async fn shut(&self) {
        let ch = self.inner.channel.locked().take();
        if let Some(ch) = ch {
            if ch.status().connected() {
                let _ = close_channel(&ch, "OK").await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_transport_failure_carries_its_underlying_error_as_its_source() {
        // A map with non-string keys is not JSON: serialising fails before
        // any connection is needed.
        let publisher = Publisher::detached(Live::default(), Duration::from_millis(10));
        let value: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let e = publisher.publish_json("", "q", &value).await.unwrap_err();
        assert!(matches!(e, PublishError::Transport { .. }), "{e:?}");
        let source = std::error::Error::source(&e).expect("the serialiser's error");
        assert!(
            source.downcast_ref::<serde_json::Error>().is_some(),
            "{source:?}"
        );
        // No connection: a transport failure without an underlying error.
        let e = publisher
            .publish("", "q", b"x", Properties::default())
            .await
            .unwrap_err();
        assert!(matches!(e, PublishError::Transport { .. }), "{e:?}");
        assert!(std::error::Error::source(&e).is_none());
        // The chain does not repeat the source's text.
        let chained = acemq_layers::display_chain(
            &PublishError::transport_with_source("q", "boom", std::io::Error::other("boom")),
            4096,
        );
        assert_eq!(chained, "publish to \"q\" failed: boom");
    }
}

//! Publishing with confirms on a channel of its own.
//!
//! The retry and dead-letter layers publish copies through it; your code can
//! publish its own messages with [`Publisher::publish`]. Every publish is
//! `mandatory` and waits for the broker's confirm: an unroutable message
//! comes back as [`PublishError::Unroutable`], never as success.

use std::sync::{Arc, Mutex};

use acemq_layers::{Outgoing, Publish, PublishError};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tracing::warn;

use crate::convert::properties_to_lapin;
use crate::topology::{declare_one, Topology};

/// A confirm-mode publisher. Cheap to clone; clones share the channel.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Mutex<Arc<Connection>>,
    channel: Mutex<Channel>,
    topology: Topology,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

async fn confirm_channel(conn: &Connection) -> lapin::Result<Channel> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(ch)
}

impl Publisher {
    /// Opens a confirm-mode channel on `connection`. `topology` is what the
    /// dead-letter layer re-declares from when its queue was deleted.
    pub async fn new(connection: Arc<Connection>, topology: Topology) -> lapin::Result<Self> {
        let channel = confirm_channel(&connection).await?;
        Ok(Publisher {
            inner: Arc::new(Inner {
                connection: Mutex::new(connection),
                channel: Mutex::new(channel),
                topology,
            }),
        })
    }

    fn connection(&self) -> Arc<Connection> {
        self.inner
            .connection
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Moves the publisher to a new connection (after a reconnect); its
    /// channel is reopened there on the next publish.
    pub(crate) fn set_connection(&self, connection: Arc<Connection>) {
        *self
            .inner
            .connection
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = connection;
    }

    fn channel(&self) -> Channel {
        self.inner
            .channel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn usable_channel(&self) -> Result<Channel, lapin::Error> {
        let ch = self.channel();
        if ch.status().connected() {
            return Ok(ch);
        }
        let fresh = confirm_channel(&self.connection()).await?;
        *self.inner.channel.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// Publishes `body` to `exchange` with `routing_key`, mandatory, and
    /// waits for the confirm. Use `""` as the exchange to address a queue by
    /// name.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let target = if exchange.is_empty() {
            routing_key.to_owned()
        } else {
            format!("{exchange}/{routing_key}")
        };
        let transport = |e: lapin::Error| PublishError::Transport {
            queue: target.clone(),
            message: e.to_string(),
        };
        let properties = crate::otel::inject_properties(properties);
        let ch = self.usable_channel().await.map_err(transport)?;
        let confirm = ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                properties,
            )
            .await
            .map_err(transport)?
            .await
            .map_err(transport)?;
        match confirm {
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
            Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) => {
                Err(PublishError::Unroutable { queue: target })
            }
            Confirmation::Nack(None) => Err(PublishError::Nacked { queue: target }),
        }
    }

    /// Closes the publisher's channel.
    pub async fn close(&self) {
        let ch = self.channel();
        if ch.status().connected() {
            let _ = ch.close(200, "OK".into()).await;
        }
    }
}

impl Publish for Publisher {
    async fn publish(&self, mut message: Outgoing<'_>) -> Result<(), PublishError> {
        crate::otel::inject_copy(&mut message.headers);
        let props = properties_to_lapin(message.delivery.properties(), &message.headers);
        Publisher::publish(self, "", message.queue, message.delivery.body(), props).await
    }

    async fn redeclare(&self, queue: &str) -> Result<(), PublishError> {
        let Some(decl) = self.inner.topology.get(queue) else {
            return Err(PublishError::Transport {
                queue: queue.to_owned(),
                message: "the topology does not name this queue".to_owned(),
            });
        };
        warn!(
            queue,
            "declaring the queue again: it was deleted while the consumer was running"
        );
        declare_one(&self.connection(), decl)
            .await
            .map_err(|e| PublishError::Transport {
                queue: queue.to_owned(),
                message: e.to_string(),
            })
    }
}

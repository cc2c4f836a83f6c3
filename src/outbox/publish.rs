//! What the relay publishes through: the [`OutboxPublish`] trait, its impl
//! for [`Publisher`], and [`StandalonePublisher`] for a relay outside `App`.

use std::future::Future;
use std::sync::Arc;

use acemq_layers::PublishError;

use super::message::OutboxRecord;
use crate::connection::{close_connection, connect};
use crate::topology::Topology;
use crate::Publisher;

/// Publishes one outbox record with a publisher confirm, `mandatory` set.
///
/// `Ok` means the broker confirmed it; [`PublishError::Unroutable`] marks
/// the row failed (not retried); any other error leaves the row pending for
/// the next attempt.
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
pub trait OutboxPublish: Send + Sync + 'static {
    /// Publishes `record` and waits for the broker's confirm.
    fn publish(
        &self,
        record: &OutboxRecord,
    ) -> impl Future<Output = Result<(), PublishError>> + Send;
}

// The one place the relay meets `Publisher`: adapt here when its signature
// changes.
impl OutboxPublish for Publisher {
    async fn publish(&self, record: &OutboxRecord) -> Result<(), PublishError> {
        self.publish_with_headers(
            &record.exchange,
            &record.routing_key,
            record.body(),
            record.properties.clone(),
            &record.headers,
        )
        .await
    }
}

impl<P: OutboxPublish> OutboxPublish for Arc<P> {
    fn publish(
        &self,
        record: &OutboxRecord,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        (**self).publish(record)
    }
}

/// A publisher with a connection of its own, opened on first use and opened
/// again after a transport failure: for a relay that runs without an
/// [`App`](crate::App) (a separate relay process, tests).
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
pub struct StandalonePublisher {
    addr: String,
    name: String,
    current: tokio::sync::Mutex<Option<(Publisher, Arc<lapin::Connection>)>>,
}

impl std::fmt::Debug for StandalonePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandalonePublisher")
            .field("broker", &crate::connection::redact(&self.addr))
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl StandalonePublisher {
    /// Connects to `addr` when first needed, naming the connection `name`.
    pub fn new(addr: impl Into<String>, name: impl Into<String>) -> Self {
        StandalonePublisher {
            addr: addr.into(),
            name: name.into(),
            current: tokio::sync::Mutex::new(None),
        }
    }

    async fn publisher(&self) -> Result<(Publisher, Arc<lapin::Connection>), PublishError> {
        let mut current = self.current.lock().await;
        if let Some((p, conn)) = &*current {
            return Ok((p.clone(), conn.clone()));
        }
        let conn = connect(
            &self.addr,
            &self.name,
            crate::config::Config::DEFAULT_CONNECT_TIMEOUT,
        )
        .await
        .map_err(|e| PublishError::transport_with_source("(outbox relay)", e.to_string(), e))?;
        let conn = Arc::new(conn);
        let p = Publisher::new(conn.clone(), Topology::default())
            .await
            .map_err(|e| PublishError::transport_with_source("(outbox relay)", e.to_string(), e))?;
        *current = Some((p.clone(), conn.clone()));
        Ok((p, conn))
    }

    /// Closes the connection, if open.
    pub async fn close(&self) {
        if let Some((p, conn)) = self.current.lock().await.take() {
            p.close();
            let _ = close_connection(&conn, "OK").await;
        }
    }
}

impl OutboxPublish for StandalonePublisher {
    async fn publish(&self, record: &OutboxRecord) -> Result<(), PublishError> {
        let (p, used) = self.publisher().await?;
        let result = OutboxPublish::publish(&p, record).await;
        if let Err(PublishError::Transport { .. }) = &result {
            // Opened again on the next publish (unless another publish of
            // the batch already did).
            let mut current = self.current.lock().await;
            if current.as_ref().is_some_and(|(_, c)| Arc::ptr_eq(c, &used)) {
                *current = None;
                drop(current);
                let _ = close_connection(&used, "OK").await;
            }
        }
        result
    }
}

//! What the drain stops: the live connections and each queue's live
//! generation ([`Link`]), and the publishers outside handlers
//! ([`Background`]).

use crate::sync::Locked;
use std::future::Future;
use std::sync::{Arc, Mutex};

use acemq_layers::PauseHandle;
use lapin::{Channel, Connection};

use crate::amqp::connection::ConnectionRole;
use crate::consumer::QueueStats;

/// One queue's live generation: its channel and consumer, its gate and
/// its stats.
#[derive(Clone)]
pub(crate) struct QueueHandle {
    pub(crate) name: String,
    pub(crate) channel: Channel,
    pub(crate) consumer_tag: String,
    pub(crate) gate: PauseHandle,
    pub(crate) stats: Arc<QueueStats>,
}

/// The live connections and the consumers on them; the supervisor
/// replaces them after a loss. The drain reads them once, after it has
/// begun (under the lock, so no new generation can start after it).
pub(crate) struct Link {
    consume: Mutex<Option<Arc<Connection>>>,
    publish: Mutex<Option<Arc<Connection>>>,
    /// Each queue's live generation, by config index.
    pub(crate) queues: Mutex<Vec<Option<QueueHandle>>>,
}

impl Link {
    pub(crate) fn new(consume: Arc<Connection>, publish: Arc<Connection>, queues: usize) -> Self {
        Link {
            consume: Mutex::new(Some(consume)),
            publish: Mutex::new(Some(publish)),
            queues: Mutex::new(vec![None; queues]),
        }
    }

    pub(crate) fn connection(&self, role: ConnectionRole) -> &Mutex<Option<Arc<Connection>>> {
        match role {
            ConnectionRole::Consumer => &self.consume,
            ConnectionRole::Publisher => &self.publish,
        }
    }

    pub(super) fn current(&self, role: ConnectionRole) -> Option<Arc<Connection>> {
        self.connection(role).locked().clone()
    }

    pub(crate) fn queues(&self) -> Vec<QueueHandle> {
        self.queues.locked().iter().flatten().cloned().collect()
    }
}

/// Something that publishes outside handlers (a background task, the outbox
/// relay): stopped before the consumers drain, within the drain's deadline.
pub(crate) type Background =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

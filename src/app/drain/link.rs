//! What the drain stops: the live connections and each queue's live
//! generation ([`Link`]), and the publishers outside handlers
//! ([`Background`]).

use crate::sync::Locked;
use std::future::Future;
use std::sync::{Arc, Mutex};

use acemq_layers::PauseHandle;
use lapin::Channel;

use crate::connection::LiveConnections;
use crate::consumer::QueueStats;

/// One queue's live generation: its channel and consumer (a stream's has
/// none: its loop unsubscribes when intake stops), its gate and its stats.
#[derive(Clone)]
pub(crate) struct QueueHandle {
    pub(crate) name: String,
    pub(crate) channel: Option<Channel>,
    pub(crate) consumer_tag: String,
    pub(crate) gate: PauseHandle,
    pub(crate) stats: Arc<QueueStats>,
}

/// The live connections and the consumers on them; the supervisor
/// replaces them after a loss. The drain reads the queues once, after it
/// has begun (under the lock, so no new generation can start after it),
/// and the connections when it closes them.
pub(crate) struct Link {
    /// The live connection of each role (the cells the supervisor writes).
    pub(crate) connections: LiveConnections,
    /// Each queue's live generation, by config index.
    pub(crate) queues: Mutex<Vec<Option<QueueHandle>>>,
}

impl Link {
    pub(crate) fn new(connections: LiveConnections, queues: usize) -> Self {
        Link {
            connections,
            queues: Mutex::new(vec![None; queues]),
        }
    }

    pub(crate) fn queues(&self) -> Vec<QueueHandle> {
        self.queues.locked().iter().flatten().cloned().collect()
    }
}

/// Something that publishes outside handlers (a background task, the outbox
/// relay): finished once the handlers have, within the drain's deadline.
pub(crate) type Background =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

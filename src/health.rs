//! Readiness and health: what a load balancer and an operator read.
//!
//! Ready means connected and not shutting down; it turns false at the first
//! step of the drain. Wire it to a **readiness** probe, never to a liveness
//! probe: a draining instance is alive and finishing work, and restarting it
//! would kill exactly the handlers the drain is waiting for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use acemq_layers::{InFlightCounter, PauseHandle};
use serde::Serialize;

use crate::consumer::QueueStats;

/// A cloneable handle on the process's readiness and per-queue state.
#[derive(Clone, Debug, Default)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    connected: AtomicBool,
    draining: AtomicBool,
    in_flight: InFlightCounter,
    queues: RwLock<Vec<QueueEntry>>,
}

#[derive(Debug, Clone)]
struct QueueEntry {
    name: String,
    gate: PauseHandle,
    stats: Arc<QueueStats>,
}

/// A point-in-time view, serialisable as JSON for `/readyz`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthSnapshot {
    /// Connected and not shutting down.
    pub ready: bool,
    /// The connection to the broker is open.
    pub connected: bool,
    /// The drain has begun.
    pub draining: bool,
    /// Per queue.
    pub queues: Vec<QueueSnapshot>,
}

/// One queue's state.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueSnapshot {
    /// Queue name.
    pub name: String,
    /// Handlers running now.
    pub in_flight: usize,
    /// Deliveries held at the pause gate now.
    pub held: usize,
    /// Deliveries handed back to the broker unhandled so far.
    pub handed_back: usize,
    /// Handlers finished so far.
    pub handled: usize,
    /// Deliveries sent to a retry rung so far.
    pub retried: usize,
    /// Deliveries dead-lettered so far.
    pub dead_lettered: usize,
    /// The consumer is taking deliveries (false after the broker cancelled it).
    pub consuming: bool,
}

impl Health {
    /// A handle reporting not ready until the runner connects.
    pub fn new() -> Self {
        Health::default()
    }

    /// Connected and not shutting down.
    pub fn is_ready(&self) -> bool {
        self.inner.connected.load(Ordering::Acquire)
            && !self.inner.draining.load(Ordering::Acquire)
            && !self
                .inner
                .queues
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|q| q.stats.cancelled_by_broker.load(Ordering::Relaxed))
    }

    /// Whether the drain has begun.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }

    /// The per-queue in-flight counter the runner's stacks report to.
    pub fn in_flight(&self) -> &InFlightCounter {
        &self.inner.in_flight
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.inner.connected.store(connected, Ordering::Release);
    }

    pub(crate) fn set_draining(&self) {
        self.inner.draining.store(true, Ordering::Release);
    }

    pub(crate) fn add_queue(&self, name: &str, gate: PauseHandle, stats: Arc<QueueStats>) {
        self.inner
            .queues
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(QueueEntry {
                name: name.to_owned(),
                gate,
                stats,
            });
    }

    fn read_queues(&self) -> Vec<QueueEntry> {
        self.inner
            .queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The pause gates of every queue (pause or resume intake by hand).
    pub fn gates(&self) -> Vec<(String, PauseHandle)> {
        self.read_queues()
            .into_iter()
            .map(|q| (q.name, q.gate))
            .collect()
    }

    /// Sets the gauges `acemq.inflight` and `acemq.held` {queue} and
    /// `acemq.ready` from the current state (call it before rendering a
    /// metrics scrape).
    pub fn record_metrics(&self) {
        let snap = self.snapshot();
        metrics::gauge!("acemq.ready").set(if snap.ready { 1.0 } else { 0.0 });
        for q in &snap.queues {
            metrics::gauge!("acemq.inflight", "queue" => q.name.clone()).set(q.in_flight as f64);
            metrics::gauge!("acemq.held", "queue" => q.name.clone()).set(q.held as f64);
        }
    }

    /// The current state.
    pub fn snapshot(&self) -> HealthSnapshot {
        let queues = self
            .read_queues()
            .into_iter()
            .map(|q| QueueSnapshot {
                in_flight: self.inner.in_flight.get(&q.name),
                held: q.gate.held(),
                handed_back: q.stats.handed_back.load(Ordering::Relaxed),
                handled: q.stats.handled.load(Ordering::Relaxed),
                retried: q.stats.retried.load(Ordering::Relaxed),
                dead_lettered: q.stats.dead_lettered.load(Ordering::Relaxed),
                consuming: !q.stats.cancelled_by_broker.load(Ordering::Relaxed)
                    && !self.is_draining(),
                name: q.name,
            })
            .collect();
        HealthSnapshot {
            ready: self.is_ready(),
            connected: self.inner.connected.load(Ordering::Acquire),
            draining: self.is_draining(),
            queues,
        }
    }
}

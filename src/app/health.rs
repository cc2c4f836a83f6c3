//! Readiness and health: what a load balancer and an operator read.
//!
//! Ready means both connections (consuming and publishing) are open — the
//! live connection of each, as lapin reports it at the moment of the read —, every
//! queue has a live consumer, and the drain has not begun; it turns false at
//! the first step of the drain. A paused queue is still ready: a paused
//! instance is healthy, and its admin routes must stay reachable. Wire it to a **readiness** probe, never to a liveness
//! probe: a draining instance is alive and finishing work, and restarting it
//! would kill exactly the handlers the drain is waiting for.
//!
//! See the example on [`Health`].

use crate::sync::{Locked, RwLocked};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use acemq_layers::{InFlightCounter, PauseHandle};
use serde::Serialize;

use crate::connection::ConnectionRole;
use crate::connection::{Live, LiveConnections};
use crate::consumer::QueueStats;

/// A cloneable handle on the process's readiness and per-queue state.
///
/// Take it from [`App::health`](crate::App::health) before start (clone it
/// into an HTTP server or a handler); the queues join it when they start.
/// Pause and resume a queue by name; readiness is unchanged by a pause.
///
/// ```no_run
/// use acemq::{App, Config, Delivery};
/// use tower::service_fn;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let config = Config::from_path("examples/shop.yaml")?;
/// let app = App::new(config).consume(
///     "shop.orders",
///     service_fn(|_d: Delivery| async { Ok::<_, acemq::BoxError>(()) }),
/// );
/// let health = app.health();
/// let running = app.start().await?;
///
/// health.pause("shop.orders")?; // new deliveries wait at the gate
/// let snap = health.snapshot();
/// assert!(snap.queues[0].paused);
/// assert!(snap.ready, "a paused instance is still ready");
/// println!("{}", serde_json::to_string(&snap)?); // what `/readyz` answers
/// health.resume("shop.orders")?; // they go on, in order
///
/// // A name the process does not consume is an error, not a no-op.
/// assert!(health.pause("shop.typo").is_err());
/// running.run().await;
/// # Ok(()) }
/// ```
///
/// With the `axum` feature, `acemq::admin::router` serves all of this over
/// HTTP.
#[derive(Clone, Debug, Default)]
pub struct Health {
    inner: Arc<Inner>,
}

/// No queue by that name is consumed here.
///
/// ```
/// use acemq::health::UnknownQueue;
/// use acemq::Health;
///
/// let health = Health::new(); // no queue has joined it
/// assert_eq!(health.pause("shop.typo"), Err(UnknownQueue("shop.typo".into())));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no queue named {0:?} is consumed here")]
pub struct UnknownQueue(pub String);

#[derive(Debug, Default)]
struct Inner {
    /// Which broker address each connection answered on (redacted).
    brokers: std::sync::Mutex<[Option<String>; 2]>,
    /// The broker's product and version, read at start.
    broker_version: std::sync::Mutex<Option<String>>,
    /// The live connections, read here (whether each is open, whether the
    /// broker blocks the publishing one), written by the supervisor.
    connections: LiveConnections,
    draining: AtomicBool,
    /// Cancelled when the drain has ended.
    drained: tokio_util::sync::CancellationToken,
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
///
/// ```
/// use acemq::Health;
///
/// let snap = Health::new().snapshot(); // before the runner connects
/// assert!(!snap.ready && !snap.connected && !snap.draining);
/// assert!(snap.queues.is_empty());
/// let json = serde_json::to_value(&snap).unwrap(); // what `/readyz` answers
/// assert_eq!(json["ready"], false);
/// ```
///
/// With queues, see the example on [`Health`].
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthSnapshot {
    /// Both connections open, every queue consuming, not shutting down.
    pub ready: bool,
    /// The consumers' connection to the broker is open.
    pub connected: bool,
    /// The publishing connection is open.
    pub publisher_connected: bool,
    /// The broker address the consumers' connection answered on, without
    /// its user name or password (anyone may read `/readyz`): with several
    /// `addresses`, which node this is.
    pub broker: Option<String>,
    /// The same for the publishing connection.
    pub publisher_broker: Option<String>,
    /// The broker's product and version as its `connection.start` gave
    /// them at start (e.g. `RabbitMQ 4.3.6`); `None` when unknown (an
    /// `amqps://` address, a connection factory).
    pub broker_version: Option<String>,
    /// The broker has blocked the publishing connection (a resource alarm).
    pub publisher_blocked: bool,
    /// The drain has begun.
    pub draining: bool,
    /// Per queue.
    pub queues: Vec<QueueSnapshot>,
}

/// One queue's state.
///
/// Example: the one on [`Health`] reads `snapshot().queues[0].paused`; `examples/shop/main.rs` logs every queue's counters from it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueSnapshot {
    /// Queue name.
    pub name: String,
    /// Deliveries in flight now: handlers running, and deliveries
    /// *confirming* (their handler returned, their rung or dead-letter
    /// copy sent and its confirm awaited, their concurrency permit already free),
    /// so it can exceed the queue's `concurrency`.
    pub in_flight: usize,
    /// Deliveries held now: at the pause gate, and (a queue consumed in
    /// batches) in a batch being formed or waiting to run.
    pub held: usize,
    /// Deliveries handed back to the broker unhandled so far.
    pub handed_back: usize,
    /// Trips through the handler's stack finished so far, whatever their
    /// outcome: a delivery that goes through a retry rung and then succeeds
    /// counts twice, one dead-lettered counts too.
    pub handled: usize,
    /// Deliveries acknowledged as done so far: the handler returned `Ok`
    /// (`Verdict::Ack`). Rung hops, dead letters and hand-backs are not
    /// counted; a duplicate the inbox acknowledged without calling the
    /// handler is (and in `inbox_duplicates` too).
    pub completed: usize,
    /// Deliveries sent to a retry rung so far.
    pub retried: usize,
    /// Deliveries dead-lettered so far.
    pub dead_lettered: usize,
    /// The consumer is taking deliveries (false while it is recovered, and
    /// once the drain began).
    pub consuming: bool,
    /// Paused by an operator (held deliveries wait at the gate).
    pub paused: bool,
    /// The queue's circuit breaker: `closed` (also without a breaker),
    /// `open` (the gate holds every delivery for a cool-down) or
    /// `half_open` (one delivery goes through as a probe); see
    /// [`acemq_layers::breaker`].
    pub circuit: &'static str,
    /// Outcomes dropped because their channel was gone (orphans).
    pub orphaned: usize,
    /// Settle frames sent so far (`basic.ack`, with `multiple` or not,
    /// `basic.nack`, `basic.reject`): against [`handled`](Self::handled),
    /// how well acknowledgements coalesce (`ack_batch`).
    pub settle_frames: usize,
    /// Deliveries an inbox layer in this process recognised as already
    /// processed and acknowledged without calling the handler, so far
    /// ([`acemq_layers::inbox::duplicates`]; `acemq.inbox.duplicates`).
    pub inbox_duplicates: u64,
}

/// `addr` (one address, already redacted) without user name or password.
fn without_user(addr: &str) -> String {
    match url::Url::parse(addr) {
        Ok(mut u) if u.has_host() => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => "<unparseable AMQP address>".to_owned(),
    }
}

impl Health {
    /// A handle reporting not ready until the runner connects.
    pub fn new() -> Self {
        Health::default()
    }

    /// A handle reading `connections` (the cells an `App`'s supervisor
    /// writes).
    pub(crate) fn reading(connections: LiveConnections) -> Self {
        Health {
            inner: Arc::new(Inner {
                connections,
                ..Inner::default()
            }),
        }
    }

    /// The live connection of `role`.
    pub(crate) fn live(&self, role: ConnectionRole) -> &Live {
        self.inner.connections.get(role)
    }

    /// Both connections open, every queue consuming, not shutting down.
    pub fn is_ready(&self) -> bool {
        self.live(ConnectionRole::Consumer).is_connected()
            && self.live(ConnectionRole::Publisher).is_connected()
            && !self.inner.draining.load(Ordering::Acquire)
            && !self
                .inner
                .queues
                .read_locked()
                .iter()
                .any(|q| q.stats.down.load(Ordering::Acquire))
    }

    /// Whether the drain has begun.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }

    /// Resolves once the drain has ended: the handlers finished (or were
    /// cancelled and abandoned), the channels and connections closed, the
    /// report made — when [`Drain::run`](crate::Drain::run) (or
    /// [`Running::run`](crate::Running::run) and the other ways to drain)
    /// is about to return — or once start-up has failed
    /// ([`App::start`](crate::App::start) returned an error, so
    /// [`App::run`](crate::App::run) returns its exit code): whenever `run`
    /// returns, this has resolved. Never resolves for a handle not from an
    /// [`App`](crate::App).
    ///
    /// Made for the admin server, so that it answers through the drain
    /// (`/readyz` 503, pause and resume 409) and stops after it:
    ///
    /// ```no_run
    /// # async fn serve(app: acemq::App) -> std::process::ExitCode {
    /// let health = app.health();
    /// let admin = acemq::admin::router(health.clone());
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
    /// let server = tokio::spawn(acemq::admin::serve(listener, admin, health.drained()));
    /// let code = app.run().await;
    /// let _ = server.await; // ended with the drain, or with a failed start
    /// code
    /// # }
    /// ```
    pub fn drained(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.inner.drained.clone().cancelled_owned()
    }

    /// Whether the drain has ended (see [`drained`](Self::drained)).
    pub fn is_drained(&self) -> bool {
        self.inner.drained.is_cancelled()
    }

    /// The per-queue in-flight counter the runner's stacks report to.
    pub fn in_flight(&self) -> &InFlightCounter {
        &self.inner.in_flight
    }

    pub(crate) fn set_broker(&self, role: ConnectionRole, broker: Option<String>) {
        let i = match role {
            ConnectionRole::Consumer => 0,
            ConnectionRole::Publisher => 1,
        };
        self.inner.brokers.locked()[i] = broker.as_deref().map(without_user);
    }

    pub(crate) fn set_broker_version(&self, version: Option<String>) {
        *self.inner.broker_version.locked() = version;
    }

    pub(crate) fn set_draining(&self) {
        self.inner.draining.store(true, Ordering::Release);
    }

    pub(crate) fn set_drained(&self) {
        self.inner.drained.cancel();
    }

    pub(crate) fn add_queue(&self, name: &str, gate: PauseHandle, stats: Arc<QueueStats>) {
        self.inner.queues.write_locked().push(QueueEntry {
            name: name.to_owned(),
            gate,
            stats,
        });
    }

    fn read_queues(&self) -> Vec<QueueEntry> {
        self.inner.queues.read_locked().clone()
    }

    fn gate(&self, queue: &str) -> Result<PauseHandle, UnknownQueue> {
        self.inner
            .queues
            .read_locked()
            .iter()
            .find(|q| q.name == queue)
            .map(|q| q.gate.clone())
            .ok_or_else(|| UnknownQueue(queue.to_owned()))
    }

    /// Pauses `queue`: new deliveries are held before the handler (they keep
    /// their place and are not in flight) until [`resume`](Self::resume).
    /// Readiness is unchanged: a paused instance is healthy.
    pub fn pause(&self, queue: &str) -> Result<(), UnknownQueue> {
        self.gate(queue)?.pause();
        Ok(())
    }

    /// Resumes `queue`: held deliveries go on, in order. On an open or
    /// half-open circuit this also overrides the breaker: the circuit
    /// closes until it trips again.
    pub fn resume(&self, queue: &str) -> Result<(), UnknownQueue> {
        self.gate(queue)?.resume();
        Ok(())
    }

    /// Whether `queue` is paused by an operator (an open circuit is not
    /// this: see [`circuit`](Self::circuit)).
    pub fn is_paused(&self, queue: &str) -> Result<bool, UnknownQueue> {
        Ok(self.gate(queue)?.is_paused_by_operator())
    }

    /// The state of `queue`'s circuit breaker (closed without one).
    pub fn circuit(&self, queue: &str) -> Result<acemq_layers::Circuit, UnknownQueue> {
        Ok(self.gate(queue)?.circuit())
    }

    /// The names of the queues consumed here, in config order.
    pub fn queue_names(&self) -> Vec<String> {
        self.read_queues().into_iter().map(|q| q.name).collect()
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
                held: q.gate.held() + q.stats.batcher.get().map_or(0, |b| b.held()),
                handed_back: q.stats.handed_back.load(Ordering::Relaxed),
                handled: q.stats.handled.load(Ordering::Relaxed),
                completed: q.stats.completed.load(Ordering::Relaxed),
                retried: q.stats.retried.load(Ordering::Relaxed),
                dead_lettered: q.stats.dead_lettered.load(Ordering::Relaxed),
                consuming: !q.stats.down.load(Ordering::Acquire) && !self.is_draining(),
                paused: q.gate.is_paused_by_operator(),
                circuit: q.gate.circuit().as_str(),
                orphaned: q.stats.orphaned.load(Ordering::Relaxed),
                settle_frames: q.stats.settle_frames.load(Ordering::Relaxed),
                inbox_duplicates: acemq_layers::inbox::duplicates(&q.name),
                name: q.name,
            })
            .collect();
        // One lock, released here: a guard in a field of the literal below
        // would live to the end of it, and a second `lock()` deadlock.
        let [broker, publisher_broker] = self.inner.brokers.locked().clone();
        HealthSnapshot {
            ready: self.is_ready(),
            connected: self.live(ConnectionRole::Consumer).is_connected(),
            publisher_connected: self.live(ConnectionRole::Publisher).is_connected(),
            publisher_blocked: self.live(ConnectionRole::Publisher).is_blocked(),
            broker,
            publisher_broker,
            broker_version: self.inner.broker_version.locked().clone(),
            draining: self.is_draining(),
            queues,
        }
    }
}

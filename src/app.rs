//! The runner: connect, declare, consume, wait for a stop signal, drain.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use acemq_layers::{
    BoxError, CancelLayer, DeadLetterLayer, Delivery, InFlightLayer, PauseHandle, PauseLayer,
    RetryLayer,
};
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::Connection;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::{Service, ServiceBuilder};
use tracing::{error, info, warn};

use crate::config::{Config, ConfigError, QueueConfig};
use crate::connection::{amqp_addr_from_env, connect, redact, ConnectError};
use crate::consumer::{ConsumerLoop, QueueStats};
use crate::drain::{Drain, DrainReport, DrainTimeout, Link, QueueHandle};
use crate::health::Health;
use crate::publisher::Publisher;
use crate::topology::{Topology, TopologyError};

/// Exit code after a clean stop.
pub const EXIT_OK: u8 = 0;
/// Exit code when the drain deadline expired (EX_TEMPFAIL).
pub const EXIT_TEMPFAIL: u8 = 75;
/// Exit code for bad config (EX_CONFIG).
pub const EXIT_CONFIG: u8 = 78;
/// Exit code when the broker is unreachable at start (EX_UNAVAILABLE).
pub const EXIT_UNAVAILABLE: u8 = 69;

type LoopFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

struct StartCtx<'a> {
    queue: &'a QueueConfig,
    channel: lapin::Channel,
    consumer: lapin::Consumer,
    shared: &'a Shared,
    gate: PauseHandle,
    stats: Arc<QueueStats>,
}

type Starter = Box<dyn Fn(StartCtx<'_>) -> LoopFuture + Send + Sync>;

/// Why the runner could not start. No consumer was started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The config is invalid, or names a queue that has no handler (or the
    /// reverse); [`ConfigError::field`] names the offending field.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The broker could not be reached.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The topology could not be declared.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// A channel or consumer could not be opened.
    #[error("could not start consuming {queue:?}: {message}")]
    Consume {
        /// The queue.
        queue: String,
        /// What the broker said.
        message: String,
    },
}

impl StartError {
    /// The exit code for this failure (78 config — including an address
    /// that is not an `amqp://` URL — 69 broker unreachable).
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Config(_)
            | StartError::Connect(ConnectError::BadAddress { .. })
            | StartError::Topology(
                TopologyError::Conflict { .. } | TopologyError::ExchangeConflict { .. },
            ) => EXIT_CONFIG,
            _ => EXIT_UNAVAILABLE,
        }
    }
}

/// Builds and runs the consumers of a [`Config`].
///
/// ```no_run
/// use acemq::{App, Config, Delivery};
/// use tower::service_fn;
///
/// # async fn run() -> std::process::ExitCode {
/// let config = Config::from_path("examples/shop.yaml").expect("valid config");
/// App::new(config)
///     .consume("shop.orders", service_fn(|d: Delivery| async move {
///         println!("{} bytes", d.body().len());
///         Ok::<_, std::io::Error>(())
///     }))
///     .run()
///     .await
/// # }
/// ```
#[must_use]
pub struct App {
    config: Config,
    addr: Option<String>,
    name: String,
    starters: Vec<(String, Starter)>,
    health: Health,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field(
                "queues",
                &self.starters.iter().map(|(q, _)| q).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl App {
    /// A runner for `config`, connecting to `AMQP_ADDR` (or the local default).
    pub fn new(config: Config) -> Self {
        App {
            config,
            addr: None,
            name: "acemq".to_owned(),
            starters: Vec::new(),
            health: Health::new(),
        }
    }

    /// Connects to `addr` instead of `AMQP_ADDR`.
    pub fn amqp_addr(mut self, addr: impl Into<String>) -> Self {
        self.addr = Some(addr.into());
        self
    }

    /// The connection name shown by `rabbitmqctl list_connections`.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The health handle (readiness, per-queue counts). Clone it before `run`.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Consumes `queue` (named in the config) with `handler`. The runner puts
    /// the acemq layers around it: pause gate, in-flight, dead-letter, retry
    /// and cancellation (see `acemq_layers`' `# Order`).
    pub fn consume<H>(mut self, queue: &str, handler: H) -> Self
    where
        H: Service<Delivery> + Clone + Send + 'static,
        H::Error: Into<BoxError>,
        H::Future: Send + 'static,
        H::Response: acemq_layers::IntoOutcome + Send + 'static,
    {
        // The stack is built again for each connection (after a reconnect);
        // the mutex only makes the starter `Sync` without asking it of `H`.
        let handler = std::sync::Mutex::new(handler);
        let starter: Starter = Box::new(move |ctx: StartCtx<'_>| {
            let q = ctx.queue;
            let sh = ctx.shared;
            let handler = handler.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let service = ServiceBuilder::new()
                .layer(PauseLayer::new(ctx.gate.clone()))
                .layer(InFlightLayer::new(sh.health.in_flight().clone()))
                .layer(DeadLetterLayer::new(sh.publisher.clone()).enabled(q.dead_letter))
                .layer(acemq_layers::RedeliveryLimitLayer::new(q.max_redeliveries))
                .layer(RetryLayer::new(
                    q.policy(),
                    sh.publisher.clone(),
                    sh.draining.clone(),
                ))
                .layer(CancelLayer::new(sh.root.clone()).abandon_after(sh.config.abandon_after))
                .service(handler);
            let lp = ConsumerLoop {
                queue: Arc::from(q.name.as_str()),
                channel: ctx.channel,
                consumer: ctx.consumer,
                service,
                concurrency: q.concurrency,
                policy: sh.config.prefetch_policy,
                dead_letter: q.dead_letter,
                intake: sh.intake.clone(),
                stats: ctx.stats,
                ended: sh.ended.clone(),
            };
            Box::pin(lp.run())
        });
        self.starters.push((queue.to_owned(), starter));
        self
    }

    /// Connects, declares the topology, then starts the consumers (never
    /// before the topology is declared). Returns the running handle whose
    /// [`Running::drain`] stops it.
    pub async fn start(self) -> Result<Running, StartError> {
        let App {
            config,
            addr,
            name,
            starters,
            health,
        } = self;
        config.validate()?;
        config.check_handlers(starters.iter().map(|(q, _)| q.as_str()))?;
        // A queue with `consume: false` is declared (the topology is built
        // from `declared`) and not consumed.
        let declared = config.clone();
        let mut config = config;
        config.queues.retain(|q| q.consume);
        if let Some(w) = config.host_deadline_warning() {
            warn!("{w}");
        }
        let addr = addr.unwrap_or_else(amqp_addr_from_env);
        info!(broker = %redact(&addr), "connecting");
        let connection = Arc::new(connect(&addr, &name, config.connect_timeout).await?);
        let topology = Topology::from_config(&declared);
        if let Err(e) = topology.declare(&connection).await {
            let _ = connection.close(200, "OK".into()).await;
            return Err(e.into());
        }
        info!(
            queues = topology.decls().len(),
            "topology declared: {}",
            topology
                .decls()
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let publisher = Publisher::new(connection.clone(), topology.clone())
            .await
            .map_err(|e| StartError::Consume {
                queue: "(publisher)".to_owned(),
                message: e.to_string(),
            })?;
        // Starters in config order, with one gate and one stats per queue
        // that outlive reconnects.
        let mut ordered = Vec::new();
        let mut starters = starters;
        for q in &config.queues {
            let idx = starters
                .iter()
                .position(|(n, _)| n == &q.name)
                .expect("checked above");
            let (_, starter) = starters.swap_remove(idx);
            let gate = PauseHandle::new();
            let stats = Arc::new(QueueStats::default());
            health.add_queue(&q.name, gate.clone(), stats.clone());
            ordered.push(QueueSlot {
                starter,
                gate,
                stats,
            });
        }
        let shared = Arc::new(Shared {
            link: Arc::new(Link::new(connection.clone())),
            config,
            addr,
            name,
            slots: ordered,
            health: health.clone(),
            publisher: publisher.clone(),
            topology,
            intake: CancellationToken::new(),
            draining: CancellationToken::new(),
            root: CancellationToken::new(),
            tracker: TaskTracker::new(),
            ended: Arc::new(Notify::new()),
        });
        // Consumers start only now, after the topology is declared.
        let generation = match start_consumers(&shared, &connection).await {
            Ok(g) => g,
            Err(e) => {
                let _ = connection.close(200, "OK".into()).await;
                return Err(e);
            }
        };
        install(&shared, connection, generation);
        tokio::spawn(supervise(shared.clone()));
        let drain = Drain {
            health: health.clone(),
            in_flight: health.in_flight().clone(),
            link: shared.link.clone(),
            intake: shared.intake.clone(),
            draining: shared.draining.clone(),
            root: shared.root.clone(),
            tracker: shared.tracker.clone(),
            publisher: publisher.clone(),
            shutdown_timeout: shared.config.shutdown_timeout,
            abandon_after: shared.config.abandon_after,
        };
        Ok(Running {
            drain,
            publisher,
            health,
        })
    }

    /// Runs until SIGTERM or SIGINT, then drains; see [`Running::run`].
    pub async fn run(self) -> ExitCode {
        // Installed before connecting, so a SIGTERM during start-up is a
        // clean stop too.
        let signals = Signals::install();
        match self.start().await {
            Ok(running) => running.run_with(signals).await,
            Err(e) => start_failed(&e),
        }
    }

    /// Runs until `stop` resolves, then drains (for programs that own their
    /// signals: tests, embedders).
    pub async fn run_until(self, stop: impl Future<Output = ()>) -> ExitCode {
        match self.start().await {
            Ok(running) => running.run_until(stop).await,
            Err(e) => start_failed(&e),
        }
    }
}

struct QueueSlot {
    starter: Starter,
    gate: PauseHandle,
    stats: Arc<QueueStats>,
}

/// What every generation of consumers (one per connection) is built from.
struct Shared {
    link: Arc<Link>,
    config: Config,
    addr: String,
    name: String,
    slots: Vec<QueueSlot>,
    health: Health,
    publisher: Publisher,
    topology: Topology,
    intake: CancellationToken,
    draining: CancellationToken,
    root: CancellationToken,
    tracker: TaskTracker,
    ended: Arc<Notify>,
}

/// Opens a channel and a consumer per queue on `connection` and builds each
/// queue's loop, without starting it.
async fn start_consumers(
    shared: &Shared,
    connection: &Connection,
) -> Result<Vec<(QueueHandle, LoopFuture)>, StartError> {
    let mut out = Vec::new();
    for (q, slot) in shared.config.queues.iter().zip(&shared.slots) {
        let consume_err = |e: lapin::Error| StartError::Consume {
            queue: q.name.clone(),
            message: e.to_string(),
        };
        let channel = connection.create_channel().await.map_err(consume_err)?;
        channel
            .basic_qos(q.prefetch, BasicQosOptions::default())
            .await
            .map_err(consume_err)?;
        let tag = format!("{}-{}", shared.name, q.name);
        let consumer = channel
            .basic_consume(
                q.name.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(consume_err)?;
        let fut = (slot.starter)(StartCtx {
            queue: q,
            channel: channel.clone(),
            consumer,
            shared,
            gate: slot.gate.clone(),
            stats: slot.stats.clone(),
        });
        out.push((
            QueueHandle {
                name: q.name.clone(),
                channel,
                consumer_tag: tag,
                gate: slot.gate.clone(),
                stats: slot.stats.clone(),
            },
            fut,
        ));
    }
    Ok(out)
}

/// Makes a generation the live one and starts its loops — unless the drain
/// has begun, in which case the new connection is closed instead. Returns
/// whether it was installed.
fn install(
    shared: &Shared,
    connection: Arc<Connection>,
    generation: Vec<(QueueHandle, LoopFuture)>,
) -> bool {
    let mut queues = shared.link.queues.lock().unwrap_or_else(|p| p.into_inner());
    if shared.draining.is_cancelled() {
        drop(queues);
        tokio::spawn(async move {
            let _ = connection.close(200, "OK".into()).await;
        });
        return false;
    }
    let mut handles = Vec::new();
    for (handle, fut) in generation {
        // Loops of the old connection stop speaking for this queue.
        handle
            .stats
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        handle
            .stats
            .cancelled_by_broker
            .store(false, std::sync::atomic::Ordering::Relaxed);
        shared.tracker.spawn(fut);
        info!(queue = %handle.name, "consuming");
        handles.push(handle);
    }
    *queues = handles;
    shared.publisher.set_connection(connection.clone());
    *shared
        .link
        .connection
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = connection;
    shared.health.set_connected(true);
    true
}

/// The first reconnect delay; it doubles up to [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(200);
/// The cap on the reconnect delay.
const RECONNECT_MAX: Duration = Duration::from_secs(10);

/// Watches the connection; when it is lost (the broker closed it, restarted,
/// or the network failed), reconnects with capped exponential backoff,
/// declares the topology again and starts a new generation of consumers.
/// Handlers of the old generation finish; their settles on the dead channel
/// are skipped (the broker has requeued those deliveries). Stops when the
/// drain begins, also in the middle of an outage.
async fn supervise(shared: Arc<Shared>) {
    loop {
        let connection = shared.link.connection();
        let mut events: std::pin::Pin<Box<dyn futures::Stream<Item = lapin::Event> + Send>> =
            Box::pin(connection.events_listener());
        // Wait until the connection is gone.
        loop {
            if !connection.status().connected() {
                break;
            }
            tokio::select! {
                () = shared.draining.cancelled() => return,
                () = shared.ended.notified() => {}
                ev = events.next() => {
                    if ev.is_none() {
                        // No more events; the consumers' streams still tell.
                        events = Box::pin(futures::stream::pending());
                    }
                }
            }
        }
        shared.health.set_connected(false);
        warn!("the connection to the broker was lost; reconnecting with backoff (readiness is off until then)");
        let mut delay = RECONNECT_MIN;
        loop {
            let attempt = async {
                let connection = Arc::new(
                    connect(&shared.addr, &shared.name, shared.config.connect_timeout).await?,
                );
                shared.topology.declare(&connection).await?;
                let generation = start_consumers(&shared, &connection).await?;
                Ok::<_, StartError>((connection, generation))
            };
            let result = tokio::select! {
                () = shared.draining.cancelled() => return,
                r = attempt => r,
            };
            match result {
                Ok((connection, generation)) => {
                    if install(&shared, connection, generation) {
                        info!("reconnected to the broker; topology declared again and consumers resumed");
                    }
                    break;
                }
                Err(e) => warn!("reconnect failed: {e}; next attempt in {delay:?}"),
            }
            tokio::select! {
                () = shared.draining.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(RECONNECT_MAX);
        }
    }
}

/// Logs a start failure, prints its one-line reason on stderr and returns
/// its exit code (78 config, 69 broker unreachable).
pub fn start_failed(e: &StartError) -> ExitCode {
    error!("{e}");
    eprintln!("acemq: {e}");
    ExitCode::from(e.exit_code())
}

/// Logs a drain's outcome (the report, or the timeout on stderr too) and
/// returns the exit code: 0 clean, 75 when the deadline expired.
pub fn finish(result: Result<DrainReport, DrainTimeout>) -> ExitCode {
    match result {
        Ok(report) => {
            info!("{report}");
            ExitCode::from(EXIT_OK)
        }
        Err(timeout) => {
            error!("{timeout}");
            eprintln!("acemq: {timeout}");
            ExitCode::from(EXIT_TEMPFAIL)
        }
    }
}

/// SIGTERM and SIGINT handlers that only push to a channel; the drain runs
/// on the task that waits on them ([`Running::run_with`]).
#[derive(Debug)]
pub struct Signals {
    rx: mpsc::UnboundedReceiver<&'static str>,
}

impl Signals {
    /// Installs the handlers (needs a tokio runtime). From now on SIGTERM and
    /// SIGINT no longer end the process by themselves.
    pub fn install() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        spawn_signal_listener(tx);
        Signals { rx }
    }
}

fn spawn_signal_listener(tx: mpsc::UnboundedSender<&'static str>) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                error!("could not install the SIGTERM/SIGINT handlers");
                return;
            };
            loop {
                let sig = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
                if tx.send(sig).is_err() {
                    return;
                }
            }
        }
        #[cfg(not(unix))]
        loop {
            if tokio::signal::ctrl_c().await.is_err() || tx.send("ctrl-c").is_err() {
                return;
            }
        }
    });
}

/// A started runner: consumers running, topology declared.
#[derive(Debug)]
#[must_use = "drop it and the consumers run until the process exits; call drain() to stop"]
pub struct Running {
    drain: Drain,
    publisher: Publisher,
    health: Health,
}

impl Running {
    /// Waits for SIGTERM or SIGINT, then drains and returns the exit code:
    /// 0 clean, 75 when the deadline expired. A second signal during the
    /// drain skips straight to cancellation and abandon. The signal handlers
    /// only push to a channel; the drain runs on the task that called `run`.
    pub async fn run(self) -> ExitCode {
        self.run_with(Signals::install()).await
    }

    /// As [`Running::run`], with signal handlers installed earlier (before
    /// [`App::start`], so that a signal during start-up is not lost).
    pub async fn run_with(self, signals: Signals) -> ExitCode {
        let Signals { mut rx } = signals;
        let Some(sig) = rx.recv().await else {
            return finish(self.drain().await);
        };
        info!(signal = sig, "stop signal received; draining");
        let hurry = async move {
            if let Some(sig) = rx.recv().await {
                warn!(
                    signal = sig,
                    "second stop signal during the drain: skipping to cancellation and abandon"
                );
            } else {
                std::future::pending::<()>().await;
            }
        };
        finish(self.drain_with(hurry).await)
    }

    /// Waits for `stop`, then drains and returns the exit code.
    pub async fn run_until(self, stop: impl Future<Output = ()>) -> ExitCode {
        stop.await;
        finish(self.drain().await)
    }

    /// The confirm-mode publisher on the runner's connection.
    pub fn publisher(&self) -> Publisher {
        self.publisher.clone()
    }

    /// The health handle.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Reports not ready at once (the drain does this as its first step;
    /// call it earlier to stop an HTTP server before the consumers).
    pub fn stop_readiness(&self) {
        self.health.set_draining();
    }

    /// Drains and closes everything.
    pub async fn drain(self) -> Result<DrainReport, DrainTimeout> {
        self.drain.run(std::future::pending()).await
    }

    /// Drains; `hurry` resolving skips to cancellation and abandon.
    pub async fn drain_with(
        self,
        hurry: impl Future<Output = ()>,
    ) -> Result<DrainReport, DrainTimeout> {
        self.drain.run(hurry).await
    }

    /// The drain, to run yourself.
    pub fn into_drain(self) -> Drain {
        self.drain
    }
}

//! The runner: connect, declare, consume, wait for a stop signal, drain.
//!
//! - [`App`] is the builder;
//! - `supervisor` keeps the two connections and every queue's generations
//!   alive;
//! - `signals` turns SIGTERM, SIGINT, SIGHUP and SIGQUIT into a stop at
//!   every phase;
//! - `exit` holds the exit codes and their one-line reasons.

pub mod drain;
mod exit;
pub mod health;
mod signals;
mod supervisor;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use acemq_layers::{BoxError, Classify, Delivery, Lifeline, PauseHandle};
use tokio::sync::{oneshot, watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::{Layer, Service};
use tracing::{info, warn};

use crate::amqp::connection::{
    connect_any_via, redact, resolve_addresses, ConnectError, ConnectOptions, ConnectRequest,
    ConnectionFactory, ConnectionRole, Via,
};
use crate::amqp::publisher::Publisher;
use crate::amqp::topology::{Topology, TopologyError};
use crate::app::drain::{Drain, DrainReport, DrainTimeout, Link};
use crate::app::health::Health;
use crate::config::{Config, ConfigError, QueueConfig};
use crate::consumer::{ConsumerLoop, End, QueueStats};
use crate::settle::ledger::Bounds;
use crate::stack::{Outcome, QueueStack};

pub use exit::{finish, start_failed, EXIT_CONFIG, EXIT_OK, EXIT_TEMPFAIL, EXIT_UNAVAILABLE};
pub use signals::Signals;
use supervisor::{Conn, QueueSlot, Shared};

type LoopFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

struct StartCtx<'a> {
    queue: &'a QueueConfig,
    channel: lapin::Channel,
    consumer: lapin::Consumer,
    shared: &'a Shared,
    gate: PauseHandle,
    stats: Arc<QueueStats>,
    slots: Arc<Semaphore>,
    lifeline: Lifeline,
    cancel: CancellationToken,
    ended: oneshot::Sender<End>,
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
    /// The publishing connection or its channel could not be opened.
    #[error("could not open the publishing connection: {message}")]
    Publisher {
        /// What the broker said.
        message: String,
    },
    /// A stop signal arrived during start-up: start-up ended at once, before
    /// any message was taken (exit 0).
    #[error("stopped by {signal} during start-up")]
    Stopped {
        /// The signal's name.
        signal: &'static str,
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
            StartError::Stopped { .. } => EXIT_OK,
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
    factory: Option<ConnectionFactory>,
    starters: Vec<(String, Starter)>,
    /// Retry policies given in code, by queue: they replace the config's.
    policies: Vec<(String, acemq_layers::RetryPolicy)>,
    health: Health,
    publisher: Publisher,
    publish_tx: watch::Sender<Option<Arc<lapin::Connection>>>,
    /// Started after the topology is declared, stopped before the drain.
    background: Vec<BackgroundStart>,
}

/// Starts a publisher outside handlers and returns how to stop it.
type BackgroundStart = Box<dyn FnOnce(Publisher) -> crate::app::drain::Background + Send>;

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
        let (publish_tx, publish_rx) = watch::channel(None);
        let publisher = Publisher::detached(publish_rx, config.connect_timeout);
        App {
            config,
            addr: None,
            name: "acemq".to_owned(),
            factory: None,
            starters: Vec::new(),
            policies: Vec::new(),
            health: Health::new(),
            publisher,
            publish_tx,
            background: Vec::new(),
        }
    }

    /// Runs the transactional outbox's relay (feature `postgres`) on this
    /// runner's publishing connection: it starts once the topology is
    /// declared and stops first in the drain (before the consumers), leaving
    /// rows it has not published for the next start.
    #[cfg(feature = "postgres")]
    pub fn outbox(
        mut self,
        pool: deadpool_postgres::Pool,
        config: crate::outbox::RelayConfig,
    ) -> Self {
        self.background.push(Box::new(move |publisher: Publisher| {
            let handle = crate::outbox::Relay::new(pool, publisher)
                .config(config)
                .spawn();
            Box::new(move || {
                Box::pin(async move {
                    let stats = handle.stop().await;
                    info!(?stats, "outbox relay stopped before the drain");
                }) as Pin<Box<dyn Future<Output = ()> + Send>>
            }) as crate::app::drain::Background
        }));
        self
    }

    /// Connects to `addr` instead of `AMQP_ADDR`.
    pub fn amqp_addr(mut self, addr: impl Into<String>) -> Self {
        self.addr = Some(addr.into());
        self
    }

    /// The connection name shown by `rabbitmqctl list_connections`
    /// (the publishing connection adds ` (publisher)`). Make it unique per
    /// process (e.g. `my-service@host:pid`) so an operator can tell
    /// instances apart.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Opens every connection through `factory` instead of acemq's own
    /// connect: both connections (consumers', publisher's), at start and at
    /// every reconnect after a loss (the supervisor reopens them, so this is
    /// a factory, not a connection). It is given a [`ConnectRequest`] with
    /// what acemq would have used — the address with the heartbeat applied
    /// (it holds the password: log [`ConnectRequest::redacted_uri`]), the
    /// connection name, the [`ConnectionRole`], acemq's
    /// `ConnectionProperties` and the TLS settings of the config — and
    /// returns the open connection. acemq still tries the addresses in
    /// shuffled order (one call per address tried), bounds each call by
    /// `connect_timeout`, and turns its error into a [`ConnectError`] as for
    /// its own connect.
    ///
    /// Write one with [`acemq::lapin`](crate::lapin) (no lapin dependency of
    /// your own needed, nor its default TLS):
    ///
    /// ```no_run
    /// use acemq::connection::ConnectRequest;
    /// use acemq::lapin::types::LongString;
    /// use acemq::{App, Config};
    ///
    /// # fn build(config: Config) -> App {
    /// App::new(config).connection_factory(|request: ConnectRequest| async move {
    ///     tracing::info!(broker = %request.redacted_uri(), role = request.role().as_str(), "connecting");
    ///     let properties = request
    ///         .properties()
    ///         .clone()
    ///         .with_client_property("deployment".into(), LongString::from("blue"));
    ///     // Or build it yourself, e.g. on a runtime of yours:
    ///     // acemq::lapin::ConnectionBuilder::new_with_runtime(runtime)
    ///     //     .with_uri_str(request.uri().to_owned())
    ///     //     .with_properties(properties)
    ///     //     .with_tls_config(request.tls_config().clone())
    ///     //     .connect()
    ///     request.with_properties(properties).connect().await
    /// })
    /// # }
    /// ```
    pub fn connection_factory<F, Fut>(mut self, factory: F) -> Self
    where
        F: Fn(ConnectRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<lapin::Connection, lapin::Error>> + Send + 'static,
    {
        self.factory = Some(ConnectionFactory::new(factory));
        self
    }

    /// The health handle (readiness, per-queue counts, pause and resume).
    /// Clone it before `run`.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// The publisher handle, usable before `start`: clone it into your
    /// handlers. It publishes on a connection of its own (never the
    /// consumers'), which `start` opens; a publish before that, or during a
    /// reconnect, waits up to `connect_timeout` for it, then fails with a
    /// clear error.
    pub fn publisher(&self) -> Publisher {
        self.publisher.clone()
    }

    /// Consumes `queue` (named in the config) with `handler`. The runner puts
    /// the acemq layers around it: pause gate, in-flight, dead-letter, retry
    /// and cancellation (see `acemq_layers`' `# Order`).
    ///
    /// # Clone
    ///
    /// The handler must be `Clone`: the retry layer clones the service for
    /// every attempt, and the stack is built again for every generation (a
    /// new channel after a reconnect or a recovery). A middleware that is not
    /// `Clone` (`tower::limit::RateLimit`, say) can be shared by wrapping it
    /// in `tower::buffer::Buffer`, whose handle is.
    pub fn consume<H>(self, queue: &str, handler: H) -> Self
    where
        H: Service<Delivery> + Clone + Send + 'static,
        H::Error: Into<BoxError>,
        H::Future: Send + 'static,
        H::Response: acemq_layers::IntoVerdict + Send + 'static,
    {
        self.consume_with(queue, QueueStack::new(), handler)
    }

    /// As [`consume`](Self::consume), with your own layers outside the
    /// acemq stack and around the handler, and the queue's own classifier
    /// and retry policy: see [`QueueStack`] and the [`stack`](crate::stack)
    /// module for where each kind of layer belongs.
    pub fn consume_with<H, O, I, C>(
        mut self,
        queue: &str,
        stack: QueueStack<O, I, C>,
        handler: H,
    ) -> Self
    where
        H: Send + 'static + Clone,
        C: Classify + Clone,
        O: Send + 'static,
        I: Send + 'static,
        I: Layer<H>,
        I::Service: Service<Delivery> + Clone + Send + 'static,
        <I::Service as Service<Delivery>>::Error: Into<BoxError>,
        <I::Service as Service<Delivery>>::Future: Send + 'static,
        <I::Service as Service<Delivery>>::Response: acemq_layers::IntoVerdict + Send + 'static,
        O: Layer<
            tower::util::MapResult<
                crate::stack::Attempts<H, I, Publisher, C>,
                crate::stack::Sealer,
            >,
        >,
        O::Service: Service<Delivery, Response = Outcome> + Clone + Send + 'static,
        BoxError: From<<O::Service as Service<Delivery>>::Error>,
        <O::Service as Service<Delivery>>::Future: Send + 'static,
    {
        if let Some(policy) = &stack.policy {
            self.policies.push((queue.to_owned(), policy.clone()));
        }
        // The stack is built again for each generation; the mutex only makes
        // the starter `Sync` without asking it of the handler or the layers.
        let parts = std::sync::Mutex::new((handler, stack));
        let starter: Starter = Box::new(move |ctx: StartCtx<'_>| {
            let q = ctx.queue;
            let sh = ctx.shared;
            let guard = parts.lock().unwrap_or_else(|p| p.into_inner());
            let (handler, stack) = &*guard;
            let service = crate::stack::build(
                crate::stack::Parts {
                    queue: q,
                    gate: ctx.gate.clone(),
                    in_flight: sh.health.in_flight().clone(),
                    publisher: sh.publisher.clone(),
                    draining: sh.draining.clone(),
                    // The supervisor (the one maker of a `StartCtx`) puts
                    // the handlers' token on every generation's lifeline.
                    cancel: ctx
                        .lifeline
                        .cancellation()
                        .expect("a generation's lifeline carries its handlers' token")
                        .clone(),
                    abandon_after: sh.config.abandon_after,
                    woken_by_loop: true,
                },
                stack,
                handler.clone(),
            );
            drop(guard);
            let lp = ConsumerLoop {
                queue: Arc::from(q.name.as_str()),
                channel: ctx.channel,
                consumer: ctx.consumer,
                service,
                slots: ctx.slots,
                policy: sh.config.prefetch_policy,
                dead_letter: q.dead_letter,
                bounds: ack_bounds(q),
                intake: sh.intake.clone(),
                stats: ctx.stats,
                lifeline: ctx.lifeline,
                cancel: ctx.cancel,
                ended: ctx.ended,
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
        self.start_until(std::future::pending()).await
    }

    /// As [`start`](Self::start), ending start-up at once (with
    /// [`StartError::Stopped`], everything opened closed again) when `stop`
    /// resolves first — during connect, topology or opening the consumers.
    pub async fn start_until(
        self,
        stop: impl Future<Output = &'static str>,
    ) -> Result<Running, StartError> {
        let App {
            mut config,
            addr,
            name,
            factory,
            starters,
            policies,
            health,
            publisher,
            publish_tx,
            background,
        } = self;
        for (queue, policy) in policies {
            if let Some(q) = config.queues.iter_mut().find(|q| q.name == queue) {
                q.retries = Some(crate::config::RetriesConfig::from_policy(&policy));
            }
        }
        config.validate()?;
        config.check_handlers(starters.iter().map(|(q, _)| q.as_str()))?;
        // A queue with `consume: false` is declared (the topology is built
        // from `declared`) and not consumed.
        let declared = config.clone();
        config.queues.retain(|q| q.consume);
        let worst = crate::app::drain::worst_case(&config);
        if let Some(w) = config.host_deadline_warning() {
            warn!("{w}");
        } else if worst >= config.host_timeout {
            warn!(
                "the drain's worst case ({worst:?}: shutdown_timeout + abandon_after + the channel and connection close bounds) is not below host_timeout ({:?}): the orchestrator may kill the process before the connections are closed; lower shutdown_timeout or raise host_timeout",
                config.host_timeout
            );
        }
        // Code, then AMQP_ADDR (may be a comma-separated list), then the
        // config's `addresses`, then the local default.
        let code: Option<Vec<String>> = addr.map(|a| vec![a]);
        let addresses = resolve_addresses(code.as_deref(), &config.addresses);
        let options = ConnectOptions::from_config(&config);
        tokio::pin!(stop);
        let mut opened: Vec<Arc<lapin::Connection>> = Vec::new();
        let result = {
            let phases = start_phases(
                &config,
                &declared,
                &addresses,
                &options,
                &name,
                factory.as_ref(),
                &health,
                &mut opened,
            );
            tokio::select! {
                r = phases => r,
                signal = &mut stop => Err(StartError::Stopped { signal }),
            }
        };
        let (consume_conn, publish_conn, topology, first) = match result {
            Ok(v) => v,
            Err(e) => {
                for c in opened {
                    let _ = tokio::time::timeout(Duration::from_secs(2), c.close(200, "OK".into()))
                        .await;
                }
                return Err(e);
            }
        };
        // Nothing below awaits: once the consumers are spawned, `Running`
        // exists to drain them.
        publish_tx.send_replace(Some(publish_conn.clone()));
        publisher.set_topology(topology.clone());
        let mut starters = starters;
        let mut slots = Vec::new();
        for q in &config.queues {
            let idx = starters
                .iter()
                .position(|(n, _)| n == &q.name)
                .expect("checked above");
            let (_, starter) = starters.swap_remove(idx);
            let gate = PauseHandle::new();
            let stats = Arc::new(QueueStats::default());
            health.add_queue(&q.name, gate.clone(), stats.clone());
            slots.push(QueueSlot {
                starter,
                gate,
                stats,
                slots: Arc::new(Semaphore::new(q.concurrency)),
            });
        }
        let (consume_tx, _) = watch::channel(Some(consume_conn.clone()));
        let link = Arc::new(Link::new(
            consume_conn.clone(),
            publish_conn.clone(),
            config.queues.len(),
        ));
        let shared = Arc::new(Shared {
            link: link.clone(),
            addresses,
            options,
            name,
            factory,
            slots,
            health: health.clone(),
            publisher: publisher.clone(),
            topology,
            consume: Conn::new(ConnectionRole::Consumer, consume_tx),
            publish: Conn::new(ConnectionRole::Publisher, publish_tx),
            intake: CancellationToken::new(),
            draining: CancellationToken::new(),
            root: CancellationToken::new(),
            tracker: TaskTracker::new(),
            config,
        });
        health.set_connected(ConnectionRole::Consumer, true);
        health.set_connected(ConnectionRole::Publisher, true);
        // Every first generation is installed (registered for the drain,
        // its loop spawned) before `Running` exists.
        for (index, opened) in first.into_iter().enumerate() {
            let installed = match shared.install(index, opened) {
                Ok(Some(i)) => i,
                Ok(None) => unreachable!("no drain can have begun before start returns"),
                Err(panic) => {
                    shared.intake.cancel();
                    for c in [&consume_conn, &publish_conn] {
                        let _ =
                            tokio::time::timeout(Duration::from_secs(2), c.close(200, "OK".into()))
                                .await;
                    }
                    return Err(StartError::Config(ConfigError::invalid(
                        format!("queues[{index}]"),
                        format!(
                            "{:?}: building its handler stack panicked: {panic}",
                            shared.config.queues[index].name
                        ),
                        "fix the layer or handler given to App::consume for it",
                    )));
                }
            };
            shared
                .tracker
                .spawn(supervisor::run_queue(shared.clone(), index, installed));
        }
        tokio::spawn(supervisor::supervise(shared.clone(), true));
        tokio::spawn(supervisor::supervise(shared.clone(), false));
        let background = background
            .into_iter()
            .map(|start| start(publisher.clone()))
            .collect();
        let drain = Drain {
            health: health.clone(),
            in_flight: health.in_flight().clone(),
            link,
            intake: shared.intake.clone(),
            draining: shared.draining.clone(),
            root: shared.root.clone(),
            tracker: shared.tracker.clone(),
            publisher: publisher.clone(),
            shutdown_timeout: shared.config.shutdown_timeout,
            abandon_after: shared.config.abandon_after,
            background,
        };
        Ok(Running {
            drain,
            publisher,
            health,
        })
    }

    /// Runs until SIGTERM, SIGINT, SIGHUP or SIGQUIT, then drains; see
    /// [`Running::run`]. A signal during start-up (connect, topology) ends
    /// it at once with exit 0: nothing was taken from any queue.
    pub async fn run(self) -> ExitCode {
        // Installed before connecting, so a signal during start-up is a
        // clean stop too.
        let mut signals = Signals::install();
        let started = self.start_until(signals.stop()).await;
        match started {
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

/// The ledger's bounds for a queue.
fn ack_bounds(q: &QueueConfig) -> Bounds {
    let (count, delay) = q.ack_batch.bounds(q.prefetch);
    Bounds {
        count,
        delay,
        window: usize::from(q.prefetch),
    }
}

type Started = (
    Arc<lapin::Connection>,
    Arc<lapin::Connection>,
    Topology,
    Vec<supervisor::Opened>,
);

/// Connect (both connections), declare, open every queue's first
/// generation. Every connection opened is pushed to `opened`, so a failure
/// or a stop signal can close them.
#[allow(clippy::too_many_arguments)]
async fn start_phases(
    config: &Config,
    declared: &Config,
    addresses: &[String],
    options: &ConnectOptions,
    name: &str,
    factory: Option<&ConnectionFactory>,
    health: &Health,
    opened: &mut Vec<Arc<lapin::Connection>>,
) -> Result<Started, StartError> {
    info!(broker = %redact(&addresses.join(",")), "connecting");
    let via = |role| Some(Via { role, factory });
    let c = connect_any_via(
        addresses,
        name,
        config.connect_timeout,
        options,
        via(ConnectionRole::Consumer),
    )
    .await?;
    info!(broker = %c.address, connection = name, "connected (consumers)");
    health.set_broker(ConnectionRole::Consumer, Some(c.address));
    let consume_conn = Arc::new(c.connection);
    opened.push(consume_conn.clone());
    let topology = Topology::from_config(declared);
    topology.declare(&consume_conn).await?;
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
    let publish_name = format!("{name}{}", ConnectionRole::Publisher.suffix());
    let p = connect_any_via(
        addresses,
        &publish_name,
        config.connect_timeout,
        options,
        via(ConnectionRole::Publisher),
    )
    .await
    .map_err(|e| StartError::Publisher {
        message: e.to_string(),
    })?;
    info!(broker = %p.address, connection = %publish_name, "connected (publisher)");
    health.set_broker(ConnectionRole::Publisher, Some(p.address));
    let publish_conn = Arc::new(p.connection);
    opened.push(publish_conn.clone());
    // Consumers start only now, after the topology is declared.
    let mut first = Vec::new();
    for q in &config.queues {
        let o = supervisor::open(name, q, &consume_conn)
            .await
            .map_err(|e| StartError::Consume {
                queue: q.name.clone(),
                message: e.to_string(),
            })?;
        first.push(o);
    }
    Ok((consume_conn, publish_conn, topology, first))
}

/// A started runner: consumers running, topology declared.
///
/// Run it until a stop signal ([`run`](Self::run)), until a future of yours
/// ([`run_until`](Self::run_until)), or drain it when you decide
/// ([`drain`](Self::drain), [`into_drain`](Self::into_drain)).
///
/// ```no_run
/// use acemq::{App, Config, Delivery};
/// use tower::service_fn;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let config = Config::from_path("examples/shop.yaml")?;
/// let running = App::new(config)
///     .consume(
///         "shop.orders",
///         service_fn(|_d: Delivery| async { Ok::<_, acemq::BoxError>(()) }),
///     )
///     .start()
///     .await?;
/// // Consuming now; publish on the publishing connection.
/// running
///     .publisher()
///     .publish_json("", "shop.orders", &serde_json::json!({ "id": "o-1" }))
///     .await?;
/// // Drain on Ctrl-C; the report says what finished and what went back.
/// tokio::signal::ctrl_c().await?;
/// let report = running.drain().await?;
/// println!("{} finished, {} handed back", report.finished(), report.handed_back());
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "drop it and the consumers run until the process exits; call drain() to stop"]
pub struct Running {
    drain: Drain,
    publisher: Publisher,
    health: Health,
}

impl Running {
    /// Waits for SIGTERM, SIGINT, SIGHUP or SIGQUIT, then drains and returns the exit code:
    /// 0 clean, 75 when the deadline expired. A second signal during the
    /// drain skips straight to cancellation and abandon. The signal handlers
    /// only push to a channel; the drain runs on the task that called `run`.
    pub async fn run(self) -> ExitCode {
        self.run_with(Signals::install()).await
    }

    /// As [`Running::run`], with signal handlers installed earlier (before
    /// [`App::start`], so that a signal during start-up is not lost).
    pub async fn run_with(self, signals: Signals) -> ExitCode {
        let mut rx = signals;
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

    /// The confirm-mode publisher (on its own connection).
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

//! The runner: connect, declare, consume, wait for a stop signal, drain.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use acemq_layers::{
    BoxError, CancelLayer, DeadLetterLayer, Decision, Delivery, InFlightLayer, PauseHandle,
    PauseLayer, RetryLayer,
};
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::{Service, ServiceBuilder};
use tracing::{error, info, warn};

use crate::config::{Config, QueueConfig};
use crate::connection::{amqp_addr_from_env, connect, redact, ConnectError};
use crate::consumer::{ConsumerLoop, QueueStats};
use crate::drain::{Drain, DrainReport, DrainTimeout, QueueHandle};
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
    publisher: Publisher,
    gate: PauseHandle,
    health: Health,
    intake: CancellationToken,
    draining: CancellationToken,
    root: CancellationToken,
    abandon_after: Duration,
    prefetch_policy: crate::config::PrefetchPolicy,
    stats: Arc<QueueStats>,
}

type Starter = Box<dyn FnOnce(StartCtx<'_>) -> LoopFuture + Send>;

/// Why the runner could not start. No consumer was started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The config is invalid, or names a queue that has no handler (or the reverse).
    #[error("{0}")]
    Config(String),
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
    /// The exit code for this failure (78 config, 69 broker unreachable).
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Config(_) | StartError::Topology(TopologyError::Conflict { .. }) => {
                EXIT_CONFIG
            }
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
        H::Response: Send + 'static,
    {
        let starter: Starter = Box::new(move |ctx: StartCtx<'_>| {
            let q = ctx.queue;
            let service = ServiceBuilder::new()
                .layer(PauseLayer::new(ctx.gate.clone()))
                .layer(InFlightLayer::new(ctx.health.in_flight().clone()))
                .layer(DeadLetterLayer::new(ctx.publisher.clone()).enabled(q.dead_letter))
                .layer(RetryLayer::new(
                    q.policy(),
                    ctx.publisher.clone(),
                    ctx.draining.clone(),
                ))
                .layer(CancelLayer::new(ctx.root.clone()).abandon_after(ctx.abandon_after))
                .service(handler);
            let lp = ConsumerLoop {
                queue: Arc::from(q.name.as_str()),
                channel: ctx.channel,
                consumer: ctx.consumer,
                service,
                concurrency: q.concurrency,
                policy: ctx.prefetch_policy,
                dead_letter: q.dead_letter,
                intake: ctx.intake,
                stats: ctx.stats,
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
        config
            .validate()
            .map_err(|e| StartError::Config(e.to_string()))?;
        for (q, _) in &starters {
            if config.queue(q).is_none() {
                return Err(StartError::Config(format!(
                    "a handler was given for queue {q:?}, which the config does not name: add it under `queues:` or fix the name"
                )));
            }
        }
        for q in &config.queues {
            if !starters.iter().any(|(n, _)| n == &q.name) {
                return Err(StartError::Config(format!(
                    "queues: {:?} has no handler: call App::consume({:?}, handler) or remove it from the config",
                    q.name, q.name
                )));
            }
        }
        if let Some(w) = config.host_deadline_warning() {
            warn!("{w}");
        }
        let addr = addr.unwrap_or_else(amqp_addr_from_env);
        info!(broker = %redact(&addr), "connecting");
        let connection = Arc::new(connect(&addr, &name, config.connect_timeout).await?);
        health.set_connected(true);
        let topology = Topology::from_config(&config);
        topology.declare(&connection).await?;
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

        let intake = CancellationToken::new();
        let draining = CancellationToken::new();
        let root = CancellationToken::new();
        let tracker = TaskTracker::new();
        let mut handles = Vec::new();
        // Consumers start in config order.
        let mut starters = starters;
        for q in &config.queues {
            let idx = starters
                .iter()
                .position(|(n, _)| n == &q.name)
                .expect("checked above");
            let (_, starter) = starters.swap_remove(idx);
            let consume_err = |e: lapin::Error| StartError::Consume {
                queue: q.name.clone(),
                message: e.to_string(),
            };
            let channel = connection.create_channel().await.map_err(consume_err)?;
            channel
                .basic_qos(q.prefetch, BasicQosOptions::default())
                .await
                .map_err(consume_err)?;
            let tag = format!("{name}-{}", q.name);
            let consumer = channel
                .basic_consume(
                    q.name.as_str().into(),
                    tag.as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(consume_err)?;
            let gate = PauseHandle::new();
            let stats = Arc::new(QueueStats::default());
            health.add_queue(&q.name, gate.clone(), stats.clone());
            let fut = starter(StartCtx {
                queue: q,
                channel: channel.clone(),
                consumer,
                publisher: publisher.clone(),
                gate: gate.clone(),
                health: health.clone(),
                intake: intake.clone(),
                draining: draining.clone(),
                root: root.clone(),
                abandon_after: config.abandon_after,
                prefetch_policy: config.prefetch_policy,
                stats: stats.clone(),
            });
            tracker.spawn(fut);
            info!(queue = %q.name, prefetch = q.prefetch, concurrency = q.concurrency, "consuming");
            handles.push(QueueHandle {
                name: q.name.clone(),
                channel,
                consumer_tag: tag,
                gate,
                stats,
            });
        }
        let drain = Drain {
            health: health.clone(),
            in_flight: health.in_flight().clone(),
            queues: handles,
            intake,
            draining,
            root,
            tracker,
            publisher: publisher.clone(),
            connection,
            shutdown_timeout: config.shutdown_timeout,
            abandon_after: config.abandon_after,
        };
        Ok(Running {
            drain,
            publisher,
            health,
        })
    }

    /// Runs until SIGTERM or SIGINT, then drains; see [`Running::run`].
    pub async fn run(self) -> ExitCode {
        match self.start().await {
            Ok(running) => running.run().await,
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
        let (tx, mut rx) = mpsc::unbounded_channel::<&'static str>();
        spawn_signal_listener(tx);
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

/// Carries out the stack's decision type: re-exported for users who build
/// their own loop.
pub type StackDecision = Decision;

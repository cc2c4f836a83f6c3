//! Start-up: apply the code's policies and validate, connect (both
//! connections) and declare the topology — ending at once on a stop signal —
//! open and install every queue's first generation, hand the rest to the
//! supervisor and build the drain.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use acemq_layers::{PauseHandle, RetryPolicy};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::broker_check::BrokerCheck;
use super::builder::App;
use super::error::StartError;
use super::generation::Starter;
use super::running::Running;
use super::supervisor::{self, Opened, QueueParts, Shared};
use crate::app::drain::{Background, Drain, Link};
use crate::app::health::Health;
use crate::config::address::resolve_checked_addresses;
use crate::config::{Config, ConfigError, QueueConfig};
use crate::connection::{
    close_connection, connect_any_via, redact, ConnectOptions, ConnectionFactory, ConnectionRole,
    Via,
};
use crate::consumer::QueueStats;
use crate::publisher::Publisher;
use crate::topology::Topology;

impl App {
    /// Connects, declares the topology, then starts the consumers (never
    /// before the topology is declared). Returns the running handle whose
    /// [`Running::drain`] stops it.
    pub async fn start(self) -> Result<Running, StartError> {
        self.start_until(std::future::pending()).await
    }

    /// As [`start`](Self::start), ending start-up at once (with
    /// [`StartError::Stopped`], everything opened closed again) when `stop`
    /// resolves first — during connect, topology or opening the consumers.
    ///
    /// A start that fails leaves nothing to drain: [`Health::drained`]
    /// resolves then (and `/readyz` says draining), so that a server
    /// stopped by it ends and the program can return the exit code.
    pub async fn start_until(
        self,
        stop: impl Future<Output = &'static str>,
    ) -> Result<Running, StartError> {
        let health = self.health.clone();
        let started = self.start_or_fail(stop).await;
        if started.is_err() {
            health.set_draining();
            health.set_drained();
        }
        started
    }

    async fn start_or_fail(
        self,
        stop: impl Future<Output = &'static str>,
    ) -> Result<Running, StartError> {
        let App {
            mut config,
            addr,
            name,
            factory,
            mut starters,
            policies,
            health,
            publisher,
            connections,
            background,
            batches,
        } = self;
        let declared = apply_policies_and_validate(&mut config, policies, &mut starters)?;
        crate::batch::validate(&config, &batches)?;
        warn_if_drain_outlasts_host(&config);
        if let Some(w) = config.dropped_rejects_warning() {
            warn!("{w}");
        }
        let plan = Plan::new(config, declared, addr, name, factory)?;
        if plan.config.queues.iter().any(QueueConfig::is_stream) {
            supervisor::stream_options(&plan.config, &plan.addresses, &plan.name).map_err(
                |why| {
                    StartError::Config(ConfigError::invalid(
                        "streams",
                        why,
                        "see the streams section of README.md",
                    ))
                },
            )?;
        }
        tokio::pin!(stop);
        let started = connect_until(&plan, &health, stop.as_mut()).await?;
        let consume_conn = started.consume_conn;
        let publish_conn = started.publish_conn;
        // From here start-up waits on the broker only to close both
        // connections when building a queue's handler stack panics (start
        // then fails); otherwise it runs through: once the consumers are
        // spawned, `Running` exists to drain them.
        publisher.set_topology(started.topology.clone());
        let queues = queue_parts(&plan.config, starters, &batches, &health);
        // The supervisor's cells get their first connections (health reads
        // them connected from here).
        connections
            .get(ConnectionRole::Consumer)
            .set(Some(consume_conn.clone()));
        connections
            .get(ConnectionRole::Publisher)
            .set(Some(publish_conn.clone()));
        let link = Arc::new(Link::new(connections, plan.config.queues.len()));
        let shared = Arc::new(Shared {
            link: link.clone(),
            addresses: plan.addresses,
            options: plan.options,
            name: plan.name,
            factory: plan.factory,
            queues,
            health: health.clone(),
            publisher: publisher.clone(),
            topology: started.topology,
            intake: CancellationToken::new(),
            draining: CancellationToken::new(),
            root: CancellationToken::new(),
            tracker: TaskTracker::new(),
            config: plan.config,
        });
        // Every first generation is installed (registered for the drain,
        // its loop spawned) before `Running` exists.
        install_first_generations(&shared, started.first, [&consume_conn, &publish_conn]).await?;
        tokio::spawn(supervisor::supervise(
            shared.clone(),
            ConnectionRole::Consumer,
        ));
        tokio::spawn(supervisor::supervise(
            shared.clone(),
            ConnectionRole::Publisher,
        ));
        let background = background
            .into_iter()
            .map(|start| start(publisher.clone()))
            .collect();
        let drain = build_drain(&shared, link, &health, &publisher, background);
        Ok(Running {
            drain,
            publisher,
            health,
        })
    }
}

/// What start-up connects with: the validated config and where to connect.
struct Plan {
    /// The queues to consume.
    config: Config,
    /// Every queue, also those with `consume: false`: the topology.
    declared: Config,
    addresses: Vec<String>,
    options: ConnectOptions,
    name: String,
    factory: Option<ConnectionFactory>,
}

impl Plan {
    /// The plan for `config`, connecting to `addr` (given in code) first.
    fn new(
        config: Config,
        declared: Config,
        addr: Option<String>,
        name: String,
        factory: Option<ConnectionFactory>,
    ) -> Result<Self, ConfigError> {
        // Code, then AMQP_ADDR (may be a comma-separated list), then the
        // config's `addresses`, then the local default; every address of
        // the list picked is checked, not only the one that answers.
        let code: Option<Vec<String>> = addr.map(|a| vec![a]);
        let addresses = resolve_checked_addresses(code.as_deref(), &config.addresses)?;
        let options = ConnectOptions::from_config(&config);
        Ok(Plan {
            config,
            declared,
            addresses,
            options,
            name,
            factory,
        })
    }
}

/// What the start phases opened: both connections, the declared topology
/// and every queue's first generation.
struct Started {
    consume_conn: Arc<lapin::Connection>,
    publish_conn: Arc<lapin::Connection>,
    topology: Topology,
    first: Vec<Option<Opened>>,
}

/// Puts the retry policies given in code in place of the config's, then
/// validates the config and its handlers. Returns the config to declare;
/// `config` keeps only the queues to consume.
fn apply_policies_and_validate(
    config: &mut Config,
    policies: Vec<(String, RetryPolicy)>,
    starters: &mut Vec<(String, Starter)>,
) -> Result<Config, StartError> {
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
    // A stream's work queue (its rungs lead there) is consumed with the
    // stream's stack and handler; the stream's declarations include it.
    let work: Vec<QueueConfig> = config
        .queues
        .iter()
        .filter_map(QueueConfig::work_queue)
        .collect();
    for w in work {
        let of = w.delivery_label().to_owned();
        if let Some((_, starter)) = starters.iter().find(|(n, _)| *n == of) {
            let starter = starter.clone();
            starters.push((w.name.clone(), starter));
            config.queues.push(w);
        }
    }
    Ok(declared)
}

/// Warns when the orchestrator may kill the process before the drain is
/// done.
fn warn_if_drain_outlasts_host(config: &Config) {
    let worst = crate::app::drain::worst_case(config);
    if let Some(w) = config.host_deadline_warning() {
        warn!("{w}");
    } else if worst >= config.host_timeout {
        warn!(
            "the drain's worst case ({worst:?}: shutdown_timeout + abandon_after + the channel and connection close bounds) is not below host_timeout ({:?}): the orchestrator may kill the process before the connections are closed; lower shutdown_timeout or raise host_timeout",
            config.host_timeout
        );
    }
}

/// Runs the start phases unless `stop` resolves first
/// ([`StartError::Stopped`]); on a failure or a stop, closes every
/// connection they opened.
async fn connect_until(
    plan: &Plan,
    health: &Health,
    stop: Pin<&mut impl Future<Output = &'static str>>,
) -> Result<Started, StartError> {
    let mut opened: Vec<Arc<lapin::Connection>> = Vec::new();
    let result = {
        let phases = start_phases(plan, health, &mut opened);
        tokio::select! {
            r = phases => r,
            signal = stop => Err(StartError::Stopped { signal }),
        }
    };
    match result {
        Ok(v) => Ok(v),
        Err(e) => {
            for c in opened {
                let _ = close_connection(&c, "OK").await;
            }
            Err(e)
        }
    }
}

/// Connect (both connections), declare, open every queue's first
/// generation. Every connection opened is pushed to `opened`, so a failure
/// or a stop signal can close them.
async fn start_phases(
    plan: &Plan,
    health: &Health,
    opened: &mut Vec<Arc<lapin::Connection>>,
) -> Result<Started, StartError> {
    let name = plan.name.as_str();
    let factory = plan.factory.as_ref();
    info!(broker = %redact(&plan.addresses.join(",")), "connecting");
    let via = |role| Some(Via { role, factory });
    let c = connect_any_via(
        &plan.addresses,
        name,
        plan.config.connect_timeout,
        &plan.options,
        via(ConnectionRole::Consumer),
    )
    .await?;
    info!(broker = %c.address, connection = name, "connected (consumers)");
    health.set_broker(ConnectionRole::Consumer, Some(c.address));
    let consume_conn = Arc::new(c.connection);
    opened.push(consume_conn.clone());
    BrokerCheck {
        consumed: &plan.config,
        declared: &plan.declared,
        addr: &plan.addresses[c.index],
        name,
        factory: factory.is_some(),
        timeout: plan.config.connect_timeout,
    }
    .run(health)
    .await?;
    let topology = Topology::from_config(&plan.declared);
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
        &plan.addresses,
        &publish_name,
        plan.config.connect_timeout,
        &plan.options,
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
    let first = open_first_generations(plan, &consume_conn).await?;
    Ok(Started {
        consume_conn,
        publish_conn,
        topology,
        first,
    })
}

/// Opens every queue's first generation on `connection`.
async fn open_first_generations(
    plan: &Plan,
    connection: &lapin::Connection,
) -> Result<Vec<Option<Opened>>, StartError> {
    // Many at once, each on a channel of its own; in the config's order.
    // A stream's runner subscribes on its own connection once installed.
    crate::fan_out::in_order(&plan.config.queues, |q| async move {
        if q.is_stream() {
            return Ok(None);
        }
        supervisor::open(&plan.name, q, connection)
            .await
            .map(Some)
            .map_err(|e| StartError::Consume {
                queue: q.name.clone(),
                message: e.to_string(),
            })
    })
    .await
}

/// Each queue's parts that outlive its generations, with its starter; each
/// queue is added to the health handle.
///
/// A queue consumed in batches claims `max_size × concurrency` deliveries
/// at once (its `concurrency` counts batches, limited where they form).
fn queue_parts(
    config: &Config,
    mut starters: Vec<(String, Starter)>,
    batches: &[(String, crate::batch::BatchSize)],
    health: &Health,
) -> Vec<QueueParts> {
    let mut queues = Vec::new();
    for q in &config.queues {
        let idx = starters
            .iter()
            .position(|(n, _)| n == &q.name)
            .expect("checked above");
        let (_, starter) = starters.swap_remove(idx);
        let gate = PauseHandle::new();
        let stats = Arc::new(QueueStats::default());
        health.add_queue(&q.name, gate.clone(), stats.clone());
        queues.push(QueueParts {
            starter,
            gate,
            stats,
            permits: Arc::new(Semaphore::new(
                batches
                    .iter()
                    .find(|(name, _)| name == &q.name)
                    .map_or(q.concurrency, |(_, size)| {
                        q.concurrency.saturating_mul(size.max_size)
                    }),
            )),
        });
    }
    queues
}

/// Installs every queue's first generation and spawns its runner. When
/// building a queue's stack panics, start-up fails: intake stops and both
/// `connections` are closed.
async fn install_first_generations(
    shared: &Arc<Shared>,
    first: Vec<Option<Opened>>,
    connections: [&Arc<lapin::Connection>; 2],
) -> Result<(), StartError> {
    for (index, opened) in first.into_iter().enumerate() {
        let Some(opened) = opened else {
            shared
                .tracker
                .spawn(supervisor::run_stream(shared.clone(), index));
            continue;
        };
        let installed = match shared.install(index, opened) {
            Ok(Some(i)) => i,
            Ok(None) => unreachable!("no drain can have begun before start returns"),
            Err(panic) => {
                shared.intake.cancel();
                for c in connections {
                    let _ = close_connection(c, "OK").await;
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
    Ok(())
}

/// The drain of the runner `shared` belongs to.
fn build_drain(
    shared: &Shared,
    link: Arc<Link>,
    health: &Health,
    publisher: &Publisher,
    background: Vec<Background>,
) -> Drain {
    Drain {
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
    }
}

//! The builder: [`App`] gathers the config, the handlers and their stacks,
//! the connection settings and the background publishers; [`App::start`]
//! (in `start`) turns it into a [`Running`](crate::Running).

use crate::sync::Locked;
use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;

use acemq_layers::{BoxError, Classify, Delivery};
use tower::{Layer, Service};

use super::error::start_failed;
use super::generation::{StartCtx, Starter};
use super::signals::Signals;
use crate::app::health::Health;
use crate::config::Config;
use crate::connection::LiveConnections;
use crate::connection::{ConnectRequest, ConnectionFactory, ConnectionRole};
use crate::publisher::Publisher;
use crate::stack::QueueStack;

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
    pub(super) config: Config,
    pub(super) addr: Option<String>,
    pub(super) name: String,
    pub(super) factory: Option<ConnectionFactory>,
    pub(super) starters: Vec<(String, Starter)>,
    /// Retry policies given in code, by queue: they replace the config's.
    pub(super) policies: Vec<(String, acemq_layers::RetryPolicy)>,
    pub(super) health: Health,
    pub(super) publisher: Publisher,
    /// The live connection of each role: the supervisor writes them,
    /// health and the publisher read them.
    pub(super) connections: LiveConnections,
    /// Started after the topology is declared, stopped before the drain.
    pub(super) background: Vec<BackgroundStart>,
    /// Queues consumed in batches, by queue: checked against the config's
    /// `prefetch` and `concurrency` at start.
    pub(super) batches: Vec<(String, crate::batch::BatchSize)>,
}

/// Starts a publisher outside handlers and returns how to stop it.
pub(super) type BackgroundStart =
    Box<dyn FnOnce(Publisher) -> crate::app::drain::Background + Send>;

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
        let connections = LiveConnections::default();
        let publisher = Publisher::detached(
            connections.get(ConnectionRole::Publisher).clone(),
            config.connect_timeout,
        );
        App {
            config,
            addr: None,
            name: "acemq".to_owned(),
            factory: None,
            starters: Vec::new(),
            policies: Vec::new(),
            health: Health::reading(connections.clone()),
            publisher,
            connections,
            background: Vec::new(),
            batches: Vec::new(),
        }
    }

    /// Runs the transactional outbox's relay (feature `postgres`) on this
    /// runner's publishing connection: it starts once the topology is
    /// declared, and in the drain, once the handlers have finished, it
    /// publishes what they committed ([`RelayHandle::finish`]) within the
    /// drain's deadline, then stops; rows it has not published by then wait
    /// for the next start.
    ///
    /// [`RelayHandle::finish`]: crate::outbox::RelayHandle::finish
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
                    let stats = handle.finish().await;
                    tracing::info!(
                        ?stats,
                        "outbox relay finished: what the handlers committed is published"
                    );
                }) as std::pin::Pin<Box<dyn Future<Output = ()> + Send>>
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
    /// connection name, the
    /// [`ConnectionRole`](crate::connection::ConnectionRole), acemq's
    /// `ConnectionProperties` and the TLS settings of the config — and
    /// returns the open connection. acemq still tries the addresses in
    /// shuffled order (one call per address tried), bounds each call by
    /// `connect_timeout`, and turns its error into a
    /// [`ConnectError`](crate::connection::ConnectError) as for its own
    /// connect.
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

    /// A request/reply client on the publishing connection, usable before
    /// `start` (calls wait for the connection as publishes do). See
    /// [`crate::rpc`].
    pub fn rpc_client(&self) -> crate::rpc::RpcClient {
        self.publisher.rpc_client()
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
        H: crate::stack::Handler,
    {
        self.consume_with(queue, QueueStack::new(), handler)
    }

    /// Serves requests on `queue` (named in the config): consumes it with a
    /// [`Responder`](crate::rpc::Responder) around `handler` on this app's
    /// publisher, and marks the queue as serving requests (its
    /// `serves_requests`), so a request that is dead-lettered gets an error
    /// reply — to a direct reply-to address or one of the queue's
    /// `reply_addresses` only, with a generic text unless the queue sets
    /// `reply_error_text: true`. See [`crate::rpc`].
    ///
    /// `consume(queue, Responder::new(..))` replies to the requests it
    /// handles too, but sends error replies only if the config sets
    /// `serves_requests: true` for the queue.
    pub fn serve<S>(mut self, queue: &str, handler: S) -> Self
    where
        S: Service<Delivery, Error = BoxError> + Clone + Send + 'static,
        S::Response: Into<Vec<u8>>,
        S::Future: Send + 'static,
    {
        if let Some(q) = self.config.queues.iter_mut().find(|q| q.name == queue) {
            q.serves_requests = true;
        }
        let responder = crate::rpc::Responder::new(self.publisher(), handler);
        self.consume(queue, responder)
    }

    /// As [`consume`](Self::consume), with your own layers outside the
    /// acemq stack and around the handler, and the queue's own classifier
    /// and retry policy: see [`QueueStack`] and the [`stack`](crate::stack)
    /// module for where each kind of layer belongs.
    pub fn consume_with<H, O, I, C>(
        self,
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
        I::Service: crate::stack::Handler,
        O: Layer<
            crate::stack::Formed<
                tower::util::MapResult<
                    crate::stack::Attempts<H, I, Publisher, C>,
                    crate::stack::Sealer,
                >,
            >,
        >,
        O::Service: crate::stack::OuterService,
        BoxError: From<<O::Service as Service<Delivery>>::Error>,
    {
        self.add_queue(queue, stack, handler, None)
    }

    /// Consumes `queue` in batches: `handler` is given up to `max_size`
    /// deliveries at once ([`Batch`](crate::batch::Batch)), formed from the
    /// prefetch window and never waiting more than `max_wait` after a
    /// batch's first delivery, and answers one outcome per delivery (or one
    /// for all: see [`IntoOutcomes`](crate::batch::IntoOutcomes)). Each
    /// delivery keeps its own retry, dead-letter and settle; an in-process
    /// retry calls `handler` with a batch of that one delivery. The queue's
    /// `concurrency` counts batches running at once, and its `prefetch`
    /// must be at least `max_size × concurrency` (checked at start). See
    /// [`crate::batch`].
    pub fn consume_batch<B>(
        self,
        queue: &str,
        max_size: usize,
        max_wait: std::time::Duration,
        handler: B,
    ) -> Self
    where
        B: Service<crate::batch::Batch> + Clone + Send + 'static,
        B::Response: crate::batch::IntoOutcomes + Send + 'static,
        B::Error: Into<BoxError>,
        B::Future: Send + 'static,
    {
        self.consume_batch_with(queue, QueueStack::new(), max_size, max_wait, handler)
    }

    /// As [`consume_batch`](Self::consume_batch), with your own
    /// [`QueueStack`]: outer layers see each delivery with its final
    /// [`Outcome`](crate::stack::Outcome) (a delivery waiting in one is held, not yet in a batch),
    /// inner layers each attempt of each delivery (its wait for the rest of
    /// its batch included).
    pub fn consume_batch_with<B, O, I, C>(
        mut self,
        queue: &str,
        stack: QueueStack<O, I, C>,
        max_size: usize,
        max_wait: std::time::Duration,
        handler: B,
    ) -> Self
    where
        B: Send + 'static + Clone,
        C: Classify + Clone,
        O: Send + 'static,
        I: Send + 'static,
        I: Layer<crate::batch::BatchHandler<B>>,
        I::Service: crate::stack::Handler,
        O: Layer<
            crate::stack::Formed<
                tower::util::MapResult<
                    crate::stack::Attempts<crate::batch::BatchHandler<B>, I, Publisher, C>,
                    crate::stack::Sealer,
                >,
            >,
        >,
        O::Service: crate::stack::OuterService,
        BoxError: From<<O::Service as Service<Delivery>>::Error>,
    {
        let size = crate::batch::BatchSize { max_size, max_wait };
        self.batches.push((queue.to_owned(), size));
        let handler = crate::batch::BatchHandler::new(handler);
        self.add_queue(queue, stack, handler, Some(size))
    }

    /// The starter of `queue`'s generations: its stack around `handler`,
    /// forming batches when `batch` is set.
    fn add_queue<H, O, I, C>(
        mut self,
        queue: &str,
        stack: QueueStack<O, I, C>,
        handler: H,
        batch: Option<crate::batch::BatchSize>,
    ) -> Self
    where
        H: Send + 'static + Clone,
        C: Classify + Clone,
        O: Send + 'static,
        I: Send + 'static,
        I: Layer<H>,
        I::Service: crate::stack::Handler,
        O: Layer<
            crate::stack::Formed<
                tower::util::MapResult<
                    crate::stack::Attempts<H, I, Publisher, C>,
                    crate::stack::Sealer,
                >,
            >,
        >,
        O::Service: crate::stack::OuterService,
        BoxError: From<<O::Service as Service<Delivery>>::Error>,
    {
        if let Some(policy) = &stack.policy {
            self.policies.push((queue.to_owned(), policy.clone()));
        }
        let parts = std::sync::Mutex::new((handler, stack));
        let starter: Starter = Arc::new(move |ctx: StartCtx<'_>| {
            let guard = parts.locked();
            let (handler, stack) = &*guard;
            let mut stack_parts = ctx.stack_parts();
            // The limit on running batches outlives the generations: made
            // with the first, from the queue's validated `concurrency`.
            stack_parts.batch = batch.map(|size| {
                ctx.stats
                    .batcher
                    .get_or_init(|| size.batcher(ctx.queue.concurrency))
                    .clone()
            });
            let service = crate::stack::build(stack_parts, stack, handler.clone());
            drop(guard);
            ctx.consumer_loop(service)
        });
        self.starters.push((queue.to_owned(), starter));
        self
    }

    /// Runs until SIGTERM, SIGINT, SIGHUP or SIGQUIT, then drains; see
    /// [`Running::run`](crate::Running::run). A signal during start-up
    /// (connect, topology) ends it at once with exit 0: nothing was taken
    /// from any queue.
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

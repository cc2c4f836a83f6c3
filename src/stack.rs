//! The stack `App` builds around a queue's handler, and where your own
//! tower layers go in it.
//!
//! Outermost first:
//!
//! | | layer | why there |
//! |---|---|---|
//! | 1 | pause gate | a held delivery has not started: not in flight, handed back without touching anything below |
//! | 1a | per-key ordering ([`QueueStack::ordered_by_fn`], or the queue's `ordered_by`, if set) | a delivery waiting for its key's turn is held; the key is kept through in-process retries |
//! | 2 | **your outer layers** ([`QueueStack::outer`]) | see each delivery once, with its final [`Outcome`]: audit, tracing, a circuit breaker or a rate limit that should count the whole delivery, retries included |
//! | 2½ | batch forming (a queue consumed with [`App::consume_batch`](crate::App::consume_batch)) | a delivery waiting for its batch to fill, or for a running batch to finish, is held; see [`crate::batch`] |
//! | 3 | claim: in-flight count and concurrency | the delivery enters the handler's side: from here it is in flight and holds one of the queue's `concurrency` permits |
//! | 4 | dead-letter | turns "cannot be handled" into a confirmed copy in `Q.dlq` with the reason |
//! | 5 | retry | waits here or on a rung, and calls the layers below again |
//! | 5½ | circuit breaker (config `circuit_breaker`, [`QueueStack::circuit_breaker`]) | counts each attempt; when too many fail, holds the queue at its pause gate (1) for a cool-down, then probes with one delivery |
//! | 6 | cancellation | the drain's token, a caught panic, abandonment |
//! | 7 | **your inner layers** ([`QueueStack::inner`]) | see each attempt: a timeout per attempt, metrics per attempt, your axum-style middleware |
//! | 8 | your handler (for a batch queue, the batch handler: the members of a batch meet here and your service is called once for them) | |
//!
//! # Held until claimed
//!
//! A delivery is *in flight* from the claim (row 3) until its outcome
//! exists; before that it is *held* — at the pause gate, or in your outer
//! layers (a `Buffer` in front of a `RateLimit`, a key's turn), or in a
//! batch being formed. A held
//! delivery holds no concurrency permit (`concurrency` counts handlers, the
//! queue's `prefetch` bounds what is held), is not counted in flight, and
//! at a drain is handed back to the broker at once — never waited for,
//! never reported as an abandoned handler. If your outer layer passes it on
//! after that, the claim refuses it and your handler does not run. See
//! [`ClaimLayer`].
//!
//! # Outer layers cannot change what was carried out
//!
//! Below your outer layers the decision is already made *and partly carried
//! out*: a rung retry or a dead-letter copy has been published and
//! confirmed, and only the acknowledgement of the original is left. An
//! outer layer that turned it into another decision would lose a message
//! (an ack with no copy) or duplicate one. So outer layers see an
//! [`Outcome`]: they can read its [`Decision`] but cannot make one — there
//! is no public constructor. An outer layer that fails (returns an error,
//! or a load-shedding layer refusing) hands the delivery back: the broker
//! redelivers it.
//!
//! # Clone
//!
//! Handler, inner and outer layers must make `Clone` services: the retry
//! layer clones the service below it for every attempt, the pause gate
//! clones the one below it for every delivery (tower's `mem::replace`
//! pattern), and the stack is built again for every generation (a new
//! channel after a reconnect or a recovery). A middleware that is not
//! `Clone` (`tower::limit::RateLimit`, say) goes behind
//! `tower::buffer::Buffer`, whose handle is:
//! `.outer(BufferLayer::new(64)).outer(RateLimitLayer::new(..))` shares one
//! limit between every delivery of the generation.
//!
//! ```no_run
//! use std::time::Duration;
//! use acemq::{App, Config, Delivery, QueueStack};
//! use tower::service_fn;
//!
//! # async fn run() -> std::process::ExitCode {
//! let config = Config::from_path("examples/shop.yaml").expect("valid config");
//! let stack = QueueStack::new()
//!     // Each attempt gets 30 s; a timeout is retried, then dead-lettered
//!     // with reason `timeout`.
//!     .inner(tower::timeout::TimeoutLayer::new(Duration::from_secs(30)))
//!     // Permanent: anything whose text says "invalid".
//!     .classifier(|e: &(dyn std::error::Error + 'static)| {
//!         if e.to_string().contains("invalid") {
//!             acemq::layers::Class::Permanent
//!         } else {
//!             acemq::layers::Class::Transient
//!         }
//!     });
//! App::new(config)
//!     .consume_with("shop.orders", stack, service_fn(|_d: Delivery| async {
//!         Ok::<_, std::io::Error>(())
//!     }))
//!     .run()
//!     .await
//! # }
//! ```
//!
//! # Naming the type
//!
//! To share a stack between `main` and your tests, name its type. Each
//! [`outer`](QueueStack::outer) or [`inner`](QueueStack::inner) call wraps
//! the layers so far in a `tower::layer::util::Stack`, so written by hand the
//! type nests the other way round from the calls: the last layer added comes
//! first. [`queue_layers!`](crate::queue_layers) writes it for you from the
//! layers in the order you added them:
//!
//! ```
//! use std::time::Duration;
//! use acemq::{queue_layers, Outcome, QueueStack};
//! use tower::limit::ConcurrencyLimitLayer;
//! use tower::timeout::TimeoutLayer;
//! use tower::util::MapResponseLayer;
//!
//! fn audit(outcome: Outcome) -> Outcome {
//!     outcome
//! }
//!
//! /// Read as written below: audit, then a limit; each attempt a timeout.
//! type Layers = QueueStack<
//!     queue_layers![MapResponseLayer<fn(Outcome) -> Outcome>, ConcurrencyLimitLayer],
//!     queue_layers![TimeoutLayer],
//! >;
//!
//! fn stack() -> Layers {
//!     QueueStack::new()
//!         .outer(MapResponseLayer::new(audit as fn(Outcome) -> Outcome))
//!         .outer(ConcurrencyLimitLayer::new(4))
//!         .inner(TimeoutLayer::new(Duration::from_secs(30)))
//! }
//! # let _ = stack();
//! ```

use std::fmt;
use std::time::Duration;

use acemq_layers::partition::KeyFn;
use acemq_layers::{
    BoxError, BreakerPolicy, CancelLayer, Cancellation, CircuitBreakerLayer, ClaimLayer, Classify,
    DeadLetterLayer, DeadLetterRetryLayer, Decision, DefaultClassifier, Delivery, InFlightCounter,
    PauseHandle, PauseLayer, Publish, RetryLayer, RetryPolicy,
};
use tokio_util::sync::CancellationToken;
use tower::layer::util::{Identity, Stack};
use tower::util::MapResultLayer;
use tower::{Layer, Service, ServiceBuilder};

use crate::config::{OrderedBy, QueueConfig};

/// A delivery's final decision, as your outer layers see it: readable, not
/// constructible (see the [module docs](self)).
///
/// Example: the [module docs](crate::stack); `examples/invoices/handler.rs` writes an outer layer that reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome(Decision);

impl Outcome {
    /// The decision acemq made and is carrying out.
    pub fn decision(&self) -> &Decision {
        &self.0
    }
}

fn seal(r: Result<Decision, BoxError>) -> Result<Outcome, BoxError> {
    r.map(Outcome)
}

fn unseal<E>(r: Result<Outcome, E>) -> Result<Decision, BoxError>
where
    BoxError: From<E>,
{
    match r {
        Ok(o) => Ok(o.0),
        Err(e) => {
            let e = BoxError::from(e);
            tracing::warn!(error = %e, "an outer layer failed; the delivery is handed back and the broker redelivers it");
            Ok(Decision::HandBack)
        }
    }
}

/// What acemq asks of a handler — your service with your inner layers
/// around it: a `tower::Service<Delivery>` that is `Clone + Send +
/// 'static`, whose future is `Send + 'static`, whose error converts into
/// [`BoxError`] and whose response into a
/// [`Verdict`](acemq_layers::Verdict) (`()` is `Ack`). Every such service
/// has it; you never implement it.
///
/// Example: the [module docs](crate::stack), and [`App::consume`](crate::App::consume).
pub trait Handler:
    Service<
        Delivery,
        Error: Into<BoxError>,
        Future: Send + 'static,
        Response: acemq_layers::IntoVerdict + Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> Handler for S
where
    S: Service<Delivery> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    S::Response: acemq_layers::IntoVerdict + Send + 'static,
{
}

/// What acemq asks of the whole stack with your outer layers around it: a
/// `tower::Service<Delivery>` answering the final [`Outcome`], `Clone +
/// Send + 'static`, its future `Send + 'static`. (Its error must also
/// convert into [`BoxError`] — `BoxError: From<Error>`, which a supertrait
/// cannot say, so the methods that take your layers state it beside this
/// bound; an outer layer's error hands the delivery back.) Every such
/// service has it; you never implement it.
///
/// Example: the [module docs](crate::stack), and [`App::consume`](crate::App::consume).
pub trait OuterService:
    Service<Delivery, Response = Outcome, Future: Send + 'static> + Clone + Send + 'static
{
}

impl<S> OuterService for S
where
    S: Service<Delivery, Response = Outcome> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
}

/// Your layers and choices for one queue's stack: layers outside the
/// acemq stack (seeing the final [`Outcome`]) and around the handler
/// (seeing each attempt), and the queue's own classifier and retry policy.
/// See the [module docs](self) for where each kind of layer belongs.
///
/// Example: the [module docs](crate::stack), and `examples/shop/main.rs`.
#[derive(Clone)]
pub struct QueueStack<O = Identity, I = Identity, C = DefaultClassifier> {
    outer: O,
    inner: I,
    classifier: C,
    pub(crate) policy: Option<RetryPolicy>,
    breaker: Option<BreakerPolicy>,
    /// The key per-key ordering uses, instead of the config's `ordered_by`.
    ordered_by: Option<OrderedBy>,
    /// Whether [`outer`](Self::outer) was called: without outer layers (and
    /// without ordering or batches) a delivery goes from the pause gate
    /// straight to the claim.
    has_outer: bool,
}

impl QueueStack {
    /// No layers of yours; the config's retry policy; the
    /// [`DefaultClassifier`].
    pub fn new() -> Self {
        QueueStack {
            outer: Identity::new(),
            inner: Identity::new(),
            classifier: DefaultClassifier,
            policy: None,
            breaker: None,
            ordered_by: None,
            has_outer: false,
        }
    }
}

impl Default for QueueStack {
    fn default() -> Self {
        QueueStack::new()
    }
}

impl<O, I, C> QueueStack<O, I, C> {
    /// Adds a layer outside dead-letter and retry (inside the pause gate,
    /// outside the claim: a delivery waiting in it is held, not in flight).
    /// The first added is the outermost.
    pub fn outer<L>(self, layer: L) -> QueueStack<Stack<L, O>, I, C> {
        QueueStack {
            outer: Stack::new(layer, self.outer),
            inner: self.inner,
            classifier: self.classifier,
            policy: self.policy,
            breaker: self.breaker,
            ordered_by: self.ordered_by,
            has_outer: true,
        }
    }

    /// Adds a layer around the handler (inside cancellation: each attempt).
    /// The first added is the outermost.
    pub fn inner<L>(self, layer: L) -> QueueStack<O, Stack<L, I>, C> {
        QueueStack {
            outer: self.outer,
            inner: Stack::new(layer, self.inner),
            classifier: self.classifier,
            policy: self.policy,
            breaker: self.breaker,
            ordered_by: self.ordered_by,
            has_outer: self.has_outer,
        }
    }

    /// Classifies this queue's failures with `classifier` (retry and
    /// dead-letter both use it).
    pub fn classifier<C2: Classify + Clone>(self, classifier: C2) -> QueueStack<O, I, C2> {
        QueueStack {
            outer: self.outer,
            inner: self.inner,
            classifier,
            policy: self.policy,
            breaker: self.breaker,
            ordered_by: self.ordered_by,
            has_outer: self.has_outer,
        }
    }

    /// This queue's retry policy, instead of the config's `retries` (the
    /// topology declares its rungs).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// A circuit breaker on this queue, instead of the config's
    /// `circuit_breaker`: it counts each attempt (inside the retry layer)
    /// and holds the queue's pause gate while open; see
    /// [`acemq_layers::breaker`].
    pub fn circuit_breaker(mut self, policy: BreakerPolicy) -> Self {
        self.breaker = Some(policy);
        self
    }

    /// Orders this queue's deliveries by `by`, instead of the config's
    /// `ordered_by` (see [`crate::config::OrderedBy`]).
    pub fn ordered_by(mut self, by: OrderedBy) -> Self {
        self.ordered_by = Some(by);
        self
    }

    /// Orders this queue's deliveries by `key`, a function of the delivery,
    /// its body included, instead of the config's `ordered_by`: equal keys
    /// run one at a time, in arrival order; `None` runs unordered.
    ///
    /// The key is computed once per delivery, before the handler, and left
    /// in the delivery's extensions as an
    /// [`OrderingKey<T>`](acemq_layers::partition::OrderingKey): the
    /// handler reads it there instead of parsing the body again. To hand
    /// the handler more than the key (the whole parsed body), return a type
    /// whose `Hash` covers only the key, or use
    /// [`KeyFn::new`](acemq_layers::partition::KeyFn::new) with
    /// [`ordered_by`](Self::ordered_by).
    ///
    /// ```
    /// use acemq::layers::partition::OrderingKey;
    /// use acemq::{Delivery, QueueStack};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Event { account: String }
    ///
    /// let stack = QueueStack::new().ordered_by_fn(|d: &Delivery| {
    ///     serde_json::from_slice::<Event>(d.body()).ok().map(|e| e.account)
    /// });
    /// // In the handler:
    /// fn account(d: &Delivery) -> Option<&str> {
    ///     d.extensions().get::<OrderingKey<String>>().map(|k| k.0.as_str())
    /// }
    /// # let _ = (stack, account);
    /// ```
    pub fn ordered_by_fn<T, F>(self, key: F) -> Self
    where
        T: std::hash::Hash + Clone + Send + Sync + 'static,
        F: Fn(&Delivery) -> Option<T> + Send + Sync + 'static,
    {
        self.ordered_by(OrderedBy::Fn(KeyFn::hashed("ordered_by_fn", key)))
    }
}

impl<O, I, C> fmt::Debug for QueueStack<O, I, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueStack")
            .field("policy", &self.policy)
            .field("breaker", &self.breaker)
            .field("ordered_by", &self.ordered_by)
            .field("has_outer", &self.has_outer)
            .finish_non_exhaustive()
    }
}

/// A failure of the stack below the claim, on a queue without outer layers:
/// handed back, as [`unseal`] hands back what passes through outer layers.
/// (Dead-letter and retry turn a handler's failures into decisions; what
/// is left is a retry that found an inner layer not ready, on a queue with
/// dead-letter off.)
fn hand_back_failure(r: Result<Decision, BoxError>) -> Result<Decision, BoxError> {
    r.or_else(|e| {
        tracing::warn!(error = %e, "the handler's stack failed (an inner layer was not ready for a retry); the delivery is handed back and the broker redelivers it");
        Ok(Decision::HandBack)
    })
}

/// What one generation's stack is built from, besides the user's parts.
pub(crate) struct Parts<'a, P> {
    pub(crate) queue: &'a QueueConfig,
    pub(crate) gate: PauseHandle,
    pub(crate) in_flight: InFlightCounter,
    /// The queue's concurrency limit, shared by its generations (`None`:
    /// unlimited), taken at the claim.
    pub(crate) concurrency: Option<std::sync::Arc<tokio::sync::Semaphore>>,
    pub(crate) publisher: P,
    pub(crate) draining: CancellationToken,
    /// Forms batches before the claim (a queue consumed with
    /// `App::consume_batch`): the limit on running batches is shared by
    /// the queue's generations, each forms its own.
    pub(crate) batch: Option<acemq_layers::batch::Batcher>,
    /// The handlers' token (the loop's deliveries carry it on their
    /// lifeline, so the layer hands it over without a reference count).
    pub(crate) cancel: Cancellation,
    pub(crate) abandon_after: Duration,
    /// The consumer loop wakes every running request when it cancels
    /// `cancel` (`CancelLayer::woken_by_transport`); the test harness,
    /// which has no loop, leaves the layer to wake itself.
    pub(crate) woken_by_loop: bool,
}

/// Turns the inner stack's decision into the [`Outcome`] outer layers see.
pub(crate) type Sealer = fn(Result<Decision, BoxError>) -> Result<Outcome, BoxError>;
/// And back, for the gate and the loop.
type Unsealer<E> = fn(Result<Outcome, E>) -> Result<Decision, BoxError>;

/// What outer layers wrap: the claim and below, behind the batch layer
/// when the queue is consumed in batches.
pub(crate) type Formed<S> = tower::util::Either<acemq_layers::batch::Batching<S>, S>;

/// The circuit breaker around each attempt, when the queue has one.
pub(crate) type Breaker<S, C> = tower::util::Either<acemq_layers::CircuitBreaker<S, C>, S>;

/// The handler's service as the acemq layers see it, from the claim down.
/// Dead-letter, redelivery limit and retry (rows 4 and 5) run as one
/// service, [`DeadLetterRetry`](acemq_layers::DeadLetterRetry): what the
/// three layers do, with one future per delivery.
pub(crate) type Attempts<H, I, P, C> = acemq_layers::Claim<
    acemq_layers::DeadLetterRetry<Breaker<acemq_layers::Cancel<<I as Layer<H>>::Service>, C>, P, C>,
>;

/// Builds exactly the stack `App` runs for a queue (the test harness
/// builds it through here too).
pub(crate) fn build<H, O, I, C, P>(
    parts: Parts<'_, P>,
    stack: &QueueStack<O, I, C>,
    handler: H,
) -> impl Service<
    Delivery,
    Response = Decision,
    Error = BoxError,
    Future: crate::consumer::Released + Send + 'static,
> + Send
       + 'static
where
    P: Publish,
    C: Classify + Clone,
    I: Layer<H>,
    I::Service: Handler,
    O: Layer<Formed<tower::util::MapResult<Attempts<H, I, P, C>, Sealer>>>,
    O::Service: OuterService,
    BoxError: From<<O::Service as Service<Delivery>>::Error>,
{
    let q = parts.queue;
    let policy = stack.policy.clone().unwrap_or_else(|| q.policy());
    let breaker = stack
        .breaker
        .clone()
        .or_else(|| q.circuit_breaker.as_ref().map(|c| c.policy()))
        .map(|p| {
            CircuitBreakerLayer::new(parts.gate.clone(), p).classifier(stack.classifier.clone())
        });
    let sealed: Sealer = seal;
    let unsealed: Unsealer<<O::Service as Service<Delivery>>::Error> = unseal;
    let claim = ClaimLayer::new(parts.in_flight);
    let claim = match parts.concurrency {
        Some(limit) => claim.concurrency(limit),
        None => claim,
    };
    let attempts = ServiceBuilder::new()
        .layer(claim)
        .layer(DeadLetterRetryLayer::new(
            DeadLetterLayer::new(parts.publisher.clone())
                .classifier(stack.classifier.clone())
                .enabled(q.dead_letter)
                .replies(q.error_replies()),
            {
                let limit = acemq_layers::RedeliveryLimitLayer::new(q.max_redeliveries);
                // Only a quorum queue's broker counts redeliveries: on a
                // classic queue the headers are whatever the publisher sent.
                // A passive queue's type is not known here: read them. A
                // stream's loop removes the publisher's and counts its own
                // re-runs of a handed-back message there.
                if q.kind == crate::config::QueueType::Quorum || q.passive || q.is_stream() {
                    limit
                } else {
                    limit.without_counts()
                }
            },
            RetryLayer::new(policy, parts.publisher, parts.draining)
                .classifier(stack.classifier.clone()),
        ))
        .option_layer(breaker)
        .layer({
            let layer =
                CancelLayer::from_cancellation(parts.cancel).abandon_after(parts.abandon_after);
            if parts.woken_by_loop {
                layer.woken_by_transport()
            } else {
                layer
            }
        })
        .service(stack.inner.layer(handler));
    let (batch, ordered_by) = (
        parts.batch,
        stack.ordered_by.as_ref().or(q.ordered_by.as_ref()),
    );
    // Nothing between the pause gate and the claim: a delivery goes
    // straight from one to the other, one future instead of five (the
    // option of ordering, your outer layers and the option of batches,
    // each wrapped). Fewer distinct futures a delivery means less code
    // fetched again for every delivery, which at a small prefetch is much
    // of the stack's cost.
    if !stack.has_outer && batch.is_none() && ordered_by.is_none() {
        let direct = MapResultLayer::new(hand_back_failure).layer(attempts);
        return PauseLayer::new(parts.gate).layer(tower::util::Either::Right(direct));
    }
    let attempts = MapResultLayer::new(sealed).layer(attempts);
    // A batch being formed is held: before the claim, under the user's
    // outer layers (which see each delivery, not the batch).
    let formed = match batch {
        Some(batcher) => {
            tower::util::Either::Left(acemq_layers::batch::BatchLayer::new(batcher).layer(attempts))
        }
        None => tower::util::Either::Right(attempts),
    };
    let outer = stack.outer.layer(formed);
    // `ordered_by`: a delivery waiting for its key's turn is held (before
    // the claim), and the key is kept through in-process retries.
    let partition = ordered_by.map(|by| acemq_layers::PartitionLayer::new(by.clone()));
    let through = ServiceBuilder::new()
        .option_layer(partition)
        .layer(MapResultLayer::new(unsealed))
        .service(outer);
    PauseLayer::new(parts.gate).layer(tower::util::Either::Left(through))
}

/// The type of the layers added to a [`QueueStack`] by successive
/// [`outer`](QueueStack::outer) (or [`inner`](QueueStack::inner)) calls,
/// written in the order of the calls: `queue_layers![A, B]` is the type
/// `.outer(a).outer(b)` makes, `Stack<B, Stack<A, Identity>>`, and
/// `queue_layers![]` is `Identity` (no layers). The first layer named is the
/// outermost, as with the calls. See [Naming the type](crate::stack#naming-the-type).
///
/// ```
/// use acemq::{queue_layers, QueueStack};
/// use tower::layer::util::{Identity, Stack};
/// use tower::limit::ConcurrencyLimitLayer;
/// use tower::load_shed::LoadShedLayer;
///
/// // The same type both ways round.
/// let by_hand: Stack<ConcurrencyLimitLayer, Stack<LoadShedLayer, Identity>> =
///     Stack::new(ConcurrencyLimitLayer::new(4), Stack::new(LoadShedLayer::new(), Identity::new()));
/// let named: queue_layers![LoadShedLayer, ConcurrencyLimitLayer] = by_hand;
///
/// let stack: QueueStack<queue_layers![LoadShedLayer, ConcurrencyLimitLayer]> = QueueStack::new()
///     .outer(LoadShedLayer::new())
///     .outer(ConcurrencyLimitLayer::new(4));
/// let none: QueueStack<queue_layers![], queue_layers![]> = QueueStack::new();
/// # let _ = (named, stack, none);
/// ```
#[macro_export]
macro_rules! queue_layers {
    (@nest [] -> $acc:ty) => { $acc };
    (@nest [$head:ty $(, $tail:ty)*] -> $acc:ty) => {
        $crate::queue_layers!(@nest [$($tail),*] -> $crate::stack::__Stack<$head, $acc>)
    };
    () => { $crate::stack::__Identity };
    ($($layer:ty),+ $(,)?) => {
        $crate::queue_layers!(@nest [$($layer),+] -> $crate::stack::__Identity)
    };
}

#[doc(hidden)]
pub use tower::layer::util::{Identity as __Identity, Stack as __Stack};

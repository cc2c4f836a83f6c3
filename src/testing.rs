//! An in-memory harness of the exact stack `App` builds for a queue
//! (feature `test-util`): your handler, your [`QueueStack`] layers, and the
//! acemq layers around them, with a recording publisher instead of a
//! broker. Each delivery's fate comes back as a value to assert on, and it
//! runs under `tokio::time::pause()`, so a retry schedule of minutes takes
//! milliseconds.
//!
//! ```
//! use std::time::Duration;
//! use acemq::testing::{Fate, TestQueue};
//! use acemq::{Config, Delivery, Reject};
//! use tower::service_fn;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let config = Config::from_yaml_str(
//!     "queues: [{ name: invoices, dead_letter: true,
//!                 retries: { max_attempts: 3, initial_delay: 10, max_delay: 60 } }]",
//! ).unwrap();
//! let q = config.queues[0].clone();
//! let mut harness = TestQueue::new(q, service_fn(|d: Delivery| async move {
//!     match &d.body()[..] {
//!         b"ok" => Ok(()),
//!         b"bad" => Err(Reject::new("not an invoice").into()),
//!         _ => Err::<(), acemq::BoxError>("database down".into()),
//!     }
//! }));
//!
//! assert_eq!(harness.deliver_body("ok").await.fate, Fate::Acked);
//!
//! let report = harness.deliver_body("bad").await;
//! assert!(matches!(report.fate, Fate::DeadLettered { reason: acemq::Reason::Rejected, .. }));
//! assert_eq!(report.published[0].queue, "invoices.dlq");
//!
//! // Attempt 1 fails; the 10 s wait is at the broker-wait threshold (30 s
//! // by default)... so it waits here, and attempt 2 runs 10 s later.
//! let report = harness.deliver_body("flaky").await;
//! assert_eq!(report.attempts.len(), 3);
//! assert_eq!(report.attempts[1].at, Duration::from_secs(10));
//! assert!(matches!(report.fate, Fate::DeadLettered { reason: acemq::Reason::MaxAttempts, .. }));
//! # }
//! ```
//!
//! A message that arrived through an exchange, with a message id, headers
//! or other properties, or as a later attempt, is shaped with
//! [`TestQueue::message`]:
//! `harness.message(body).exchange("billing").routing_key("invoices.eu").message_id("inv-1").deliver().await`
//! (see [`TestMessage`]).
//!
//! Compare MassTransit's in-memory test harness or Spring's
//! `RabbitListenerTestHarness`: the same questions — was it acknowledged,
//! retried, where, with which headers, dead-lettered with which reason —
//! answered without a broker, by the stack that runs in production.

use crate::sync::Locked;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use acemq_layers::{
    BoxError, Cancellation, Classify, Decision, Delivery, Headers, InFlightCounter, Outgoing,
    PauseHandle, Publish, PublishError, Reason, RetryVia,
};
use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use tower::util::BoxService;
use tower::{Layer, Service, ServiceExt};

use crate::config::QueueConfig;
use crate::stack::{Attempts, Parts, QueueStack};

mod message;
pub use message::TestMessage;

/// What the recording publisher answers.
///
/// ```
/// use acemq::testing::{Fate, PublishMode, TestQueue};
/// use acemq::{Config, Delivery, Reject};
/// use tower::service_fn;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let config = Config::from_yaml_str("queues: [{ name: invoices, dead_letter: true }]").unwrap();
/// let mut harness = TestQueue::new(config.queues[0].clone(), service_fn(|_d: Delivery| async {
///     Err::<(), acemq::BoxError>(Reject::new("not an invoice").into())
/// }));
/// // The broker refuses the dead-letter copy: the queue's own DLX takes it.
/// harness.publisher().answer("invoices.dlq", PublishMode::Nack);
/// let report = harness.deliver_body("bad").await;
/// assert!(matches!(report.fate, Fate::RejectedToDlx { .. }));
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishMode {
    /// Confirmed (the default).
    Confirm,
    /// Nacked by the broker.
    Nack,
    /// Returned: no such queue.
    Unroutable,
    /// The connection failed.
    Fail,
}

/// One copy the stack published (a rung copy or a dead-letter copy).
///
/// Example: the [module docs](crate::testing).
#[derive(Clone, Debug, PartialEq)]
pub struct Published {
    /// The queue it was addressed to.
    pub queue: String,
    /// Its headers.
    pub headers: Headers,
    /// Its body.
    pub body: Bytes,
}

/// A [`Publish`] that records every copy and answers as told.
///
/// Example: the [module docs](crate::testing).
#[derive(Clone, Debug, Default)]
pub struct RecordingPublisher {
    inner: Arc<Mutex<Recorder>>,
}

#[derive(Debug, Default)]
struct Recorder {
    published: Vec<Published>,
    modes: Vec<(String, PublishMode)>,
    /// The queues the topology declares; `None`: every queue exists.
    known: Option<Vec<String>>,
}

impl RecordingPublisher {
    /// Publishes to queues whose name starts with `prefix` answer `mode`
    /// (the last matching rule wins; `""` matches every queue). Without a
    /// rule, a queue the topology declares confirms and any other is
    /// unroutable, as on a broker.
    pub fn answer(&self, prefix: &str, mode: PublishMode) {
        self.inner.locked().modes.push((prefix.to_owned(), mode));
    }

    /// Every copy published so far (confirmed or not).
    pub fn published(&self) -> Vec<Published> {
        self.inner.locked().published.clone()
    }
}

impl Publish for RecordingPublisher {
    async fn publish(&self, message: Outgoing<'_>) -> Result<(), PublishError> {
        let mut r = self.inner.locked();
        let mode = r
            .modes
            .iter()
            .rev()
            .find(|(p, _)| message.queue.starts_with(p.as_str()))
            .map(|(_, m)| *m)
            .unwrap_or_else(|| match &r.known {
                Some(known) if !known.iter().any(|k| k == message.queue) => PublishMode::Unroutable,
                _ => PublishMode::Confirm,
            });
        r.published.push(Published {
            queue: message.queue.to_owned(),
            headers: message.headers.clone(),
            body: message.delivery.body().clone(),
        });
        let queue = message.queue.to_owned();
        match mode {
            PublishMode::Confirm => Ok(()),
            PublishMode::Nack => Err(PublishError::Nacked { queue }),
            PublishMode::Unroutable => Err(PublishError::Unroutable { queue }),
            PublishMode::Fail => Err(PublishError::transport(
                queue,
                "the test publisher was told to fail",
            )),
        }
    }

    async fn redeclare(&self, _queue: &str) -> Result<(), PublishError> {
        Ok(())
    }
}

/// One call of your handler.
///
/// Example: the [module docs](crate::testing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The attempt number the handler saw.
    pub attempt: u32,
    /// When, on tokio's clock, since the delivery was handed to the stack.
    pub at: Duration,
}

/// What became of a delivery.
///
/// Example: the [module docs](crate::testing).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Fate {
    /// Acknowledged.
    Acked,
    /// A copy is on the rung `rung` (confirmed) as attempt `attempt`, after
    /// `delay`; the original is acknowledged.
    RetriedOnRung {
        /// The rung queue, e.g. `invoices.retry.60s`.
        rung: String,
        /// The attempt the copy carries.
        attempt: u32,
        /// The rung's delay.
        delay: Duration,
        /// The copy's headers.
        headers: Headers,
    },
    /// Rejected with requeue for the queue's own delayed retry to hold back
    /// (`retries.in_queue`, RabbitMQ 4.3 quorum queues): attempt `attempt`
    /// comes back after `delay`.
    RetriedInQueue {
        /// The attempt the broker's count will make it.
        attempt: u32,
        /// How long the queue holds it back.
        delay: Duration,
    },
    /// A copy with the reason headers is in the dead-letter queue
    /// (confirmed); the original is acknowledged.
    DeadLettered {
        /// The reason (`x-acemq-reason`).
        reason: Reason,
        /// The error chain (`x-acemq-error`).
        error: String,
        /// The copy's headers.
        headers: Headers,
    },
    /// Rejected without requeue, so the queue's own dead-letter exchange
    /// takes it without the reason (the copy could not be published, or
    /// `dead_letter` is off).
    RejectedToDlx {
        /// The reason that could not be attached.
        reason: Reason,
        /// The error chain.
        error: String,
    },
    /// Left to the broker: redelivered at the same attempt number.
    HandedBack,
    /// The handler ignored cancellation past `abandon_after`.
    Abandoned,
}

/// A delivery's fate, every call of the handler, and every copy published
/// for it.
///
/// Example: the [module docs](crate::testing).
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// What became of it.
    pub fate: Fate,
    /// The handler's calls, in order.
    pub attempts: Vec<Attempt>,
    /// The copies published while it was handled.
    pub published: Vec<Published>,
    /// The stack's raw decision.
    pub decision: Decision,
}

/// Your handler, wrapped by the harness to record its calls (innermost, so
/// it sees exactly what your handler sees).
///
/// Example: the [module docs](crate::testing).
#[derive(Clone, Debug)]
pub struct Recording<H> {
    inner: H,
    calls: Arc<Mutex<Vec<Attempt>>>,
    start: Arc<Mutex<tokio::time::Instant>>,
}

impl<H: Service<Delivery>> Service<Delivery> for Recording<H> {
    type Response = H::Response;
    type Error = H::Error;
    type Future = H::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, d: Delivery) -> Self::Future {
        let start = *self.start.locked();
        self.calls.locked().push(Attempt {
            attempt: d.attempt(),
            at: start.elapsed(),
        });
        self.inner.call(d)
    }
}

/// The exact stack `App` builds for one queue, in memory.
///
/// Example: the [module docs](crate::testing).
pub struct TestQueue {
    service: BoxService<Delivery, Decision, BoxError>,
    queue: QueueConfig,
    publisher: RecordingPublisher,
    calls: Arc<Mutex<Vec<Attempt>>>,
    start: Arc<Mutex<tokio::time::Instant>>,
    gate: PauseHandle,
    in_flight: InFlightCounter,
    draining: CancellationToken,
    cancel: CancellationToken,
    next_tag: u64,
}

impl std::fmt::Debug for TestQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestQueue")
            .field("queue", &self.queue.name)
            .finish_non_exhaustive()
    }
}

impl TestQueue {
    /// The stack for `queue` around `handler`, with no layers of yours.
    pub fn new<H>(queue: QueueConfig, handler: H) -> Self
    where
        H: Service<Delivery> + Clone + Send + 'static,
        H::Error: Into<BoxError>,
        H::Future: Send + 'static,
        H::Response: acemq_layers::IntoVerdict + Send + 'static,
    {
        TestQueue::with_stack(queue, QueueStack::new(), handler)
    }

    /// The stack for `queue` with your [`QueueStack`] around `handler`,
    /// as [`App::consume_with`](crate::App::consume_with) builds it.
    pub fn with_stack<H, O, I, C>(
        queue: QueueConfig,
        stack: QueueStack<O, I, C>,
        handler: H,
    ) -> Self
    where
        H: Service<Delivery> + Clone + Send + 'static,
        H::Error: Into<BoxError>,
        H::Future: Send + 'static,
        H::Response: acemq_layers::IntoVerdict + Send + 'static,
        C: Classify + Clone,
        I: Layer<Recording<H>>,
        I::Service: crate::stack::Handler,
        O: Layer<
            crate::stack::Formed<
                tower::util::MapResult<
                    Attempts<Recording<H>, I, RecordingPublisher, C>,
                    crate::stack::Sealer,
                >,
            >,
        >,
        O::Service: crate::stack::OuterService,
        BoxError: From<<O::Service as Service<Delivery>>::Error>,
    {
        let publisher = RecordingPublisher::default();
        publisher.inner.locked().known = Some(
            crate::topology::Topology::for_queue(&queue)
                .into_iter()
                .map(|d| d.name)
                .collect(),
        );
        let calls = Arc::new(Mutex::new(Vec::new()));
        let start = Arc::new(Mutex::new(tokio::time::Instant::now()));
        let gate = PauseHandle::new();
        let in_flight = InFlightCounter::new();
        let draining = CancellationToken::new();
        let cancel = CancellationToken::new();
        let handler = Recording {
            inner: handler,
            calls: calls.clone(),
            start: start.clone(),
        };
        let service = crate::stack::build(
            Parts {
                queue: &queue,
                gate: gate.clone(),
                in_flight: in_flight.clone(),
                concurrency: None,
                batch: None,
                publisher: publisher.clone(),
                draining: draining.clone(),
                cancel: Cancellation::new(cancel.clone()),
                // How long a handler may run on after cancellation: as
                // `App`'s default.
                abandon_after: crate::config::Config::DEFAULT_ABANDON_AFTER,
                woken_by_loop: false,
            },
            &stack,
            handler,
        );
        TestQueue {
            service: BoxService::new(service),
            queue,
            publisher,
            calls,
            start,
            gate,
            in_flight,
            draining,
            cancel,
            next_tag: 0,
        }
    }

    /// The recording publisher: tell it how to answer, read what it got.
    pub fn publisher(&self) -> &RecordingPublisher {
        &self.publisher
    }

    /// The queue's pause gate (as `Health::pause` would reach it).
    pub fn gate(&self) -> &PauseHandle {
        &self.gate
    }

    /// Handlers running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.total()
    }

    /// What the drain does once the broker answered its cancels: in-process
    /// waits stop and move to their rungs (or the delivery is handed back).
    pub fn start_drain(&self) {
        self.draining.cancel();
    }

    /// What the drain does at its deadline: every handler's token fires.
    pub fn cancel_handlers(&self) {
        self.cancel.cancel();
    }

    /// A delivery from this queue with `body` (headers, properties and the
    /// attempt as a fresh message has them).
    pub fn delivery(&mut self, body: impl Into<Bytes>) -> Delivery {
        self.next_tag += 1;
        Delivery::builder()
            .queue(self.queue.name.as_str())
            .routing_key(self.queue.name.as_str())
            .delivery_tag(self.next_tag)
            .body(body)
            .build()
    }

    /// A message with `body` arriving on this queue, to shape before it is
    /// delivered: the exchange and routing key it came by, its message id,
    /// headers and other properties, its attempt (see [`TestMessage`]).
    ///
    /// ```
    /// # use acemq::testing::TestQueue;
    /// # use acemq::{Config, Delivery};
    /// # let config = Config::from_yaml_str("queues: [{ name: q }]").unwrap();
    /// # let mut harness = TestQueue::new(config.queues[0].clone(),
    /// #     tower::service_fn(|_d: Delivery| async { Ok::<_, acemq::BoxError>(()) }));
    /// let d = harness.message("{}").exchange("billing").routing_key("invoices.eu")
    ///     .message_id("inv-1").header("tenant", "acme").attempt(2).build();
    /// assert_eq!((d.exchange(), d.routing_key(), d.attempt()), ("billing", "invoices.eu", 2));
    /// assert_eq!(d.properties().message_id.as_deref(), Some("inv-1"));
    /// ```
    pub fn message(&mut self, body: impl Into<Bytes>) -> TestMessage<'_> {
        TestMessage::new(self, body.into())
    }

    /// Runs `body` through the stack; see [`deliver`](Self::deliver).
    pub async fn deliver_body(&mut self, body: impl Into<Bytes>) -> Report {
        let d = self.delivery(body);
        self.deliver(d).await
    }

    /// Runs `delivery` through the stack to its end and reports its fate.
    pub async fn deliver(&mut self, delivery: Delivery) -> Report {
        *self.start.locked() = tokio::time::Instant::now();
        self.calls.locked().clear();
        let before = self.publisher.published().len();
        let decision = match self.service.ready().await {
            Ok(svc) => svc.call(delivery).await,
            Err(e) => Err(e),
        }
        .unwrap_or_else(|e| panic!("the stack returned an error instead of a decision: {e}"));
        let published: Vec<Published> = self.publisher.published().split_off(before);
        let fate = fate(&decision, &published);
        Report {
            fate,
            attempts: self.calls.locked().clone(),
            published,
            decision,
        }
    }
}

fn fate(decision: &Decision, published: &[Published]) -> Fate {
    let headers_of = |queue: &str| {
        published
            .iter()
            .rev()
            .find(|p| p.queue == queue)
            .map(|p| p.headers.clone())
            .unwrap_or_default()
    };
    match decision {
        Decision::Ack => Fate::Acked,
        Decision::Retry(r) => match &r.via {
            RetryVia::Rung(rung) => Fate::RetriedOnRung {
                rung: rung.clone(),
                attempt: r.attempt,
                delay: r.delay,
                headers: headers_of(rung),
            },
            RetryVia::Queue => Fate::RetriedInQueue {
                attempt: r.attempt,
                delay: r.delay,
            },
            // Not carried out by a retry layer: the loop hands it back.
            _ => Fate::HandedBack,
        },
        Decision::DeadLetter(d) if d.published => Fate::DeadLettered {
            reason: d.reason,
            error: d.error.clone(),
            headers: published
                .iter()
                .rev()
                .find(|p| p.queue.ends_with(acemq_layers::dead_letter::DLQ_SUFFIX))
                .map(|p| p.headers.clone())
                .unwrap_or_default(),
        },
        Decision::DeadLetter(d) => Fate::RejectedToDlx {
            reason: d.reason,
            error: d.error.clone(),
        },
        Decision::Abandoned => Fate::Abandoned,
        _ => Fate::HandedBack,
    }
}

//! The ordered stop, within one shared deadline.
//!
//! 1. readiness reports not ready;
//! 2. every consumer stops intake at once (`basic.cancel` on all of them
//!    concurrently); once the broker has answered, deliveries still buffered
//!    are handed back (`prefetch_policy: hand_back`) or handled
//!    (`handle_buffered`), and paused gates close, handing back what they
//!    hold (every gate closes at the deadline);
//! 3. the handlers in flight on all queues are waited for together, within
//!    what is left of `shutdown_timeout`;
//! 4. deadline passed (or a second signal): the handlers' tokens are
//!    cancelled — cancellation is last, never first — and a handler still
//!    running `abandon_after` later is abandoned;
//! 5. the consumer channels, then the publisher, then the connection close,
//!    also when the deadline expired;
//! 6. a [`DrainReport`], or a [`DrainTimeout`] naming each queue that still
//!    had deliveries in flight.

use std::fmt;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_layers::{InFlightCounter, PauseHandle};
use futures::future::join_all;
use lapin::options::BasicCancelOptions;
use lapin::{Channel, Connection};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::amqp::connection::ConnectionRole;
use crate::amqp::publisher::Publisher;
use crate::app::health::Health;
use crate::consumer::QueueStats;

/// How long closing a channel or the connection may take before the drain
/// moves on (a broker that went away must not hold the process).
const CLOSE_TIMEOUT: Duration = Duration::from_millis(1500);

#[derive(Clone)]
pub(crate) struct QueueHandle {
    pub(crate) name: String,
    pub(crate) channel: Channel,
    pub(crate) consumer_tag: String,
    pub(crate) gate: PauseHandle,
    pub(crate) stats: Arc<QueueStats>,
}

/// The live connections and the consumers on them; the supervisor
/// replaces them after a loss. The drain reads them once, after it has
/// begun (under the lock, so no new generation can start after it).
pub(crate) struct Link {
    consume: Mutex<Option<Arc<Connection>>>,
    publish: Mutex<Option<Arc<Connection>>>,
    /// Each queue's live generation, by config index.
    pub(crate) queues: Mutex<Vec<Option<QueueHandle>>>,
}

impl Link {
    pub(crate) fn new(consume: Arc<Connection>, publish: Arc<Connection>, queues: usize) -> Self {
        Link {
            consume: Mutex::new(Some(consume)),
            publish: Mutex::new(Some(publish)),
            queues: Mutex::new(vec![None; queues]),
        }
    }

    pub(crate) fn connection(&self, role: ConnectionRole) -> &Mutex<Option<Arc<Connection>>> {
        match role {
            ConnectionRole::Consumer => &self.consume,
            ConnectionRole::Publisher => &self.publish,
        }
    }

    fn current(&self, role: ConnectionRole) -> Option<Arc<Connection>> {
        self.connection(role)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn queues(&self) -> Vec<QueueHandle> {
        self.queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flatten()
            .cloned()
            .collect()
    }
}

/// The longest a drain can take: `shutdown_timeout`, then `abandon_after`
/// (and the grace the drain adds to it), then the close bounds: consumer
/// channels (together), the publishing connection, the consumers'
/// connection.
pub(crate) fn worst_case(config: &crate::config::Config) -> Duration {
    config.shutdown_timeout + config.abandon_after + ABANDON_GRACE + CLOSE_TIMEOUT * 3
}

/// Added to `abandon_after` before the drain stops waiting for abandoned
/// handlers to be dropped.
const ABANDON_GRACE: Duration = Duration::from_millis(250);

/// Something that publishes outside handlers (a background task, the outbox
/// relay): stopped before the consumers drain, within the drain's deadline.
pub(crate) type Background =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Coordinates the stop. Built by the runner ([`Running::into_drain`](crate::Running::into_drain));
/// see the module docs for its steps.
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
/// tokio::signal::ctrl_c().await?;
/// // A second Ctrl-C skips straight to cancellation and abandon. Do not wrap
/// // `run` in a timeout: its own deadline is `shutdown_timeout` (see
/// // `Drain::run`'s `# Cancellation safety`).
/// let hurry = async {
///     let _ = tokio::signal::ctrl_c().await;
/// };
/// match running.into_drain().run(hurry).await {
///     Ok(report) => println!("drained in {:?}", report.duration),
///     Err(timeout) => eprintln!("{timeout}"), // names each queue still in flight
/// }
/// # Ok(()) }
/// ```
#[must_use = "a Drain does nothing until it is run"]
pub struct Drain {
    pub(crate) health: Health,
    pub(crate) link: Arc<Link>,
    pub(crate) intake: CancellationToken,
    pub(crate) draining: CancellationToken,
    pub(crate) root: CancellationToken,
    pub(crate) tracker: TaskTracker,
    pub(crate) in_flight: InFlightCounter,
    pub(crate) publisher: Publisher,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) abandon_after: Duration,
    /// Publishers outside handlers, stopped first.
    pub(crate) background: Vec<Background>,
}

impl fmt::Debug for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field(
                "queues",
                &self
                    .link
                    .queues()
                    .iter()
                    .map(|q| q.name.clone())
                    .collect::<Vec<_>>(),
            )
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("abandon_after", &self.abandon_after)
            .finish_non_exhaustive()
    }
}

/// One queue's part of a drain.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueDrain {
    /// Queue name.
    pub name: String,
    /// Handlers that finished during the drain.
    pub finished: usize,
    /// Deliveries fetched but never handled, handed back to the broker.
    pub handed_back: usize,
    /// Deliveries the stream yielded after `basic.cancel` (held or handled,
    /// per `prefetch_policy`).
    pub buffered: usize,
}

/// What a clean drain did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport {
    /// From the first step to the connection closed.
    pub duration: Duration,
    /// Per queue.
    pub queues: Vec<QueueDrain>,
}

impl DrainReport {
    /// Handlers finished during the drain, all queues.
    pub fn finished(&self) -> usize {
        self.queues.iter().map(|q| q.finished).sum()
    }
    /// Deliveries handed back unhandled, all queues.
    pub fn handed_back(&self) -> usize {
        self.queues.iter().map(|q| q.handed_back).sum()
    }
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drained in {:.2} s; every handler finished ({} during the drain)",
            self.duration.as_secs_f64(),
            self.finished()
        )?;
        let held = self.handed_back();
        if held > 0 {
            write!(
                f,
                "; {} fetched but never handled — the broker will redeliver {} (",
                plural(held, "delivery was", "deliveries were"),
                if held == 1 { "it" } else { "them" }
            )?;
            let parts: Vec<String> = self
                .queues
                .iter()
                .filter(|q| q.handed_back > 0)
                .map(|q| format!("{}: {}", q.name, q.handed_back))
                .collect();
            write!(f, "{})", parts.join(", "))?;
        }
        Ok(())
    }
}

/// What ended the wait for handlers early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadlineKind {
    /// `shutdown_timeout` expired.
    ShutdownTimeout,
    /// A second stop signal arrived during the drain.
    SecondSignal,
}

/// The drain's deadline expired with handlers still running. The stop was
/// still carried out: consumers cancelled, handlers cancelled then
/// abandoned, channels and connection closed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainTimeout {
    /// What ended the wait.
    pub kind: DeadlineKind,
    /// The deadline it was given.
    pub shutdown_timeout: Duration,
    /// The grace after cancellation.
    pub abandon_after: Duration,
    /// Queues with deliveries still in flight when the deadline passed, and how many.
    pub in_flight: Vec<(String, usize)>,
    /// What else the drain was still waiting for at the deadline, per queue
    /// (consumer loops with nothing in flight that had not finished:
    /// settles stuck on a channel that does not answer, say).
    pub waiting: Vec<String>,
    /// Handlers still running `abandon_after` after cancellation (abandoned).
    pub abandoned: usize,
    /// The rest of the report.
    pub report: DrainReport,
}

impl fmt::Display for DrainTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queues: Vec<String> = self
            .in_flight
            .iter()
            .map(|(q, n)| format!("{q}: {n} in flight"))
            .collect();
        let running = if queues.is_empty() {
            "before the drain finished".to_owned()
        } else {
            format!("with handlers still running ({})", queues.join(", "))
        };
        match self.kind {
            DeadlineKind::ShutdownTimeout => write!(
                f,
                "drain deadline expired: shutdown_timeout ({:.1} s) passed {running}",
                self.shutdown_timeout.as_secs_f64(),
            )?,
            DeadlineKind::SecondSignal => {
                write!(f, "drain cut short by a second stop signal {running}")?
            }
        }
        if !self.waiting.is_empty() {
            write!(f, "; still waiting for: {}", self.waiting.join("; "))?;
        }
        write!(f, "; their tokens were cancelled")?;
        if self.abandoned > 0 {
            write!(
                f,
                " and {} handler(s) still running {:.1} s later (abandon_after) were abandoned",
                self.abandoned,
                self.abandon_after.as_secs_f64()
            )?;
        }
        write!(
            f,
            "; the connections are closed and the broker will redeliver their messages ({} and {} handed back during the drain). Lengthen shutdown_timeout (within the orchestrator's grace) or find the handler that does not return",
            plural(self.report.finished(), "handler finished", "handlers finished"),
            plural(self.report.handed_back(), "delivery was", "deliveries were"),
        )
    }
}

/// `1 delivery was`, `2 deliveries were`.
fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl std::error::Error for DrainTimeout {}

impl Drain {
    /// Runs the drain; `hurry` resolving (a second signal) skips straight to
    /// cancellation and abandon, at whichever step the drain is.
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe: dropping the future (wrapping it in
    /// `tokio::time::timeout`, say) leaves the channels and connections
    /// open and the handlers uncancelled. Its own deadline is
    /// `shutdown_timeout`; use `hurry` to cut it short — for a tighter bound
    /// of your own, pass `tokio::time::sleep(bound)` as `hurry`: the drain
    /// then still cancels, abandons and closes everything, within
    /// `abandon_after` and the close bounds after it.
    pub async fn run(
        mut self,
        hurry: impl Future<Output = ()>,
    ) -> Result<DrainReport, DrainTimeout> {
        let start = Instant::now();
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        info!(
            shutdown_timeout = ?self.shutdown_timeout,
            "drain started: readiness off, stopping intake; waiting for {} handler(s) in flight",
            self.in_flight.total()
        );
        tokio::pin!(hurry);
        let mut hurried = false;
        // 1. Readiness off.
        self.health.set_draining();
        // Publishers outside handlers (the outbox relay) stop first: what
        // they have not published waits for the next start.
        let background: Vec<_> = std::mem::take(&mut self.background)
            .into_iter()
            .map(|stop| stop())
            .collect();
        if !background.is_empty() {
            tokio::select! {
                _ = tokio::time::timeout_at(deadline, join_all(background)) => {}
                () = &mut hurry => hurried = true,
            }
        }
        // No new generation starts after this read (the runners check
        // `intake` under the same lock).
        let queues = {
            let guard = self.link.queues.lock().unwrap_or_else(|p| p.into_inner());
            self.intake.cancel();
            guard.iter().flatten().cloned().collect::<Vec<_>>()
        };
        // 2. Stop intake everywhere at once: the loops start no new handler
        // (`hand_back`) and flush what they hold; the broker stops sending.
        let unanswered: Mutex<Vec<String>> = Mutex::new(Vec::new());
        let cancels = join_all(queues.iter().map(|q| {
            let unanswered = &unanswered;
            async move {
                if !q.channel.status().connected() {
                    return;
                }
                let cancel = q
                    .channel
                    .basic_cancel(q.consumer_tag.as_str().into(), BasicCancelOptions::default());
                let why = match tokio::time::timeout_at(deadline, cancel).await {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => {
                        warn!(queue = %q.name, error = %e, "basic.cancel failed; the channel close will stop the consumer");
                        format!("{}: basic.cancel was not answered ({e})", q.name)
                    }
                    Err(_) => format!("{}: the broker never answered basic.cancel", q.name),
                };
                unanswered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(why);
            }
        }));
        tokio::select! {
            _ = cancels => {}
            () = &mut hurry => hurried = true,
        }
        let unanswered = unanswered.into_inner().unwrap_or_else(|p| p.into_inner());
        // Only now may anything be handed back or moved: a delivery requeued
        // while its consumer was still registered would be sent straight
        // back to it. In-process retry waits move to their rungs; a paused
        // gate hands back what it holds; an open one stays open so that
        // `handle_buffered` can handle what the stream still yields. Every
        // gate closes at the deadline.
        self.draining.cancel();
        for q in &queues {
            q.stats.consumer_cancelled.cancel();
            if q.gate.is_paused() {
                q.gate.close();
            }
        }
        // 3. Wait for handlers on all queues (every generation), within what
        // is left.
        self.tracker.close();
        let ended = if hurried {
            Some(DeadlineKind::SecondSignal)
        } else if !unanswered.is_empty() {
            Some(DeadlineKind::ShutdownTimeout)
        } else {
            tokio::select! {
                () = self.tracker.wait() => None,
                () = tokio::time::sleep_until(deadline) => Some(DeadlineKind::ShutdownTimeout),
                () = &mut hurry => Some(DeadlineKind::SecondSignal),
            }
        };
        let mut timeout = None;
        if let Some(kind) = ended {
            // 4. Cancel last; abandon after the grace.
            let in_flight: Vec<(String, usize)> = self
                .in_flight
                .snapshot()
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect();
            // What else the drain was waiting for: loops with nothing in
            // flight that had not finished (settles or a buffer stuck on a
            // channel that does not answer).
            let mut waiting = unanswered.clone();
            waiting.extend(queues
                .iter()
                .filter_map(|q| {
                    let loops = q.stats.loops.load(Ordering::Relaxed);
                    let unsettled = q.stats.unsettled.load(Ordering::Relaxed);
                    let buffered = q.stats.buffered.load(Ordering::Relaxed);
                    (loops > 0).then(|| {
                        format!(
                            "{}: {loops} consumer loop(s) not finished, {unsettled} settle(s) not sent or not answered, {buffered} buffered",
                            q.name
                        )
                    })
                }));
            warn!(
                ?kind,
                "drain deadline reached with {} handler(s) in flight; cancelling their tokens, abandoning any still running after {:?}",
                self.in_flight.total(),
                self.abandon_after
            );
            for q in &queues {
                q.gate.close();
            }
            self.root.cancel();
            let grace = self.abandon_after + ABANDON_GRACE;
            let _ = tokio::time::timeout(grace, self.tracker.wait()).await;
            if !in_flight.is_empty() || !waiting.is_empty() {
                timeout = Some((kind, in_flight, waiting));
            }
        }
        let abandoned: usize = queues
            .iter()
            .map(|q| q.stats.abandoned.load(Ordering::Relaxed))
            .sum::<usize>()
            + self.in_flight.total();
        // 5. Close the consumer channels, then the publishing connection,
        // then the consumers' connection.
        for q in &queues {
            q.gate.close();
        }
        let closes = join_all(queues.iter().map(|q| async move {
            if q.channel.status().connected()
                && tokio::time::timeout(CLOSE_TIMEOUT, q.channel.close(200, "OK".into()))
                    .await
                    .is_err()
            {
                return Some(format!(
                    "{}: the broker did not answer channel.close within {CLOSE_TIMEOUT:?}",
                    q.name
                ));
            }
            None
        }))
        .await;
        let mut unanswered_close: Vec<String> = closes.into_iter().flatten().collect();
        self.publisher.shut().await;
        for role in [ConnectionRole::Publisher, ConnectionRole::Consumer] {
            if let Some(connection) = self.link.current(role) {
                if connection.status().connected()
                    && tokio::time::timeout(CLOSE_TIMEOUT, connection.close(200, "OK".into()))
                        .await
                        .is_err()
                {
                    unanswered_close.push(format!(
                        "the {} connection: the broker did not answer connection.close within {CLOSE_TIMEOUT:?}",
                        role.as_str()
                    ));
                }
            }
            self.health.set_connected(role, false);
        }
        if !unanswered_close.is_empty() {
            match &mut timeout {
                Some((_, _, waiting)) => waiting.extend(unanswered_close),
                None => {
                    timeout = Some((DeadlineKind::ShutdownTimeout, Vec::new(), unanswered_close))
                }
            }
        }
        // 6. Report.
        let report = DrainReport {
            duration: start.elapsed(),
            queues: queues
                .iter()
                .map(|q| QueueDrain {
                    name: q.name.clone(),
                    finished: q.stats.finished_during_drain.load(Ordering::Relaxed),
                    handed_back: q.stats.handed_back.load(Ordering::Relaxed),
                    buffered: q.stats.buffered_after_cancel.load(Ordering::Relaxed),
                })
                .collect(),
        };
        metrics::histogram!("acemq.drain.duration").record(report.duration.as_secs_f64());
        match timeout {
            None => Ok(report),
            Some((kind, in_flight, waiting)) => {
                metrics::counter!("acemq.drain.timeouts").increment(1);
                Err(DrainTimeout {
                    kind,
                    shutdown_timeout: self.shutdown_timeout,
                    abandon_after: self.abandon_after,
                    in_flight,
                    waiting,
                    abandoned,
                    report,
                })
            }
        }
    }
}

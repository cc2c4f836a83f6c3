//! [`Drain`] and its run, in the module docs' numbered steps: one named
//! step each.

use crate::sync::Locked;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_layers::InFlightCounter;
use futures::future::join_all;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::bounds::ABANDON_GRACE;
use super::closes::{CloseStep, CLOSE_STEPS};
use super::consumers::{cancel_consumers, close_channels, loops_not_finished};
use super::link::{Background, Link, QueueHandle};
use super::report::{DeadlineKind, DrainReport, DrainTimeout, QueueDrain};
use crate::app::health::Health;
use crate::connection::{close_connection, ConnectionRole, CLOSE_BOUND};
use crate::publisher::Publisher;

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

/// Why a drain ends in a [`DrainTimeout`]: what ended the wait, the queues
/// with deliveries still in flight, and what else it was still waiting for.
struct Unfinished {
    kind: DeadlineKind,
    in_flight: Vec<(String, usize)>,
    waiting: Vec<String>,
}

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
        let queues = self.last_generations();
        // 2. Stop intake everywhere at once: the loops start no new handler
        // (`hand_back`) and flush what they hold; the broker stops sending.
        let unanswered = cancel_consumers(&queues, deadline, hurry.as_mut(), &mut hurried).await;
        self.start_hand_back(&queues);
        // 3. Wait for handlers on all queues (every generation), within what
        // is left.
        let ended = self
            .wait_for_handlers(hurried, &unanswered, deadline, hurry.as_mut())
            .await;
        hurried |= ended == Some(DeadlineKind::SecondSignal);
        let mut unfinished = None;
        if let Some(kind) = ended {
            // 4. Cancel last; abandon after the grace.
            unfinished = self.cancel_and_abandon(kind, &queues, unanswered).await;
        }
        let abandoned = self.abandoned(&queues);
        // 5. Publishers outside handlers (the outbox relay) publish what
        // the handlers committed, within what is left of the deadline.
        self.finish_background(deadline, hurry, hurried).await;
        // 6. Close the consumer channels, then the publishing connection,
        // then the consumers' connection.
        let unanswered_close = self.close(&queues).await;
        let unfinished = with_unanswered_close(unfinished, unanswered_close);
        // 7. Report: a loss during the drain makes it unclean too.
        let report = self.report(start, &queues);
        self.health.set_drained();
        let unfinished = with_lost(unfinished, &report);
        match unfinished {
            None => Ok(report),
            Some(unfinished) => Err(self.timed_out(unfinished, abandoned, report)),
        }
    }

    // The steps that await take `&mut self`: a `Drain` is `Send` but not
    // `Sync` (its `Background`s), so a `&self` held across an await would
    // make `run`'s future not `Send`.

    /// Publishers outside handlers (the outbox relay) finish once the
    /// handlers have: they publish what was committed, until the deadline
    /// or a second signal; what they have not published then waits for the
    /// next start (dropping their futures stops them). A drain already
    /// hurried does not wait.
    async fn finish_background<H: Future<Output = ()>>(
        &mut self,
        deadline: tokio::time::Instant,
        hurry: Pin<&mut H>,
        hurried: bool,
    ) {
        let background: Vec<_> = std::mem::take(&mut self.background)
            .into_iter()
            .map(|finish| finish())
            .collect();
        if !background.is_empty() && !hurried {
            tokio::select! {
                _ = tokio::time::timeout_at(deadline, join_all(background)) => {}
                () = hurry => {}
            }
        }
    }

    /// Stops intake (`intake` cancelled) and reads each queue's live
    /// generation, the ones the drain stops.
    fn last_generations(&self) -> Vec<QueueHandle> {
        // No new generation starts after this read (the runners check
        // `intake` under the same lock).
        let guard = self.link.queues.locked();
        self.intake.cancel();
        guard.iter().flatten().cloned().collect::<Vec<_>>()
    }

    /// Once the consumers are cancelled: the loops hand back or handle what
    /// they hold, and paused gates close.
    fn start_hand_back(&self, queues: &[QueueHandle]) {
        // Only now may anything be handed back or moved: a delivery requeued
        // while its consumer was still registered would be sent straight
        // back to it. In-process retry waits move to their rungs; a paused
        // gate hands back what it holds (an operator's pause, or a circuit
        // open or half-open: what waits for the breaker's probe is held too);
        // an open one stays open so that `handle_buffered` can handle what
        // the stream still yields. Every gate closes at the deadline.
        self.draining.cancel();
        for q in queues {
            q.stats.consumer_cancelled.cancel();
            if q.gate.is_paused() || q.gate.circuit() != acemq_layers::Circuit::Closed {
                q.gate.close();
            }
        }
    }

    /// Waits for the handlers in flight on all queues, until the deadline or
    /// `hurry`; `None` when they all finished. A drain already hurried, or
    /// whose `basic.cancel`s were not all answered, does not wait.
    async fn wait_for_handlers<H: Future<Output = ()>>(
        &mut self,
        hurried: bool,
        unanswered: &[String],
        deadline: tokio::time::Instant,
        hurry: Pin<&mut H>,
    ) -> Option<DeadlineKind> {
        self.tracker.close();
        if hurried {
            Some(DeadlineKind::SecondSignal)
        } else if !unanswered.is_empty() {
            // A `basic.cancel` the broker never answered waited for the
            // deadline; one it refused did not.
            if tokio::time::Instant::now() >= deadline {
                Some(DeadlineKind::ShutdownTimeout)
            } else {
                Some(DeadlineKind::Unanswered)
            }
        } else {
            tokio::select! {
                // Handlers that finished as the deadline or a second signal
                // came make a clean drain, not a timeout.
                biased;
                () = self.tracker.wait() => None,
                () = hurry => Some(DeadlineKind::SecondSignal),
                () = tokio::time::sleep_until(deadline) => Some(DeadlineKind::ShutdownTimeout),
            }
        }
    }

    /// Cancels the handlers' tokens and waits `abandon_after` (and the
    /// grace) for them; what the drain did not finish, if anything: the
    /// queues still in flight, and `unanswered` with the loops not finished.
    async fn cancel_and_abandon(
        &mut self,
        kind: DeadlineKind,
        queues: &[QueueHandle],
        unanswered: Vec<String>,
    ) -> Option<Unfinished> {
        let in_flight: Vec<(String, usize)> = self
            .in_flight
            .snapshot()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        // What else the drain was waiting for: loops with nothing in
        // flight that had not finished (settles or a buffer stuck on a
        // channel that does not answer).
        let mut waiting = unanswered;
        waiting.extend(queues.iter().filter_map(loops_not_finished));
        warn!(
            ?kind,
            "drain deadline reached with {} handler(s) in flight; cancelling their tokens, abandoning any still running after {:?}",
            self.in_flight.total(),
            self.abandon_after
        );
        for q in queues {
            q.gate.close();
        }
        self.root.cancel();
        let grace = self.abandon_after + ABANDON_GRACE;
        let _ = tokio::time::timeout(grace, self.tracker.wait()).await;
        if !in_flight.is_empty() || !waiting.is_empty() {
            Some(Unfinished {
                kind,
                in_flight,
                waiting,
            })
        } else {
            None
        }
    }

    /// Handlers abandoned: those the loops gave up on, and those still in
    /// flight.
    fn abandoned(&self, queues: &[QueueHandle]) -> usize {
        queues
            .iter()
            .map(|q| q.stats.abandoned.load(Ordering::Relaxed))
            .sum::<usize>()
            + self.in_flight.total()
    }

    /// Closes every gate, then each of the [`CLOSE_STEPS`] in order: the
    /// consumer channels, the publisher, the connections; what the broker
    /// did not answer within [`CLOSE_BOUND`].
    async fn close(&mut self, queues: &[QueueHandle]) -> Vec<String> {
        for q in queues {
            q.gate.close();
            // From here a closed channel is the drain's doing, not a loss.
            q.stats.drain_closing.store(true, Ordering::Release);
        }
        let mut unanswered_close = Vec::new();
        for step in CLOSE_STEPS {
            match step {
                CloseStep::ConsumerChannels => {
                    unanswered_close.extend(close_channels(queues).await)
                }
                CloseStep::PublisherChannel => self.publisher.shut().await,
                CloseStep::Connection(role) => {
                    unanswered_close.extend(self.close_connection(role).await)
                }
            }
        }
        unanswered_close
    }

    /// Closes `role`'s connection and empties its cell (health reads it as
    /// not connected); the publishing connection first, then the
    /// consumers'. The supervisor stopped with intake: from here the drain
    /// alone writes the cells.
    async fn close_connection(&mut self, role: ConnectionRole) -> Option<String> {
        let mut unanswered_close = None;
        let live = self.link.connections.get(role);
        if let Some(connection) = live.current() {
            // A close not answered on a connection lapin has meanwhile
            // found lost (the socket closed under it: an outage as the
            // drain began) left nothing unanswered: what was on it is
            // counted as lost, if anything, by its queue.
            if connection.status().connected()
                && close_connection(&connection, "OK")
                    .await
                    .is_err_and(|e| e.is_unanswered())
                && connection.status().connected()
            {
                unanswered_close = Some(format!(
                    "the {} connection: the broker did not answer connection.close within {CLOSE_BOUND:?}",
                    role.as_str()
                ));
            }
        }
        live.set(None);
        unanswered_close
    }

    /// What each queue did; records the drain's duration.
    fn report(&self, start: Instant, queues: &[QueueHandle]) -> DrainReport {
        let report = DrainReport {
            duration: start.elapsed(),
            queues: queues
                .iter()
                .map(|q| QueueDrain {
                    name: q.name.clone(),
                    finished: q.stats.finished_during_drain.load(Ordering::Relaxed),
                    handed_back: q.stats.handed_back.load(Ordering::Relaxed),
                    buffered: q.stats.buffered_after_cancel.load(Ordering::Relaxed),
                    lost: q.stats.lost_in_drain.load(Ordering::Relaxed),
                })
                .collect(),
        };
        metrics::histogram!("acemq.drain.duration").record(report.duration.as_secs_f64());
        report
    }

    /// The timeout around the report; counts it.
    fn timed_out(
        &self,
        unfinished: Unfinished,
        abandoned: usize,
        report: DrainReport,
    ) -> DrainTimeout {
        let Unfinished {
            kind,
            in_flight,
            waiting,
        } = unfinished;
        metrics::counter!("acemq.drain.timeouts").increment(1);
        DrainTimeout {
            kind,
            shutdown_timeout: self.shutdown_timeout,
            abandon_after: self.abandon_after,
            in_flight,
            waiting,
            abandoned,
            report,
        }
    }
}

/// Outcomes lost with a channel or connection during the drain make it
/// unclean: a `ChannelLost` on its own, or part of what else it did not
/// finish (the report carries the counts either way).
fn with_lost(unfinished: Option<Unfinished>, report: &DrainReport) -> Option<Unfinished> {
    if unfinished.is_some() || report.lost() == 0 {
        return unfinished;
    }
    Some(Unfinished {
        kind: DeadlineKind::ChannelLost,
        in_flight: Vec::new(),
        waiting: Vec::new(),
    })
}

/// Closes the broker did not answer are waited for too: they join what the
/// drain did not finish, or alone make it `Unanswered` (no deadline passed:
/// saying so would send an operator after a handler that returned).
fn with_unanswered_close(
    unfinished: Option<Unfinished>,
    unanswered_close: Vec<String>,
) -> Option<Unfinished> {
    let mut unfinished = unfinished;
    if !unanswered_close.is_empty() {
        match &mut unfinished {
            Some(u) => u.waiting.extend(unanswered_close),
            None => {
                unfinished = Some(Unfinished {
                    kind: DeadlineKind::Unanswered,
                    in_flight: Vec::new(),
                    waiting: unanswered_close,
                })
            }
        }
    }
    unfinished
}

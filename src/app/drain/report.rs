//! What a drain did: the [`DrainReport`] of a clean drain, or the
//! [`DrainTimeout`] of one whose deadline expired.

use std::fmt;
use std::time::Duration;

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

//! What a drain did: the [`DrainReport`] of a clean drain, or the
//! [`DrainTimeout`] of one whose deadline expired.

use std::fmt;
use std::time::Duration;

/// One queue's part of a drain.
///
/// Example: the one on [`Drain`](crate::Drain); `examples/shop/main.rs` exits with it through [`finish`](crate::app::finish).
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
    /// Outcomes lost with the queue's channel or connection during the
    /// drain: handlers still running when it was lost (cancelled, their
    /// outcomes dropped) and outcomes not yet sent. The broker redelivers
    /// those messages, and work already done for them is done again.
    pub lost: usize,
}

/// What a clean drain did.
///
/// Example: the one on [`Drain`](crate::Drain); `examples/shop/main.rs` exits with it through [`finish`](crate::app::finish).
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
    /// Outcomes lost with a channel or connection during the drain, all
    /// queues (see [`QueueDrain::lost`]). Not zero: the stop was not clean,
    /// and the drain returned a [`DrainTimeout`] of kind
    /// [`DeadlineKind::ChannelLost`] (exit code 75).
    pub fn lost(&self) -> usize {
        self.queues.iter().map(|q| q.lost).sum()
    }

    /// `N outcomes were lost with a channel … (q: n)`, when any was.
    fn lost_text(&self) -> Option<String> {
        let lost = self.lost();
        (lost > 0).then(|| {
            let parts: Vec<String> = self
                .queues
                .iter()
                .filter(|q| q.lost > 0)
                .map(|q| format!("{}: {}", q.name, q.lost))
                .collect();
            format!(
                "{} lost with a channel or connection during the drain ({}): their handlers \
                 were cancelled and their outcomes dropped; the broker will redeliver {} and \
                 work already done for {} is done again",
                plural(lost, "outcome was", "outcomes were"),
                parts.join(", "),
                if lost == 1 {
                    "that message"
                } else {
                    "those messages"
                },
                if lost == 1 { "it" } else { "them" },
            )
        })
    }
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.lost_text() {
            None => write!(
                f,
                "drained in {:.2} s; every handler finished ({} during the drain)",
                self.duration.as_secs_f64(),
                self.finished()
            )?,
            Some(lost) => write!(
                f,
                "drained in {:.2} s, not cleanly: {lost}; {} during the drain",
                self.duration.as_secs_f64(),
                plural(self.finished(), "handler finished", "handlers finished"),
            )?,
        }
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
///
/// Example: the one on [`Drain`](crate::Drain); `examples/shop/main.rs` exits with it through [`finish`](crate::app::finish).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadlineKind {
    /// `shutdown_timeout` expired.
    ShutdownTimeout,
    /// A second stop signal arrived during the drain.
    SecondSignal,
    /// No deadline passed, but a queue's channel or connection was lost
    /// during the drain with handlers running or outcomes not yet sent:
    /// the handlers were cancelled and their outcomes dropped, and the
    /// broker redelivers those messages ([`DrainReport::lost`]).
    ChannelLost,
    /// No deadline passed, but the broker did not answer a step of the stop
    /// in time — the close of a channel or connection (within its close
    /// bound), or a `basic.cancel` it refused — so the settles sent just
    /// before may not have reached it and it may redeliver those messages
    /// ([`DrainTimeout::waiting`] names each step). Seen when a node is
    /// overloaded, frozen or just continued.
    Unanswered,
}

/// The drain did not stop cleanly: its deadline expired (or a second signal
/// cut it short) with handlers still running, or a channel or connection
/// was lost during it with outcomes not yet settled ([`DeadlineKind`]
/// says which). The stop was still carried out: consumers cancelled,
/// handlers cancelled then abandoned, channels and connection closed. The
/// exit code is 75: work will be redone.
///
/// Example: the one on [`Drain`](crate::Drain); `examples/shop/main.rs` exits with it through [`finish`](crate::app::finish).
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
        let running = if self.in_flight.is_empty() {
            "before the drain finished".to_owned()
        } else {
            format!("with handlers still running ({})", self.in_flight_list())
        };
        match self.kind {
            DeadlineKind::ChannelLost => return self.fmt_lost(f),
            DeadlineKind::Unanswered => return self.fmt_unanswered(f),
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
        self.fmt_abandoned_and_lost(f)?;
        write!(
            f,
            "; the connections are closed and the broker will redeliver their messages ({}). Lengthen shutdown_timeout (within the orchestrator's grace) or find the handler that does not return",
            self.counts(),
        )
    }
}

impl DrainTimeout {
    /// The drain finished within its deadline, but outcomes were lost with
    /// a channel or connection.
    fn fmt_lost(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lost = self.report.lost_text().unwrap_or_default();
        write!(f, "drain not clean: {lost}")?;
        if self.abandoned > 0 {
            write!(
                f,
                "; {} handler(s) ignored the cancellation and were abandoned {:.1} s later (abandon_after)",
                self.abandoned,
                self.abandon_after.as_secs_f64()
            )?;
        }
        write!(f, "; the connections are closed ({})", self.counts())
    }
}

impl DrainTimeout {
    /// `q: 1 in flight, r: 2 in flight`.
    fn in_flight_list(&self) -> String {
        let queues: Vec<String> = self
            .in_flight
            .iter()
            .map(|(q, n)| format!("{q}: {n} in flight"))
            .collect();
        queues.join(", ")
    }

    /// The handlers abandoned after the grace, and the outcomes lost, if any.
    fn fmt_abandoned_and_lost(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.abandoned > 0 {
            write!(
                f,
                " and {} handler(s) still running {:.1} s later (abandon_after) were abandoned",
                self.abandoned,
                self.abandon_after.as_secs_f64()
            )?;
        }
        if let Some(lost) = self.report.lost_text() {
            write!(f, "; {lost}")?;
        }
        Ok(())
    }

    /// `3 handlers finished and 1 delivery was handed back during the drain`.
    fn counts(&self) -> String {
        format!(
            "{} and {} handed back during the drain",
            plural(
                self.report.finished(),
                "handler finished",
                "handlers finished"
            ),
            plural(self.report.handed_back(), "delivery was", "deliveries were"),
        )
    }

    /// The drain finished within its deadline, but the broker did not
    /// answer a step of the stop.
    fn fmt_unanswered(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drain not clean: the broker did not answer in time: {}",
            self.waiting.join("; ")
        )?;
        if !self.in_flight.is_empty() {
            write!(
                f,
                "; handlers still running ({}) had their tokens cancelled",
                self.in_flight_list()
            )?;
        }
        self.fmt_abandoned_and_lost(f)?;
        write!(
            f,
            "; the connections are closed, and the broker may redeliver what it had not settled ({}). The broker, or the network to it, was slow or not answering: see its logs (a frozen or overloaded node, a memory alarm)",
            self.counts(),
        )
    }
}

/// `1 delivery was`, `2 deliveries were`.
fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl std::error::Error for DrainTimeout {}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(lost: usize) -> DrainReport {
        DrainReport {
            duration: Duration::from_millis(3210),
            queues: vec![
                QueueDrain {
                    name: "a".into(),
                    finished: 2,
                    handed_back: 0,
                    buffered: 0,
                    lost,
                },
                QueueDrain {
                    name: "b".into(),
                    finished: 1,
                    handed_back: 3,
                    buffered: 3,
                    lost: 0,
                },
            ],
        }
    }

    #[test]
    fn a_report_with_outcomes_lost_never_says_every_handler_finished() {
        let clean = report(0).to_string();
        assert!(
            clean.contains("every handler finished (3 during the drain)"),
            "{clean}"
        );
        let lost = report(1);
        assert_eq!(lost.lost(), 1);
        let text = lost.to_string();
        assert!(!text.contains("every handler finished"), "{text}");
        assert!(
            text.starts_with("drained in 3.21 s, not cleanly: 1 outcome was lost with a channel or connection during the drain (a: 1)")
                && text.contains("the broker will redeliver that message")
                && text.contains("3 handlers finished during the drain")
                && text.contains("3 deliveries were fetched but never handled"),
            "{text}"
        );
    }

    #[test]
    fn a_drain_ended_by_a_loss_says_how_many_outcomes_will_be_redelivered() {
        let t = DrainTimeout {
            kind: DeadlineKind::ChannelLost,
            shutdown_timeout: Duration::from_secs(20),
            abandon_after: Duration::from_secs(5),
            in_flight: Vec::new(),
            waiting: Vec::new(),
            abandoned: 0,
            report: report(2),
        };
        let text = t.to_string();
        assert!(
            text.starts_with("drain not clean: 2 outcomes were lost with a channel or connection during the drain (a: 2)")
                && text.contains("the broker will redeliver those messages")
                && !text.contains("deadline"),
            "{text}"
        );
        let unanswered = DrainTimeout {
            kind: DeadlineKind::Unanswered,
            waiting: vec![
                "the consumer connection: the broker did not answer connection.close within 1s"
                    .into(),
            ],
            report: report(0),
            ..t.clone()
        };
        let text = unanswered.to_string();
        assert!(
            text.starts_with("drain not clean: the broker did not answer in time: the consumer connection: the broker did not answer connection.close within 1s")
                && text.contains("the broker may redeliver what it had not settled (3 handlers finished and 3 deliveries were handed back during the drain)")
                && !text.contains("deadline")
                && !text.contains("shutdown_timeout"),
            "{text}"
        );
        let deadline = DrainTimeout {
            kind: DeadlineKind::ShutdownTimeout,
            in_flight: vec![("b".into(), 1)],
            ..t
        };
        let text = deadline.to_string();
        assert!(
            text.starts_with("drain deadline expired")
                && text.contains("2 outcomes were lost with a channel or connection"),
            "{text}"
        );
    }
}

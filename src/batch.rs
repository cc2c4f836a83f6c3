//! Batch consumption: a handler given many deliveries at once — one
//! statement for a hundred rows instead of a hundred round trips — while
//! each delivery keeps its own outcome, retries, dead-letter and settle.
//!
//! ```no_run
//! use std::time::Duration;
//! use acemq::batch::Batch;
//! use acemq::config::QueueConfig;
//! use acemq::{App, Config, Reject, Verdict};
//! use tower::service_fn;
//!
//! # async fn run() -> std::process::ExitCode {
//! let mut queue = QueueConfig::new("rows");
//! queue.prefetch = 200; // at least max_size × concurrency
//! queue.concurrency = 2; // batches running at once
//! queue.dead_letter = true;
//! let config = Config::new([queue]);
//! App::new(config)
//!     .consume_batch("rows", 100, Duration::from_millis(50), service_fn(|batch: Batch| async move {
//!         // One outcome per delivery, in the batch's order: a bad row is
//!         // dead-lettered alone, the rest are acknowledged together.
//!         let outcomes: Vec<Result<Verdict, Reject>> = batch
//!             .iter()
//!             .map(|d| match std::str::from_utf8(d.body()) {
//!                 Ok(_) => Ok(Verdict::Ack),
//!                 Err(_) => Err(Reject::new("not UTF-8")),
//!             })
//!             .collect();
//!         // ... write the good rows in one statement here ...
//!         Ok::<_, std::io::Error>(outcomes)
//!     }))
//!     .run()
//!     .await
//! # }
//! ```
//!
//! # How a batch is formed
//!
//! Deliveries come from the queue's prefetch window, one request each, down
//! the [queue's stack](crate::stack). Under your outer layers and before
//! the claim, they gather into a batch of at most `max_size`, closed when
//! it is full or `max_wait` after its first delivery, whichever is first:
//! a batch never waits longer for the rest (a quiet queue runs partial
//! batches). A closed batch waits for one of the queue's `concurrency`
//! permits — **for a batch queue, `concurrency` counts batches running at
//! once** — then each delivery is claimed on its own (in flight, counted
//! per delivery) and goes down through dead-letter, retry and cancellation
//! to the handler's place, where the batch waits for its members and calls
//! your service once.
//!
//! `prefetch` must be at least `max_size × concurrency` (checked at start,
//! with the fix in the error): the broker sends at most `prefetch`
//! unacknowledged deliveries, so a smaller window could never fill the
//! batches that may run.
//!
//! # Outcomes
//!
//! Your service answers ([`IntoOutcomes`]) `()` (every delivery
//! succeeded), one [`Verdict`](crate::Verdict) for all, or a
//! `Vec<Result<V, E>>` with one result per delivery in the batch's order.
//! An `Err` from the service fails every delivery with it. Then each
//! delivery is on its own:
//!
//! - a success is acknowledged — a run of them in one `basic.ack` with
//!   `multiple` (the settle ledger coalesces contiguous acknowledgements);
//! - a permanent failure ([`Reject`](crate::Reject) in its chain, or
//!   `Verdict::DeadLetter`) is dead-lettered with its reason, alone;
//! - a transient failure is retried on the queue's schedule, alone: an
//!   in-process retry calls your service with a batch of that one
//!   delivery; a rung retry brings it back to the queue, to a later batch.
//!
//! # Drain
//!
//! A delivery whose batch is being formed, or whose formed batch waits for
//! a running one, is *held*: the drain hands it back to the broker at once
//! and never calls it abandoned. A batch whose service was called runs to
//! its end within the drain's deadline, and its deliveries settle as
//! usual; past the deadline, [`Batch::token`] fires. In-flight and
//! handed-back counts in the drain's report are per delivery.

use std::time::Duration;

pub use acemq_layers::batch::{Batch, BatchFailed, BatchHandler, IntoOutcomes, Outcomes};

use crate::config::{Config, ConfigError};

/// A queue's batch size, as given to `App::consume_batch`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchSize {
    pub(crate) max_size: usize,
    pub(crate) max_wait: Duration,
}

impl BatchSize {
    /// The batcher of a queue with `concurrency` batches running at once.
    pub(crate) fn batcher(self, concurrency: usize) -> acemq_layers::batch::Batcher {
        acemq_layers::batch::Batcher::new(self.max_size, self.max_wait, concurrency)
    }
}

/// Checks each queue consumed in batches against its config: `max_size`
/// at least 1, `prefetch` at least `max_size × concurrency`.
pub(crate) fn validate(
    config: &Config,
    batches: &[(String, BatchSize)],
) -> Result<(), ConfigError> {
    for (queue, size) in batches {
        let Some(i) = config.queues.iter().position(|q| &q.name == queue) else {
            continue; // `check_handlers` names it
        };
        let q = &config.queues[i];
        if size.max_size == 0 {
            return Err(ConfigError::invalid(
                format!("queues[{i}]"),
                format!("{queue:?} is consumed in batches of max_size 0"),
                "give App::consume_batch a max_size of at least 1",
            ));
        }
        let needed = size.max_size.saturating_mul(q.concurrency);
        if usize::from(q.prefetch) < needed {
            let fits = (usize::from(q.prefetch) / size.max_size).max(1);
            return Err(ConfigError::invalid(
                format!("queues[{i}].prefetch"),
                format!(
                    "({}) is below max_size × concurrency ({} × {} = {needed}) for {queue:?}, \
                     consumed in batches",
                    q.prefetch, size.max_size, q.concurrency
                ),
                format!(
                    "raise prefetch to at least {needed}, or lower concurrency to {fits} \
                     (batches running at once) or max_size: the broker sends at most prefetch \
                     unacknowledged deliveries, so the batches could never fill"
                ),
            ));
        }
    }
    Ok(())
}

//! The ordered stop, within one shared deadline.
//!
//! 1. readiness reports not ready;
//! 2. every consumer stops intake at once (`basic.cancel` on all of them
//!    concurrently); once the broker has answered, deliveries still buffered
//!    are handed back (`prefetch_policy: hand_back`) or handled
//!    (`handle_buffered`), and paused gates close, handing back what they
//!    hold (every gate closes at the deadline);
//! 3. the handlers in flight on all queues are waited for together, within
//!    what is left of `shutdown_timeout` — including deliveries that are
//!    *confirming* (their handler returned and gave its concurrency permit
//!    up; only their rung or dead-letter copy's confirm is awaited): they
//!    stay counted in flight until the confirm is in and their outcome
//!    exists, so the publishing channel is not closed under them and each
//!    is settled after its copy is confirmed;
//! 4. deadline passed (or a second signal): the handlers' tokens are
//!    cancelled — cancellation is last, never first — and a handler still
//!    running `abandon_after` later is abandoned;
//! 5. the consumer channels, then the publisher, then the connection close,
//!    also when the deadline expired;
//! 6. a [`DrainReport`], or a [`DrainTimeout`] naming each queue that still
//!    had deliveries in flight.
//!
//! A channel or connection lost during the drain is a loss like any other:
//! that queue's running handlers are cancelled (`abandon_after` applies) and
//! their outcomes are orphans, never settled. The other queues drain on. The
//! drain then ends in a [`DrainTimeout`] of kind
//! [`DeadlineKind::ChannelLost`] (exit code 75) whose report says how many
//! outcomes were lost and will be redelivered ([`DrainReport::lost`]) —
//! never "every handler finished". A channel closed once its consumer's
//! stream has ended is noticed within 100 ms.
//!
//! See the example on [`Drain`].

mod bounds;
mod closes;
mod consumers;
mod link;
mod report;
mod run;

pub(crate) use bounds::worst_case;
pub(crate) use link::{Background, Link, QueueHandle};
pub use report::{DeadlineKind, DrainReport, DrainTimeout, QueueDrain};
pub use run::Drain;

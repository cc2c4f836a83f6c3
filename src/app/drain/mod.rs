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

mod bounds;
mod consumers;
mod link;
mod report;
mod run;

pub(crate) use bounds::worst_case;
pub(crate) use link::{Background, Link, QueueHandle};
pub use report::{DeadlineKind, DrainReport, DrainTimeout, QueueDrain};
pub use run::Drain;

//! Declaring what the config names: its exchanges, then for each queue `Q`,
//! `Q.dlq` and one rung `Q.retry.<delay>` per distinct broker-side delay,
//! then the queues' bindings.
//!
//! A queue with `passive: true` is declared passively (with its `.dlq` and
//! rungs): nothing is created, a missing one is
//! [`TopologyError::Missing`]. Errors are recognised by the broker's reply
//! code (406 PRECONDITION_FAILED for a conflict, 404 NOT_FOUND for a missing
//! queue or exchange), not by its text.
//!
//! See the example on [`Topology`].

mod broker;
mod decls;
mod delivery_limit;
mod error;

pub(crate) use broker::declare_one;
#[doc(hidden)]
pub use decls::{BindingDecl, ExchangeDecl};
pub use decls::{QueueDecl, Topology};
pub use error::TopologyError;

//! The supervisor: two connections (consuming, publishing), each watched and
//! reopened with capped, jittered backoff (`backoff`), and kept in its
//! role's cell (`connection::live`), which it alone writes; and one long-lived runner per
//! queue that starts a generation (a channel and its consumer loop) and
//! recovers it when it ends — a lost connection, a channel the broker closed
//! (`consumer_timeout`, 404, 406), a consumer the broker cancelled (queue
//! deleted), a stack whose `poll_ready` failed, or a loop that panicked.
//!
//! Shaped like mini-redis's listener: the runner owns the queue's
//! concurrency semaphore (shared by its generations, so an old generation's
//! handlers still hold their permits while a new one starts) and hands each
//! generation the shutdown tokens; a generation's whole life is one
//! [`ConsumerLoop`] whose `run` returns when it is done.
//!
//! - `shared`: what the supervisor and the runners share, and how a
//!   generation is opened and installed;
//! - `queue`: one queue's runner;
//! - `connection`: one connection's supervisor;
//! - `stream`: one stream's runner (a stream connection per generation).

mod connection;
mod queue;
mod shared;
mod stream;

pub(crate) use connection::supervise;
pub(crate) use queue::run_queue;
pub(crate) use shared::{open, Opened, QueueParts, Shared};
pub(crate) use stream::{run_stream, stream_options};

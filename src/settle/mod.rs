//! Settling deliveries of your own lapin consumer exactly once, the way
//! [`App`](crate::App)'s consumer loop does: carrying out a [`Decision`](crate::Decision)
//! through the same settle ledger, with acknowledgements coalesced into
//! `multiple` runs.
//!
//! You keep your `basic_consume` and your stream; a [`Settler`] made from
//! the consumer's channel turns each lapin delivery into an acemq
//! [`Delivery`](crate::Delivery) and a [`Ticket`] ([`Settler::track`]), and the ticket
//! carries out the decision the layers (or you) made
//! ([`Ticket::settle`]). The ticket is consumed by it and is not `Clone`:
//! a delivery is settled once by type.
//!
//! ```no_run
//! use acemq::config::AckBatch;
//! use acemq::lapin::options::{BasicConsumeOptions, BasicQosOptions};
//! use acemq::lapin::types::FieldTable;
//! use acemq::lapin::{Connection, ConnectionProperties};
//! use acemq::{Decision, Settler};
//! use futures::StreamExt;
//!
//! # async fn run() -> Result<(), acemq::BoxError> {
//! let conn = Connection::connect("amqp://127.0.0.1:5672/%2f", ConnectionProperties::default()).await?;
//! let channel = conn.create_channel().await?;
//! let prefetch = 32;
//! channel.basic_qos(prefetch, BasicQosOptions::default()).await?;
//! let mut consumer = channel
//!     .basic_consume("orders".into(), "".into(), BasicConsumeOptions::default(), FieldTable::default())
//!     .await?;
//! let settler = Settler::new(channel.clone(), "orders", AckBatch::default(), prefetch);
//! while let Some(raw) = consumer.next().await {
//!     // In arrival order, straight from the stream.
//!     let (delivery, ticket) = settler.track(raw?);
//!     tokio::spawn(async move {
//!         let decision = if delivery.body().is_empty() {
//!             Decision::HandBack // nack with requeue
//!         } else {
//!             Decision::Ack
//!         };
//!         ticket.settle(decision); // consumed: settled once
//!     });
//! #   break;
//! }
//! // ... after basic_cancel and once every handler has settled:
//! let report = settler.close().await; // everything held goes out first
//! assert_eq!(report.not_sent, 0);
//! channel.close(200, "OK".into()).await?;
//! # Ok(()) }
//! ```
//!
//! `examples/own_consumer.rs` is the whole program: acemq's layers (retry,
//! dead-letter, cancellation) around a handler, a plain lapin consumer,
//! and a stop on SIGTERM or Ctrl-C that cancels the consumer, waits for the
//! handlers, closes the settler and then the channel.
//!
//! # How a decision is carried out
//!
//! Exactly as the consumer loop does, by one shared mapping:
//!
//! | decision | on the wire |
//! |---|---|
//! | `Ack`; a retry on a rung; a dead-letter whose copy is in `Q.dlq` | `basic.ack` (coalesced) |
//! | a dead-letter whose copy was not published | `basic.reject`, no requeue: the queue's own dead-letter exchange takes it, or it is dropped |
//! | `Requeue` (a handler's [`Verdict::Requeue`](crate::Verdict::Requeue)) | `basic.reject` with requeue: counted in `x-delivery-count` by quorum queues on every RabbitMQ version |
//! | `HandBack` (a drain, the pause gate, a cancelled handler); an in-process retry no retry layer carried out; a dropped [`Ticket`] | `basic.nack` with requeue: not counted in `x-delivery-count` by RabbitMQ 4.3's quorum queues (only in `x-acquired-count`) |
//! | `Abandoned` | nothing: the channel's close returns it to the broker |
//!
//! An abandoned delivery (the cancel layer gave up on a handler that ignored
//! its cancellation) stays unacknowledged, counted against the prefetch, until
//! the channel closes; no `multiple` ack ever covers it, so the
//! acknowledgements above it go out singly after the time bound from then
//! on. Abandon only on the way to closing the channel, as a drain does.
//!
//! Acknowledgements are held and sent as one `basic.ack` with `multiple`
//! for the longest contiguous run of acknowledged tags from the lowest
//! unsettled one; a nack or reject (with requeue or without) goes out
//! alone, at its turn, after the run before it: neither has a `multiple`
//! flag here (`basic.reject` has none at all). What is held goes out when a run reaches the count
//! bound, when the time bound passes (an acknowledgement held above a lower
//! tag that is not decided yet then goes out on its own, so a slow handler
//! never stalls the others), as soon as every tracked delivery is decided
//! while the prefetch window is used up (the broker then sends nothing until
//! a settle), and at [`Settler::close`]. [`AckBatch::off`](crate::config::AckBatch::off) sends every settle
//! at once, on its own. A `multiple` ack is never sent with tag 0.
//!
//! # Rules
//!
//! - **The settler is the only path that settles the channel's
//!   deliveries.** A `multiple` ack covers every unacknowledged tag up to
//!   its own, and lapin's `Acker`s it covers are not poisoned: acking one of
//!   them again is a second ack of the same tag, which the broker answers by
//!   closing the channel (406) and requeueing everything unacknowledged on
//!   it. So: never use the lapin delivery's `acker`, nor `basic_ack` /
//!   `basic_nack` / `basic_reject` yourself, on a channel a settler settles;
//!   [`track`](Settler::track) drops the acker.
//! - **One settler per channel, and every delivery of that channel goes
//!   through [`track`](Settler::track), in arrival order**: call it from
//!   the consumer stream's loop, before handing the delivery to a task.
//!   Delivery tags are per channel: a tag the settler never saw (a second
//!   consumer or a `basic_get` on the same channel) could be covered by a
//!   `multiple` ack. Consume with `no_ack: false`.
//! - **A channel, once closed or lost, stays lost for its settler.** The
//!   broker has requeued every unsettled delivery and redelivers it (on
//!   another channel). From then on settling sends nothing and says so
//!   ([`SettleStatus::ChannelClosed`], counted in
//!   [`SettleReport::not_sent`]); every tracked delivery's
//!   [`Lifeline`](crate::Lifeline) is lost, so the retry and dead-letter
//!   layers publish nothing more for them. Consume again on a new channel
//!   with a new `Settler`. lapin's channel auto-recovery (tags start again
//!   at 1 on the same `Channel`) is not supported.
//!
//! # What the report counts
//!
//! Settling returns at once: [`SettleStatus::Queued`] means the settler has
//! the decision and puts it on the wire in order; the [`SettleReport`]
//! ([`Settler::report`] at any time, [`Settler::close`] at the end) counts
//! what actually went out, per delivery, and what could not be sent.

//!
//! # Inside
//!
//! - `ledger`: the pure bookkeeping — which tags are decided, which run a
//!   `multiple` ack may cover, what a flush puts out;
//! - `book`: the settler task's ledger with what is still pending, and
//!   what a lost channel leaves unsent;
//! - `wire`: the one way a ledger operation becomes a frame on a channel;
//! - `settler`: the public [`Settler`] and [`Ticket`] over both, for a
//!   consumer of your own (`App`'s consumer loop drives the same ledger and
//!   writer itself).

mod book;
#[doc(hidden)]
pub mod door;
pub(crate) mod ledger;
mod settler;
pub(crate) mod wire;

pub use settler::{SettleReport, SettleStatus, Settler, Ticket};

//! Request/reply over RabbitMQ's direct reply-to.
//!
//! The calling side is [`RpcClient`], a `tower::Service<RpcRequest>` whose
//! response is the [`Reply`]: timeouts, retries, rate limits and
//! load-shedding from tower apply to calls as they do to HTTP. The serving
//! side is [`Responder`]: it wraps a handler that returns a reply value into
//! one that [`App::consume`](crate::App::consume) takes, and publishes the
//! reply before the request is acknowledged.
//!
//! ```no_run
//! use std::time::Duration;
//! use acemq::rpc::{Reply, RpcRequest};
//! use acemq::{App, Config, Delivery};
//! use tower::{service_fn, Service, ServiceExt};
//!
//! # async fn run() -> Result<(), acemq::BoxError> {
//! let config = Config::from_path("examples/shop.yaml")?;
//! let app = App::new(config);
//! // The server: the reply is the request's body upper-cased.
//! let upper = service_fn(|d: Delivery| async move {
//!     Ok::<_, acemq::BoxError>(d.body().to_ascii_uppercase())
//! });
//! let client = app.rpc_client();
//! // A `Responder` around `upper`, the queue marked as serving requests.
//! let app = app.serve("shop.orders", upper);
//! // The client (in this process or another): one call, 5 s deadline.
//! let mut client = client;
//! let reply: Reply = client
//!     .ready()
//!     .await?
//!     .call(RpcRequest::new("", "shop.orders", b"hello".to_vec(), Duration::from_secs(5)))
//!     .await?;
//! assert_eq!(reply.body(), b"HELLO");
//! # let _ = app; Ok(()) }
//! ```
//!
//! # What a call does
//!
//! - The request is published **mandatory** on the client's channel with a
//!   fresh `correlation_id`, `reply_to: amq.rabbitmq.reply-to`, and its
//!   deadline as its `expiration` (a request nobody takes in time expires
//!   in the queue instead of being handled for a caller who has gone). An
//!   unroutable request fails at once with [`RpcError::Unroutable`], not
//!   at its deadline. [`RpcClient::confirm_requests`]`(false)` publishes
//!   without the confirm (and so not mandatory): the throughput of a plain
//!   lapin client that does not confirm, and an unroutable request then
//!   ends at its deadline.
//! - The reply comes back on the same channel (direct reply-to: no queue is
//!   declared). An error reply (the request was dead-lettered, see
//!   [Error replies](#error-replies)): [`RpcError::Rejected`] with the
//!   reason. No reply by the deadline: [`RpcError::Timeout`]; a reply
//!   arriving later is dropped and counted
//!   ([`RpcClient::late_replies`], metric `acemq.rpc.late_replies`).
//! - The connection or channel lost while calls wait: each of them fails at
//!   once with [`RpcError::ConnectionLost`] (the request may or may not have
//!   been handled); the next call opens a new channel. A client from
//!   [`App::rpc_client`](crate::App::rpc_client) rides the publishing
//!   connection and follows its reconnects, so during a broker resource
//!   alarm (which blocks publishing connections) calls stall until their
//!   deadline.
//!
//! # What the server does
//!
//! [`App::serve`](crate::App::serve)`(queue, service)` consumes the queue
//! with a [`Responder`] around your service and marks it as serving
//! requests (its `serves_requests`). [`Responder`] calls your service; on
//! success it publishes the reply to
//! the request's `reply_to` with its `correlation_id`, confirmed but **not
//! mandatory**, and only then lets the request be acknowledged.
//! A reply to a caller that has gone is dropped by the broker; the request
//! is acknowledged as handled, and the caller's call has already ended at
//! its own deadline. Nothing rests on a `basic.return`: before RabbitMQ 4.2
//! a mandatory publish to a direct reply-to address whose caller has gone
//! came back as returned (`NO_ROUTE`), from 4.2 it counts as routed
//! whether the caller is there or not (both measured, on 3.10.8 and 4.3.6). A request
//! without `reply_to` is handled as a normal message. A failed attempt
//! publishes nothing: a request retried (in the process or through rungs)
//! gets one reply, after its final outcome — the reply of the attempt that
//! succeeds, or an error reply if it is dead-lettered.
//!
//! # Error replies
//!
//! A request that is dead-lettered — its handler failed permanently, its
//! retries ran out, it panicked, timed out, or was redelivered too often —
//! gets an **error reply** carrying the reason, so its caller does not wait
//! out its deadline for a message that is gone: the call ends with
//! [`RpcError::Rejected`] as soon as the request is in the dead-letter
//! queue. The dead-letter layer sends it (after the confirmed copy to
//! `{queue}.dlq`, before the request is acknowledged); a queue with
//! `dead_letter: false` sends it too before the request is rejected. Only a
//! delivery with a non-empty `reply_to` and a `correlation_id` gets one,
//! and it costs nothing on any other path.
//!
//! A message's `reply_to` is the publisher's to choose, so error replies go
//! only where they belong (see
//! [`ErrorReplies`](acemq_layers::dead_letter::ErrorReplies)):
//! - only from a queue that serves requests: one given to
//!   [`App::serve`](crate::App::serve), or with `serves_requests: true` in
//!   the config (for any handler, a `Responder` under `consume` included);
//!   every other queue sends none, whatever a message's `reply_to` says;
//! - only to a direct reply-to address (`amq.rabbitmq.reply-to.*`, what the
//!   broker makes of [`RpcClient`]'s) or one of the queue's
//!   `reply_addresses`;
//! - with the reason and a generic text (`the request could not be
//!   handled`) unless the queue sets `reply_error_text: true`: then the
//!   handler's error text and the queue's name too.
//!
//! A request gets one reply at most: a successful reply ends
//! its handling, and a dead-lettered request is not handled again. (If the
//! process dies between the reply and the acknowledgement, the request comes
//! back and may be answered again; the caller has already had its answer
//! and drops the second as late.)
//!
//! The wire format, for callers in other languages (a contract between
//! AceMQ members, also in `docs/rpc.md`):
//!
//! | | value |
//! |---|---|
//! | exchange, routing key | `""`, the request's `reply_to`; not mandatory, confirmed |
//! | `correlation_id` | the request's |
//! | header `x-acemq-reason` | why, as in the dead-letter queue: `max-attempts`, `rejected`, `panic`, `timeout`, `redelivered`, `transaction-ended`, `consumer-timeout`, `malformed-headers` (more may come: treat an unknown one as an error too) |
//! | header `x-acemq-error` | the last error's display chain, at most 4 KiB, with `reply_error_text: true`; otherwise `the request could not be handled` |
//! | header `x-acemq-attempts` | how many attempts were made (integer) |
//! | header `x-acemq-queue` | the queue the request was consumed from (with `reply_error_text: true` only) |
//! | `content_type`, body | `text/plain; charset=utf-8`, the text of `x-acemq-error` |
//!
//! **A reply carrying the `x-acemq-reason` header is an error reply**; a
//! normal reply never carries it. [`RpcClient`] turns an error reply into
//! [`RpcError::Rejected`] with the reason and the error text.

mod call;
mod client;
mod server;

#[doc(hidden)]
pub use call::REPLY_TO;
pub use call::{Reply, RpcError, RpcRequest};
pub use client::RpcClient;
pub use server::Responder;

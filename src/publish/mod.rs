//! Publishing: the [`Publisher`](publisher::Publisher) (confirms, on a
//! connection of its own; the public `acemq::publisher`) with every method
//! it has — its [`PublishOptions`](publisher::PublishOptions) (`options`),
//! delayed publishing through TTL buckets (`delay`, the public
//! `acemq::delay`), and the `Publish` the layers call for rung and
//! dead-letter copies and error replies (`layers`) — except
//! `Publisher::rpc_client`, which `crate::rpc` adds: request/reply is built
//! on this room, never the other way round.

pub mod delay;
mod layers;
mod options;
pub mod publisher;

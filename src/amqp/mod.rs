//! Everything that speaks AMQP to the broker: connecting ([`connection`]),
//! the live connection of each role (`live`),
//! declaring ([`topology`], many calls at once through `fan_out`), publishing with confirms ([`publisher`]),
//! turning lapin's types into acemq's ([`convert`]), and the delivery's
//! `process` span with its trace context (`span`, `otel`).
//!
//! Depends on `config` only; every room below it (settle, consumer, app,
//! ops) uses it.

use std::time::Duration;

/// How long closing a channel or a connection, or cancelling a consumer, may
/// take before acemq moves on: a broker that went away must not hold the
/// process. The one bound for every such wait; the drain's worst case
/// ([`crate::app`]'s start-up warning) counts it once for each close the
/// drain awaits.
pub(crate) const CLOSE_BOUND: Duration = Duration::from_secs(1);

pub(crate) mod backoff;
mod connect_error;
pub mod connection;
pub mod convert;
pub mod delay;
pub(crate) mod delivery_limit;
pub(crate) mod fan_out;
pub(crate) mod live;
pub(crate) mod otel;
pub mod publisher;
pub(crate) mod span;
mod tls;
pub mod topology;

//! Everything that speaks AMQP to the broker: connecting ([`connection`]),
//! declaring ([`topology`]), publishing with confirms ([`publisher`]),
//! turning lapin's types into acemq's ([`convert`]), and the delivery's
//! `process` span with its trace context (`span`, `otel`).
//!
//! Depends on `config` only; every room below it (settle, consumer, app,
//! ops) uses it.

pub(crate) mod backoff;
mod connect_error;
pub mod connection;
pub mod convert;
pub mod delay;
pub(crate) mod delivery_limit;
pub(crate) mod otel;
pub mod publisher;
pub(crate) mod span;
mod tls;
pub mod topology;

//! acemq: a tower middleware stack for RabbitMQ message handlers, on tokio
//! and lapin.
//!
//! A delivery becomes a tower request ([`Delivery`]); the layers of
//! [`acemq_layers`] track it, hold it, retry it (in process or on a rung
//! queue in the broker), dead-letter it with a reason and cancel it
//! cooperatively; a [`Drain`] stops everything in order within one deadline.
//! [`App`] runs it all: connect, declare the topology, consume, wait for
//! SIGTERM, drain, exit with a sysexits code.

#[cfg(feature = "axum")]
pub mod admin;
pub mod app;
pub mod config;
pub mod connection;
mod consumer;
pub mod convert;
pub mod drain;
pub mod health;
#[cfg(feature = "postgres")]
pub mod inbox;
mod otel;
#[cfg(feature = "postgres")]
pub mod outbox;
pub mod publisher;
pub mod replay;
pub mod settle;
mod span;
pub mod stack;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod topology;

pub use acemq_layers as layers;
pub use acemq_layers::{
    BoxError, Cancellation, Decision, Delivery, Headers, IntoVerdict, Lifeline, Properties,
    PublishError, Reason, Reject, Value, Verdict,
};
pub use app::{App, Running, Signals, StartError};
pub use config::Config;
pub use drain::{Drain, DrainReport, DrainTimeout};
pub use health::{Health, HealthSnapshot, UnknownQueue};
/// The lapin crate acemq is built on (with acemq's lean features: no default
/// TLS), for a consumer of your own (see [`settle`]), a
/// [connection factory](App::connection_factory) or
/// [`Publisher::publish_lapin`] without a lapin dependency of your own.
pub use lapin;
pub use publisher::Publisher;
pub use settle::Settler;
pub use stack::{Outcome, QueueStack};

/// Compiles the README's Rust code as a doctest, so the quickstart stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

//! acemq: a tower middleware stack for RabbitMQ message handlers, on tokio
//! and lapin.
//!
//! A delivery becomes a tower request ([`Delivery`]); the layers of
//! [`acemq_layers`] track it, hold it, retry it (in process or on a rung
//! queue in the broker), dead-letter it with a reason and cancel it
//! cooperatively; a [`Drain`] stops everything in order within one deadline.
//! [`App`] runs it all: connect, declare the topology, consume, wait for
//! SIGTERM, drain, exit with a sysexits code.

//!
//! # Where things live
//!
//! The crate is filed by concern, each room depending only on those above
//! it in this list, never on one below (`docs/architecture.md` draws it;
//! `tests/rooms.rs` checks it):
//!
//! - `config`: the schema, its validation and errors, durations, broker
//!   addresses as data, exchanges and bindings as data;
//! - small tools that depend on no room: `sync` (a poisoned lock taken as
//!   it is), `backoff` (full jitter, for reconnects and the outbox relay),
//!   `fan_out` (many independent broker calls at once), [`log`] (filter
//!   directives);
//! - [`connection`]: connecting, each role's live connection, TLS, why a
//!   connect failed, and the one bounded close for channels and for
//!   connections;
//! - `convert` (lapin's types to acemq's) and `telemetry` (the delivery's
//!   `process` span and its trace context);
//! - [`topology`]: what to declare, and declaring it;
//! - `publish`: the [`Publisher`] with its methods ([`publisher`],
//!   [`delay`]), and what the layers publish through it;
//! - [`rpc`]: request/reply, built on the publisher (it adds
//!   `Publisher::rpc_client`; the publisher knows nothing of it);
#![cfg_attr(
    feature = "postgres",
    doc = "- with `postgres`, the [`outbox`] (it publishes through the publisher)\n  and the [`inbox`];"
)]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "- with `postgres`, the `outbox` (it publishes through the publisher)\n  and the `inbox` (not in this build);"
)]
//! - [`stream`]: acemq's own client of RabbitMQ's stream protocol
//!   (consuming side);
//! - [`settle`]: the settle ledger, the one writer of settle frames, and the
//!   public [`Settler`];
//! - `consumer`: one generation's consumer loop and its counters;
//! - [`stack`] (the layers around a handler) and [`batch`];
//! - [`app`]: the runner — the builder, start-up, the supervisor, the
//!   [`drain`], [`health`], signals and exit codes;
#![cfg_attr(
    feature = "axum",
    doc = "- `ops`: what operators reach for — the [`admin`] router, [`replay`];"
)]
#![cfg_attr(
    not(feature = "axum"),
    doc = "- `ops`: what operators reach for — the `admin` router (with `axum`), [`replay`];"
)]
#![cfg_attr(
    feature = "test-util",
    doc = "- [`testing`]: the in-memory harness of the exact stack `App` builds."
)]
#![cfg_attr(
    not(feature = "test-util"),
    doc = "- `testing` (with `test-util`): the in-memory harness of the exact stack `App` builds."
)]
//!
//! Start with the README's quickstart (compiled as a doctest) and the
//! service in `examples/shop/main.rs`; every public item's docs carry an
//! example or point to a runnable one in `examples/`.

pub mod app;
mod backoff;
pub mod batch;
pub mod config;
pub mod connection;
mod consumer;
#[doc(hidden)]
pub mod convert;
mod fan_out;
#[cfg(feature = "postgres")]
pub mod inbox;
pub mod log;
mod ops;
#[cfg(feature = "postgres")]
pub mod outbox;
mod publish;
pub mod rpc;
pub mod settle;
pub mod stack;
pub mod stream;
mod sync;
mod telemetry;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod topology;

// The public paths, kept where users found them.
pub use app::{drain, health};
/// A stream message's offset, in its delivery's extensions.
pub use consumer::StreamOffsetOf;
#[cfg(feature = "axum")]
pub use ops::admin;
pub use ops::replay;
pub use publish::{delay, publisher};

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
pub use publisher::{PublishOptions, Publisher};
pub use settle::Settler;
pub use stack::{Outcome, QueueStack};

/// Compiles the README's Rust code as a doctest, so the quickstart stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

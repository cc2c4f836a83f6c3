//! Integration tests against the real RabbitMQ at `AMQP_ADDR` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`). Each test declares its own
//! uniquely named queues and deletes them; they run in parallel safely.
//! `rabbitmqctl` is run as `ACEMQ_RABBITMQCTL` says (default `rabbitmqctl`;
//! `scripts/rabbitmq4.sh ctl` for the RabbitMQ 4 node, see
//! `scripts/rabbitmq4-suite.sh broker`), so it talks to the same broker.
#![allow(unreachable_pub, missing_docs, clippy::disallowed_methods)]

#[path = "../common/mod.rs"]
mod common;

mod support;

#[cfg(feature = "axum")]
mod admin;
#[cfg(feature = "axum")]
mod admin_drain;
mod admin_serve;
mod bad_input;
mod batch;
mod breaker;
mod broker_cancel;
mod broker_version;
mod coalesce;
mod config_load;
mod confirming;
#[cfg(feature = "console")]
mod console;
mod dead_letter;
mod delay;
mod delivery_limit;
mod drain;
mod factory;
mod faults;
mod held;
mod hostile_headers;
mod hostile_text;
mod kill_dupes;
mod logs;
mod lost_in_drain;
mod metrics_names;
mod ordered;
mod pause;
mod process;
mod proxy;
mod publish_options;
mod queue_retry;
mod recovery;
mod redeclared;
mod reliability;
mod replay;
mod retry;
mod round_trip;
mod routing;
mod rpc;
mod settle;
mod shop_flow;
mod shop_queues;
mod shop_timeout;
mod soak;
mod stream_client;
mod streams;
mod streams_faults;
mod streams_hostile;
mod streams_sac;
mod topology;

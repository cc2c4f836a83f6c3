//! Integration tests of the outbox and the inbox against the real
//! PostgreSQL (`ACEMQ_TEST_PG`, default `host=127.0.0.1 user=postgres`) and
//! RabbitMQ (`AMQP_ADDR`). Each test creates its own database
//! (`acemq_test_<pid>_<n>_<nanos>`, dropped by a guard) and its own queues
//! (deleted by a guard); tests run in parallel safely.
#![allow(unreachable_pub, missing_docs, clippy::disallowed_methods)]

#[path = "../common/mod.rs"]
mod common;

mod support;

#[path = "../broker/proxy.rs"]
#[allow(dead_code)]
mod proxy;

mod compose;
mod inbox;
mod migrate;
mod process;
mod relay;
#[cfg(feature = "tls")]
mod tls;

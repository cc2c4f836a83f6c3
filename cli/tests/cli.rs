//! The `acemq` command against the real RabbitMQ at `AMQP_ADDR` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`): each test runs the built binary
//! on queues and exchanges of its own (unique names, deleted at the end), so
//! the tests run in parallel safely. No mock broker.

#![allow(unreachable_pub, missing_docs, clippy::disallowed_methods)]

mod support;

#[path = "cli/asyncapi.rs"]
mod asyncapi;
#[path = "cli/dlq_peek.rs"]
mod dlq_peek;
#[path = "cli/dlq_replay.rs"]
mod dlq_replay;
#[path = "cli/errors.rs"]
mod errors;
#[path = "cli/publish.rs"]
mod publish;
#[path = "cli/queues.rs"]
mod queues;
#[path = "cli/streams.rs"]
mod streams;
#[path = "cli/topology.rs"]
mod topology;

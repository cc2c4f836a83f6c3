//! A node lost (`kill -9`) or frozen (SIGSTOP) under load, on a local
//! three-node RabbitMQ cluster (`scripts/cluster.sh`: `acemq-1..3@localhost`
//! on 5681–5683) that these tests start and stop themselves, beside the
//! default broker.
//!
//! They are `#[ignore]`d in `cargo test --workspace` (they take minutes and
//! start three nodes); run them with:
//! `cargo test -p acemq --test cluster -- --ignored --test-threads=1`
//! (`ACEMQ_KEEP_CLUSTER=1` leaves the cluster up afterwards).
#![allow(unreachable_pub, missing_docs, clippy::disallowed_methods)]

#[path = "../common/mod.rs"]
mod common;

#[path = "../node/freeze.rs"]
mod freeze;
#[path = "../broker/support.rs"]
mod shop_proc;
mod support;

mod chaos;

mod frozen;
mod node_loss;

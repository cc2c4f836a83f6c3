//! Faults that touch a whole broker — a short `consumer_timeout`, a memory
//! alarm, a broker restart, the node frozen (SIGSTOP) — on a throwaway RabbitMQ node of these tests' own
//! (`scripts/broker-node.sh`, node `acemq-fault@localhost` on port 5690),
//! never on the default broker that the other suites share. The tests of
//! what the broker's acknowledgement timeout does (`lost_in_drain`,
//! `timeout_strikes`) run on a second node whose timeout is checked every
//! second ([`ticks`], `acemq-ticks@localhost` on port 5720).
//!
//! The tests share the node, so they run one at a time (a lock in
//! [`support::Node`], and `--test-threads=1` in `.ci/run`). Each test brings
//! the node up (or finds it up), and its guard restores what the test
//! changed (memory watermark, a stopped app) and stops the node, also when
//! the test fails. `ACEMQ_KEEP_NODE=1` leaves the node up between runs.
//!
//! They are `#[ignore]`d in `cargo test --workspace` (they take minutes and
//! start a node); run them with:
//! `cargo test -p acemq --test node -- --ignored --test-threads=1`
#![allow(unreachable_pub, missing_docs, clippy::disallowed_methods)]

#[path = "../common/mod.rs"]
mod common;

mod freeze;
mod support;
mod ticks;

mod broker_restart;
mod consumer_timeout;
mod frozen_node;
mod frozen_shop;
mod lost_in_drain;
mod memory_alarm;
mod quorum_timeout;
mod stream_restart;
mod timeout_strikes;

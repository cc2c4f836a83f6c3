//! acemq: a tower middleware stack for RabbitMQ message handlers.
#![allow(missing_docs)]

pub mod config;

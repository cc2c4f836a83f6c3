//! Connecting to the broker, with the password kept out of every message.
//!
//! One address is the common case ([`connect`]); a cluster gives several
//! ([`connect_any`] tries them in shuffled order, so a fleet spreads over
//! the nodes). Where the addresses come from is decided in one place,
//! [`resolve_addresses`]: an address given in code, then `AMQP_ADDR` (one
//! address or several separated by commas), then the config's `addresses`,
//! then [`DEFAULT_AMQP_ADDR`].
//!
//! Every connection an [`App`](crate::App) opens or reopens can go through a
//! factory of yours instead ([`App::connection_factory`](crate::App::connection_factory)):
//! it gets a [`ConnectRequest`] with what acemq would have used and returns
//! the open connection.
//!
//! ```no_run
//! use std::time::Duration;
//! use acemq::config::Config;
//! use acemq::connection::{connect_any, redact, resolve_addresses, ConnectOptions};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::from_path("examples/shop.yaml")?;
//! let addresses = resolve_addresses(None, &config.addresses);
//! let options = ConnectOptions::from_config(&config);
//! let connected = connect_any(&addresses, "shop-tools", Duration::from_secs(10), &options).await?;
//! println!("connected to {}", connected.address); // already redacted
//! # let _ = redact; Ok(()) }
//! ```
//!
//! Closing is bounded: a channel or a connection acemq closes is given one
//! second for the broker's answer, then left (`close_channel`,
//! `close_connection`).

mod close;
mod connect;
mod error;
mod live;
mod tls;
mod version;

pub(crate) use close::CLOSE_BOUND;
pub use close::{close_channel, close_connection, CloseError};
pub use connect::{
    connect, connect_any, ConnectOptions, ConnectRequest, Connected, ConnectionRole,
};
pub(crate) use connect::{connect_any_via, ConnectionFactory, Via};
pub use error::ConnectError;
pub(crate) use live::{Live, LiveConnections};
pub(crate) use version::read_broker_version;
pub use version::BrokerVersion;

pub use crate::config::address::{
    amqp_addr_from_env, check_address, redact, resolve_addresses, DEFAULT_AMQP_ADDR,
};
#[doc(hidden)]
pub use crate::config::address::{resolve_addresses_with, shuffled};

//! The broker's version at start: read once, over the address the
//! consumers' connection answered on, before the topology is declared;
//! logged, shown in `/readyz`, and deciding what the config may hold. On
//! RabbitMQ 4.3 and later a queue argument 4.3 refuses is a config error
//! (exit 78) and a consumed classic queue without `consumer_timeout` is
//! warned about (4.3 never times out a classic queue's consumer); before
//! 4.3, or when the version is unknown, those arguments stay warnings.

use std::time::Duration;

use tracing::{info, warn};

use super::health::Health;
use crate::config::{Config, ConfigError};
use crate::connection::{read_broker_version, redact};

/// What start-up knows when it checks the broker.
pub(super) struct BrokerCheck<'a> {
    /// The queues consumed.
    pub(super) consumed: &'a Config,
    /// Every queue declared, also those with `consume: false`.
    pub(super) declared: &'a Config,
    /// The address that answered (it holds the password: never logged).
    pub(super) addr: &'a str,
    /// The connection name (the check's connection is named after it).
    pub(super) name: &'a str,
    /// A connection factory of the user's opens the connections.
    pub(super) factory: bool,
    pub(super) timeout: Duration,
}

impl BrokerCheck<'_> {
    /// Reads the version and checks the config against it.
    pub(super) async fn run(self, health: &Health) -> Result<(), ConfigError> {
        let broker = redact(self.addr);
        if self.factory {
            info!(%broker, "the broker's version is not read: a connection factory opens the connections (the queue arguments RabbitMQ 4.3 refuses stay warnings)");
            self.unchecked();
            return Ok(());
        }
        let check_name = format!("{} (version check)", self.name);
        let version = match read_broker_version(self.addr, &check_name, self.timeout).await {
            Ok(v) => v,
            Err(why) if self.addr.starts_with("amqps") => {
                info!(%broker, "the broker's version is unknown ({why}); the queue arguments RabbitMQ 4.3 refuses stay warnings");
                self.unchecked();
                return Ok(());
            }
            Err(why) => {
                warn!(%broker, "the broker's version is unknown ({why}); the queue arguments RabbitMQ 4.3 refuses stay warnings");
                self.unchecked();
                return Ok(());
            }
        };
        info!(%broker, version = %version.version, "broker version: {version}");
        health.set_broker_version(Some(version.to_string()));
        if version.product == "RabbitMQ" && !version.at_least(3, 11) {
            if let Some(e) = self
                .declared
                .single_active_before_3_11(&version.to_string())
            {
                return Err(e);
            }
        }
        if version.product == "RabbitMQ" && version.at_least(4, 3) {
            let shown = version.to_string();
            if let Some(e) = self.declared.refused_on_4_3(&shown) {
                return Err(e);
            }
            for w in self.consumed.unbounded_on_4_3(&shown) {
                warn!("{w}");
            }
        } else if let Some(e) = self.declared.in_queue_before_4_3(&version.to_string()) {
            return Err(e);
        }
        Ok(())
    }

    /// The version is unknown: retries in the queue are warned about.
    fn unchecked(&self) {
        for w in self.declared.in_queue_unchecked() {
            warn!("{w}");
        }
    }
}

//! Why the topology could not be declared.

/// Why the topology could not be declared. No consumer starts.
///
/// ```no_run
/// use acemq::config::Config;
/// use acemq::topology::{Topology, TopologyError};
///
/// # async fn run(conn: acemq::lapin::Connection) {
/// let topology = Topology::from_config(&Config::from_path("examples/shop.yaml").unwrap());
/// match topology.declare(&conn).await {
///     Ok(()) => {}
///     Err(e @ TopologyError::Conflict { .. }) => eprintln!("declared otherwise already: {e}"),
///     Err(e) => eprintln!("{e}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// The queue exists with other arguments.
    #[error("queue {queue:?} already exists with a different {argument}: the broker said {message:?}. Delete it (rabbitmqctl delete_queue {queue}) after moving its messages, or change the config to match the existing queue")]
    Conflict {
        /// The queue.
        queue: String,
        /// The argument that differs.
        argument: String,
        /// What the broker said.
        message: String,
    },
    /// A queue marked `passive` does not exist (404 NOT_FOUND).
    #[error("queue {queue:?} does not exist, and the config marks it passive: acemq checks that it exists and declares nothing (the broker said {message:?}). Declare it where it is managed, or remove passive: true so acemq declares it")]
    Missing {
        /// The queue.
        queue: String,
        /// What the broker said.
        message: String,
    },
    /// An exchange exists with another type or durability (406).
    #[error("exchange {exchange:?} already exists with a different type or durability: the broker said {message:?}. Change the config to match it, or delete it (rabbitmqctl delete_exchange {exchange}) if nothing else uses it")]
    ExchangeConflict {
        /// The exchange.
        exchange: String,
        /// What the broker said.
        message: String,
    },
    /// A binding names an exchange that does not exist (404 NOT_FOUND).
    #[error("cannot bind queue {queue:?} to exchange {exchange:?}: it does not exist (the broker said {message:?}). Add it under exchanges: in the config, or fix the name")]
    NoExchange {
        /// The queue.
        queue: String,
        /// The exchange.
        exchange: String,
        /// What the broker said.
        message: String,
    },
    /// Another broker error.
    #[error("could not declare queue {queue:?}: {message}")]
    Broker {
        /// The queue.
        queue: String,
        /// What the broker said.
        message: String,
    },
}

//! Declaring the queues the config names: `Q`, `Q.dlq` and one rung
//! `Q.retry.<delay>` per distinct broker-side delay.

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::Connection;

use crate::config::{Config, QueueConfig, QueueType};

/// One queue to declare, with its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueDecl {
    /// The queue name.
    pub name: String,
    /// Its `x-` arguments.
    pub arguments: FieldTable,
}

/// Everything the config names, in declaration order.
#[derive(Clone, Debug, Default)]
pub struct Topology {
    decls: Vec<QueueDecl>,
}

fn str_arg(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.to_owned()))
}

fn table(entries: Vec<(&str, AMQPValue)>) -> FieldTable {
    let map: BTreeMap<ShortString, AMQPValue> = entries
        .into_iter()
        .map(|(k, v)| (ShortString::from(k), v))
        .collect();
    FieldTable::from(map)
}

fn type_args(kind: QueueType) -> Vec<(&'static str, AMQPValue)> {
    match kind {
        QueueType::Quorum => vec![("x-queue-type", str_arg("quorum"))],
        _ => Vec::new(),
    }
}

impl Topology {
    /// The declarations for `config`.
    pub fn from_config(config: &Config) -> Self {
        let mut decls = Vec::new();
        for q in &config.queues {
            decls.extend(Self::for_queue(q));
        }
        Topology { decls }
    }

    /// The declarations for one queue.
    pub fn for_queue(q: &QueueConfig) -> Vec<QueueDecl> {
        let mut out = Vec::new();
        let mut main = type_args(q.kind);
        if q.dead_letter {
            main.push(("x-dead-letter-exchange", str_arg("")));
            main.push(("x-dead-letter-routing-key", str_arg(&q.dlq_name())));
        }
        out.push(QueueDecl {
            name: q.name.clone(),
            arguments: table(main),
        });
        if q.dead_letter {
            out.push(QueueDecl {
                name: q.dlq_name(),
                arguments: table(type_args(q.kind)),
            });
        }
        for (name, delay) in q.rungs() {
            out.push(QueueDecl {
                name,
                arguments: table(rung_args(q, delay)),
            });
        }
        out
    }

    /// All declarations.
    pub fn decls(&self) -> &[QueueDecl] {
        &self.decls
    }

    /// The declaration of `queue`, if the topology has one.
    pub fn get(&self, queue: &str) -> Option<&QueueDecl> {
        self.decls.iter().find(|d| d.name == queue)
    }

    /// Declares every queue, stopping at the first failure.
    pub async fn declare(&self, conn: &Connection) -> Result<(), TopologyError> {
        for d in &self.decls {
            declare_one(conn, d).await?;
        }
        Ok(())
    }
}

fn rung_args(q: &QueueConfig, delay: Duration) -> Vec<(&'static str, AMQPValue)> {
    let mut args = type_args(q.kind);
    let ttl = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    args.push(("x-message-ttl", AMQPValue::LongLongInt(ttl)));
    args.push(("x-dead-letter-exchange", str_arg("")));
    args.push(("x-dead-letter-routing-key", str_arg(&q.name)));
    if q.kind == QueueType::Quorum {
        args.push(("x-dead-letter-strategy", str_arg("at-least-once")));
        args.push(("x-overflow", str_arg("reject-publish")));
    }
    args
}

/// Declares one queue on a channel of its own (a refused declare closes the
/// channel it was made on).
pub async fn declare_one(conn: &Connection, d: &QueueDecl) -> Result<(), TopologyError> {
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| TopologyError::Broker {
            queue: d.name.clone(),
            message: e.to_string(),
        })?;
    let res = channel
        .queue_declare(
            d.name.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            d.arguments.clone(),
        )
        .await;
    match res {
        Ok(_) => {
            let _ = channel.close(200, "OK".into()).await;
            Ok(())
        }
        Err(e) => {
            let message = e.to_string();
            if message.contains("PRECONDITION") || message.contains("inequivalent") {
                let argument = message
                    .split("inequivalent arg '")
                    .nth(1)
                    .and_then(|rest| rest.split('\'').next())
                    .unwrap_or("its arguments or durability")
                    .to_owned();
                Err(TopologyError::Conflict {
                    queue: d.name.clone(),
                    argument,
                    message,
                })
            } else {
                Err(TopologyError::Broker {
                    queue: d.name.clone(),
                    message,
                })
            }
        }
    }
}

/// Why the topology could not be declared. No consumer starts.
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
    /// Another broker error.
    #[error("could not declare queue {queue:?}: {message}")]
    Broker {
        /// The queue.
        queue: String,
        /// What the broker said.
        message: String,
    },
}

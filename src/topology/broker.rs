//! The broker calls of declaring: one exchange, queue or binding each on a
//! channel of its own, the broker's refusals turned into [`TopologyError`]s
//! by their reply codes; declaring a whole [`Topology`], or again what
//! belongs to one queue.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Connection;

use super::decls::{BindingDecl, ExchangeDecl, QueueDecl, Topology};
use super::delivery_limit;
use super::error::TopologyError;
use crate::config::ExchangeKind;
use crate::connection::close_channel;
use crate::fan_out;

/// The broker's reply code and text, when `e` is an AMQP error.
fn reply(e: &lapin::Error) -> Option<(u16, String)> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            Some((amqp.get_id(), amqp.get_message().to_string()))
        }
        _ => None,
    }
}

/// 404 NOT_FOUND.
const NOT_FOUND: u16 = 404;
/// 406 PRECONDITION_FAILED.
const PRECONDITION_FAILED: u16 = 406;

async fn open_channel(conn: &Connection, what: &str) -> Result<lapin::Channel, TopologyError> {
    conn.create_channel()
        .await
        .map_err(|e| TopologyError::Broker {
            queue: what.to_owned(),
            message: e.to_string(),
        })
}

/// The end of one call on a channel of its own: on success the channel is
/// closed; a refusal is what `refused` makes of the broker's reply code and
/// text, else (or for an error that is not a reply) a `Broker` error about
/// `what`.
async fn finish<T>(
    channel: lapin::Channel,
    res: lapin::Result<T>,
    what: &str,
    refused: impl FnOnce(u16, String) -> Option<TopologyError>,
) -> Result<(), TopologyError> {
    match res {
        Ok(_) => {
            let _ = close_channel(&channel, "OK").await;
            Ok(())
        }
        Err(e) => Err(reply(&e)
            .and_then(|(code, message)| refused(code, message))
            .unwrap_or_else(|| TopologyError::Broker {
                queue: what.to_owned(),
                message: e.to_string(),
            })),
    }
}

/// Declares one exchange on a channel of its own.
pub(crate) async fn declare_exchange(
    conn: &Connection,
    x: &ExchangeDecl,
) -> Result<(), TopologyError> {
    let channel = open_channel(conn, &x.name).await?;
    let kind = match x.kind {
        ExchangeKind::Direct => lapin::ExchangeKind::Direct,
        ExchangeKind::Topic => lapin::ExchangeKind::Topic,
        ExchangeKind::Fanout => lapin::ExchangeKind::Fanout,
        ExchangeKind::Headers => lapin::ExchangeKind::Headers,
    };
    let res = channel
        .exchange_declare(
            x.name.as_str().into(),
            kind,
            ExchangeDeclareOptions {
                durable: x.durable,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    finish(channel, res, &x.name, |code, message| {
        (code == PRECONDITION_FAILED).then(|| TopologyError::ExchangeConflict {
            exchange: x.name.clone(),
            message,
        })
    })
    .await
}

/// Binds a queue to an exchange on a channel of its own.
pub(crate) async fn bind(conn: &Connection, b: &BindingDecl) -> Result<(), TopologyError> {
    let channel = open_channel(conn, &b.queue).await?;
    let res = channel
        .queue_bind(
            b.queue.as_str().into(),
            b.exchange.as_str().into(),
            b.routing_key.as_str().into(),
            QueueBindOptions::default(),
            b.arguments.clone(),
        )
        .await;
    finish(channel, res, &b.queue, |code, message| {
        (code == NOT_FOUND).then(|| TopologyError::NoExchange {
            queue: b.queue.clone(),
            exchange: b.exchange.clone(),
            message,
        })
    })
    .await
}

/// Declares one queue on a channel of its own (a refused declare closes the
/// channel it was made on). A quorum queue that exists without the
/// `x-delivery-limit` acemq gives it (or with one at or below
/// `max_redeliveries`) is declared as it is, every other argument still
/// checked, with a warning once per queue that gives the `rabbitmqctl
/// set_policy` command for the limit; never an error (RabbitMQ checks
/// `x-delivery-limit` for equivalence, 3.10 too).
pub(crate) async fn declare_one(conn: &Connection, d: &QueueDecl) -> Result<(), TopologyError> {
    let arguments = if d.passive {
        FieldTable::default()
    } else {
        d.arguments.clone()
    };
    let first = declare_with(conn, d, arguments, d.passive).await;
    let (wanted, message) = match (&first, d.delivery_limit) {
        (
            Err(TopologyError::Conflict {
                argument, message, ..
            }),
            Some(wanted),
        ) if argument == delivery_limit::ARGUMENT && !d.passive => (wanted, message.clone()),
        _ => return first,
    };
    // The queue exists with another limit, or none: declare it as it is,
    // every other argument still checked.
    let Some(current) = delivery_limit::current_limit(&message) else {
        declare_with(conn, d, FieldTable::default(), true).await?;
        delivery_limit::warn_once(&d.name, None, wanted);
        return Ok(());
    };
    let mut arguments = d.arguments.clone();
    let (key, _) = wanted.argument();
    let mut map = arguments.inner().clone();
    map.remove(&key);
    if let Some(n) = current {
        map.insert(key, AMQPValue::LongLongInt(n));
    }
    arguments = FieldTable::from(map);
    match declare_with(conn, d, arguments, false).await {
        Err(TopologyError::Conflict { argument, .. }) if argument == delivery_limit::ARGUMENT => {
            // Its limit has another integer type: only check it exists.
            declare_with(conn, d, FieldTable::default(), true).await?;
        }
        other => other?,
    }
    if !delivery_limit::enough(current, wanted) {
        delivery_limit::warn_once(&d.name, current, wanted);
    } else {
        tracing::debug!(queue = %d.name, delivery_limit = ?current, "the queue keeps the delivery limit it was created with");
    }
    Ok(())
}

/// One `queue.declare` of `d` with `arguments` on a channel of its own.
async fn declare_with(
    conn: &Connection,
    d: &QueueDecl,
    arguments: FieldTable,
    passive: bool,
) -> Result<(), TopologyError> {
    let channel = open_channel(conn, &d.name).await?;
    let res = channel
        .queue_declare(
            d.name.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                passive,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await;
    finish(channel, res, &d.name, |code, message| match code {
        PRECONDITION_FAILED => {
            // The broker names the argument in its text; the code is what
            // says it is a conflict.
            let argument = message
                .split("inequivalent arg '")
                .nth(1)
                .and_then(|rest| rest.split('\'').next())
                .unwrap_or("its arguments or durability")
                .to_owned();
            Some(TopologyError::Conflict {
                queue: d.name.clone(),
                argument,
                message,
            })
        }
        NOT_FOUND if passive => Some(TopologyError::Missing {
            queue: d.name.clone(),
            message,
        }),
        _ => None,
    })
    .await
}

impl Topology {
    /// Declares every exchange, then every queue, then every binding,
    /// stopping at the first failure.
    pub async fn declare(&self, conn: &Connection) -> Result<(), TopologyError> {
        // Exchanges, then queues, then bindings; within each, many at
        // once (each on a channel of its own), the first failure in order
        // reported.
        fan_out::in_order(self.exchanges(), |x| declare_exchange(conn, x)).await?;
        fan_out::in_order(self.decls(), |d| declare_one(conn, d)).await?;
        fan_out::in_order(self.bindings(), |b| bind(conn, b)).await?;
        Ok(())
    }
}

/// Whether the broker says queue `name` does not exist (a passive declare
/// answered 404, on a channel of its own); any other answer is `false`.
async fn is_missing(conn: &Connection, name: &str) -> bool {
    let Ok(channel) = conn.create_channel().await else {
        return false;
    };
    let res = channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    match res {
        Ok(_) => {
            let _ = close_channel(&channel, "OK").await;
            false
        }
        // The broker closed the channel with its refusal.
        Err(e) => reply(&e).is_some_and(|(code, _)| code == NOT_FOUND),
    }
}

impl Topology {
    /// Declares again what belongs to queue `q` (after the broker deleted
    /// it): the exchanges it is bound to, the queue, its dead-letter queue
    /// and rungs, then its bindings — a deleted queue loses its bindings
    /// with it.
    pub(crate) async fn declare_for_queue(
        &self,
        conn: &Connection,
        q: &str,
    ) -> Result<(), TopologyError> {
        let dlq = acemq_layers::dead_letter::dlq_name(q);
        let rungs = format!("{q}.retry.");
        let bindings: Vec<&BindingDecl> = self.bindings().iter().filter(|b| b.queue == q).collect();
        for x in self.exchanges() {
            if bindings.iter().any(|b| b.exchange == x.name) {
                declare_exchange(conn, x).await?;
            }
        }
        for d in self.decls() {
            if d.name == q || d.name == dlq || d.name.starts_with(&rungs) {
                // Looked for first, so that one coming back is said: a
                // deleted dead-letter queue or rung lost what it held.
                let was_missing = !d.passive && is_missing(conn, &d.name).await;
                declare_one(conn, d).await?;
                if was_missing {
                    let role = if d.name == q {
                        "queue"
                    } else if d.name == dlq {
                        "dead-letter queue"
                    } else {
                        "retry rung"
                    };
                    tracing::warn!(
                        queue = d.name.as_str(),
                        consumed = q,
                        "{role} declared again: it was missing (deleted?), and the messages it held are gone"
                    );
                }
            }
        }
        for b in bindings {
            bind(conn, b).await?;
        }
        Ok(())
    }
}

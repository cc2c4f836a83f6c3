//! Asking the broker what it holds without changing it.
//!
//! AMQP 0-9-1 cannot read a queue's arguments, list bindings or list
//! queues. What it can do:
//!
//! - a **passive** declare says whether a queue or exchange exists (and a
//!   queue's ready messages and consumers); a missing one is 404 NOT_FOUND,
//!   which closes the channel;
//! - a declare with exactly the expected arguments on a queue or exchange
//!   that **exists** is refused with 406 PRECONDITION_FAILED naming the
//!   first argument that differs, and creates nothing, because it exists.
//!
//! The second probe is only ever made on something the first one found: it
//! takes an [`Existing`], which only the passive probe hands out. A queue
//! deleted in the milliseconds between the two would be created by the
//! second; nothing else is.
//!
//! Each probe runs on the prober's channel, reopened after a refusal closed
//! it.

use acemq::config::ExchangeKind;
use acemq::connection::close_channel;
use acemq::lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use acemq::lapin::types::FieldTable;
use acemq::lapin::{Channel, Connection, ErrorKind, ExchangeKind as LapinKind};
use acemq::topology::{ExchangeDecl, QueueDecl};

use crate::exit::Failure;

pub(crate) const NOT_FOUND: u16 = 404;
const RESOURCE_LOCKED: u16 = 405;
const PRECONDITION_FAILED: u16 = 406;

/// Something the passive probe found: the proof a non-passive probe needs.
#[derive(Debug)]
pub(crate) struct Existing {
    name: String,
    /// Messages ready (not those delivered and unacknowledged).
    pub(crate) messages: u32,
    /// Consumers (0 for an exchange).
    pub(crate) consumers: u32,
}

/// What a passive probe found.
#[derive(Debug)]
pub(crate) enum Found {
    /// It is there.
    Present(Existing),
    /// 404: it is not there.
    Missing { message: String },
    /// 405: an exclusive queue of another connection.
    Locked { message: String },
}

/// What a declare with the expected arguments said about something that
/// exists.
#[derive(Debug)]
pub(crate) enum Equivalence {
    /// The broker accepted the declaration: what it checks is equal.
    Same,
    /// 406: `argument` differs (the broker's own text in `message`).
    Differs { argument: String, message: String },
    /// Another refusal (e.g. 403, no configure permission): not checked.
    Unchecked { message: String },
}

/// Probes on one connection, a channel at a time.
pub(crate) struct Prober<'a> {
    conn: &'a Connection,
    channel: Option<Channel>,
}

impl std::fmt::Debug for Prober<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober").finish_non_exhaustive()
    }
}

/// The broker's reply code and text, when `e` is its refusal.
pub(crate) fn reply(e: &acemq::lapin::Error) -> Option<(u16, String)> {
    match e.kind() {
        ErrorKind::ProtocolError(amqp) => Some((amqp.get_id(), amqp.get_message().to_string())),
        _ => None,
    }
}

/// The argument a 406's text names (`inequivalent arg 'x-message-ttl'`).
pub(crate) fn argument_of(message: &str) -> String {
    message
        .split("inequivalent arg '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap_or("its arguments or durability")
        .to_owned()
}

fn lapin_kind(kind: ExchangeKind) -> LapinKind {
    match kind {
        ExchangeKind::Direct => LapinKind::Direct,
        ExchangeKind::Topic => LapinKind::Topic,
        ExchangeKind::Fanout => LapinKind::Fanout,
        ExchangeKind::Headers => LapinKind::Headers,
        _ => LapinKind::Custom(kind.as_str().to_owned()),
    }
}

impl<'a> Prober<'a> {
    pub(crate) fn new(conn: &'a Connection) -> Self {
        Prober {
            conn,
            channel: None,
        }
    }

    async fn channel(&mut self) -> Result<Channel, Failure> {
        if let Some(ch) = &self.channel {
            if ch.status().connected() {
                return Ok(ch.clone());
            }
        }
        let ch = self
            .conn
            .create_channel()
            .await
            .map_err(|e| Failure::unavailable(format!("could not open a channel: {e}")))?;
        self.channel = Some(ch.clone());
        Ok(ch)
    }

    /// Passive declare of queue `name`.
    pub(crate) async fn queue(&mut self, name: &str) -> Result<Found, Failure> {
        let ch = self.channel().await?;
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        match ch
            .queue_declare(name.into(), options, FieldTable::default())
            .await
        {
            Ok(q) => Ok(Found::Present(Existing {
                name: name.to_owned(),
                messages: q.message_count(),
                consumers: q.consumer_count(),
            })),
            Err(e) => match reply(&e) {
                Some((NOT_FOUND, message)) => Ok(Found::Missing { message }),
                Some((RESOURCE_LOCKED, message)) => Ok(Found::Locked { message }),
                _ => Err(Failure::unavailable(format!(
                    "could not check queue {name:?}: {e}"
                ))),
            },
        }
    }

    /// Declares `decl` as the library does (durable, not exclusive, not
    /// auto-delete, its arguments) on the queue the passive probe found.
    pub(crate) async fn queue_equivalent(
        &mut self,
        existing: &Existing,
        decl: &QueueDecl,
    ) -> Result<Equivalence, Failure> {
        assert_eq!(existing.name, decl.name, "the probe checks what it found");
        let ch = self.channel().await?;
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let res = ch
            .queue_declare(decl.name.as_str().into(), options, decl.arguments.clone())
            .await;
        equivalence(res.map(|_| ()), &decl.name)
    }

    /// Passive declare of exchange `name`.
    pub(crate) async fn exchange(&mut self, name: &str) -> Result<Found, Failure> {
        let ch = self.channel().await?;
        let options = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        match ch
            .exchange_declare(
                name.into(),
                LapinKind::Direct,
                options,
                FieldTable::default(),
            )
            .await
        {
            Ok(()) => Ok(Found::Present(Existing {
                name: name.to_owned(),
                messages: 0,
                consumers: 0,
            })),
            Err(e) => match reply(&e) {
                Some((NOT_FOUND, message)) => Ok(Found::Missing { message }),
                _ => Err(Failure::unavailable(format!(
                    "could not check exchange {name:?}: {e}"
                ))),
            },
        }
    }

    /// Declares `decl` as the library does (its type and durability) on the
    /// exchange the passive probe found.
    pub(crate) async fn exchange_equivalent(
        &mut self,
        existing: &Existing,
        decl: &ExchangeDecl,
    ) -> Result<Equivalence, Failure> {
        assert_eq!(existing.name, decl.name, "the probe checks what it found");
        let ch = self.channel().await?;
        let options = ExchangeDeclareOptions {
            durable: decl.durable,
            ..ExchangeDeclareOptions::default()
        };
        let res = ch
            .exchange_declare(
                decl.name.as_str().into(),
                lapin_kind(decl.kind),
                options,
                FieldTable::default(),
            )
            .await;
        equivalence(res, &decl.name)
    }

    /// Closes the channel (a refusal may have closed it already).
    pub(crate) async fn close(self) {
        if let Some(ch) = self.channel {
            if ch.status().connected() {
                let _ = close_channel(&ch, "OK").await;
            }
        }
    }
}

fn equivalence(res: Result<(), acemq::lapin::Error>, name: &str) -> Result<Equivalence, Failure> {
    match res {
        Ok(()) => Ok(Equivalence::Same),
        Err(e) => match reply(&e) {
            Some((PRECONDITION_FAILED, message)) => Ok(Equivalence::Differs {
                argument: argument_of(&message),
                message,
            }),
            Some((_, message)) => Ok(Equivalence::Unchecked { message }),
            None => Err(Failure::unavailable(format!(
                "could not check {name:?}: {e}"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_is_read_from_the_brokers_text() {
        let m =
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': \
                 received the value '20000' of type 'signedint' but current is none";
        assert_eq!(argument_of(m), "x-message-ttl");
        assert_eq!(argument_of("something else"), "its arguments or durability");
    }
}

//! A connection's supervisor: watches one of the two connections and, when
//! it is lost, reopens it with capped, jittered backoff.
//!
//! It wakes only when something happens: an event lapin sends on the
//! connection (an error — a missed heartbeat, a socket closed, a close from
//! the broker with an error code —, a block or an unblock), a poke from
//! whoever found the connection closed before it did (a queue's runner
//! whose generation was lost, a publish, a request/reply call or a
//! readiness read waiting on the cell: [`Live::suspect`]), or the drain.
//! No timer runs while the connection is up and nothing happens.

use std::pin::Pin;
use std::sync::Arc;

use futures::{FutureExt, Stream, StreamExt};
use lapin::{Connection, Event};
use tracing::{info, warn};

use super::shared::{sleep_or_stop, Next, Shared};
use crate::app::error::StartError;
use crate::backoff::Backoff;
use crate::connection::Live;
use crate::connection::{close_connection, connect_any_via, ConnectionRole, Via};

/// Watches the connection of `role`; when it is lost, reopens it with
/// capped, jittered backoff (declaring the topology again first, for the
/// consuming one) and puts the new one in its cell. Stops when the drain
/// begins, also mid-outage.
pub(crate) async fn supervise(shared: Arc<Shared>, role: ConnectionRole) {
    let live = shared.live(role);
    loop {
        let Some(connection) = live.current() else {
            return;
        };
        let error = match watch_events(&shared, role, live, &connection).await {
            Next::On(error) => error,
            Next::Again | Next::Stop => return,
        };
        // Readiness is off from here (health reads the empty cell).
        live.set(None);
        // The one line for this loss (lapin's own ERROR events about it are
        // for `acemq::log::LAPIN_DIRECTIVE` to keep out).
        let error = error.map(|e| format!(" ({e})")).unwrap_or_default();
        warn!(
            connection = role.as_str(),
            "the {} connection to the broker was lost{error}; reconnecting with backoff (readiness is off until then)",
            role.as_str()
        );
        if let Next::Stop = reconnect(&shared, role, live).await {
            return;
        }
    }
}

/// Watches `connection` (its events, and its status whenever it wakes)
/// until it is lost (`Next::On`, with lapin's error when it reported one);
/// `Next::Stop` when the drain begins.
async fn watch_events(
    shared: &Shared,
    role: ConnectionRole,
    live: &Live,
    connection: &Connection,
) -> Next<Option<lapin::Error>> {
    // The listener before the first look at the status: a loss in between
    // is queued as an event, not missed.
    let mut events: Pin<Box<dyn Stream<Item = Event> + Send>> =
        Box::pin(connection.events_listener());
    let mut lost_with = None;
    loop {
        if !connection.status().connected() {
            // The error lapin reported with the loss, if it is already queued.
            while let Some(Some(ev)) = events.next().now_or_never() {
                if let Event::Error(e) = ev {
                    lost_with = Some(e);
                }
            }
            return Next::On(lost_with);
        }
        tokio::select! {
            () = shared.intake.cancelled() => return Next::Stop,
            // A close lapin reports without an event (one it reads as a
            // clean close) is found by whoever uses the connection next.
            () = live.suspected() => {}
            ev = events.next() => match ev {
                Some(Event::ConnectionBlocked(reason)) => {
                    // Health reads the block from lapin's status.
                    metrics::counter!("acemq.connection.blocked", "connection" => role.as_str()).increment(1);
                    warn!(connection = role.as_str(), "the broker blocked this connection ({reason}): a resource alarm (memory or disk); publishes wait, and the consumers' connection, which never publishes, keeps acknowledging");
                }
                Some(Event::ConnectionUnblocked) => {
                    info!(connection = role.as_str(), "the broker unblocked this connection");
                }
                Some(Event::Error(e)) => {
                    if connection.status().connected() && is_not_found(&e) {
                        // A channel's 404: the call that met it reports it
                        // (a consume, a declare, the look for a deleted
                        // queue before it is declared again).
                        tracing::debug!(connection = role.as_str(), "a channel was refused: {e}");
                    } else if connection.status().connected() {
                        warn!(connection = role.as_str(), "connection error: {e}");
                    } else {
                        // The loss: told once, with this error, by `supervise`.
                        lost_with = Some(e);
                    }
                }
                Some(_) => {}
                None => {
                    // No more events: the status tells from now on.
                    events = Box::pin(futures::stream::pending());
                }
            },
        }
    }
}

/// A channel closed by the broker with 404 NOT_FOUND (the connection
/// stays open).
fn is_not_found(e: &lapin::Error) -> bool {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => amqp.get_id() == 404,
        _ => false,
    }
}

/// Reopens the lost connection with capped, jittered backoff (declaring the
/// topology again first, for the consuming one) and puts the new one in its
/// cell: `Next::Again` to watch it, `Next::Stop` when the drain begins.
async fn reconnect(shared: &Shared, role: ConnectionRole, live: &Live) -> Next {
    let consuming = role == ConnectionRole::Consumer;
    let mut backoff = Backoff::new();
    loop {
        let attempt = async {
            let name = format!("{}{}", shared.name, role.suffix());
            let connected = connect_any_via(
                &shared.addresses,
                &name,
                shared.config.connect_timeout,
                &shared.options,
                Some(Via {
                    role,
                    factory: shared.factory.as_ref(),
                }),
            )
            .await?;
            let broker = connected.address.clone();
            let c = Arc::new(connected.connection);
            if consuming {
                shared.topology.declare(&c).await?;
            }
            Ok::<_, StartError>((c, broker))
        };
        let result = tokio::select! {
            () = shared.intake.cancelled() => return Next::Stop,
            r = attempt => r,
        };
        match result {
            Ok((c, broker)) => {
                if shared.intake.is_cancelled() {
                    let _ = close_connection(&c, "OK").await;
                    return Next::Stop;
                }
                live.set(Some(c));
                shared.health.set_broker(role, Some(broker.clone()));
                info!(
                    connection = role.as_str(),
                    broker = %broker,
                    "reconnected to the broker{}",
                    if consuming { "; topology declared again, consumers resume" } else { "" }
                );
                return Next::Again;
            }
            Err(e) => {
                let delay = backoff.next_delay();
                warn!(
                    connection = role.as_str(),
                    "reconnect failed: {e}; next attempt in {delay:.1?}"
                );
                if !sleep_or_stop(shared, delay).await {
                    return Next::Stop;
                }
            }
        }
    }
}

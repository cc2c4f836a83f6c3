//! The live connection of each of an [`App`](crate::App)'s two roles
//! (consuming, publishing), each kept in one watch-backed cell: the
//! supervisor writes it (start-up puts the first connection in, a loss
//! empties it, a reconnect puts the new one in); the queues' runners, the
//! publisher, the request/reply client, health and the drain read it.
//!
//! Nothing else keeps a copy. Whether a role is connected, and whether the
//! broker blocks it, are read from the connection in the cell and lapin's
//! status of it, not from flags kept beside it.
//!
//! A reader that finds the connection in the cell closed — lapin knows, the
//! supervisor has not noticed yet — tells the supervisor
//! ([`Live::suspect`]), which looks at once: a clean close lapin reports
//! without an event is seen by whoever uses the connection next, a
//! readiness probe included, with no timer running while nothing happens.

use std::sync::Arc;

use lapin::Connection;
use tokio::sync::{watch, Notify};

use super::connect::ConnectionRole;

/// One role's live connection: `None` while it is being (re)opened. Cheap
/// to clone; clones share the cell.
#[derive(Clone)]
pub(crate) struct Live {
    inner: Arc<Inner>,
}

struct Inner {
    cell: watch::Sender<Option<Arc<Connection>>>,
    /// Poked by a reader that found the connection closed (or a runner
    /// whose generation was lost with it): the supervisor looks at once.
    suspect: Notify,
    /// Whether a supervisor reopens the connection. A cell made around a
    /// connection of the caller's ([`Live::fixed`]) has none: a wait for
    /// it ends when that connection is closed.
    supervised: bool,
}

impl Default for Live {
    /// An empty cell a supervisor fills.
    fn default() -> Self {
        Live::with(None, true)
    }
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field(
                "connected",
                &self.current().is_some_and(|c| c.status().connected()),
            )
            .field("supervised", &self.inner.supervised)
            .finish()
    }
}

impl Live {
    fn with(connection: Option<Arc<Connection>>, supervised: bool) -> Self {
        Live {
            inner: Arc::new(Inner {
                cell: watch::Sender::new(connection),
                suspect: Notify::new(),
                supervised,
            }),
        }
    }

    /// A cell holding `connection` for good: nothing reopens it (a
    /// publisher or client made on a connection of the caller's).
    pub(crate) fn fixed(connection: Arc<Connection>) -> Self {
        Live::with(Some(connection), false)
    }

    /// The connection in the cell, connected or not.
    pub(crate) fn current(&self) -> Option<Arc<Connection>> {
        self.inner.cell.borrow().clone()
    }

    /// Puts `connection` in the cell (`None`: lost, being reopened) and
    /// wakes every wait. The supervisor's (and start-up's) alone.
    pub(crate) fn set(&self, connection: Option<Arc<Connection>>) {
        self.inner.cell.send_replace(connection);
    }

    /// Whether the cell holds a connection lapin reports connected. One it
    /// reports closed is told to the supervisor.
    pub(crate) fn is_connected(&self) -> bool {
        match self.inner.cell.borrow().as_ref() {
            Some(c) if c.status().connected() => true,
            Some(_) => {
                self.suspect();
                false
            }
            None => false,
        }
    }

    /// Whether the broker blocks the connection in the cell (a resource
    /// alarm).
    pub(crate) fn is_blocked(&self) -> bool {
        self.inner
            .cell
            .borrow()
            .as_ref()
            .is_some_and(|c| c.status().blocked())
    }

    /// Waits until the cell holds a connected connection and returns it:
    /// the one wait for "a live connection exists" (the publisher, the
    /// request/reply client and the queues' runners use it; bound it with a
    /// timeout). A closed connection found in the cell is told to the
    /// supervisor. `None` only for a cell nothing reopens whose connection
    /// is closed.
    pub(crate) async fn wait(&self) -> Option<Arc<Connection>> {
        let mut rx = self.inner.cell.subscribe();
        loop {
            let current = rx.borrow_and_update().clone();
            match current {
                Some(c) if c.status().connected() => return Some(c),
                Some(_) if !self.inner.supervised => return None,
                Some(_) => self.suspect(),
                None => {}
            }
            // The sender lives in `self`: this only returns on a change.
            let _ = rx.changed().await;
        }
    }

    /// Tells the supervisor to look at the connection now.
    pub(crate) fn suspect(&self) {
        self.inner.suspect.notify_one();
    }

    /// Resolves when someone told the supervisor to look (a poke made
    /// while it was not waiting is kept for its next wait).
    pub(crate) async fn suspected(&self) {
        self.inner.suspect.notified().await;
    }
}

/// The two cells of an [`App`](crate::App): one per [`ConnectionRole`].
/// Cheap to clone; clones share the cells.
#[derive(Clone, Debug, Default)]
pub(crate) struct LiveConnections {
    consumer: Live,
    publisher: Live,
}

impl LiveConnections {
    /// The cell of `role`.
    pub(crate) fn get(&self, role: ConnectionRole) -> &Live {
        match role {
            ConnectionRole::Consumer => &self.consumer,
            ConnectionRole::Publisher => &self.publisher,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn an_empty_supervised_cell_waits_and_tells_nobody() {
        let live = Live::default();
        assert!(!live.is_connected() && !live.is_blocked());
        assert!(live.current().is_none());
        let waited = tokio::time::timeout(Duration::from_millis(20), live.wait()).await;
        assert!(waited.is_err(), "no connection: the wait goes on");
        // Nothing was found closed, so nothing was told to the supervisor.
        let told = tokio::time::timeout(Duration::from_millis(20), live.suspected()).await;
        assert!(told.is_err());
    }

    #[tokio::test]
    async fn a_closed_connection_in_the_cell_is_told_to_the_supervisor_and_a_new_one_ends_the_wait()
    {
        let addr = crate::connection::amqp_addr_from_env();
        let connect = || async {
            Arc::new(
                crate::connection::connect(&addr, "live-cell-test", Duration::from_secs(5))
                    .await
                    .expect("the test broker"),
            )
        };
        let first = connect().await;
        let live = Live::default();
        live.set(Some(first.clone()));
        assert!(live.is_connected());
        crate::connection::close_connection(&first, "OK")
            .await
            .expect("close");
        assert!(!live.is_connected(), "read from lapin's status");
        tokio::time::timeout(Duration::from_secs(1), live.suspected())
            .await
            .expect("the reader told the supervisor");

        let waiting = tokio::spawn({
            let live = live.clone();
            async move { live.wait().await }
        });
        let second = connect().await;
        live.set(Some(second.clone()));
        let got = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the wait ends on the new connection")
            .expect("join")
            .expect("a connection");
        assert!(Arc::ptr_eq(&got, &second));
        crate::connection::close_connection(&second, "OK")
            .await
            .expect("close");

        // Nothing reopens a fixed cell: its wait ends once it is closed.
        let fixed = Live::fixed(second);
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(1), fixed.wait())
                .await
                .expect("at once")
                .map(|_| ()),
            None
        );
    }
}

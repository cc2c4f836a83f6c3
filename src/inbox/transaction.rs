//! The transaction the inbox hands to the handler.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use acemq_layers::Delivery;
use deadpool_postgres::Object;
use tokio::sync::{Mutex, MutexGuard};

use super::client::InboxClient;

/// An open PostgreSQL transaction holding the inbox's mark: do the
/// handler's writes through [`client`](Self::client). The inbox layer
/// commits it after the handler returns `Ok`; dropped uncommitted (an
/// error, a panic, a cancelled handler) it rolls back.
///
/// Cheap to clone (an `Arc`): the delivery's extensions hold a clone. Do
/// not keep one past the handler. The handler cannot open or end a
/// transaction through it ([`InboxClient`] has no such method); a `COMMIT`
/// or `ROLLBACK` sent as a statement is found before the layer's commit
/// (the transaction's id, recorded at `BEGIN`, is no longer the current
/// one) and the delivery is dead-lettered with reason `transaction-ended`.
///
/// Example: the [module docs](crate::inbox); runnable: `examples/outbox.rs`.
#[derive(Clone)]
pub struct PgTransaction {
    inner: Arc<Inner>,
}

struct Inner {
    client: Mutex<Option<Object>>,
    committed: AtomicBool,
    /// `pg_current_xact_id()` at `BEGIN`.
    xid: u64,
    /// (queue, message id) of the mark, if the delivery has a message id.
    key: Option<(String, String)>,
}

/// The delivery has no [`PgTransaction`] (or, for
/// [`InboxTransaction::of`](super::InboxTransaction::of), no transaction of
/// either inbox): the handler is not under an `InboxLayer`.
///
/// Example: the [module docs](crate::inbox); runnable: `examples/outbox.rs`.
#[derive(Debug)]
pub struct NoTransaction(());

impl fmt::Display for NoTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "the delivery carries no inbox transaction: wrap the handler in \
             InboxLayer::new(PgInbox::new(pool)) (or InboxLayer::new(MemoryInbox::new()) in a test)",
        )
    }
}

impl NoTransaction {
    pub(super) fn new() -> Self {
        NoTransaction(())
    }
}

impl std::error::Error for NoTransaction {}

/// How the commit went.
pub(super) enum Committed {
    /// Work and mark are committed.
    Yes,
    /// The transaction begun at `BEGIN` was no longer open: the handler
    /// ended it. Nothing more is committed; a mark this transaction had
    /// committed early is removed (`true`).
    Ended { mark_removed: bool },
}

/// The SQLSTATE the pre-commit check raises (a class of acemq's own).
const ENDED: &str = "AQ001";

/// Removes the mark written by the transaction whose 32-bit id is `$3`
/// (`xmin`), and no other: a concurrent delivery of the same key may have
/// marked it since.
const UNMARK: &str =
    "DELETE FROM acemq_inbox WHERE queue = $1 AND message_id = $2 AND xmin::text = $3";

impl PgTransaction {
    pub(super) fn new(client: Object, xid: u64, key: Option<(String, String)>) -> Self {
        PgTransaction {
            inner: Arc::new(Inner {
                client: Mutex::new(Some(client)),
                committed: AtomicBool::new(false),
                xid,
                key,
            }),
        }
    }

    /// The transaction of `delivery`, put there by the inbox layer.
    pub fn of(delivery: &Delivery) -> Result<PgTransaction, NoTransaction> {
        delivery
            .extensions()
            .get::<PgTransaction>()
            .cloned()
            .ok_or(NoTransaction(()))
    }

    /// The connection the transaction is open on: run your statements on
    /// it (`execute`, `query`, `prepare_cached`, …) and enqueue outbox
    /// messages with [`InboxClient::enqueue`]. Held until the guard drops.
    ///
    /// # Panics
    ///
    /// After the layer committed (a clone kept past the handler).
    pub async fn client(&self) -> InboxClient<'_> {
        InboxClient::new(MutexGuard::map(self.inner.client.lock().await, |c| {
            &mut **c
                .as_mut()
                .expect("the inbox transaction was already committed")
        }))
    }

    /// The (queue, message id) of the mark, if any.
    pub(super) fn key(&self) -> Option<(&str, &str)> {
        self.inner
            .key
            .as_ref()
            .map(|(q, id)| (q.as_str(), id.as_str()))
    }

    /// Checks that the transaction begun at `BEGIN` is still the open one,
    /// and commits it: one round trip (the check and the `COMMIT` are
    /// pipelined; a failed check aborts whatever transaction is open, so
    /// the `COMMIT` behind it commits nothing). The connection goes back to
    /// the pool.
    pub(super) async fn commit(&self) -> Result<Committed, tokio_postgres::Error> {
        let mut guard = self.inner.client.lock().await;
        let Some(client) = guard.as_mut() else {
            return Ok(Committed::Yes);
        };
        // The id is a number PostgreSQL gave: no quoting needed.
        let check = format!(
            "DO $acemq$BEGIN IF pg_current_xact_id_if_assigned() IS DISTINCT FROM '{}'::xid8 THEN \
             RAISE EXCEPTION USING ERRCODE = '{ENDED}', \
             MESSAGE = 'the inbox transaction is not the open one'; END IF; END$acemq$",
            self.inner.xid
        );
        let (checked, committed) =
            futures::future::join(client.batch_execute(&check), client.batch_execute("COMMIT"))
                .await;
        match checked {
            Ok(()) => committed?,
            Err(e) if e.code().is_some_and(|c| c.code() == ENDED) => {
                // The COMMIT behind the check ended (as a rollback) any
                // transaction the handler had begun after ending ours; the
                // connection is idle, so the delete below commits at once.
                committed?;
                let mut mark_removed = false;
                if let Some((queue, id)) = &self.inner.key {
                    let xmin = (self.inner.xid & u64::from(u32::MAX)).to_string();
                    mark_removed = client.execute(UNMARK, &[queue, id, &xmin]).await? > 0;
                }
                self.inner.committed.store(true, Ordering::Release);
                guard.take();
                return Ok(Committed::Ended { mark_removed });
            }
            Err(e) => return Err(e),
        }
        self.inner.committed.store(true, Ordering::Release);
        guard.take();
        Ok(Committed::Yes)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let Some(client) = self.client.get_mut().take() else {
            return;
        };
        if self.committed.load(Ordering::Acquire) {
            return;
        }
        // Uncommitted: roll back before the connection goes back to the
        // pool; without a runtime, close it (the server rolls back).
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if client.batch_execute("ROLLBACK").await.is_err() {
                        drop(Object::take(client));
                    }
                });
            }
            Err(_) => drop(Object::take(client)),
        }
    }
}

impl fmt::Debug for PgTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTransaction")
            .field("committed", &self.inner.committed.load(Ordering::Relaxed))
            .finish()
    }
}

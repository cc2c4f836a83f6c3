//! The transaction the inbox hands to the handler.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use acemq_layers::Delivery;
use deadpool_postgres::{ClientWrapper, Object};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

/// An open PostgreSQL transaction holding the inbox's mark: do the
/// handler's writes through [`client`](Self::client). The inbox layer
/// commits it after the handler returns `Ok`; dropped uncommitted (an
/// error, a panic, a cancelled handler) it rolls back.
///
/// Cheap to clone (an `Arc`): the delivery's extensions hold a clone. Do
/// not keep one past the handler, and do not `BEGIN`/`COMMIT` on it
/// yourself.
#[derive(Clone)]
pub struct PgTransaction {
    inner: Arc<Inner>,
}

struct Inner {
    client: Mutex<Option<Object>>,
    committed: AtomicBool,
}

/// The delivery has no [`PgTransaction`]: the handler is not under an
/// `InboxLayer` on a [`PgInbox`](super::PgInbox).
#[derive(Debug)]
pub struct NoTransaction(());

impl fmt::Display for NoTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "the delivery carries no inbox transaction: wrap the handler in \
             InboxLayer::new(PgInbox::new(pool))",
        )
    }
}

impl std::error::Error for NoTransaction {}

impl PgTransaction {
    pub(crate) fn new(client: Object) -> Self {
        PgTransaction {
            inner: Arc::new(Inner {
                client: Mutex::new(Some(client)),
                committed: AtomicBool::new(false),
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
    /// it (`execute`, `query`, `prepare_cached`, …). Held until the guard
    /// drops.
    ///
    /// # Panics
    ///
    /// After the layer committed (a clone kept past the handler).
    pub async fn client(&self) -> MappedMutexGuard<'_, ClientWrapper> {
        MutexGuard::map(self.inner.client.lock().await, |c| {
            &mut **c
                .as_mut()
                .expect("the inbox transaction was already committed")
        })
    }

    /// Commits, and gives the connection back to the pool.
    pub(crate) async fn commit(&self) -> Result<(), tokio_postgres::Error> {
        let mut guard = self.inner.client.lock().await;
        let Some(client) = guard.as_mut() else {
            return Ok(());
        };
        client.batch_execute("COMMIT").await?;
        self.inner.committed.store(true, Ordering::Release);
        guard.take();
        Ok(())
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

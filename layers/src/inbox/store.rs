//! The storage side of the inbox: the [`InboxStore`] trait and an in-memory
//! store for tests and benchmarks.

use std::collections::HashSet;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::BoxError;

/// What [`InboxStore::begin`] found.
#[derive(Debug)]
pub enum Begun<T> {
    /// The key was not processed before: here is the unit of work (a
    /// transaction) the handler's own writes go into, holding the mark.
    Fresh(T),
    /// The key was processed (committed) before: skip the handler.
    Duplicate,
}

/// Where the inbox keeps the keys it has processed.
///
/// A store hands out a unit of work per delivery: [`begin`](Self::begin)
/// opens it and writes the "processed" mark for `(queue, message_id)` into
/// it (or reports the key as a duplicate); the handler does its own work in
/// the same unit (the layer puts the transaction in the delivery's
/// extensions); [`commit`](Self::commit) makes the work and the mark durable
/// together. Dropping the transaction without committing must undo both —
/// that is what makes a crash between the work and the ack safe.
///
/// The futures are associated types so the layer's future needs no boxing;
/// a store on an async database client may box them (one allocation per
/// database round trip is noise beside the round trip).
pub trait InboxStore: Clone {
    /// The unit of work handed to the handler. Cloned into the delivery's
    /// extensions, so it is a cheap handle (`Arc` inside).
    type Transaction: Clone + Send + Sync + 'static;
    /// A storage failure.
    type Error: Into<BoxError>;
    /// Resolves when the transaction is open and the mark is written.
    type BeginFuture: Future<Output = Result<Begun<Self::Transaction>, Self::Error>>;
    /// Resolves when the transaction is committed.
    type CommitFuture: Future<Output = Result<(), Self::Error>>;

    /// Opens a unit of work. With a key, writes its mark in it, or returns
    /// [`Begun::Duplicate`] when the key was committed before (a store
    /// waits for a concurrent holder of the same key to commit or roll
    /// back before it answers). Without a key (a delivery without message
    /// id, handled anyway), opens the unit of work and marks nothing.
    fn begin(&self, key: Option<(&str, &str)>) -> Self::BeginFuture;

    /// Commits the unit of work: the handler's writes and the mark.
    fn commit(&self, transaction: Self::Transaction) -> Self::CommitFuture;
}

/// An in-memory [`InboxStore`], for tests and benchmarks: a set of keys
/// behind a mutex. A key is reserved by `begin` and kept by `commit`; a
/// transaction dropped without commit releases it. Unlike a database, it
/// does not wait for a concurrent holder of the same key: a key reserved by
/// a transaction still in progress is reported as a duplicate. Not durable:
/// a process restart forgets everything.
///
/// A handler's writes can be recorded in its transaction
/// ([`MemoryTransaction::record`]): they join
/// [`committed_writes`](MemoryInbox::committed_writes) when the layer
/// commits, and vanish when it drops the transaction — what a database
/// would keep, for a test without one.
#[derive(Clone, Default)]
pub struct MemoryInbox {
    keys: Arc<Mutex<HashSet<(String, String)>>>,
    committed: Arc<Mutex<Vec<String>>>,
}

impl MemoryInbox {
    /// An empty store.
    pub fn new() -> Self {
        MemoryInbox::default()
    }

    /// Whether `(queue, message_id)` is marked (reserved or committed).
    pub fn contains(&self, queue: &str, message_id: &str) -> bool {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&(queue.to_owned(), message_id.to_owned()))
    }

    /// How many keys are marked.
    pub fn len(&self) -> usize {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no key is marked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The writes recorded in transactions that committed, in commit order.
    pub fn committed_writes(&self) -> Vec<String> {
        self.committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl fmt::Debug for MemoryInbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryInbox")
            .field("keys", &self.len())
            .finish()
    }
}

/// The transaction of a [`MemoryInbox`]: releases its key when the last
/// clone drops uncommitted. What the handler [`record`](Self::record)s in
/// it is kept by the store's
/// [`committed_writes`](MemoryInbox::committed_writes) at commit only.
#[derive(Clone, Debug)]
pub struct MemoryTransaction {
    guard: Option<Arc<KeyGuard>>,
    writes: Arc<Mutex<Vec<String>>>,
    committed: Arc<Mutex<Vec<String>>>,
}

impl MemoryTransaction {
    /// Records a write in the transaction: committed with it, or dropped
    /// with it.
    pub fn record(&self, write: impl Into<String>) {
        self.writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(write.into());
    }
}

#[derive(Debug)]
struct KeyGuard {
    keys: Arc<Mutex<HashSet<(String, String)>>>,
    key: (String, String),
    committed: std::sync::atomic::AtomicBool,
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        if !self.committed.load(std::sync::atomic::Ordering::Acquire) {
            self.keys
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&self.key);
        }
    }
}

impl InboxStore for MemoryInbox {
    type Transaction = MemoryTransaction;
    type Error = std::convert::Infallible;
    type BeginFuture = Ready<Result<Begun<MemoryTransaction>, std::convert::Infallible>>;
    type CommitFuture = Ready<Result<(), std::convert::Infallible>>;

    fn begin(&self, key: Option<(&str, &str)>) -> Self::BeginFuture {
        let transaction = |guard| MemoryTransaction {
            guard,
            writes: Arc::default(),
            committed: self.committed.clone(),
        };
        let Some((queue, id)) = key else {
            return ready(Ok(Begun::Fresh(transaction(None))));
        };
        let key = (queue.to_owned(), id.to_owned());
        let fresh = self
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone());
        ready(Ok(if fresh {
            Begun::Fresh(transaction(Some(Arc::new(KeyGuard {
                keys: self.keys.clone(),
                key,
                committed: false.into(),
            }))))
        } else {
            Begun::Duplicate
        }))
    }

    fn commit(&self, transaction: MemoryTransaction) -> Self::CommitFuture {
        let writes = std::mem::take(
            &mut *transaction
                .writes
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        transaction
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(writes);
        if let Some(guard) = transaction.guard {
            guard
                .committed
                .store(true, std::sync::atomic::Ordering::Release);
        }
        ready(Ok(()))
    }
}

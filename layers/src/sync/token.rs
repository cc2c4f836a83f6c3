//! A model of `tokio_util::sync::CancellationToken` for loom (which cannot
//! see inside tokio-util's): a loom `AtomicBool`, the [`Notify`] model and
//! a loom `Mutex` around the children.
//!
//! It keeps tokio-util's documented rules, for exactly what acemq-layers
//! uses (`new`, `cancel`, `is_cancelled`, `cancelled`, `cancelled_owned`,
//! `child_token`, `Clone`, `Default`):
//!
//! - `cancel` is idempotent; it sets the flag (under the children's lock,
//!   as tokio-util sets it under the node's), cancels the children, then
//!   wakes every future waiting on the token. `is_cancelled` is an acquire
//!   load of the flag (tokio-util takes the node's lock: the same
//!   happens-before edge from the `cancel`).
//! - `cancelled()` resolves once the token is cancelled, including a
//!   cancellation between its creation and its first poll (it is created
//!   before the flag is read, as tokio-util's is).
//! - A child is cancelled with its parent, at once if the parent already
//!   is; cancelling the child reaches nothing else.
//!
//! Not modelled: `drop_guard`, `run_until_cancelled`, and the tree's
//! re-parenting when a child is dropped (children are kept until the
//! parent is cancelled or dropped).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use loom::sync::atomic::AtomicBool;
use loom::sync::Mutex;
use std::sync::atomic::Ordering;

use super::notify::{Notified, Notify, OwnedNotified};

/// See the module docs.
#[derive(Clone)]
pub struct CancellationToken {
    node: Arc<Node>,
}

struct Node {
    cancelled: AtomicBool,
    waiters: Arc<Notify>,
    children: Mutex<Vec<CancellationToken>>,
}

impl CancellationToken {
    pub(crate) fn new() -> Self {
        CancellationToken {
            node: Arc::new(Node {
                cancelled: AtomicBool::new(false),
                waiters: Arc::new(Notify::new()),
                children: Mutex::new(Vec::new()),
            }),
        }
    }

    pub(crate) fn cancel(&self) {
        let children = {
            let mut children = self.node.children.lock().unwrap();
            if self.node.cancelled.swap(true, Ordering::AcqRel) {
                return;
            }
            std::mem::take(&mut *children)
        };
        for child in children {
            child.cancel();
        }
        self.node.waiters.notify_waiters();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.node.cancelled.load(Ordering::Acquire)
    }

    pub(crate) fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        WaitForCancellationFuture {
            token: self,
            notified: self.node.waiters.notified(),
        }
    }

    pub(crate) fn cancelled_owned(self) -> WaitForCancellationFutureOwned {
        let notified = self.node.waiters.clone().notified_owned();
        WaitForCancellationFutureOwned {
            token: self,
            notified,
        }
    }

    pub(crate) fn child_token(&self) -> CancellationToken {
        let child = CancellationToken::new();
        let mut children = self.node.children.lock().unwrap();
        // The flag is set under this lock: a child pushed here is taken
        // and cancelled by `cancel`.
        if self.is_cancelled() {
            drop(children);
            child.cancel();
        } else {
            children.push(child.clone());
        }
        child
    }
}

impl Default for CancellationToken {
    fn default() -> Self {
        CancellationToken::new()
    }
}

impl fmt::Debug for CancellationToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancellationToken")
            .field("is_cancelled", &self.is_cancelled())
            .finish()
    }
}

/// `tokio_util::sync::WaitForCancellationFuture`: see the module docs.
#[derive(Debug)]
pub struct WaitForCancellationFuture<'a> {
    token: &'a CancellationToken,
    notified: Notified<'a>,
}

impl Future for WaitForCancellationFuture<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            if this.token.is_cancelled() {
                return Poll::Ready(());
            }
            std::task::ready!(Pin::new(&mut this.notified).poll(cx));
            this.notified = this.token.node.waiters.notified();
        }
    }
}

/// `tokio_util::sync::WaitForCancellationFutureOwned`: see the module docs.
#[derive(Debug)]
pub struct WaitForCancellationFutureOwned {
    token: CancellationToken,
    notified: OwnedNotified,
}

impl Future for WaitForCancellationFutureOwned {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            if this.token.is_cancelled() {
                return Poll::Ready(());
            }
            std::task::ready!(Pin::new(&mut this.notified).poll(cx));
            this.notified = this.token.node.waiters.clone().notified_owned();
        }
    }
}

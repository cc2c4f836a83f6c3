//! The primitives through which the layers coordinate threads, in one
//! place so that the model-checking build can swap them (tokio's own
//! pattern, `tokio/src/loom/`).
//!
//! In a normal build these are re-exports of std's atomics, tokio's
//! `Notify`, tokio-util's `CancellationToken` and futures' `AtomicWaker`:
//! the types the code always used, nothing in between. Under
//! `--cfg acemq_loom` (see the crate docs' "Verification") they are loom's
//! atomics and `loom::future::AtomicWaker`, and two shims built on loom's
//! `Mutex` and atomics with the documented semantics of the types loom
//! cannot look into (`notify.rs`: tokio's `Notify`; `token.rs`:
//! tokio-util's `CancellationToken`); the cancellation view's watcher task
//! becomes a loom thread.
//!
//! `Arc` stays std's in both builds: a waker made from an `Arc` (`Wake`)
//! needs std's, and reference counting is not part of any protocol here.
//! Locks that only guard a registry (the in-flight counter's queues, the
//! retry layer's warnings) stay std's too; a lock that a lock-free path
//! hands over to (the partition table's) is this module's `Mutex`.

#[cfg(not(acemq_loom))]
mod imp {
    pub(crate) mod atomic {
        pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    }

    pub(crate) use futures::task::AtomicWaker;
    pub(crate) use std::sync::{Mutex, MutexGuard};
    pub(crate) use tokio::sync::futures::OwnedNotified;
    pub(crate) use tokio::sync::Notify;
    pub(crate) use tokio_util::sync::{
        CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
    };

    /// Between two `SeqCst` accesses to different atomics that must not be
    /// reordered (a store-buffering pattern: each thread writes one and
    /// reads the other): nothing, since the accesses' single total order
    /// already forbids it. Under loom a `SeqCst` fence, because loom models
    /// `SeqCst` accesses as `AcqRel` (its README, "Unsupported features")
    /// and would report the reordering C11 forbids; with a fence it checks
    /// the pattern exactly.
    #[inline(always)]
    pub(crate) fn seq_cst_order() {}

    /// Where the cancellation view's watcher runs: the current tokio
    /// runtime, if there is one.
    #[inline]
    pub(crate) fn runtime() -> Option<tokio::runtime::Handle> {
        tokio::runtime::Handle::try_current().ok()
    }

    /// One value per process, made on first use.
    macro_rules! shared_static {
        ($ty:ty, $init:expr) => {{
            static CELL: std::sync::OnceLock<$ty> = std::sync::OnceLock::new();
            CELL.get_or_init(|| $init)
        }};
    }
    pub(crate) use shared_static;
}

#[cfg(acemq_loom)]
mod imp {
    pub(crate) mod atomic {
        pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
        pub(crate) use std::sync::atomic::Ordering;
    }

    pub(crate) use loom::sync::{Mutex, MutexGuard};

    pub(crate) use super::notify::{Notify, OwnedNotified};
    pub(crate) use super::token::{
        CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
    };

    use std::future::Future;
    use std::task::Waker;

    /// See the normal build's: a `SeqCst` fence, which loom models.
    pub(crate) fn seq_cst_order() {
        loom::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    /// `loom::future::AtomicWaker` with futures' signature (`register`
    /// borrows the waker).
    #[derive(Debug, Default)]
    pub(crate) struct AtomicWaker(loom::future::AtomicWaker);

    impl AtomicWaker {
        pub(crate) fn new() -> Self {
            AtomicWaker(loom::future::AtomicWaker::new())
        }

        pub(crate) fn register(&self, waker: &Waker) {
            self.0.register_by_ref(waker);
        }

        pub(crate) fn wake(&self) {
            self.0.wake();
        }
    }

    /// The watcher's "runtime" under loom: each task is a loom thread that
    /// blocks on it (a thread left blocked when the others end is reported
    /// as a deadlock, so a watcher that never ends fails the model).
    #[derive(Debug)]
    pub(crate) struct Threads;

    impl Threads {
        pub(crate) fn spawn<F>(&self, task: F)
        where
            F: Future<Output = ()> + Send + 'static,
        {
            loom::thread::spawn(move || loom::future::block_on(task));
        }
    }

    pub(crate) fn runtime() -> Option<Threads> {
        Some(Threads)
    }

    /// One value per model execution (loom's `lazy_static`: a loom object
    /// must not outlive its execution).
    macro_rules! shared_static {
        ($ty:ty, $init:expr) => {{
            loom::lazy_static! {
                static ref CELL: $ty = $init;
            }
            &*CELL
        }};
    }
    pub(crate) use shared_static;
}

#[cfg(acemq_loom)]
pub(crate) mod notify;
#[cfg(acemq_loom)]
pub(crate) mod token;

#[cfg(test)]
mod tests;

pub(crate) use imp::*;

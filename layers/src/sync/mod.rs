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
//! retry layer's warnings) stay std's too.

#[cfg(not(acemq_loom))]
mod imp {
    pub(crate) mod atomic {
        pub(crate) use std::sync::atomic::{
            AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering,
        };
    }

    pub(crate) use futures::task::AtomicWaker;
    pub(crate) use tokio::sync::futures::OwnedNotified;
    pub(crate) use tokio::sync::Notify;
    pub(crate) use tokio_util::sync::{
        CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
    };

    /// Where the cancellation view's watcher runs: the current tokio
    /// runtime, if there is one.
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

pub(crate) use imp::*;

//! The one rule for a poisoned lock: acemq takes it as it is.
//!
//! A lock is poisoned when a thread panicked while holding it. acemq's
//! critical sections only assign or take whole values (a channel, a
//! snapshot, a list of queues), so what a panicking holder left is never
//! half-written, and refusing it would only turn one panic into many.

use std::sync::{Mutex, MutexGuard};

/// [`Mutex::lock`], recovering the guard from a poisoned lock.
pub(crate) trait Locked<T: ?Sized> {
    /// The guard, poisoned or not.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}

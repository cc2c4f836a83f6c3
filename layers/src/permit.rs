//! A claimed delivery's concurrency permit (the one its claim took), kept
//! in the part every copy of the delivery shares, so that the layers below
//! the claim can give it up while only a copy's confirm is awaited (see the
//! [in-flight module's docs](crate::in_flight#confirming)).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Where a delivery's concurrency permit is: nowhere (not claimed, no
/// limit, or the claim has ended), kept (the delivery counts against its
/// queue's concurrency), or given up while its copy's confirm is awaited
/// (the semaphore is kept, so that a refused rung copy can take a permit
/// again before its next attempt).
///
/// std's lock in every build: it guards one value, is taken by one
/// delivery's own layers, and a delivery may be built outside a
/// model-checked execution.
#[derive(Default)]
pub(crate) struct PermitCell(Mutex<State>);

#[derive(Default)]
enum State {
    #[default]
    Empty,
    Kept(OwnedSemaphorePermit),
    Confirming(Arc<Semaphore>),
}

impl PermitCell {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while it is held.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The claim hands the delivery its permit; returned (`Err`) if the
    /// delivery already keeps a claim's (a second claim point under the
    /// first: that claim keeps its own permit to itself).
    pub(crate) fn keep(&self, permit: OwnedSemaphorePermit) -> Result<(), OwnedSemaphorePermit> {
        let mut state = self.lock();
        if !matches!(*state, State::Empty) {
            return Err(permit);
        }
        *state = State::Kept(permit);
        Ok(())
    }

    /// Kept → confirming: the permit goes back to the semaphore (dropped
    /// after the lock is released). `false` if there was none to give up.
    pub(crate) fn give_up(&self) -> bool {
        let permit = {
            let mut state = self.lock();
            match std::mem::take(&mut *state) {
                State::Kept(permit) => {
                    *state = State::Confirming(permit.semaphore().clone());
                    permit
                }
                other => {
                    *state = other;
                    return false;
                }
            }
        };
        drop(permit);
        true
    }

    /// The semaphore to take a permit from again if the permit was given
    /// up, `None` if the delivery still keeps it (or never had one).
    pub(crate) fn given_up(&self) -> Option<Arc<Semaphore>> {
        match &*self.lock() {
            State::Confirming(semaphore) => Some(semaphore.clone()),
            _ => None,
        }
    }

    /// Confirming → kept again, with `permit` (taken from the semaphore
    /// [`given_up`](Self::given_up) returned). If the claim ended
    /// meanwhile the permit is dropped at once.
    pub(crate) fn take_back(&self, permit: OwnedSemaphorePermit) {
        let mut state = self.lock();
        if matches!(*state, State::Confirming(_)) {
            *state = State::Kept(permit);
        } else {
            drop(state);
            drop(permit);
        }
    }

    /// The claim has ended: whatever the delivery still keeps goes back.
    pub(crate) fn end(&self) {
        let old = std::mem::take(&mut *self.lock());
        drop(old);
    }

    /// Whether a claimed delivery has given up its permit and awaits only
    /// its copy's confirm.
    pub(crate) fn is_confirming(&self) -> bool {
        matches!(*self.lock(), State::Confirming(_))
    }
}

impl Clone for PermitCell {
    // A delivery's shared part is copied only when a copy replaces its
    // lifeline before being cloned (`Delivery::set_lifeline`), before any
    // claim: a permit is never duplicated.
    fn clone(&self) -> Self {
        PermitCell::default()
    }
}

impl fmt::Debug for PermitCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match &*self.lock() {
            State::Empty => "none",
            State::Kept(_) => "kept",
            State::Confirming(_) => "confirming",
        })
    }
}

//! A model of `tokio::sync::Notify` for loom (which cannot see inside
//! tokio's): one loom `Mutex` around the permit, the count of
//! `notify_waiters` calls and the list of waiters.
//!
//! It keeps tokio's documented rules, for exactly what acemq-layers uses
//! (`notify_one`, `notify_waiters`, `notified`, `notified_owned`, `enable`
//! and polling):
//!
//! - `notify_one` wakes the first waiter that is enabled (polled or
//!   `enable`d) and not yet notified; with none, it stores the permit (at
//!   most one). The next future to be enabled takes the permit and is ready.
//! - `notify_waiters` makes ready every future created before the call,
//!   enabled or not (the count of calls is read at creation), wakes those
//!   that registered a waker, and stores no permit.
//! - A future notified by `notify_one` and dropped before it returned
//!   `Ready` passes the notification on (to the next waiter, or as the
//!   permit), as tokio's does.
//! - Wakers are woken after the lock is released.
//!
//! Not modelled: `notify_last`, `Notified::enable`'s use without pinning
//! (these futures are `Unpin`), and tokio's intrusive list (a `Vec` here).
//! The lock gives every operation acquire/release ordering at least as
//! strong as tokio's state word; tokio's relaxed fast paths are not
//! explored.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use loom::sync::Mutex;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Notify {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    permit: bool,
    // How many times `notify_waiters` was called.
    calls: usize,
    next_id: u64,
    // Enabled futures, in the order they were enabled.
    waiters: Vec<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    waker: Option<Waker>,
    notified: Option<By>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum By {
    One,
    All,
}

/// Where one future stands.
#[derive(Debug)]
struct Entry {
    // `calls` when the future was created.
    calls: usize,
    stage: Stage,
}

#[derive(Debug)]
enum Stage {
    Init,
    Waiting(u64),
    Done,
}

impl State {
    // Marks the first enabled, unnotified waiter (taking its waker), or
    // stores the permit.
    fn notify_one(&mut self) -> Option<Waker> {
        match self.waiters.iter_mut().find(|w| w.notified.is_none()) {
            Some(waiter) => {
                waiter.notified = Some(By::One);
                waiter.waker.take()
            }
            None => {
                self.permit = true;
                None
            }
        }
    }
}

impl Notify {
    pub(crate) fn new() -> Self {
        Notify {
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> loom::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    pub(crate) fn notify_one(&self) {
        let waker = self.lock().notify_one();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    pub(crate) fn notify_waiters(&self) {
        let wakers: Vec<Waker> = {
            let mut state = self.lock();
            state.calls += 1;
            state
                .waiters
                .iter_mut()
                .filter(|w| w.notified.is_none())
                .filter_map(|w| {
                    w.notified = Some(By::All);
                    w.waker.take()
                })
                .collect()
        };
        for waker in wakers {
            waker.wake();
        }
    }

    pub(crate) fn notified(&self) -> Notified<'_> {
        Notified {
            notify: self,
            entry: self.entry(),
        }
    }

    pub(crate) fn notified_owned(self: Arc<Self>) -> OwnedNotified {
        let entry = self.entry();
        OwnedNotified {
            notify: self,
            entry,
        }
    }

    fn entry(&self) -> Entry {
        Entry {
            calls: self.lock().calls,
            stage: Stage::Init,
        }
    }

    // Enables (with no waker) or polls one future.
    fn poll_entry(&self, entry: &mut Entry, waker: Option<&Waker>) -> Poll<()> {
        let mut state = self.lock();
        match entry.stage {
            Stage::Init => {
                if state.calls != entry.calls {
                    entry.stage = Stage::Done;
                    return Poll::Ready(());
                }
                if state.permit {
                    state.permit = false;
                    entry.stage = Stage::Done;
                    return Poll::Ready(());
                }
                let id = state.next_id;
                state.next_id += 1;
                state.waiters.push(Waiter {
                    id,
                    waker: waker.cloned(),
                    notified: None,
                });
                entry.stage = Stage::Waiting(id);
                Poll::Pending
            }
            Stage::Waiting(id) => {
                let i = state
                    .waiters
                    .iter()
                    .position(|w| w.id == id)
                    .expect("an enabled future is listed until it is done");
                if state.waiters[i].notified.is_some() {
                    state.waiters.remove(i);
                    entry.stage = Stage::Done;
                    return Poll::Ready(());
                }
                if let Some(waker) = waker {
                    let slot = &mut state.waiters[i].waker;
                    if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
                        *slot = Some(waker.clone());
                    }
                }
                Poll::Pending
            }
            Stage::Done => Poll::Ready(()),
        }
    }

    fn drop_entry(&self, entry: &Entry) {
        let Stage::Waiting(id) = entry.stage else {
            return;
        };
        let waker = {
            let mut state = self.lock();
            let i = state
                .waiters
                .iter()
                .position(|w| w.id == id)
                .expect("an enabled future is listed until it is done");
            let waiter = state.waiters.remove(i);
            match waiter.notified {
                // Not taken: pass it on.
                Some(By::One) => state.notify_one(),
                _ => None,
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// `tokio::sync::Notified`: see the module docs.
#[derive(Debug)]
pub(crate) struct Notified<'a> {
    notify: &'a Notify,
    entry: Entry,
}

impl Notified<'_> {
    #[allow(dead_code)] // tokio's API; the crate enables only owned ones
    pub(crate) fn enable(self: Pin<&mut Self>) -> bool {
        let this = self.get_mut();
        this.notify.poll_entry(&mut this.entry, None).is_ready()
    }
}

impl Future for Notified<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        this.notify.poll_entry(&mut this.entry, Some(cx.waker()))
    }
}

impl Drop for Notified<'_> {
    fn drop(&mut self) {
        self.notify.drop_entry(&self.entry);
    }
}

/// `tokio::sync::futures::OwnedNotified`: see the module docs.
#[derive(Debug)]
pub(crate) struct OwnedNotified {
    notify: Arc<Notify>,
    entry: Entry,
}

impl OwnedNotified {
    pub(crate) fn enable(self: Pin<&mut Self>) -> bool {
        let this = self.get_mut();
        this.notify.poll_entry(&mut this.entry, None).is_ready()
    }
}

impl Future for OwnedNotified {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        this.notify.poll_entry(&mut this.entry, Some(cx.waker()))
    }
}

impl Drop for OwnedNotified {
    fn drop(&mut self) {
        self.notify.drop_entry(&self.entry);
    }
}

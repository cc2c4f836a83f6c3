//! Polling one of the loop's sources only when it has woken the loop since
//! it last answered `Pending`.
//!
//! The loop runs its steps in rounds until none progresses, so without
//! this it would poll each source once more in every round of every poll.
//! Those polls are not free: each poll of lapin's consumer takes the
//! consumer's lock, which lapin's I/O thread takes for every delivery it
//! hands over, and each poll of a cancellation token's future takes the
//! token's lock and its waiters' lock — and they find nothing. A source is
//! polled with a waker of its own instead: when it wakes, the waker raises
//! a flag and wakes the loop's task. A round polls the source only if the
//! flag is up, or if the source has not answered `Pending` yet.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// One source's own waker and what it knows.
pub(super) struct Watched {
    flag: Arc<Flag>,
    waker: Waker,
    /// The source's last answer was `Pending`: nothing new until the flag
    /// goes up.
    caught_up: bool,
}

struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Raised before the task is woken: the poll that follows sees it.
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Watched {
    pub(super) fn new() -> Self {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        Watched {
            waker: Waker::from(flag.clone()),
            flag,
            caught_up: false,
        }
    }

    /// `poll` called with the source's own waker, or `Pending` without
    /// calling it when the source has not woken since its last `Pending`
    /// (the loop's task is woken when it does).
    pub(super) fn poll<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        // Registered before the flag is read: a wake after this read wakes
        // the task.
        self.flag.task.register(cx.waker());
        if !self.flag.woken.swap(false, Ordering::AcqRel) && self.caught_up {
            return Poll::Pending;
        }
        let polled = poll(&mut Context::from_waker(&self.waker));
        self.caught_up = polled.is_pending();
        polled
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;

    use super::*;

    /// A waker that counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_flag_wakes_the_task_registered_last_and_is_taken_once() {
        let watched = Watched::new();
        let first = Arc::new(Count(0.into()));
        let second = Arc::new(Count(0.into()));
        watched.flag.task.register(&Waker::from(first.clone()));
        watched.flag.task.register(&Waker::from(second.clone()));
        watched.waker.wake_by_ref();
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
        assert!(watched.flag.woken.swap(false, Ordering::AcqRel));
        assert!(!watched.flag.woken.swap(false, Ordering::AcqRel));
    }

    #[test]
    fn a_source_is_polled_again_only_after_it_woke() {
        let mut watched = Watched::new();
        let mut cx = Context::from_waker(Waker::noop());
        let notify = tokio::sync::Notify::new();
        let mut notified = pin!(notify.notified());
        let polls = std::cell::Cell::new(0);
        let mut poll = |watched: &mut Watched, cx: &mut Context<'_>| {
            watched.poll(cx, |cx| {
                polls.set(polls.get() + 1);
                notified.as_mut().poll(cx)
            })
        };
        assert!(poll(&mut watched, &mut cx).is_pending());
        assert!(poll(&mut watched, &mut cx).is_pending());
        assert!(poll(&mut watched, &mut cx).is_pending());
        notify.notify_waiters();
        assert!(poll(&mut watched, &mut cx).is_ready());
        assert_eq!(polls.get(), 2, "polled first, then once it woke");
    }
}

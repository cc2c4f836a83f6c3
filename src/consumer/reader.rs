//! Reading lapin's consumer only when it has woken the loop since it last
//! answered `Pending`.
//!
//! The loop runs its steps in rounds until none progresses, so without
//! this it would poll the consumer once more in every round of every poll.
//! Each of those polls takes the consumer's lock, which lapin's I/O thread
//! takes for every delivery it hands over, and finds nothing. The consumer
//! is polled with a waker of its own instead: when lapin wakes it, it
//! raises a flag and wakes the loop's task. A round polls the consumer only
//! if the flag is up, or if the consumer has not answered `Pending` yet.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::Consumer;

/// The consumer's own waker and what it knows.
pub(super) struct Reader {
    flag: Arc<Flag>,
    waker: Waker,
    /// The consumer's last answer was `Pending`: nothing new until the flag
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

impl Reader {
    pub(super) fn new() -> Self {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        Reader {
            waker: Waker::from(flag.clone()),
            flag,
            caught_up: false,
        }
    }

    /// The consumer's next item, or `Pending` (the loop's task is woken
    /// when there is more). Polls the consumer only when it may have
    /// something.
    pub(super) fn poll_next(
        &mut self,
        consumer: &mut Consumer,
        cx: &mut Context<'_>,
    ) -> Poll<Option<lapin::Result<Delivery>>> {
        // Registered before the flag is read: a wake after this read wakes
        // the task.
        self.flag.task.register(cx.waker());
        if !self.flag.woken.swap(false, Ordering::AcqRel) && self.caught_up {
            return Poll::Pending;
        }
        let polled = consumer.poll_next_unpin(&mut Context::from_waker(&self.waker));
        self.caught_up = polled.is_pending();
        polled
    }
}

#[cfg(test)]
mod tests {
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
        let reader = Reader::new();
        let first = Arc::new(Count(0.into()));
        let second = Arc::new(Count(0.into()));
        reader.flag.task.register(&Waker::from(first.clone()));
        reader.flag.task.register(&Waker::from(second.clone()));
        reader.waker.wake_by_ref();
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
        assert!(reader.flag.woken.swap(false, Ordering::AcqRel));
        assert!(!reader.flag.woken.swap(false, Ordering::AcqRel));
    }
}

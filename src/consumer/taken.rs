//! [`TakenBack`]: the messages whose deliveries the broker took back (a
//! lost channel or connection, a consumer the broker cancelled — RabbitMQ
//! 4.3's consumer timeout) while their handlers still ran.
//!
//! Those handlers are cancelled through their tokens, but a handler may
//! take until `abandon_after` to end, and the broker may hand the same
//! message to the queue's next generation meanwhile. So a queue remembers,
//! by strike key (`message_id`, else a digest of headers and body), which
//! messages still run in a generation that no longer owns them, and its
//! consuming generation does not start a delivery of one of them until that
//! handler has ended: no message runs in two handlers of one process at
//! once. The next delivery waits behind it (the buffer keeps its order), at
//! most until the old handler is abandoned.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::task::Context;

use futures::task::AtomicWaker;

use crate::sync::Locked;

/// A queue's messages still running in a generation whose deliveries the
/// broker took back: key → handlers running.
#[derive(Debug, Default)]
pub(crate) struct TakenBack {
    /// Keys held; read without the lock (zero: nothing to look up).
    len: AtomicUsize,
    keys: Mutex<HashMap<u64, usize>>,
    /// The consuming generation's loop, waiting for a key to be released.
    waiter: AtomicWaker,
}

impl TakenBack {
    /// Nothing runs in a generation that lost its deliveries.
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// A handler of message `key` still runs, though its delivery is the
    /// broker's again.
    pub(crate) fn hold(&self, key: u64) {
        let mut keys = self.keys.locked();
        *keys.entry(key).or_insert(0) += 1;
        self.len.store(keys.len(), Ordering::Release);
    }

    /// That handler ended: a waiting delivery of the message may start.
    pub(crate) fn release(&self, key: u64) {
        let mut keys = self.keys.locked();
        if let Some(n) = keys.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                keys.remove(&key);
            }
        }
        self.len.store(keys.len(), Ordering::Release);
        drop(keys);
        self.waiter.wake();
    }

    /// Whether a delivery of message `key` must wait (a handler of it still
    /// runs elsewhere); the task of `cx` is woken at the next release.
    pub(crate) fn waits(&self, key: u64, cx: &Context<'_>) -> bool {
        // Registered before the look: a release after it wakes the task.
        self.waiter.register(cx.waker());
        self.keys.locked().contains_key(&key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_message_waits_while_any_handler_of_it_runs_and_its_release_wakes_the_waiter() {
        let t = TakenBack::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let cx = Context::from_waker(&waker);
        assert!(t.is_empty());
        assert!(!t.waits(7, &cx));
        t.hold(7);
        t.hold(7);
        assert!(!t.is_empty());
        assert!(t.waits(7, &cx));
        assert!(!t.waits(8, &cx), "another message starts at once");
        t.release(7);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken at the release");
        assert!(t.waits(7, &cx), "one handler of it still runs");
        t.release(7);
        assert!(!t.waits(7, &cx) && t.is_empty());
        // A key never held: released harmlessly.
        t.release(9);
        assert!(t.is_empty());
    }
}

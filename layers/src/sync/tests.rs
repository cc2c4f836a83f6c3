//! The rules the loom shims promise, checked on the types the normal build
//! uses (tokio's `Notify`, tokio-util's `CancellationToken`) and, under
//! `--cfg acemq_loom`, on the shims: the same assertions hold for both.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Waker};

use super::{CancellationToken, Notify};

fn ready<F: Future>(f: Pin<&mut F>) -> bool {
    f.poll(&mut Context::from_waker(Waker::noop())).is_ready()
}

#[cfg(not(acemq_loom))]
fn check(rules: fn()) {
    rules();
}

#[cfg(acemq_loom)]
fn check(rules: fn()) {
    loom::model(rules);
}

#[test]
fn notify_one_stores_one_permit_for_the_next_future_enabled() {
    check(|| {
        let notify = Notify::new();
        notify.notify_one();
        notify.notify_one();
        assert!(pin!(notify.notified()).enable(), "the permit");
        assert!(!pin!(notify.notified()).enable(), "only one");
    });
}

#[test]
fn notify_one_wakes_the_first_enabled_future_and_a_dropped_one_passes_it_on() {
    check(|| {
        let notify = Notify::new();
        let mut first = pin!(notify.notified());
        let mut second = Box::pin(notify.notified());
        let mut third = pin!(notify.notified());
        assert!(!first.as_mut().enable() && !second.as_mut().enable());
        assert!(!third.as_mut().enable());
        notify.notify_one();
        assert!(ready(first.as_mut()) && !ready(second.as_mut()));
        notify.notify_one();
        // Notified, then dropped before it was polled: passed on.
        drop(second);
        assert!(ready(third.as_mut()));
        assert!(!pin!(notify.notified()).enable(), "no permit left");
    });
}

#[test]
fn notify_waiters_reaches_every_future_made_before_it_and_stores_no_permit() {
    check(|| {
        let notify = Arc::new(Notify::new());
        let mut enabled = pin!(notify.notified());
        assert!(!enabled.as_mut().enable());
        let mut made = pin!(notify.clone().notified_owned());
        notify.notify_waiters();
        let mut after = pin!(notify.notified());
        assert!(ready(enabled.as_mut()), "enabled before");
        assert!(ready(made.as_mut()), "made before, never polled");
        assert!(!ready(after.as_mut()), "made after: no permit");
    });
}

#[test]
fn a_token_wakes_a_future_made_before_the_cancel_and_reaches_its_children() {
    check(|| {
        let token = CancellationToken::new();
        let child = token.child_token();
        let grandchild = child.child_token();
        let mut cancelled = pin!(token.cancelled());
        let mut owned = pin!(token.clone().cancelled_owned());
        assert!(!ready(cancelled.as_mut()) && !ready(owned.as_mut()));
        grandchild.cancel();
        assert!(!child.is_cancelled(), "a child reaches nothing above it");
        token.cancel();
        assert!(ready(cancelled.as_mut()) && ready(owned.as_mut()));
        assert!(token.is_cancelled() && child.is_cancelled());
        assert!(token.child_token().is_cancelled(), "born cancelled");
    });
}

//! The in-flight counter: the total, the count of `WaitIdle` futures and
//! the `Notify` the last guard wakes them with.

use std::convert::Infallible;
use std::future::Ready;

use loom::future::block_on;
use loom::thread;
use tower::{service_fn, Service};

use super::model;
use crate::{Delivery, InFlight, InFlightCounter};

type Done = fn(Delivery) -> Ready<Result<(), Infallible>>;

fn counted(counter: &InFlightCounter) -> InFlight<tower::util::ServiceFn<Done>> {
    let done: Done = |_| std::future::ready(Ok(()));
    InFlight::new(service_fn(done), counter.clone())
}

// The last delivery ending on a handler thread as the drain starts to wait
// (before, between the waiter's count and its registration, or after):
// `wait_idle` resolves; the notification is not lost.
#[test]
fn the_last_guard_dropping_as_the_drain_starts_to_wait_wakes_it() {
    model(|| {
        let counter = InFlightCounter::new();
        let request = counted(&counter).call(Delivery::builder().queue("q").build());
        let handler = thread::spawn(move || block_on(request).unwrap());
        block_on(counter.wait_idle());
        handler.join().unwrap();
        assert_eq!(counter.total(), 0);
    });
}

// Two deliveries in flight when the drain starts to wait, ending on two
// threads: only the last one wakes it, once both are done.
#[test]
fn two_deliveries_ending_on_two_threads_wake_the_drain_once_both_are_done() {
    model(|| {
        let counter = InFlightCounter::new();
        let mut svc = counted(&counter);
        let requests: Vec<_> = (0..2)
            .map(|_| svc.call(Delivery::builder().queue("q").build()))
            .collect();
        let handlers: Vec<_> = requests
            .into_iter()
            .map(|request| thread::spawn(move || block_on(request).unwrap()))
            .collect();
        block_on(counter.wait_idle());
        assert_eq!(counter.total(), 0);
        for handler in handlers {
            handler.join().unwrap();
        }
    });
}

// Found by this model: a delivery that brought the total to 0 *before* the
// wait began can still wake it, while a delivery started after it is in
// flight, so `wait_idle` resolves though nothing was ever idle during the
// wait (its docs: "resolves when nothing is in flight"). The interleaving:
//
// 1. delivery A is counted (total 0 -> 1) and ends on a handler thread:
//    its guard's `total.fetch_sub` takes the total 1 -> 0, and the thread
//    is preempted before it reads `waiters`;
// 2. delivery B is counted (0 -> 1) and runs on another thread;
// 3. the drain calls `wait_idle`: its `Notified` is made, `waiters` 0 -> 1,
//    its first poll reads the total (1) and waits;
// 4. A's guard resumes, reads `waiters` == 1 and calls `notify_waiters`:
//    the drain's future is woken and resolves without reading the total
//    again (by design: "resolve, even if another delivery has started
//    since"), while B is still in flight.
//
// The window is a few instructions on the handler thread, and acemq's
// binding crate does not call `wait_idle`; the fix is not a one-liner
// (re-reading the total on wake-up could starve a drain under steady
// load; the guard would have to see the waiters atomically with its
// transition to 0, per waiter), so it is reported, not fixed here.
#[test]
#[ignore = "finds a real bug: a guard that reached 0 before the wait began wakes it while a later delivery is in flight (see the comment)"]
fn a_delivery_that_ended_before_the_wait_does_not_wake_it_while_another_runs() {
    model(|| {
        let counter = InFlightCounter::new();
        let mut svc = counted(&counter);
        let first = svc.call(Delivery::builder().queue("q").build());
        let first = thread::spawn(move || block_on(first).unwrap());
        let second = svc.call(Delivery::builder().queue("q").build());
        let second = thread::spawn(move || block_on(second).unwrap());
        block_on(counter.wait_idle());
        // Nothing was idle between the start of the wait and now unless
        // both deliveries have ended.
        assert_eq!(
            counter.total(),
            0,
            "wait_idle resolved with a delivery in flight"
        );
        first.join().unwrap();
        second.join().unwrap();
    });
}

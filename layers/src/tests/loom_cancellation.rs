//! The cancellation view: the watcher that turns the token's cancellation
//! into `fired` and a wake-up of every waiter, the waiters of the
//! cancellation layer, and the `gone` signal that ends the watcher.

use std::pin::pin;

use loom::future::block_on;
use loom::thread;

use super::model;
use crate::lifeline::Cancellation;
use crate::sync::CancellationToken;

// What the cancellation layer does for a handler that waits (its
// `Watch::Signal`): the waiter made first, then `fired` read, then the
// waiter awaited while `fired` is false.
async fn wait_as_the_layer_does(view: &Cancellation) {
    let waiter = view.waiter().expect("the watcher runs on a loom thread");
    let waiter = pin!(waiter);
    if !view.fired() {
        waiter.await;
    }
}

// `cancel()` on one thread, a handler waiting on another (the watcher on a
// third): the handler sees the view cancelled, never stays parked.
#[test]
fn a_handler_sees_a_cancel_made_on_another_thread() {
    model(|| {
        let root = CancellationToken::new();
        let view = Cancellation::new(root.clone());
        let canceller = thread::spawn(move || root.cancel());
        let handler = {
            let view = view.clone();
            thread::spawn(move || {
                block_on(wait_as_the_layer_does(&view));
                assert!(view.fired() && view.is_cancelled());
            })
        };
        canceller.join().unwrap();
        handler.join().unwrap();
    });
}

// Two handlers starting to wait at once: one watcher between them (the
// `watching` flag), and both see the cancellation.
#[test]
fn two_handlers_share_one_watcher_and_both_see_the_cancel() {
    model(|| {
        let root = CancellationToken::new();
        let view = Cancellation::new(root.clone());
        let handlers: Vec<_> = (0..2)
            .map(|_| {
                let view = view.clone();
                thread::spawn(move || block_on(wait_as_the_layer_does(&view)))
            })
            .collect();
        root.cancel();
        for handler in handlers {
            handler.join().unwrap();
        }
        assert!(view.fired());
    });
}

// Every view dropped while the watcher starts, the token never cancelled:
// the watcher still ends (the `gone` permit is kept for it), which loom
// checks (a thread left parked is a deadlock).
#[test]
fn the_watcher_ends_when_every_view_is_gone() {
    model(|| {
        let view = Cancellation::new(CancellationToken::new());
        drop(view.waiter().expect("the watcher runs on a loom thread"));
        drop(view);
    });
}

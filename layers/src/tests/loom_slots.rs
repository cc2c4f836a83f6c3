//! `cancel::Slots`: the slot wakers' bits and the owner's `AtomicWaker`
//! against the loop that pushes and polls.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures::StreamExt;
use loom::future::block_on;
use loom::sync::Mutex;
use loom::thread;

use super::model;
use crate::cancel::Slots;

/// A request that waits until another thread opens it.
struct Gate {
    id: usize,
    state: Arc<Mutex<(bool, Option<Waker>)>>,
}

impl Future for Gate {
    type Output = usize;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
        let mut state = self.state.lock().unwrap();
        if state.0 {
            return Poll::Ready(self.id);
        }
        state.1 = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Opens a [`Gate`] (from another thread).
struct Opener(Arc<Mutex<(bool, Option<Waker>)>>);

impl Opener {
    fn open(&self) {
        let waker = {
            let mut state = self.0.lock().unwrap();
            state.0 = true;
            state.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

fn gate(id: usize, open: bool) -> (Gate, Opener) {
    let state = Arc::new(Mutex::new((open, None)));
    (
        Gate {
            id,
            state: state.clone(),
        },
        Opener(state),
    )
}

// A slot woken from another thread while the loop polls it and pushes
// another request: the loop is woken, the request polled again; no wake-up
// is lost (a lost one leaves the loop parked: loom reports a deadlock).
#[test]
fn a_wake_from_another_thread_racing_a_poll_and_a_push_is_not_lost() {
    model(|| {
        let (a, opener) = gate(1, false);
        let (b, _) = gate(2, true);
        let mut slots = Slots::new();
        slots.push(a);
        let waker = thread::spawn(move || opener.open());
        let mut seen = block_on(async move {
            let mut seen = Vec::new();
            if let Poll::Ready(Some(id)) = futures::poll!(slots.next()) {
                seen.push(id);
            }
            slots.push(b);
            while let Some(id) = slots.next().await {
                seen.push(id);
            }
            seen
        });
        waker.join().unwrap();
        seen.sort_unstable();
        assert_eq!(seen, [1, 2]);
    });
}

// `wake_all` (the loop cancelled the root) racing the request's own
// wake-up and its finishing: it comes out once, and the loop ends.
#[test]
fn wake_all_racing_a_request_that_finishes_yields_it_once() {
    model(|| {
        let (a, opener) = gate(1, false);
        let mut slots = Slots::new();
        slots.push(a);
        let waker = thread::spawn(move || opener.open());
        let seen = block_on(async move {
            let mut seen = Vec::new();
            if let Poll::Ready(Some(id)) = futures::poll!(slots.next()) {
                seen.push(id);
            }
            slots.wake_all();
            while let Some(id) = slots.next().await {
                seen.push(id);
            }
            assert!(slots.is_empty());
            seen
        });
        waker.join().unwrap();
        assert_eq!(seen, [1]);
    });
}

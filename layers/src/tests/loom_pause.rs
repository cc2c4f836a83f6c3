//! The pause gate: its state, the held count and the `Notify` the held
//! requests wait on, against `resume`, `close` and `hand_back_held`.

use std::convert::Infallible;
use std::future::Ready;

use loom::future::block_on;
use loom::thread;
use tower::service_fn;
use tower::Service;

use super::model;
use crate::{Decision, Delivery, Pause, PauseHandle};

type Ack = fn(Delivery) -> Ready<Result<Decision, Infallible>>;

fn gate(handle: &PauseHandle) -> Pause<tower::util::ServiceFn<Ack>> {
    let ack: Ack = |_| std::future::ready(Ok(Decision::Ack));
    Pause::new(service_fn(ack), handle.clone())
}

// A request arriving at a paused gate while another thread resumes it
// (before the call, between the call and the waiter's registration, or
// after): it is let through, never left parked.
#[test]
fn a_resume_racing_a_request_that_registers_lets_it_through() {
    model(|| {
        let handle = PauseHandle::new();
        handle.pause();
        let mut svc = gate(&handle);
        let resumer = {
            let handle = handle.clone();
            thread::spawn(move || assert!(handle.resume()))
        };
        let decision = block_on(svc.call(Delivery::builder().build())).unwrap();
        resumer.join().unwrap();
        assert_eq!((decision, handle.held()), (Decision::Ack, 0));
    });
}

// `close()` racing a request at a paused gate: handed back, whether it
// was held first or arrived at a closed gate; never admitted.
#[test]
fn close_racing_a_held_request_hands_it_back() {
    model(|| {
        let handle = PauseHandle::new();
        handle.pause();
        let mut svc = gate(&handle);
        let closer = {
            let handle = handle.clone();
            thread::spawn(move || assert!(handle.close()))
        };
        let decision = block_on(svc.call(Delivery::builder().build())).unwrap();
        closer.join().unwrap();
        assert_eq!((decision, handle.held()), (Decision::HandBack, 0));
    });
}

// `hand_back_held` racing the registration of a request held before it:
// handed back.
#[test]
fn hand_back_held_racing_a_held_request_hands_it_back() {
    model(|| {
        let handle = PauseHandle::new();
        handle.pause();
        let mut svc = gate(&handle);
        let held = svc.call(Delivery::builder().build());
        let evictor = {
            let handle = handle.clone();
            thread::spawn(move || handle.hand_back_held())
        };
        let decision = block_on(held).unwrap();
        evictor.join().unwrap();
        assert_eq!((decision, handle.held()), (Decision::HandBack, 0));
    });
}

// `resumed()` (what a transport awaits) racing `resume()`: it returns.
#[test]
fn resumed_racing_a_resume_returns() {
    model(|| {
        let handle = PauseHandle::new();
        handle.pause();
        let resumer = {
            let handle = handle.clone();
            thread::spawn(move || assert!(handle.resume()))
        };
        block_on(handle.resumed());
        resumer.join().unwrap();
        assert!(!handle.is_paused());
    });
}

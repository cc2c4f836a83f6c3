//! Random sequences of submit / complete / pause / resume / close over
//! `Pause` + `InFlight`: every request is held, in flight, finished or
//! handed back, and nothing reaches the handler after close.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use acemq_layers::{Decision, Delivery, InFlightCounter, InFlightLayer, PauseHandle, PauseLayer};
use proptest::prelude::*;
use tokio::sync::oneshot;
use tower::{Service, ServiceBuilder};

#[derive(Clone, Debug)]
enum Op {
    Submit,
    /// Completes the `n % running`-th running handler, with success or not.
    Complete(usize, bool),
    Pause,
    Resume,
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Submit),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(n, ok)| Op::Complete(n, ok)),
        2 => Just(Op::Pause),
        2 => Just(Op::Resume),
        1 => Just(Op::Close),
    ]
}

/// The handler's side: how often it was called, and the replies it owes.
#[derive(Default)]
struct Handler {
    calls: usize,
    running: Vec<oneshot::Sender<Result<Decision, String>>>,
}

type Response = Pin<Box<dyn Future<Output = Result<Decision, String>>>>;

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let handler = Arc::new(Mutex::new(Handler::default()));
    let gate = PauseHandle::new();
    let counter = InFlightCounter::new();
    let inner = {
        let handler = handler.clone();
        tower::service_fn(move |_d: Delivery| {
            let (tx, rx) = oneshot::channel();
            let mut h = handler.lock().unwrap();
            h.calls += 1;
            h.running.push(tx);
            async move { rx.await.unwrap_or_else(|_| Err("reply dropped".to_owned())) }
        })
    };
    let mut svc = ServiceBuilder::new()
        .layer(PauseLayer::new(gate.clone()))
        .layer(InFlightLayer::new(counter.clone()))
        .service(inner);

    let mut cx = Context::from_waker(Waker::noop());
    let mut outstanding: Vec<Response> = Vec::new();
    let (mut submitted, mut finished, mut handed_back) = (0usize, 0usize, 0usize);
    let mut calls_at_close: Option<usize> = None;

    for op in ops {
        match op {
            Op::Submit => {
                prop_assert!(svc.poll_ready(&mut cx).is_ready());
                outstanding.push(Box::pin(svc.call(Delivery::builder().queue("q").build())));
                submitted += 1;
            }
            Op::Complete(n, ok) => {
                let mut h = handler.lock().unwrap();
                if !h.running.is_empty() {
                    let i = n % h.running.len();
                    let reply = if ok {
                        Ok(Decision::Ack)
                    } else {
                        Err("failed".to_owned())
                    };
                    let _ = h.running.remove(i).send(reply);
                }
            }
            Op::Pause => {
                gate.pause();
            }
            Op::Resume => {
                gate.resume();
            }
            Op::Close => {
                gate.close();
                calls_at_close.get_or_insert(handler.lock().unwrap().calls);
            }
        }

        // Drive every outstanding request as far as it goes.
        outstanding.retain_mut(|fut| match fut.as_mut().poll(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Ok(Decision::HandBack)) => {
                handed_back += 1;
                false
            }
            Poll::Ready(Ok(Decision::Ack) | Err(_)) => {
                finished += 1;
                false
            }
            Poll::Ready(Ok(other)) => panic!("unexpected decision {other:?}"),
        });

        let held = gate.held();
        let in_flight = counter.total();
        let h = handler.lock().unwrap();
        prop_assert_eq!(held + in_flight + finished + handed_back, submitted);
        prop_assert_eq!(held + in_flight, outstanding.len());
        prop_assert_eq!(in_flight, h.running.len());
        prop_assert_eq!(counter.get("q"), in_flight);
        if !gate.is_paused() {
            prop_assert_eq!(held, 0, "only a paused gate holds");
        }
        if let Some(calls) = calls_at_close {
            prop_assert_eq!(h.calls, calls, "the handler was called after close");
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn every_request_is_held_in_flight_finished_or_handed_back(
        ops in proptest::collection::vec(op(), 0..60)
    ) {
        run(ops)?;
    }
}

#[test]
fn a_fixed_sequence_through_every_state_keeps_the_invariant() {
    run(vec![
        Op::Pause,
        Op::Submit,
        Op::Resume,
        Op::Pause,
        Op::Submit,
        Op::Complete(0, true),
        Op::Close,
        Op::Submit,
    ])
    .unwrap();
}

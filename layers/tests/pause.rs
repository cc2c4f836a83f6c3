//! The pause gate: pause holds in order, resume releases and wakes, close
//! hands back, and the three states stay apart.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use acemq_layers::{Decision, Delivery, Pause, PauseHandle, PauseLayer};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_test::mock;

/// A waker that counts its wakes.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn delivery(tag: u64) -> Delivery {
    Delivery::builder()
        .queue("orders")
        .delivery_tag(tag)
        .build()
}

/// A handler that records the delivery tags it is called with, in order.
fn recording() -> (
    Arc<Mutex<Vec<u64>>>,
    impl Service<Delivery, Response = Decision, Error = std::io::Error, Future: Send> + Clone,
) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let svc = tower::service_fn(move |d: Delivery| {
        seen.lock().unwrap().push(d.delivery_tag());
        async { Ok::<_, std::io::Error>(Decision::Ack) }
    });
    (calls, svc)
}

#[tokio::test(flavor = "current_thread")]
async fn an_open_gate_calls_the_handler_at_once() {
    let gate = PauseHandle::new();
    let (calls, handler) = recording();
    let mut svc = Pause::new(handler, gate.clone());
    let fut = svc.ready().await.unwrap().call(delivery(1));
    assert_eq!(
        *calls.lock().unwrap(),
        [1],
        "called in `call`, before any poll"
    );
    assert_eq!(gate.held(), 0);
    assert_eq!(fut.await.unwrap(), Decision::Ack);
}

#[tokio::test(flavor = "current_thread")]
async fn a_paused_gate_holds_requests_and_releases_them_in_arrival_order() {
    let gate = PauseHandle::new();
    let (calls, handler) = recording();
    let mut svc = ServiceBuilder::new()
        .layer(PauseLayer::new(gate.clone()))
        .service(handler);

    assert!(gate.pause());
    assert!(gate.is_paused());
    assert!(!gate.is_closed());
    let mut tasks = Vec::new();
    for tag in 1..=5 {
        let fut = svc.ready().await.unwrap().call(delivery(tag));
        tasks.push(tokio::spawn(fut));
    }
    tokio::task::yield_now().await;
    assert_eq!(gate.held(), 5);
    assert!(
        calls.lock().unwrap().is_empty(),
        "a held request reaches nothing"
    );
    assert!(tasks.iter().all(|t| !t.is_finished()));

    assert!(gate.resume());
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), Decision::Ack);
    }
    assert_eq!(*calls.lock().unwrap(), [1, 2, 3, 4, 5]);
    assert_eq!(gate.held(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn resume_wakes_every_waiting_task() {
    let gate = PauseHandle::new();
    let (calls, handler) = recording();
    let mut svc = Pause::new(handler, gate.clone());
    gate.pause();

    let mut held = Vec::new();
    for tag in 1..=3 {
        let fut = Box::pin(svc.ready().await.unwrap().call(delivery(tag)));
        held.push((fut, Arc::new(CountingWaker::default())));
    }
    for (fut, wakes) in &mut held {
        let waker = Waker::from(wakes.clone());
        let polled = fut.as_mut().poll(&mut Context::from_waker(&waker));
        assert!(polled.is_pending());
    }
    assert_eq!(gate.held(), 3);
    assert!(held.iter().all(|(_, w)| w.0.load(Ordering::SeqCst) == 0));

    gate.resume();
    assert!(
        held.iter().all(|(_, w)| w.0.load(Ordering::SeqCst) == 1),
        "every held request is woken, once"
    );
    for (fut, wakes) in &mut held {
        let waker = Waker::from(wakes.clone());
        let polled = fut.as_mut().poll(&mut Context::from_waker(&waker));
        assert!(matches!(polled, Poll::Ready(Ok(Decision::Ack))));
    }
    assert_eq!(*calls.lock().unwrap(), [1, 2, 3]);
    assert_eq!(gate.held(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn close_hands_back_every_held_request_and_every_later_one() {
    let gate = PauseHandle::new();
    let (calls, handler) = recording();
    let mut svc = Pause::new(handler, gate.clone());
    gate.pause();

    let held: Vec<_> = {
        let mut v = Vec::new();
        for tag in 1..=3 {
            v.push(tokio::spawn(svc.ready().await.unwrap().call(delivery(tag))));
        }
        v
    };
    tokio::task::yield_now().await;
    assert_eq!(gate.held(), 3);

    assert!(gate.close());
    assert!(gate.is_closed());
    assert!(!gate.is_paused());
    for task in held {
        assert_eq!(task.await.unwrap().unwrap(), Decision::HandBack);
    }
    assert_eq!(gate.held(), 0);

    for tag in 4..=6 {
        let later = svc.ready().await.unwrap().call(delivery(tag)).await;
        assert_eq!(later.unwrap(), Decision::HandBack);
    }
    assert!(
        calls.lock().unwrap().is_empty(),
        "nothing reaches the handler after close"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn close_is_final_and_wins_over_pause_and_resume() {
    let gate = PauseHandle::new();
    assert!(gate.close());
    assert!(!gate.close(), "a second close changes nothing");
    assert!(!gate.pause());
    assert!(!gate.is_paused());
    assert!(!gate.resume());
    assert!(gate.is_closed());

    let (calls, handler) = recording();
    let mut svc = Pause::new(handler, gate.clone());
    let decision = svc.ready().await.unwrap().call(delivery(1)).await.unwrap();
    assert_eq!(decision, Decision::HandBack);
    assert!(calls.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn a_paused_gate_is_not_closed_and_resume_reopens_it() {
    let gate = PauseHandle::new();
    assert!(!gate.resume(), "an open gate has nothing to resume");
    assert!(gate.pause());
    assert!(!gate.pause(), "already paused");
    assert!(gate.is_paused() && !gate.is_closed());
    assert!(gate.resume());
    assert!(!gate.is_paused() && !gate.is_closed());
}

#[tokio::test(flavor = "current_thread")]
async fn dropping_a_held_request_uncounts_it_without_calling_the_handler() {
    let gate = PauseHandle::new();
    let (calls, handler) = recording();
    let mut svc = Pause::new(handler, gate.clone());
    gate.pause();
    let mut fut = Box::pin(svc.ready().await.unwrap().call(delivery(1)));
    assert!(futures::poll!(fut.as_mut()).is_pending());
    assert_eq!(gate.held(), 1);
    drop(fut);
    assert_eq!(gate.held(), 0);
    gate.resume();
    assert!(calls.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn poll_ready_is_the_inner_services_and_wakes_with_it() {
    let gate = PauseHandle::new();
    let (mut svc, mut handle) =
        mock::spawn_layer::<Delivery, Decision, _>(PauseLayer::new(gate.clone()));

    handle.allow(0);
    assert!(svc.poll_ready().is_pending());
    handle.allow(1);
    assert!(svc.is_woken(), "the inner service registered the waker");
    assert!(svc.poll_ready().is_ready());

    // A held request keeps the readiness it was given: resume calls the
    // inner service with no second `poll_ready`.
    gate.pause();
    let fut = svc.call(delivery(7));
    let task = tokio::spawn(fut);
    tokio::task::yield_now().await;
    assert_eq!(gate.held(), 1);
    gate.resume();
    let (req, respond) = handle.next_request().await.unwrap();
    assert_eq!(req.delivery_tag(), 7);
    respond.send_response(Decision::Ack);
    assert_eq!(task.await.unwrap().unwrap(), Decision::Ack);
}

#[tokio::test(flavor = "current_thread")]
async fn a_pause_and_resume_before_the_first_poll_lets_the_request_through() {
    let gate = PauseHandle::new();
    let (calls, handler) = recording();
    let mut svc = Pause::new(handler, gate.clone());
    gate.pause();
    let fut = svc.ready().await.unwrap().call(delivery(1));
    gate.resume();
    assert_eq!(fut.await.unwrap(), Decision::Ack);
    assert_eq!(*calls.lock().unwrap(), [1]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn hand_back_held_returns_what_is_held_and_holds_later_requests_again() {
    let gate = PauseHandle::new();
    let (calls, svc) = recording();
    let svc = ServiceBuilder::new()
        .layer(PauseLayer::new(gate.clone()))
        .service(svc);
    assert!(gate.pause());
    let first = tokio::spawn(svc.clone().oneshot(delivery(1)));
    let second = tokio::spawn(svc.clone().oneshot(delivery(2)));
    tokio::task::yield_now().await;
    assert_eq!(gate.held(), 2);

    gate.hand_back_held();
    assert_eq!(first.await.unwrap().unwrap(), Decision::HandBack);
    assert_eq!(second.await.unwrap().unwrap(), Decision::HandBack);
    assert!(gate.is_paused(), "still paused");
    assert_eq!(gate.held(), 0);

    let third = tokio::spawn(svc.clone().oneshot(delivery(3)));
    tokio::task::yield_now().await;
    assert_eq!(gate.held(), 1, "a later request is held again");
    gate.resume();
    assert_eq!(third.await.unwrap().unwrap(), Decision::Ack);
    assert_eq!(
        *calls.lock().unwrap(),
        vec![3],
        "only the later one reached the handler"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn paused_for_resolves_only_after_an_unbroken_pause_of_the_bound() {
    use std::time::Duration;
    let gate = PauseHandle::new();
    let g = gate.clone();
    let watch = tokio::spawn(async move { g.paused_for(Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!watch.is_finished(), "open: never");
    gate.pause();
    tokio::time::sleep(Duration::from_secs(6)).await;
    gate.resume();
    gate.pause();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        !watch.is_finished(),
        "a resume in between starts the bound over"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(watch.is_finished(), "10 s unbroken: resolved");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_held_request_says_when_it_was_released_and_one_called_at_once_does_not() {
    let gate = PauseHandle::new();
    let (_calls, handler) = recording();
    let mut svc = Pause::new(handler, gate.clone());
    let mut at_once = Box::pin(svc.ready().await.unwrap().call(delivery(1)));
    assert_eq!(at_once.released_at(), None);
    assert_eq!(at_once.as_mut().await.unwrap(), Decision::Ack);
    assert_eq!(at_once.released_at(), None, "never held, never stamped");

    gate.pause();
    let held_since = tokio::time::Instant::now();
    let mut held = Box::pin(svc.ready().await.unwrap().call(delivery(2)));
    let waker = Waker::from(Arc::new(CountingWaker::default()));
    assert!(held
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    assert_eq!(held.released_at(), None, "still held");
    tokio::time::advance(std::time::Duration::from_secs(5)).await;
    gate.resume();
    assert_eq!(held.as_mut().await.unwrap(), Decision::Ack);
    let released = held.released_at().expect("released by the resume");
    assert_eq!(released - held_since, std::time::Duration::from_secs(5));
}

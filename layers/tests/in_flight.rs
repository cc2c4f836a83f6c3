//! The in-flight layer: counts fall on every way a request can end, per
//! queue, and `wait_idle` resolves exactly when the last one ends.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use acemq_layers::{Delivery, InFlight, InFlightCounter, InFlightLayer};
use futures::FutureExt;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_test::mock;

/// A waker that counts its wakes.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl CountingWaker {
    fn wakes(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn delivery(queue: &str) -> Delivery {
    Delivery::builder().queue(queue).build()
}

#[tokio::test(flavor = "current_thread")]
async fn the_count_rises_in_the_handler_and_falls_when_it_succeeds() {
    let counter = InFlightCounter::new();
    let (svc, mut handle) = mock::pair::<Delivery, ()>();
    let mut svc = InFlight::new(svc, counter.clone());

    let fut = svc.ready().await.unwrap().call(delivery("orders"));
    assert_eq!(counter.total(), 1);
    assert_eq!(counter.get("orders"), 1);

    let (_req, respond) = handle.next_request().await.unwrap();
    respond.send_response(());
    fut.await.unwrap();
    assert_eq!(counter.total(), 0);
    assert_eq!(counter.get("orders"), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn the_count_falls_when_the_handler_fails_and_the_error_passes_through() {
    let counter = InFlightCounter::new();
    let (svc, mut handle) = mock::pair::<Delivery, ()>();
    let mut svc = InFlight::new(svc, counter.clone());

    let fut = svc.ready().await.unwrap().call(delivery("orders"));
    assert_eq!(counter.total(), 1);
    let (_req, respond) = handle.next_request().await.unwrap();
    respond.send_error(std::io::Error::other("db down"));
    let err = fut.await.unwrap_err();
    assert_eq!(err.to_string(), "db down");
    assert_eq!(counter.total(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn the_count_falls_when_the_handler_panics() {
    let counter = InFlightCounter::new();
    let seen = counter.clone();
    let mut svc = ServiceBuilder::new()
        .layer(InFlightLayer::new(counter.clone()))
        .service_fn(move |_d: Delivery| {
            let seen = seen.clone();
            async move {
                assert_eq!(seen.total(), 1);
                panic!("handler bug");
                #[allow(unreachable_code)]
                Ok::<(), std::io::Error>(())
            }
        });

    let fut = svc.ready().await.unwrap().call(delivery("orders"));
    let caught = AssertUnwindSafe(fut).catch_unwind().await;
    assert!(caught.is_err());
    assert_eq!(counter.total(), 0);
    assert_eq!(counter.get("orders"), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn the_count_falls_when_a_panicking_handler_runs_in_a_spawned_task() {
    let counter = InFlightCounter::new();
    let mut svc = ServiceBuilder::new()
        .layer(InFlightLayer::new(counter.clone()))
        .service_fn(|_d: Delivery| async move {
            panic!("handler bug");
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        });

    let fut = svc.ready().await.unwrap().call(delivery("orders"));
    assert_eq!(counter.total(), 1);
    let joined = tokio::spawn(fut).await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(counter.total(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn the_count_falls_when_the_response_future_is_dropped_unfinished() {
    let counter = InFlightCounter::new();
    let (svc, mut handle) = mock::pair::<Delivery, ()>();
    let mut svc = InFlight::new(svc, counter.clone());

    let polled = svc.ready().await.unwrap().call(delivery("orders"));
    let never_polled = svc.ready().await.unwrap().call(delivery("orders"));
    assert_eq!(counter.total(), 2);

    let mut polled = Box::pin(polled);
    assert!(futures::poll!(polled.as_mut()).is_pending());
    drop(polled);
    assert_eq!(counter.total(), 1);
    drop(never_polled);
    assert_eq!(counter.total(), 0);
    // The mock saw both requests; nobody answers them.
    assert!(handle.next_request().await.is_some());
}

#[tokio::test(flavor = "current_thread")]
async fn wait_idle_resolves_when_the_last_request_ends_and_not_before() {
    let counter = InFlightCounter::new();
    let (svc, mut handle) = mock::pair::<Delivery, ()>();
    let mut svc = InFlight::new(svc, counter.clone());

    let mut first = pin!(svc.ready().await.unwrap().call(delivery("orders")));
    let mut second = pin!(svc.ready().await.unwrap().call(delivery("emails")));
    let (_, respond_first) = handle.next_request().await.unwrap();
    let (_, respond_second) = handle.next_request().await.unwrap();

    let waker_state = Arc::new(CountingWaker::default());
    let waker = Waker::from(waker_state.clone());
    let mut cx = Context::from_waker(&waker);
    let mut idle = pin!(counter.wait_idle());
    assert!(idle.as_mut().poll(&mut cx).is_pending());

    respond_first.send_response(());
    first.as_mut().await.unwrap();
    assert_eq!(counter.total(), 1);
    assert_eq!(waker_state.wakes(), 0, "woken while one is still in flight");
    assert!(idle.as_mut().poll(&mut cx).is_pending());

    respond_second.send_response(());
    second.as_mut().await.unwrap();
    assert_eq!(counter.total(), 0);
    assert_eq!(waker_state.wakes(), 1, "the last guard wakes the waiter");
    assert_eq!(idle.as_mut().poll(&mut cx), Poll::Ready(()));
}

#[tokio::test(flavor = "current_thread")]
async fn wait_idle_resolves_at_once_when_nothing_is_in_flight() {
    let counter = InFlightCounter::new();
    counter.wait_idle().await;
    let clone = counter.clone();
    assert_eq!(clone.total(), 0);
    clone.wait_idle().await;
}

#[tokio::test(flavor = "current_thread")]
async fn every_waiter_of_wait_idle_is_woken() {
    let counter = InFlightCounter::new();
    let (svc, mut handle) = mock::pair::<Delivery, ()>();
    let mut svc = InFlight::new(svc, counter.clone());
    let fut = svc.ready().await.unwrap().call(delivery("orders"));

    let waiters: Vec<_> = (0..3).map(|_| tokio::spawn(counter.wait_idle())).collect();
    tokio::task::yield_now().await;
    assert!(waiters.iter().all(|w| !w.is_finished()));

    let (_, respond) = handle.next_request().await.unwrap();
    respond.send_response(());
    fut.await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_snapshot_counts_each_queue_and_keeps_queues_at_zero() {
    let counter = InFlightCounter::new();
    let (svc, mut handle) = mock::pair::<Delivery, ()>();
    let mut svc = InFlight::new(svc, counter.clone());
    assert!(counter.snapshot().is_empty());

    // Alternate queues on one service, so its cached slot is replaced.
    let a = svc.ready().await.unwrap().call(delivery("orders"));
    let b = svc.ready().await.unwrap().call(delivery("emails"));
    let c = svc.ready().await.unwrap().call(delivery("orders"));
    let snapshot = counter.snapshot();
    assert_eq!(snapshot.len(), 2);
    assert_eq!(snapshot["orders"], 2);
    assert_eq!(snapshot["emails"], 1);
    assert_eq!(counter.get("orders"), 2);
    assert_eq!(counter.get("emails"), 1);
    assert_eq!(counter.get("never-seen"), 0);
    assert_eq!(counter.total(), 3);
    assert_eq!(
        counter.queues(),
        vec!["emails".to_owned(), "orders".to_owned()]
    );

    for _ in 0..3 {
        let (_, respond) = handle.next_request().await.unwrap();
        respond.send_response(());
    }
    a.await.unwrap();
    assert_eq!(counter.get("orders"), 1);
    b.await.unwrap();
    c.await.unwrap();
    let snapshot = counter.snapshot();
    assert_eq!(snapshot["orders"], 0);
    assert_eq!(snapshot["emails"], 0);
    assert_eq!(counter.total(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn services_layered_from_one_counter_share_the_counts() {
    let counter = InFlightCounter::new();
    let layer = InFlightLayer::new(counter.clone());
    let handler = |_d: Delivery| async { Ok::<_, std::io::Error>(()) };
    let mut one = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(handler));
    let mut two = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(handler));

    let a = one.ready().await.unwrap().call(delivery("orders"));
    let b = two
        .ready()
        .await
        .unwrap()
        .call(delivery(&String::from("orders")));
    assert_eq!(counter.get("orders"), 2);
    assert_eq!(counter.snapshot().len(), 1);
    a.await.unwrap();
    b.await.unwrap();
    assert_eq!(counter.total(), 0);
}

//! The cancellation layer: child tokens, hand-back on a cancelled handler,
//! abandonment after the grace period, caught panics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_layers::{
    BoxError, Cancel, CancelLayer, Class, Classify, Decision, DefaultClassifier, Delivery,
    HandlerPanic,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder, ServiceExt};

fn delivery() -> Delivery {
    Delivery::builder().queue("orders").build()
}

/// A handler that waits for its token, then stops with an error.
async fn listening(d: Delivery) -> Result<(), std::io::Error> {
    d.token().cancelled().await;
    Err(std::io::Error::other("stopped"))
}

/// Sets its flag when dropped: shows a handler's future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_that_succeeds_is_acked() {
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(CancellationToken::new()))
        .service_fn(|_d: Delivery| async { Ok::<_, std::io::Error>(()) });
    assert_eq!(svc.oneshot(delivery()).await.unwrap(), Decision::Ack);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_error_without_cancellation_is_an_error() {
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(CancellationToken::new()))
        .service_fn(|_d: Delivery| async { Err::<(), _>(std::io::Error::other("db down")) });
    let err = svc.oneshot(delivery()).await.unwrap_err();
    assert_eq!(err.to_string(), "db down");
    assert_eq!(DefaultClassifier.classify(&*err), Class::Transient);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_delivery_sees_the_roots_cancellation_as_a_view_it_cannot_cancel() {
    let root = CancellationToken::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut svc = Cancel::new(
        tower::service_fn(move |d: Delivery| {
            tx.send(d.token().clone()).unwrap();
            async { Ok::<_, std::io::Error>(()) }
        }),
        root.clone(),
    );
    let given = CancellationToken::new();
    let d = Delivery::builder().token(given.clone()).build();
    svc.ready().await.unwrap().call(d).await.unwrap();
    svc.ready().await.unwrap().call(delivery()).await.unwrap();
    let (first, second) = (rx.recv().unwrap(), rx.recv().unwrap());

    // A token of the handler's own reaches nothing above it nor beside it.
    first.child_token().cancel();
    assert!(!root.is_cancelled());
    assert!(!first.is_cancelled());
    assert!(!second.is_cancelled());
    // The builder's token was replaced by the layer's.
    given.cancel();
    assert!(!first.is_cancelled(), "the builder's token was replaced");
    // Cancelling the root reaches every delivery.
    root.cancel();
    assert!(first.is_cancelled() && second.is_cancelled());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn cancelling_the_root_reaches_every_running_handler() {
    let root = CancellationToken::new();
    let mut svc = ServiceBuilder::new()
        .layer(CancelLayer::new(root.clone()))
        .service_fn(listening);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        tasks.push(tokio::spawn(svc.ready().await.unwrap().call(delivery())));
    }
    tokio::task::yield_now().await;
    assert!(tasks.iter().all(|t| !t.is_finished()));

    let start = Instant::now();
    root.cancel();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), Decision::HandBack);
    }
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "listening handlers end at once"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handlers_own_child_token_stops_only_its_own_work() {
    let root = CancellationToken::new();
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let seen = tokens.clone();
    let mut svc = ServiceBuilder::new()
        .layer(CancelLayer::new(root.clone()))
        .service_fn(move |d: Delivery| {
            let mine = d.token().child_token();
            seen.lock().unwrap().push(mine.clone());
            async move {
                mine.cancelled().await;
                Err::<(), _>(std::io::Error::other("stopped by itself"))
            }
        });
    let first = tokio::spawn(svc.ready().await.unwrap().call(delivery()));
    let second = tokio::spawn(svc.ready().await.unwrap().call(delivery()));
    tokio::task::yield_now().await;

    let first_token = tokens.lock().unwrap()[0].clone();
    first_token.cancel();
    // Its own cancellation is a failure of its own, not the drain's.
    assert!(first.await.unwrap().is_err());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!second.is_finished(), "the other handler runs on");
    assert!(!root.is_cancelled());

    root.cancel();
    assert_eq!(second.await.unwrap().unwrap(), Decision::HandBack);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_that_ignores_its_token_is_abandoned_at_abandon_after_and_not_before() {
    let root = CancellationToken::new();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let mut svc = ServiceBuilder::new()
        .layer(CancelLayer::new(root.clone()).abandon_after(Duration::from_secs(2)))
        .service_fn(move |_d: Delivery| {
            let flag = DropFlag(flag.clone());
            async move {
                let _flag = flag;
                // Ignores its token.
                std::future::pending::<Result<(), std::io::Error>>().await
            }
        });
    let mut fut = std::pin::pin!(svc.ready().await.unwrap().call(delivery()));
    assert!(futures::poll!(fut.as_mut()).is_pending());

    // Without cancellation, no grace period runs.
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(futures::poll!(fut.as_mut()).is_pending());

    root.cancel();
    assert!(futures::poll!(fut.as_mut()).is_pending());
    tokio::time::advance(Duration::from_millis(1999)).await;
    assert!(futures::poll!(fut.as_mut()).is_pending(), "abandoned early");
    assert!(!dropped.load(Ordering::SeqCst));

    tokio::time::advance(Duration::from_millis(1)).await;
    let decision = futures::poll!(fut.as_mut());
    assert!(matches!(
        decision,
        std::task::Poll::Ready(Ok(Decision::Abandoned))
    ));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler's future is dropped"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn abandonment_waits_the_default_five_seconds() {
    assert_eq!(CancelLayer::DEFAULT_ABANDON_AFTER, Duration::from_secs(5));
    let root = CancellationToken::new();
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(root.clone()))
        .service_fn(|_d: Delivery| std::future::pending::<Result<(), std::io::Error>>());
    let task = tokio::spawn(svc.oneshot(delivery()));
    tokio::task::yield_now().await;

    let start = Instant::now();
    root.cancel();
    assert_eq!(task.await.unwrap().unwrap(), Decision::Abandoned);
    assert_eq!(start.elapsed(), CancelLayer::DEFAULT_ABANDON_AFTER);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_that_listens_ends_early_with_hand_back() {
    let root = CancellationToken::new();
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(root.clone()))
        .service_fn(|d: Delivery| async move {
            tokio::select! {
                _ = d.token().cancelled() => Err(std::io::Error::other("cancelled")),
                _ = tokio::time::sleep(Duration::from_secs(60)) => Ok(()),
            }
        });
    let task = tokio::spawn(svc.oneshot(delivery()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start = Instant::now();
    root.cancel();
    assert_eq!(task.await.unwrap().unwrap(), Decision::HandBack);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_that_finishes_its_work_after_cancellation_is_still_acked() {
    let root = CancellationToken::new();
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(root.clone()))
        .service_fn(|_d: Delivery| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, std::io::Error>(())
        });
    let task = tokio::spawn(svc.oneshot(delivery()));
    tokio::task::yield_now().await;
    root.cancel();
    assert_eq!(task.await.unwrap().unwrap(), Decision::Ack);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_panic_in_the_handler_future_is_an_error_classified_as_panic() {
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(CancellationToken::new()))
        .service_fn(|_d: Delivery| async {
            tokio::task::yield_now().await;
            panic!("boom in the handler");
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        });
    let err: BoxError = svc.oneshot(delivery()).await.unwrap_err();
    assert_eq!(DefaultClassifier.classify(&*err), Class::Panic);
    let panic = err.downcast_ref::<HandlerPanic>().unwrap();
    assert_eq!(panic.message(), "boom in the handler");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_panic_in_the_handlers_call_is_an_error_classified_as_panic() {
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(CancellationToken::new()))
        .service_fn(|d: Delivery| {
            if d.queue() == "orders" {
                panic!("boom before the future: {}", d.queue());
            }
            async { Ok::<(), std::io::Error>(()) }
        });
    let err = svc.oneshot(delivery()).await.unwrap_err();
    assert_eq!(DefaultClassifier.classify(&*err), Class::Panic);
    assert_eq!(
        err.to_string(),
        "handler panicked: boom before the future: orders"
    );
}

/// A handler that never finishes and ignores its token.
fn ignoring(_d: Delivery) -> std::future::Pending<Result<(), std::io::Error>> {
    std::future::pending()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_handlers_that_ignore_their_token_on_two_threads_are_all_abandoned_after_the_cancel(
) {
    let root = CancellationToken::new();
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(root.clone()).abandon_after(Duration::from_millis(200)))
        .service_fn(ignoring);
    let tasks: Vec<_> = (0..100)
        .map(|_| tokio::spawn(svc.clone().oneshot(delivery())))
        .collect();
    // Every one of them is waiting (none can finish on its own).
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(tasks.iter().all(|t| !t.is_finished()));

    let cancelled_at = std::time::Instant::now();
    root.cancel();
    for t in tasks {
        let decision = tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("abandoned within 10 s of the cancel")
            .unwrap()
            .unwrap();
        assert_eq!(decision, Decision::Abandoned);
    }
    assert!(
        cancelled_at.elapsed() >= Duration::from_millis(200),
        "not before abandon_after: {:?}",
        cancelled_at.elapsed()
    );
}

#[test]
fn a_layer_moved_to_a_new_runtime_still_abandons_once_its_first_runtime_is_gone() {
    let root = CancellationToken::new();
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(root.clone()).abandon_after(Duration::from_millis(100)))
        .service_fn(ignoring);
    let rt = |paused: bool| {
        let mut b = tokio::runtime::Builder::new_current_thread();
        b.enable_all();
        if paused {
            b.start_paused(true);
        }
        b.build().unwrap()
    };
    // A first runtime: a handler waits (the layer's watcher starts there),
    // then the runtime is dropped with it.
    let first = rt(false);
    let s = svc.clone();
    first.block_on(async move {
        let waiting = tokio::spawn(s.oneshot(delivery()));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
    });
    drop(first);

    // In a second runtime, the cancel still reaches a waiting handler.
    rt(true).block_on(async move {
        let task = tokio::spawn(svc.oneshot(delivery()));
        tokio::task::yield_now().await;
        let start = Instant::now();
        root.cancel();
        let decision = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("abandoned within a minute of the cancel (on tokio's paused clock)");
        assert_eq!(decision.unwrap().unwrap(), Decision::Abandoned);
        assert_eq!(start.elapsed(), Duration::from_millis(100));
    });
}

#[tokio::test(flavor = "current_thread")]
async fn the_layers_watcher_task_ends_once_the_layer_and_its_requests_are_gone() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let root = CancellationToken::new();
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(root.clone()))
        .service_fn(ignoring);
    {
        let mut fut = std::pin::pin!(svc.clone().oneshot(delivery()));
        assert!(futures::poll!(fut.as_mut()).is_pending());
        tokio::task::yield_now().await;
        assert_eq!(metrics.num_alive_tasks(), 1, "the watcher runs");
    }
    drop(svc);
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while metrics.num_alive_tasks() > 0 {
        assert!(
            std::time::Instant::now() < end,
            "the watcher still runs 5 s after the layer went"
        );
        tokio::task::yield_now().await;
    }
    assert!(!root.is_cancelled());
}

#[test]
fn outside_a_tokio_runtime_a_listening_handler_is_handed_back_on_cancel() {
    let root = CancellationToken::new();
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(root.clone()))
        .service_fn(listening);
    let canceller = {
        let root = root.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            root.cancel();
        })
    };
    let decision = futures::executor::block_on(svc.oneshot(delivery())).unwrap();
    canceller.join().unwrap();
    assert_eq!(decision, Decision::HandBack);
}

/// A root token and a cancellation layer woken by its transport (2 s of
/// grace) around a handler that ignores its token.
macro_rules! woken_by_transport_around_ignoring {
    () => {{
        let root = CancellationToken::new();
        let svc = ServiceBuilder::new()
            .layer(
                CancelLayer::new(root.clone())
                    .abandon_after(Duration::from_secs(2))
                    .woken_by_transport(),
            )
            .service_fn(ignoring);
        (root, svc)
    }};
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn woken_by_its_transport_a_handler_that_ignores_its_token_is_abandoned_after_the_grace() {
    use acemq_layers::cancel::Wakeable;
    use futures::stream::{FuturesUnordered, StreamExt};
    let (root, mut svc) = woken_by_transport_around_ignoring!();
    // A transport: each request wrapped, all polled through one set (which
    // polls a request only when it was woken).
    let mut running = FuturesUnordered::new();
    running.push(Wakeable::new(svc.ready().await.unwrap().call(delivery())));
    assert!(futures::poll!(running.next()).is_pending());

    // The root is cancelled, but nothing wakes the request: its layer
    // registered no waiter, so no grace period starts.
    root.cancel();
    tokio::time::advance(Duration::from_secs(3)).await;
    assert!(futures::poll!(running.next()).is_pending());

    // The transport wakes what runs; a request it starts after that is
    // wrapped to wake itself.
    let start = Instant::now();
    for r in std::pin::Pin::new(&mut running).iter_pin_mut() {
        r.wake();
    }
    running.push(Wakeable::after_cancel(
        svc.ready().await.unwrap().call(delivery()),
    ));
    let decisions: Vec<_> = tokio::time::timeout(Duration::from_secs(60), running.collect())
        .await
        .expect("both abandoned within a minute of the wake (tokio's paused clock)");
    assert_eq!(decisions.len(), 2);
    for d in decisions {
        assert_eq!(d.unwrap(), Decision::Abandoned);
    }
    assert_eq!(start.elapsed(), Duration::from_secs(2));
}

// Started before the cancel but first polled after the transport woke
// everything: the layer's first poll does not ask the token, so the wake
// must reach it after that poll.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn woken_by_its_transport_a_request_first_polled_after_the_wake_is_still_abandoned() {
    use acemq_layers::cancel::Wakeable;
    use futures::stream::{FuturesUnordered, StreamExt};
    let (root, mut svc) = woken_by_transport_around_ignoring!();
    let mut running = FuturesUnordered::new();
    running.push(Wakeable::new(svc.ready().await.unwrap().call(delivery())));
    root.cancel();
    for r in std::pin::Pin::new(&mut running).iter_pin_mut() {
        r.wake();
    }
    let decision = tokio::time::timeout(Duration::from_secs(60), running.next())
        .await
        .expect("abandoned within a minute (tokio's paused clock)");
    assert_eq!(decision.unwrap().unwrap(), Decision::Abandoned);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn woken_by_its_transport_the_layer_registers_nothing_and_a_listening_handler_is_handed_back()
{
    use acemq_layers::cancel::Wakeable;
    let root = CancellationToken::new();
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new(root.clone()).woken_by_transport())
        .service_fn(listening);
    let task = tokio::spawn(Wakeable::new(svc.oneshot(delivery())));
    tokio::task::yield_now().await;
    let metrics = tokio::runtime::Handle::current().metrics();
    assert_eq!(
        metrics.num_alive_tasks(),
        1,
        "no watcher task: the layer registers nothing of its own"
    );
    root.cancel();
    assert_eq!(task.await.unwrap().unwrap(), Decision::HandBack);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_delivery_finds_its_token_on_its_lifeline_when_the_layer_was_given_that_view() {
    use acemq_layers::{Cancellation, Lifeline};
    let root = CancellationToken::new();
    let generation = Lifeline::with_cancellation(Cancellation::new(root.clone()));
    let view = generation.cancellation().expect("made with one").clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut svc = ServiceBuilder::new()
        .layer(CancelLayer::from_cancellation(view))
        .service_fn(move |d: Delivery| {
            tx.send(d.token().clone()).unwrap();
            listening(d)
        });

    // Outside the layer, before it runs, the delivery already sees the
    // generation's token through its lifeline.
    let d = Delivery::builder().lifeline(generation.clone()).build();
    assert!(!d.token().is_cancelled());
    // One of another generation, and one with a builder's token of its own:
    // the layer hands both its view.
    let other = Delivery::builder().build();
    let given = CancellationToken::new();
    let own = Delivery::builder()
        .lifeline(generation.clone())
        .token(given.clone())
        .build();

    let mut tasks = Vec::new();
    for d in [d, other, own] {
        tasks.push(tokio::spawn(svc.ready().await.unwrap().call(d)));
    }
    tokio::task::yield_now().await;
    let seen: Vec<Cancellation> = rx.try_iter().collect();
    assert_eq!(seen.len(), 3);
    given.cancel();
    assert!(
        seen.iter().all(|t| !t.is_cancelled()),
        "the builder's token was replaced by the layer's"
    );
    assert!(tasks.iter().all(|t| !t.is_finished()));

    root.cancel();
    assert!(seen.iter().all(|t| t.is_cancelled()));
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), Decision::HandBack);
    }
}

#[test]
fn a_lifeline_made_without_a_cancellation_leaves_the_token_one_that_never_fires() {
    use acemq_layers::Lifeline;
    let d = Delivery::builder().lifeline(Lifeline::new()).build();
    assert!(Lifeline::new().cancellation().is_none());
    assert!(!d.token().is_cancelled());
}

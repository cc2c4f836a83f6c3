//! The batch layer in memory, under tokio's paused clock: a full batch runs
//! at once, a partial one after `max_wait`, each member keeps its outcome,
//! a retry is a batch of one, a member handed back while held leaves its
//! batch, and `concurrency` counts batches running at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

use super::{Batch, BatchHandler, BatchLayer, Batcher};
use crate::{
    BoxError, CancelLayer, ClaimLayer, Decision, Delivery, InFlightCounter, Lifeline, Reject,
    Verdict,
};

type Calls = Arc<Mutex<Vec<Vec<String>>>>;

fn delivery(body: &str, lifeline: &Lifeline) -> Delivery {
    Delivery::builder()
        .queue("q")
        .body(body.to_owned())
        .lifeline(lifeline.clone())
        .build()
}

fn bodies(batch: &Batch) -> Vec<String> {
    batch
        .iter()
        .map(|d| String::from_utf8_lossy(d.body()).into_owned())
        .collect()
}

/// The order acemq uses, without retry and dead-letter: batches formed
/// before the claim, the batch handler under cancellation. The handler
/// records each batch, waits `work`, then answers per body: `bad` is
/// rejected, `flaky` fails on its first attempt.
fn stack(
    batcher: Batcher,
    counter: InFlightCounter,
    calls: Calls,
    work: Duration,
) -> impl Service<Delivery, Response = Decision, Error = BoxError, Future: Send + 'static> + Clone + Send
{
    ServiceBuilder::new()
        .layer(BatchLayer::new(batcher))
        .layer(ClaimLayer::new(counter))
        .layer(CancelLayer::new(CancellationToken::new()))
        .service(BatchHandler::new(service_fn(move |batch: Batch| {
            calls.lock().unwrap().push(bodies(&batch));
            async move {
                tokio::time::sleep(work).await;
                let outcomes: Vec<Result<Verdict, BoxError>> = batch
                    .iter()
                    .map(|d| match (&d.body()[..], d.attempt()) {
                        (b"bad", _) => Err(Reject::new("bad row").into()),
                        (b"flaky", 1) => Err("blinked".into()),
                        _ => Ok(Verdict::Ack),
                    })
                    .collect();
                Ok::<_, BoxError>(outcomes)
            }
        })))
}

fn spawn_call<S>(svc: &mut S, d: Delivery) -> tokio::task::JoinHandle<Result<Decision, BoxError>>
where
    S: Service<Delivery, Response = Decision, Error = BoxError>,
    S::Future: Send + 'static,
{
    tokio::spawn(svc.call(d))
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_batch_runs_at_once_and_each_member_keeps_its_own_outcome() {
    let calls = Calls::default();
    let lifeline = Lifeline::new();
    let batcher = Batcher::new(3, Duration::from_secs(10), 1);
    let mut svc = stack(
        batcher,
        InFlightCounter::new(),
        calls.clone(),
        Duration::ZERO,
    );
    let started = tokio::time::Instant::now();
    let handles: Vec<_> = ["a", "bad", "c"]
        .iter()
        .map(|b| spawn_call(&mut svc, delivery(b, &lifeline)))
        .collect();
    let mut decisions = Vec::new();
    for h in handles {
        decisions.push(h.await.unwrap());
    }
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "a full batch does not wait"
    );
    assert_eq!(*calls.lock().unwrap(), vec![vec!["a", "bad", "c"]]);
    assert_eq!(decisions[0].as_ref().unwrap(), &Decision::Ack);
    // The error goes up to the dead-letter layer, for this member alone.
    let error = decisions[1].as_ref().unwrap_err();
    assert!(Reject::is_in(&**error), "{error}");
    assert_eq!(decisions[2].as_ref().unwrap(), &Decision::Ack);
}

#[tokio::test(start_paused = true)]
async fn a_partial_batch_runs_once_max_wait_has_passed_since_its_first_member() {
    let calls = Calls::default();
    let lifeline = Lifeline::new();
    let batcher = Batcher::new(10, Duration::from_millis(50), 1);
    let mut svc = stack(
        batcher,
        InFlightCounter::new(),
        calls.clone(),
        Duration::ZERO,
    );
    let first = spawn_call(&mut svc, delivery("a", &lifeline));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = spawn_call(&mut svc, delivery("b", &lifeline));
    tokio::time::sleep(Duration::from_millis(29)).await;
    settle().await;
    assert!(calls.lock().unwrap().is_empty(), "still forming at 49 ms");
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert_eq!(first.await.unwrap().unwrap(), Decision::Ack);
    assert_eq!(second.await.unwrap().unwrap(), Decision::Ack);
    assert_eq!(*calls.lock().unwrap(), vec![vec!["a", "b"]]);
}

#[tokio::test(start_paused = true)]
async fn a_member_called_again_after_its_batch_ran_is_a_batch_of_one() {
    let calls = Calls::default();
    let lifeline = Lifeline::new();
    // Stands in for the retry layer: calls the handler again for the same
    // delivery, at the next attempt, when the first attempt failed.
    let inner = BatchHandler::new(service_fn({
        let calls = calls.clone();
        move |batch: Batch| {
            calls.lock().unwrap().push(bodies(&batch));
            async move {
                let outcomes: Vec<Result<(), BoxError>> = batch
                    .iter()
                    .map(|d| match (&d.body()[..], d.attempt()) {
                        (b"flaky", 1) => Err("blinked".into()),
                        _ => Ok(()),
                    })
                    .collect();
                Ok::<_, BoxError>(outcomes)
            }
        }
    }));
    let retrying = service_fn(move |mut d: Delivery| {
        let mut inner = inner.clone();
        async move {
            match inner.ready().await?.call(d.clone()).await {
                Ok(v) => Ok::<_, BoxError>(v),
                Err(_) => {
                    d.set_attempt(d.attempt() + 1);
                    inner.ready().await?.call(d).await
                }
            }
        }
    });
    let mut svc = ServiceBuilder::new()
        .layer(BatchLayer::new(Batcher::new(2, Duration::from_secs(1), 1)))
        .layer(ClaimLayer::new(InFlightCounter::new()))
        .layer(CancelLayer::new(CancellationToken::new()))
        .service(retrying);
    let a = spawn_call(&mut svc, delivery("a", &lifeline));
    let flaky = spawn_call(&mut svc, delivery("flaky", &lifeline));
    assert_eq!(a.await.unwrap().unwrap(), Decision::Ack);
    assert_eq!(flaky.await.unwrap().unwrap(), Decision::Ack);
    assert_eq!(
        *calls.lock().unwrap(),
        vec![vec!["a", "flaky"], vec!["flaky"]],
        "the second attempt is a batch of one"
    );
}

#[tokio::test(start_paused = true)]
async fn a_member_handed_back_while_its_batch_forms_leaves_it_and_the_rest_run() {
    let calls = Calls::default();
    let lifeline = Lifeline::new();
    let counter = InFlightCounter::new();
    let batcher = Batcher::new(10, Duration::from_millis(50), 1);
    let mut svc = stack(batcher, counter.clone(), calls.clone(), Duration::ZERO);
    let kept = spawn_call(&mut svc, delivery("kept", &lifeline));
    let gone = delivery("gone", &lifeline);
    let handed_back = spawn_call(&mut svc, gone.clone());
    settle().await;
    // The transport's side: the delivery is still held, so it goes back,
    // and its request is dropped.
    assert!(gone.hand_back_if_held(), "held while its batch forms");
    handed_back.abort();
    assert_eq!(counter.total(), 0, "nothing in flight while forming");
    assert_eq!(kept.await.unwrap().unwrap(), Decision::Ack);
    assert_eq!(*calls.lock().unwrap(), vec![vec!["kept"]]);
}

#[tokio::test(start_paused = true)]
async fn concurrency_counts_batches_running_and_a_batch_waiting_to_run_is_held() {
    let calls = Calls::default();
    let lifeline = Lifeline::new();
    let counter = InFlightCounter::new();
    let batcher = Batcher::new(2, Duration::from_secs(1), 1);
    let mut svc = stack(
        batcher.clone(),
        counter.clone(),
        calls.clone(),
        Duration::from_millis(100),
    );
    let handles: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|b| spawn_call(&mut svc, delivery(b, &lifeline)))
        .collect();
    settle().await;
    assert_eq!(calls.lock().unwrap().len(), 1, "one batch at a time");
    assert_eq!(counter.total(), 2, "in flight: the running batch's members");
    assert_eq!(batcher.held(), 2, "held: the batch waiting to run");
    tokio::time::sleep(Duration::from_millis(101)).await;
    settle().await;
    assert_eq!(calls.lock().unwrap().len(), 2);
    for h in handles {
        assert_eq!(h.await.unwrap().unwrap(), Decision::Ack);
    }
    assert_eq!(*calls.lock().unwrap(), vec![vec!["a", "b"], vec!["c", "d"]]);
}

//! Confirming: a failing delivery whose copy is sent gives its handler slot
//! up while the copy's confirm is awaited, stays in flight until the
//! confirm is in, and is settled (its outcome exists) only after it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_layers::{
    BoxError, ClaimLayer, DeadLetterLayer, Decision, Delivery, InFlightCounter, Outgoing, Publish,
    PublishError, RetryLayer, RetryPolicy, RetryVia,
};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::{ServiceBuilder, ServiceExt};

/// The bound on every wait for a condition (never reached when the code is
/// right; a wrong one fails here instead of hanging).
const BOUND: Duration = Duration::from_secs(10);

/// A publisher whose confirms come only when the test lets them: each
/// publish is "sent" (and says so with `Outgoing::queued` unless `silent`),
/// counted as outstanding, then waits for one permit of `confirms`.
#[derive(Clone)]
struct SlowConfirms {
    confirms: Arc<Semaphore>,
    outstanding: Arc<AtomicUsize>,
    /// Every publish so far.
    total: Arc<AtomicUsize>,
    sent: Arc<Notify>,
    silent: bool,
    /// The first this many publishes are nacked once confirmed.
    nack_first: Arc<AtomicUsize>,
}

impl SlowConfirms {
    fn new() -> Self {
        SlowConfirms {
            confirms: Arc::new(Semaphore::new(0)),
            outstanding: Arc::new(AtomicUsize::new(0)),
            total: Arc::new(AtomicUsize::new(0)),
            sent: Arc::new(Notify::new()),
            silent: false,
            nack_first: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Waits (bounded) until `n` confirms are outstanding at once.
    async fn until_outstanding(&self, n: usize) {
        self.until(&self.outstanding, n, "confirm(s) outstanding")
            .await;
    }

    /// Waits (bounded) until `n` copies were sent in all.
    async fn until_sent(&self, n: usize) {
        self.until(&self.total, n, "copies sent").await;
    }

    async fn until(&self, count: &AtomicUsize, n: usize, what: &str) {
        let wait = async {
            loop {
                let sent = self.sent.notified();
                if count.load(Ordering::SeqCst) >= n {
                    return;
                }
                sent.await;
            }
        };
        tokio::time::timeout(BOUND, wait)
            .await
            .unwrap_or_else(|_| panic!("{} {what}, never {n}", count.load(Ordering::SeqCst)));
    }
}

impl Publish for SlowConfirms {
    fn publish(
        &self,
        message: Outgoing<'_>,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        let queue = message.queue.to_owned();
        if !self.silent {
            message.queued();
        }
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        self.total.fetch_add(1, Ordering::SeqCst);
        self.sent.notify_waiters();
        let this = self.clone();
        async move {
            let confirm = this.confirms.acquire().await.expect("never closed");
            confirm.forget();
            this.outstanding.fetch_sub(1, Ordering::SeqCst);
            let nack = this
                .nack_first
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if nack {
                Err(PublishError::Nacked { queue })
            } else {
                Ok(())
            }
        }
    }

    fn redeclare(&self, _queue: &str) -> impl Future<Output = Result<(), PublishError>> + Send {
        std::future::ready(Ok(()))
    }
}

fn delivery(n: u64) -> Delivery {
    Delivery::builder()
        .queue("storm")
        .delivery_tag(n)
        .body("payload")
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_handler_slot_a_failure_storm_has_every_copys_confirm_outstanding_at_once() {
    const N: usize = 6;
    let counter = InFlightCounter::new();
    let permits = Arc::new(Semaphore::new(1));
    let publisher = SlowConfirms::new();
    let handled = Arc::new(AtomicUsize::new(0));
    let seen = handled.clone();
    let svc = ServiceBuilder::new()
        .layer(ClaimLayer::new(counter.clone()).concurrency(permits.clone()))
        .layer(DeadLetterLayer::new(publisher.clone()))
        .service_fn(move |_d: Delivery| {
            seen.fetch_add(1, Ordering::SeqCst);
            async { Err::<Decision, BoxError>("always fails".into()) }
        });
    let deliveries: Vec<Delivery> = (1..=N as u64).map(delivery).collect();
    let running: Vec<_> = deliveries
        .iter()
        .map(|d| tokio::spawn(svc.clone().oneshot(d.clone())))
        .collect();

    // No confirm has come, yet every handler ran: each one's slot was
    // given up as soon as its copy was sent.
    publisher.until_outstanding(N).await;
    assert_eq!(handled.load(Ordering::SeqCst), N);
    assert_eq!(
        permits.available_permits(),
        1,
        "confirming deliveries hold no handler slot"
    );
    assert!(deliveries.iter().all(Delivery::is_confirming));
    // Still in flight: the drain would wait for every one.
    assert_eq!(counter.total(), N);
    let mut idle = std::pin::pin!(counter.wait_idle());
    assert!(futures::poll!(idle.as_mut()).is_pending());
    assert!(running.iter().all(|r| !r.is_finished()));

    // The confirms come: each outcome exists only now, once.
    publisher.confirms.add_permits(N);
    for r in running {
        match tokio::time::timeout(BOUND, r)
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Decision::DeadLetter(d) => assert!(d.published, "settled after its copy's confirm"),
            other => panic!("expected a dead-letter, got {other:?}"),
        }
    }
    tokio::time::timeout(BOUND, idle).await.unwrap();
    assert_eq!(counter.total(), 0);
    assert_eq!(permits.available_permits(), 1);
    assert!(deliveries.iter().all(|d| !d.is_confirming()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_that_never_says_its_copy_is_sent_keeps_the_slot_until_the_confirm() {
    let counter = InFlightCounter::new();
    let permits = Arc::new(Semaphore::new(1));
    let mut publisher = SlowConfirms::new();
    publisher.silent = true;
    let handled = Arc::new(AtomicUsize::new(0));
    let seen = handled.clone();
    let svc = ServiceBuilder::new()
        .layer(ClaimLayer::new(counter.clone()).concurrency(permits.clone()))
        .layer(DeadLetterLayer::new(publisher.clone()))
        .service_fn(move |_d: Delivery| {
            seen.fetch_add(1, Ordering::SeqCst);
            async { Err::<Decision, BoxError>("always fails".into()) }
        });
    let first = delivery(1);
    let a = tokio::spawn(svc.clone().oneshot(first.clone()));
    publisher.until_sent(1).await;
    assert_eq!(permits.available_permits(), 0, "the slot is still held");
    assert!(!first.is_confirming());
    let b = tokio::spawn(svc.clone().oneshot(delivery(2)));
    publisher.confirms.add_permits(1);
    publisher.until_sent(2).await;
    publisher.confirms.add_permits(1);
    for r in [a, b] {
        tokio::time::timeout(BOUND, r)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    assert_eq!(handled.load(Ordering::SeqCst), 2);
    assert_eq!(counter.total(), 0);
    assert_eq!(permits.available_permits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rung_copy_refused_after_it_was_sent_takes_a_slot_back_before_the_next_attempt() {
    let counter = InFlightCounter::new();
    let permits = Arc::new(Semaphore::new(1));
    let publisher = SlowConfirms::new();
    publisher.nack_first.store(1, Ordering::SeqCst);
    publisher.confirms.add_permits(1);
    // Every delay is a broker wait (a rung); refused, it is waited here.
    let mut policy =
        RetryPolicy::exponential(3, Duration::from_millis(1), Duration::from_millis(1));
    policy.broker_wait_threshold = Duration::from_millis(1);
    policy.jitter = false;
    let attempts = Arc::new(AtomicUsize::new(0));
    let without_slot = Arc::new(AtomicBool::new(false));
    let (seen, slotless, slots) = (attempts.clone(), without_slot.clone(), permits.clone());
    let svc = ServiceBuilder::new()
        .layer(ClaimLayer::new(counter.clone()).concurrency(permits.clone()))
        .layer(RetryLayer::new(
            policy,
            publisher.clone(),
            CancellationToken::new(),
        ))
        .service_fn(move |d: Delivery| {
            // This handler's delivery is the only one: it holds the only slot.
            if slots.available_permits() != 0 || d.is_confirming() {
                slotless.store(true, Ordering::SeqCst);
            }
            let first = seen.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    Err::<Decision, BoxError>("fails once".into())
                } else {
                    Ok(Decision::Ack)
                }
            }
        });
    let d = delivery(1);
    let outcome = tokio::time::timeout(BOUND, svc.oneshot(d.clone()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome, Decision::Ack, "retried here once the rung refused");
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert!(
        !without_slot.load(Ordering::SeqCst),
        "the second attempt ran without a handler slot"
    );
    assert_eq!(permits.available_permits(), 1);
    assert_eq!(counter.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rung_copy_confirmed_settles_as_a_retry_after_its_confirm_with_the_slot_given_up_meanwhile(
) {
    let counter = InFlightCounter::new();
    let permits = Arc::new(Semaphore::new(1));
    let publisher = SlowConfirms::new();
    let mut policy = RetryPolicy::exponential(3, Duration::from_secs(60), Duration::from_secs(60));
    policy.broker_wait_threshold = Duration::from_secs(1);
    let svc = ServiceBuilder::new()
        .layer(ClaimLayer::new(counter.clone()).concurrency(permits.clone()))
        .layer(RetryLayer::new(
            policy,
            publisher.clone(),
            CancellationToken::new(),
        ))
        .service_fn(|_d: Delivery| async { Err::<Decision, BoxError>("fails".into()) });
    let d = delivery(1);
    let running = tokio::spawn(svc.oneshot(d.clone()));
    publisher.until_outstanding(1).await;
    assert!(d.is_confirming());
    assert_eq!(permits.available_permits(), 1);
    assert_eq!(counter.total(), 1);
    publisher.confirms.add_permits(1);
    match tokio::time::timeout(BOUND, running)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        Decision::Retry(r) => assert!(matches!(r.via, RetryVia::Rung(_))),
        other => panic!("expected a retry on a rung, got {other:?}"),
    }
    assert_eq!(counter.total(), 0);
    assert!(!d.is_confirming());
}

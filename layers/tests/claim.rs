//! The claim point: in flight from the claim, a permit per claimed
//! delivery, and the race with a hand-back (first writer wins).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use acemq_layers::{ClaimLayer, Decision, Delivery, InFlightCounter, Lifeline};
use tokio::sync::{Notify, Semaphore};
use tower::{Service, ServiceBuilder, ServiceExt};

#[tokio::test]
async fn a_claimed_delivery_is_in_flight_with_a_permit_until_its_outcome_exists() {
    let counter = InFlightCounter::new();
    let permits = Arc::new(Semaphore::new(2));
    let release = Arc::new(Notify::new());
    let gate = release.clone();
    let svc = ServiceBuilder::new()
        .layer(ClaimLayer::new(counter.clone()).concurrency(permits.clone()))
        .service_fn(move |_d: Delivery| {
            let gate = gate.clone();
            async move {
                gate.notified().await;
                Ok::<_, std::io::Error>(Decision::Ack)
            }
        });
    let d = Delivery::builder().queue("q").build();
    let running = tokio::spawn(svc.oneshot(d.clone()));
    while counter.total() == 0 {
        tokio::task::yield_now().await;
    }
    assert!(d.is_claimed());
    assert_eq!(counter.get("q"), 1);
    assert_eq!(
        permits.available_permits(),
        1,
        "the claimed delivery holds a permit"
    );
    assert!(!d.hand_back_if_held(), "claimed first: the hand-back loses");
    assert!(!d.is_handed_back());
    release.notify_one();
    assert_eq!(running.await.unwrap().unwrap(), Decision::Ack);
    assert_eq!(counter.total(), 0);
    assert_eq!(permits.available_permits(), 2);
}

#[tokio::test]
async fn a_delivery_handed_back_before_its_claim_is_refused_without_calling_the_service() {
    let counter = InFlightCounter::new();
    let permits = Arc::new(Semaphore::new(1));
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let mut svc = ServiceBuilder::new()
        .layer(ClaimLayer::new(counter.clone()).concurrency(permits.clone()))
        .service_fn(move |_d: Delivery| {
            seen.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::io::Error>(Decision::Ack) }
        });
    let held = Delivery::builder().queue("q").build();
    assert!(held.hand_back_if_held(), "held: the hand-back wins");
    svc.ready().await.unwrap();
    let refused = svc.call(held.clone()).await.unwrap();
    assert_eq!(refused, Decision::HandBack);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler never ran");
    assert!(!held.is_claimed());
    assert_eq!(counter.total(), 0);
    // The permit the refused call was made ready with serves the next one.
    svc.ready().await.unwrap();
    let next = Delivery::builder().queue("q").build();
    assert_eq!(svc.call(next).await.unwrap(), Decision::Ack);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn once_a_generation_hands_back_what_is_held_a_later_claim_is_refused() {
    let counter = InFlightCounter::new();
    let svc = ServiceBuilder::new()
        .layer(ClaimLayer::new(counter.clone()))
        .service_fn(|_d: Delivery| async { Ok::<_, std::io::Error>(Decision::Ack) });
    let lifeline = Lifeline::new();
    let d = Delivery::builder().lifeline(lifeline.clone()).build();
    lifeline.hand_back_held();
    assert!(lifeline.hands_back_held());
    assert_eq!(svc.oneshot(d.clone()).await.unwrap(), Decision::HandBack);
    assert!(d.is_handed_back());
}

//! The shop example's handler (`examples/shop/handler.rs`) through the exact
//! stack `App` builds for it, in memory under a paused clock
//! (`acemq::testing`, feature `test-util`), on the example's own config
//! (`examples/shop.yaml`: 4 attempts, delays 1 s, 2 s, 4 s, rungs from 2 s).

#[path = "../examples/shop/handler.rs"]
mod handler;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use acemq::testing::{Fate, Report, TestQueue};
use acemq::{Config, Reason};
use handler::Stats;

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn harness() -> (TestQueue, Arc<Stats>) {
    let config = Config::from_yaml_str(include_str!("../examples/shop.yaml"))
        .expect("the example's config is valid");
    let stats = Arc::new(Stats::default());
    let queue = config.queues[0].clone();
    assert_eq!(queue.name, "shop.orders");
    (TestQueue::new(queue, handler::orders(stats.clone())), stats)
}

/// `(attempt, when)` of every call of the handler.
fn calls(r: &Report) -> Vec<(u32, Duration)> {
    r.attempts.iter().map(|a| (a.attempt, a.at)).collect()
}

/// The copy of a delivery that comes back from a rung as `attempt`.
async fn redelivered(h: &mut TestQueue, body: &str, attempt: u32) -> Report {
    let mut d = h.delivery(body.to_owned());
    d.set_attempt(attempt);
    h.deliver(d).await
}

fn assert_dead_lettered(r: &Report, want: Reason, error_has: &str) {
    match &r.fate {
        Fate::DeadLettered {
            reason,
            error,
            headers,
        } => {
            assert_eq!(*reason, want, "{error}");
            assert!(error.contains(error_has), "{error:?} has {error_has:?}");
            assert_eq!(
                headers.get("x-acemq-reason").and_then(|v| v.as_str()),
                Some(want.as_str())
            );
            assert_eq!(
                headers.get("x-acemq-queue").and_then(|v| v.as_str()),
                Some("shop.orders")
            );
        }
        other => panic!("expected a dead-letter ({want:?}), got {other:?}"),
    }
    assert_eq!(r.published.len(), 1, "{:?}", r.published);
    assert_eq!(r.published[0].queue, "shop.orders.dlq");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_good_order_is_acknowledged_after_its_work() {
    let (mut h, stats) = harness();
    let r = h.deliver_body(r#"{"id":"o-1","work_ms":300}"#).await;
    assert_eq!(r.fate, Fate::Acked);
    assert_eq!(calls(&r), [(1, Duration::ZERO)]);
    assert!(r.published.is_empty());
    assert_eq!(stats.ok.load(Ordering::Relaxed), 1);
    assert_eq!(stats.failed.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_that_is_not_an_order_is_dead_lettered_at_once_as_rejected() {
    let (mut h, stats) = harness();
    // Not JSON, and JSON that is not an order (no id; a wrong type).
    for body in [
        "this is not an order",
        r#"{"work_ms":1}"#,
        r#"{"id":"o-2","fail_attempts":"two"}"#,
        r#"{"id":"o-3","fail":"sometimes"}"#,
    ] {
        let r = h.deliver_body(body.to_owned()).await;
        assert_dead_lettered(&r, Reason::Rejected, "body is not an order");
        assert_eq!(calls(&r).len(), 1, "{body}: permanent, never retried");
    }
    assert_eq!(stats.failed.load(Ordering::Relaxed), 4);
    assert_eq!(stats.ok.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_permanent_failure_is_rejected_and_a_panic_dead_lettered_as_panic() {
    let (mut h, _) = harness();
    let r = h
        .deliver_body(r#"{"id":"o-permanent","fail":"permanent"}"#)
        .await;
    assert_dead_lettered(
        &r,
        Reason::Rejected,
        "order o-permanent cannot be fulfilled",
    );
    assert_eq!(calls(&r).len(), 1);
    let r = h.deliver_body(r#"{"id":"o-panic","fail":"panic"}"#).await;
    assert_dead_lettered(&r, Reason::Panic, "order o-panic hit a bug");
    assert_eq!(
        calls(&r).len(),
        1,
        "a panic is not retried (retry_panics: false)"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn one_transient_failure_is_retried_here_after_one_second() {
    let (mut h, stats) = harness();
    let r = h
        .deliver_body(r#"{"id":"o-retry-here","fail_attempts":1}"#)
        .await;
    assert_eq!(r.fate, Fate::Acked);
    // 1 s is below the 2 s threshold: waited in process.
    assert_eq!(calls(&r), [(1, Duration::ZERO), (2, SECS(1))]);
    assert!(r.published.is_empty(), "no rung: {:?}", r.published);
    assert_eq!(stats.failed.load(Ordering::Relaxed), 1);
    assert_eq!(stats.ok.load(Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn two_transient_failures_hop_to_the_two_second_rung_and_the_copy_succeeds() {
    let (mut h, _) = harness();
    let body = r#"{"id":"o-rung-hop","fail_attempts":2}"#;
    let r = h.deliver_body(body).await;
    assert_eq!(calls(&r), [(1, Duration::ZERO), (2, SECS(1))]);
    match &r.fate {
        Fate::RetriedOnRung {
            rung,
            attempt,
            delay,
            headers,
        } => {
            assert_eq!(rung, "shop.orders.retry.2s");
            assert_eq!(*attempt, 3);
            assert_eq!(*delay, SECS(2));
            assert_eq!(
                headers.get("x-acemq-attempt").and_then(|v| v.as_i64()),
                Some(3)
            );
        }
        other => panic!("expected the 2 s rung, got {other:?}"),
    }
    let r = redelivered(&mut h, body, 3).await;
    assert_eq!(r.fate, Fate::Acked);
    assert_eq!(calls(&r), [(3, Duration::ZERO)]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_order_that_always_fails_climbs_both_rungs_then_is_dead_lettered_after_four_attempts() {
    let (mut h, _) = harness();
    let body = r#"{"id":"o-exhausted","fail_attempts":99}"#;
    let r = h.deliver_body(body).await;
    assert_eq!(calls(&r), [(1, Duration::ZERO), (2, SECS(1))]);
    assert!(
        matches!(&r.fate, Fate::RetriedOnRung { rung, attempt: 3, .. } if rung == "shop.orders.retry.2s"),
        "{:?}",
        r.fate
    );
    // Attempt 3 fails: 4 s, the second rung.
    let r = redelivered(&mut h, body, 3).await;
    assert_eq!(calls(&r), [(3, Duration::ZERO)]);
    match &r.fate {
        Fate::RetriedOnRung {
            rung,
            attempt,
            delay,
            ..
        } => {
            assert_eq!(rung, "shop.orders.retry.4s");
            assert_eq!(*attempt, 4);
            assert_eq!(*delay, SECS(4));
        }
        other => panic!("expected the 4 s rung, got {other:?}"),
    }
    // Attempt 4 is the last (max_attempts: 4).
    let r = redelivered(&mut h, body, 4).await;
    assert_eq!(calls(&r), [(4, Duration::ZERO)]);
    assert_dead_lettered(
        &r,
        Reason::MaxAttempts,
        "order o-exhausted: simulated failure on attempt 4",
    );
    match &r.fate {
        Fate::DeadLettered { headers, .. } => assert_eq!(
            headers.get("x-acemq-attempts").and_then(|v| v.as_i64()),
            Some(4)
        ),
        _ => unreachable!(),
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn at_the_drain_a_cooperative_order_is_handed_back_and_one_ignoring_cancellation_abandoned() {
    let (mut h, _) = harness();
    h.start_drain();
    h.cancel_handlers();
    let r = h.deliver_body(r#"{"id":"o-slow","work_ms":60000}"#).await;
    assert_eq!(r.fate, Fate::HandedBack, "{:?}", r.decision);
    assert_eq!(calls(&r).len(), 1);
    let r = h
        .deliver_body(r#"{"id":"o-stubborn","work_ms":60000,"ignore_cancel":true}"#)
        .await;
    assert_eq!(r.fate, Fate::Abandoned, "{:?}", r.decision);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_order_fails_transiently_until_its_outage_ends_and_is_handled_after_it() {
    let (mut h, stats) = harness();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let r = h
        .deliver_body(format!(
            r#"{{"id":"o-back","fail_until_ms":{}}}"#,
            now_ms - 1
        ))
        .await;
    assert_eq!(r.fate, Fate::Acked, "the outage is over");
    // An hour's outage: both in-process attempts fail, then the 2 s rung.
    let r = h
        .deliver_body(format!(
            r#"{{"id":"o-down","fail_until_ms":{}}}"#,
            now_ms + 3_600_000
        ))
        .await;
    assert_eq!(calls(&r), [(1, Duration::ZERO), (2, SECS(1))]);
    assert!(
        matches!(&r.fate, Fate::RetriedOnRung { rung, attempt: 3, .. } if rung == "shop.orders.retry.2s"),
        "{:?}",
        r.fate
    );
    assert_eq!(stats.failed.load(Ordering::Relaxed), 2);
    assert_eq!(stats.ok.load(Ordering::Relaxed), 1);
}

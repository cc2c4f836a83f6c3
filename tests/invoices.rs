//! The invoices example's stack, in memory, under a paused clock: the same
//! config, layers and handler as `examples/invoices`, through
//! `acemq::testing` (feature `test-util`).

#[path = "../examples/invoices/handler.rs"]
mod handler;

use std::time::Duration;

use acemq::testing::{Fate, TestQueue};
use acemq::{Config, Delivery, Reason};

fn harness() -> TestQueue {
    let config = Config::from_yaml_str(handler::CONFIG).expect("the example's config is valid");
    let queue = config.queues[0].clone();
    TestQueue::with_stack(
        queue,
        handler::stack(),
        handler::Invoices::without_receipts(),
    )
}

/// An invoice as it arrives through the topic exchange.
fn invoice(h: &mut TestQueue, key: &str, body: &str) -> Delivery {
    h.message(body.to_owned())
        .exchange("billing")
        .routing_key(key)
        .content_type("application/json")
        .build()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_valid_invoice_is_acknowledged_once() {
    let mut h = harness();
    let d = invoice(&mut h, "invoices.eu", r#"{"id":"inv-1","amount":120}"#);
    let r = h.deliver(d).await;
    assert_eq!(r.fate, Fate::Acked);
    assert_eq!(r.attempts.len(), 1);
    assert!(r.published.is_empty());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_that_is_not_an_invoice_and_a_non_positive_amount_are_dead_lettered_at_once() {
    let mut h = harness();
    for body in ["not json", r#"{"id":"inv-2","amount":-5}"#] {
        let d = invoice(&mut h, "invoices.us", body);
        let r = h.deliver(d).await;
        match &r.fate {
            Fate::DeadLettered {
                reason, headers, ..
            } => {
                assert_eq!(*reason, Reason::Rejected);
                assert_eq!(
                    headers.get("x-acemq-queue").and_then(|v| v.as_str()),
                    Some("billing.invoices")
                );
            }
            other => panic!("{body}: expected a dead-letter, got {other:?}"),
        }
        assert_eq!(r.attempts.len(), 1, "{body}: permanent, no retry");
        assert_eq!(r.published[0].queue, "billing.invoices.dlq");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_slow_invoice_times_out_each_attempt_waits_then_moves_to_its_rung_keeping_its_routing_key(
) {
    let mut h = harness();
    let d = invoice(&mut h, "invoices.slow", r#"{"id":"inv-3","amount":10}"#);
    let r = h.deliver(d).await;
    // Attempt 1 times out at 2 s; 1 s is below the 2 s threshold: waits here;
    // attempt 2 times out; 2 s is at the threshold: the rung.
    assert_eq!(
        r.attempts
            .iter()
            .map(|a| (a.attempt, a.at))
            .collect::<Vec<_>>(),
        vec![(1, Duration::ZERO), (2, Duration::from_secs(3))]
    );
    match &r.fate {
        Fate::RetriedOnRung {
            rung,
            attempt,
            headers,
            ..
        } => {
            assert_eq!(rung, "billing.invoices.retry.2s");
            assert_eq!(*attempt, 3);
            assert_eq!(
                headers
                    .get("x-acemq-original-routing-key")
                    .and_then(|v| v.as_str()),
                Some("invoices.slow"),
                "the copy remembers where it came from"
            );
        }
        other => panic!("expected a rung hop, got {other:?}"),
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_last_attempt_of_a_slow_invoice_is_dead_lettered_as_a_timeout() {
    let mut h = harness();
    // The copy from the last rung: attempt 3.
    let r = h
        .message(r#"{"id":"inv-3","amount":10}"#)
        .exchange("billing")
        .routing_key("invoices.slow")
        .attempt(3)
        .deliver()
        .await;
    assert!(
        matches!(
            r.fate,
            Fate::DeadLettered {
                reason: Reason::Timeout,
                ..
            }
        ),
        "{:?}",
        r.fate
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dead_lettered_invoice_keeps_the_headers_it_came_with_and_where_it_came_from() {
    let mut h = harness();
    let r = h
        .message(r#"{"id":"inv-4","amount":0}"#)
        .exchange("billing")
        .routing_key("invoices.eu")
        .message_id("inv-4")
        .header("tenant", "acme")
        .deliver()
        .await;
    match &r.fate {
        Fate::DeadLettered { headers, .. } => {
            assert_eq!(
                headers.get("tenant").and_then(|v| v.as_str()),
                Some("acme"),
                "{headers:?}"
            );
            assert_eq!(
                headers
                    .get("x-acemq-original-exchange")
                    .and_then(|v| v.as_str()),
                Some("billing"),
                "{headers:?}"
            );
        }
        other => panic!("expected a dead-letter, got {other:?}"),
    }
}

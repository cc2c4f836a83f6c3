//! The shop process with per-key ordering and with a circuit breaker, as
//! the README walks through them: `examples/shop.ordered.yaml` with
//! `--seed customers`, `examples/shop.breaker.yaml` with `--seed outage`,
//! checked from the shop's JSON log lines and its `/queues` route.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::support::{topology_queues, unique, QueueCleanup, ShopProcess};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The example config `file` with its queue renamed `q`, and every queue it
/// declares (to delete).
fn example_config(yaml: &str, q: &str) -> (String, Vec<String>) {
    let yaml = yaml.replace("name: shop.orders", &format!("name: {q}"));
    let config = acemq::Config::from_yaml_str(&yaml).expect("the example's config is valid");
    (yaml, topology_queues(&config))
}

/// `hh:mm:ss.frac` of an RFC 3339 timestamp, in seconds since midnight.
fn seconds_of_day(ts: &str) -> f64 {
    let time = ts.split('T').nth(1).expect("an RFC 3339 timestamp");
    let time = time.trim_end_matches('Z');
    let mut parts = time.split(':');
    let mut next = || -> f64 { parts.next().and_then(|p| p.parse().ok()).expect(ts) };
    next() * 3600.0 + next() * 60.0 + next()
}

/// `(order id, seconds since midnight)` of every "order handled" line of a
/// JSON log, in log order.
fn handled_orders(stderr: &str) -> Vec<(String, f64)> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|j| j["message"] == "order handled")
        .map(|j| {
            (
                j["order"].as_str().expect("an order field").to_owned(),
                seconds_of_day(j["timestamp"].as_str().expect("a timestamp")),
            )
        })
        .collect()
}

/// `GET /queues/{q}`, waited for until `cond` holds (or `within` passes);
/// every snapshot seen, in order.
async fn watch_queue(
    shop: &ShopProcess,
    q: &str,
    within: Duration,
    mut cond: impl FnMut(&serde_json::Value) -> bool,
) -> Vec<(Instant, serde_json::Value)> {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    loop {
        if let Some((200, j)) = shop.get_json(&format!("/queues/{q}")).await {
            let done = cond(&j);
            seen.push((Instant::now(), j));
            if done {
                return seen;
            }
        }
        assert!(
            t0.elapsed() < within,
            "/queues/{q} never showed what was waited for within {within:?}: last {:?}; stderr:\n{}",
            seen.last().map(|(_, j)| j),
            shop.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_ordered_by_customer_handles_each_customers_orders_in_publish_order_and_the_customers_in_parallel(
) {
    const WORK: f64 = 0.050;
    let q = unique("shop.ordered");
    let (yaml, queues) = example_config(include_str!("../../examples/shop.ordered.yaml"), &q);
    let _cleanup = QueueCleanup::new(queues);
    let mut shop = ShopProcess::spawn_with_args(
        &q,
        &yaml,
        &["--seed", "customers", "--queue", &q, "--log-format", "json"],
        &[],
    );
    shop.wait_ready().await;
    watch_queue(&shop, &q, SECS(30), |j| j["handled"] == 40).await;
    shop.signal("-TERM");
    let status = shop.exit_within(SECS(15)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());

    let handled = handled_orders(&shop.stderr());
    assert_eq!(
        handled.len(),
        40,
        "40 orders handled once each: {handled:?}"
    );
    // Each customer's orders, in the order they were handled (a customer's
    // orders never run at once, so end order is start order).
    let mut per_customer: HashMap<&str, Vec<usize>> = HashMap::new();
    for (id, _) in &handled {
        let (customer, n) = id.rsplit_once('-').expect("customer-n");
        per_customer
            .entry(customer)
            .or_default()
            .push(n.parse().expect("a number"));
    }
    for customer in ["ada", "bob", "cyd", "dee"] {
        assert_eq!(
            per_customer.get(customer),
            Some(&(0..10).collect::<Vec<_>>()),
            "{customer}'s orders in publish order: {handled:?}"
        );
    }
    // Each order ran at least over [its line's time - 50 ms, its line's
    // time]: two such spans of different customers that overlap ran at once.
    let mut overlapping = 0;
    for (i, (a, ta)) in handled.iter().enumerate() {
        for (b, tb) in &handled[i + 1..] {
            let different = a.rsplit_once('-').map(|p| p.0) != b.rsplit_once('-').map(|p| p.0);
            if different && (ta - tb).abs() < WORK {
                overlapping += 1;
            }
        }
    }
    let span = handled.last().unwrap().1 - handled.first().unwrap().1 + WORK;
    eprintln!(
        "--- shop ordered: 40 orders in {span:.3} s (one at a time: at least {:.3} s); \
         {overlapping} pairs of orders of different customers overlapped",
        40.0 * WORK
    );
    assert!(
        overlapping > 0,
        "the customers ran in parallel: {handled:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_with_a_circuit_breaker_stops_taking_orders_while_they_fail_and_resumes_by_itself_when_they_succeed(
) {
    let q = unique("shop.breaker");
    let (yaml, queues) = example_config(include_str!("../../examples/shop.breaker.yaml"), &q);
    let _cleanup = QueueCleanup::new(queues);
    let mut shop = ShopProcess::spawn_with_args(
        &q,
        &yaml,
        &["--seed", "outage", "--queue", &q, "--log-format", "json"],
        &[],
    );
    shop.wait_ready().await;
    let t0 = Instant::now();
    let opening = watch_queue(&shop, &q, SECS(15), |j| j["circuit"] == "open").await;
    let opened = opening.last().unwrap().0;
    // Open: the orders not yet let through wait at the gate.
    // `handled` counts each delivery that finished, a hop to a rung too.
    let open = watch_queue(&shop, &q, SECS(30), |j| {
        let (handled, retried) = (j["handled"].as_u64(), j["retried"].as_u64());
        j["circuit"] == "closed" && handled.zip(retried).is_some_and(|(h, r)| h == r + 20)
    })
    .await;
    let closed = open
        .iter()
        .find(|(_, j)| j["circuit"] == "closed")
        .map(|(t, _)| *t)
        .unwrap();
    let most_held = open
        .iter()
        .filter(|(_, j)| j["circuit"] == "open")
        .filter_map(|(_, j)| j["held"].as_u64())
        .max()
        .unwrap_or(0);
    let circuits: Vec<&str> =
        open.iter()
            .filter_map(|(_, j)| j["circuit"].as_str())
            .fold(Vec::new(), |mut v, c| {
                if v.last() != Some(&c) {
                    v.push(c);
                }
                v
            });
    shop.signal("-TERM");
    let status = shop.exit_within(SECS(15)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
    let stderr = shop.stderr();

    let handled = handled_orders(&stderr);
    let mut ids: Vec<&str> = handled.iter().map(|(id, _)| id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        (handled.len(), ids.len()),
        (20, 20),
        "every order handled once: {handled:?}"
    );
    let count = |needle: &str| stderr.lines().filter(|l| l.contains(needle)).count();
    let failed = count("simulated outage");
    let (opens, half_opens, closes) = (
        count("circuit open"),
        count("circuit half-open"),
        count("circuit closed"),
    );
    eprintln!(
        "--- shop breaker: open {:?} after start, closed {:?} after it opened; /queues showed {circuits:?}, \
         at most {most_held} held while open; {failed} failed attempts for 20 orders; \
         log: {opens} open, {half_opens} half-open, {closes} closed",
        opened - t0,
        closed - opened,
    );
    assert!(
        most_held > 0,
        "while open the gate holds the orders it has not let through"
    );
    assert!(
        failed < 20,
        "the shop stopped taking orders: {failed} failed attempts, fewer than one per order"
    );
    assert!(
        opens >= 1 && half_opens >= 1 && closes == 1,
        "the log says each transition; stderr:\n{stderr}"
    );
    assert!(
        closed - opened >= SECS(1),
        "closed no sooner than the cool-down"
    );
}

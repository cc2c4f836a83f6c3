//! Per-key ordering from config against the real broker: `ordered_by:
//! { header: x-customer }` runs each customer's orders one at a time in
//! publish order, the customers side by side; a connection the broker
//! closes mid-run loses nothing and breaks no key's order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::config::{OrderedBy, QueueConfig};
use acemq::{App, BoxError, Config, Delivery};

use crate::support::{all_queues, eventually, field_table, long_str, unique, Broker};

#[derive(Default)]
struct Seen {
    /// (customer, order number, start, end), in the order they ended.
    runs: Vec<(String, usize, Instant, Instant)>,
    running: HashMap<String, usize>,
    overlaps: usize,
    now: usize,
    max: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_ordered_by_a_header_each_customers_orders_run_one_at_a_time_in_publish_order_and_customers_run_side_by_side(
) {
    let q = unique("ordered-header");
    let mut broker = Broker::new().await;
    let mut queue = QueueConfig::new(q.clone());
    queue.prefetch = 40;
    queue.concurrency = 8;
    queue.ordered_by = Some(OrderedBy::Header("x-customer".into()));
    let config = Config::new([queue]);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = seen.clone();
    let handler = tower::service_fn(move |d: Delivery| {
        let log = log.clone();
        async move {
            let body = String::from_utf8_lossy(d.body()).into_owned();
            let (customer, n) = body.split_once('/').expect("customer/n");
            let n: usize = n.parse().expect("a number");
            let start = Instant::now();
            {
                let mut s = log.lock().unwrap();
                let r = s.running.entry(customer.to_owned()).or_default();
                *r += 1;
                if *r > 1 {
                    s.overlaps += 1;
                }
                s.now += 1;
                s.max = s.max.max(s.now);
            }
            // Later orders are quicker: unordered, they would overtake.
            tokio::time::sleep(Duration::from_millis(5 + 3 * (10 - n as u64 % 10))).await;
            let mut s = log.lock().unwrap();
            *s.running.get_mut(customer).unwrap() -= 1;
            s.now -= 1;
            s.runs.push((customer.to_owned(), n, start, Instant::now()));
            Ok::<(), BoxError>(())
        }
    });
    let running = App::new(config)
        .consume(&q, handler)
        .start()
        .await
        .expect("starts");
    // 40 orders over 4 customers, interleaved.
    for n in 0..10 {
        for c in ["ada", "bob", "cyd", "dee"] {
            let headers = field_table(vec![("x-customer", long_str(c))]);
            broker
                .publish(&q, format!("{c}/{n}").as_bytes(), headers)
                .await;
        }
    }
    assert!(
        eventually(Duration::from_secs(20), || async {
            seen.lock().unwrap().runs.len() == 40
        })
        .await,
        "all 40 orders handled: {}",
        seen.lock().unwrap().runs.len()
    );
    running.drain().await.expect("a clean drain");
    {
        let s = seen.lock().unwrap();
        assert_eq!(s.overlaps, 0, "two orders of one customer ran at once");
        for c in ["ada", "bob", "cyd", "dee"] {
            let mut mine: Vec<_> = s.runs.iter().filter(|r| r.0 == c).collect();
            mine.sort_by_key(|r| r.2);
            let order: Vec<usize> = mine.iter().map(|r| r.1).collect();
            assert_eq!(
                order,
                (0..10).collect::<Vec<_>>(),
                "{c}'s orders in publish order"
            );
        }
        assert!(
            s.max >= 2,
            "the customers ran side by side (at most {} at once)",
            s.max
        );
    }
    broker.delete(&all_queues(&q)).await;
}

/// What the handler of the forced-close test saw.
#[derive(Default)]
struct Handled {
    /// (key, sequence number, redelivered) of every call, in start order.
    starts: Vec<(String, usize, bool)>,
    /// (key, sequence number) of every call that finished its work.
    done: Vec<(String, usize)>,
}

/// Each key's sequence numbers in the order of `items`.
fn per_key<'a>(items: impl Iterator<Item = (&'a str, usize)>) -> HashMap<String, Vec<usize>> {
    let mut out: HashMap<String, Vec<usize>> = HashMap::new();
    for (k, n) in items {
        out.entry(k.to_owned()).or_default().push(n);
    }
    out
}

/// The broker closes the consumers' connection mid-run. What must hold, and
/// why:
///
/// 1. Nothing is lost: every message's work is done at least once (the
///    broker requeues whatever was not acknowledged when the connection
///    went).
/// 2. Per key, the *first* handling of each message follows the publish
///    order. Before the close the partition runs a key's deliveries one at a
///    time in arrival order, which is publish order (one queue, one
///    consumer). At the close, the unacknowledged messages go back to their
///    original places in the (classic) queue, ahead of everything not yet
///    delivered, so the new consumer receives each key's remainder in
///    publish order again.
/// 3. Among the deliveries marked redelivered, each key's order holds
///    (strictly increasing sequence numbers): they are that remainder, run
///    one at a time in arrival order.
/// 4. Per key, the sequence of every handling goes back at most once (at
///    the close): a message handled before it whose acknowledgement did not
///    reach the broker is handled again, and its successors after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_queue_whose_connection_the_broker_closes_loses_nothing_and_keeps_each_keys_order_among_first_handlings_and_redeliveries(
) {
    const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
    const PER_KEY: usize = 50;
    let q = unique("ordered-close");
    let name = format!("acemq-test-{q}");
    let _cleanup = crate::support::QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let mut queue = QueueConfig::new(q.clone());
    queue.prefetch = 20;
    queue.concurrency = 4;
    queue.ordered_by = Some(OrderedBy::Header("x-key".into()));
    let mut config = Config::new([queue]);
    config.shutdown_timeout = Duration::from_secs(10);
    let seen = Arc::new(Mutex::new(Handled::default()));
    let log = seen.clone();
    let total = KEYS.len() * PER_KEY;
    // Once a quarter is done, new calls wait until the close has been
    // asked for, so it comes mid-run however slow rabbitmqctl is.
    let (release, released) = tokio::sync::watch::channel(false);
    let handler = tower::service_fn(move |d: Delivery| {
        let log = log.clone();
        let mut released = released.clone();
        async move {
            let body = String::from_utf8_lossy(d.body()).into_owned();
            let (key, n) = body.split_once('/').expect("key/n");
            let n: usize = n.parse().expect("a number");
            log.lock()
                .unwrap()
                .starts
                .push((key.to_owned(), n, d.redelivered()));
            if log.lock().unwrap().done.len() >= total / 4 {
                tokio::select! {
                    _ = released.wait_for(|r| *r) => {}
                    () = d.token().cancelled() => return Err::<(), BoxError>("cancelled".into()),
                }
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(15)) => {}
                () = d.token().cancelled() => return Err::<(), BoxError>("cancelled".into()),
            }
            log.lock().unwrap().done.push((key.to_owned(), n));
            Ok(())
        }
    });
    let app = App::new(config)
        .connection_name(name.clone())
        .consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts");
    let mut bodies = Vec::new();
    for n in 0..PER_KEY {
        for k in KEYS {
            bodies.push((k, format!("{k}/{n}")));
        }
    }
    for (k, body) in &bodies {
        let headers = field_table(vec![("x-key", long_str(k))]);
        broker.publish(&q, body.as_bytes(), headers).await;
    }
    assert!(
        eventually(Duration::from_secs(20), || async {
            seen.lock().unwrap().done.len() >= total / 4
        })
        .await,
        "a quarter handled before the close"
    );
    let done_at_close = seen.lock().unwrap().done.len();
    crate::support::close_connection_named(&name, "acemq test: closed mid-run").await;
    // The loss cancels the handlers waiting for `release` and drops their
    // outcomes as orphans (their deliveries went back with the channel).
    // Readiness goes off too, but the first reconnect is at once and can be
    // back before `rabbitmqctl` has returned: not a state to wait for.
    assert!(
        eventually(Duration::from_secs(10), || async {
            !health.is_ready() || health.snapshot().queues.iter().any(|q| q.orphaned > 0)
        })
        .await,
        "the runner noticed the lost connection: {:?}",
        health.snapshot()
    );
    release.send_replace(true);
    let all_done = || {
        let s = seen.lock().unwrap();
        let distinct: std::collections::HashSet<_> = s.done.iter().collect();
        distinct.len() == total
    };
    assert!(
        eventually(Duration::from_secs(60), || async { all_done() }).await,
        "every message handled after the reconnect: {} of {total}; {:?}",
        seen.lock().unwrap().done.len(),
        health.snapshot()
    );
    running.drain().await.expect("a clean drain");
    assert_eq!(broker.ready(&q).await, Some(0), "nothing left in the queue");

    let s = std::mem::take(&mut *seen.lock().unwrap());
    let redelivered = s.starts.iter().filter(|(_, _, r)| *r).count();
    let again = s.done.len() - total;
    eprintln!(
        "--- ordered close: {done_at_close} of {total} done at the close; {} calls in all, \
         {redelivered} of redelivered deliveries, {again} messages whose work was done twice",
        s.starts.len()
    );
    assert!(
        redelivered > 0,
        "the close came mid-run: some deliveries were redelivered"
    );
    // 2. First handlings in publish order.
    let mut first = std::collections::HashSet::new();
    let firsts = per_key(
        s.starts
            .iter()
            .filter(|(k, n, _)| first.insert((k.clone(), *n)))
            .map(|(k, n, _)| (k.as_str(), *n)),
    );
    for k in KEYS {
        assert_eq!(
            firsts[k],
            (0..PER_KEY).collect::<Vec<_>>(),
            "{k}: first handlings in publish order"
        );
    }
    // 3. Redeliveries in order.
    let redeliveries = per_key(
        s.starts
            .iter()
            .filter(|(_, _, r)| *r)
            .map(|(k, n, _)| (k.as_str(), *n)),
    );
    for (k, ns) in &redeliveries {
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "{k}: redelivered messages in publish order: {ns:?}"
        );
    }
    // 4. Every handling: at most one step back per key.
    let all = per_key(s.starts.iter().map(|(k, n, _)| (k.as_str(), *n)));
    for (k, ns) in &all {
        let back = ns.windows(2).filter(|w| w[1] <= w[0]).count();
        assert!(
            back <= 1,
            "{k}: goes back at most once, at the close: {ns:?}"
        );
    }
    broker.delete(&all_queues(&q)).await;
}

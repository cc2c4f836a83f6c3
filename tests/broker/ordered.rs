//! Per-key ordering from config against the real broker: `ordered_by:
//! { header: x-customer }` runs each customer's orders one at a time in
//! publish order, the customers side by side.

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

//! The partition layer in memory, under tokio's paused clock: per-key order,
//! no two deliveries of one key at once, the other keys beside a hot one,
//! a drain in the middle, and the bounds.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder, ServiceExt};

use super::{OrderedBy, PartitionLayer};
use crate::{ClaimLayer, Decision, Delivery, Headers, InFlightCounter, Lifeline, Value};

const CONCURRENCY: usize = 8;

/// What the handler saw.
#[derive(Default)]
struct Log {
    /// (key, seq, start, end) of every handler that ran.
    runs: Vec<(String, usize, Instant, Instant)>,
    running: HashMap<String, usize>,
    overlaps: usize,
    now: usize,
    max: usize,
    /// The seqs running now.
    live: std::collections::BTreeSet<usize>,
}

fn delivery(key: &str, seq: usize, lifeline: &Lifeline) -> Delivery {
    let mut headers = Headers::new();
    headers.insert("k", Value::String(key.as_bytes().to_vec()));
    Delivery::builder()
        .queue("q")
        .headers(headers)
        .body(seq.to_string())
        .lifeline(lifeline.clone())
        .build()
}

fn key_of(d: &Delivery) -> String {
    String::from_utf8_lossy(match d.headers().get("k") {
        Some(Value::String(b)) => b,
        _ => unreachable!(),
    })
    .into_owned()
}

/// Partition by header `k` over a claim with `CONCURRENCY` permits over a
/// handler that runs `work(seq)` long.
fn stack(
    log: Arc<Mutex<Log>>,
    work: fn(usize) -> Duration,
    layer: PartitionLayer<OrderedBy>,
) -> impl Service<Delivery, Response = Decision, Error = Infallible, Future: Send> + Clone + Send {
    ServiceBuilder::new()
        .layer(layer)
        .layer(
            ClaimLayer::new(InFlightCounter::new())
                .concurrency(Arc::new(Semaphore::new(CONCURRENCY))),
        )
        .service_fn(move |d: Delivery| {
            let log = log.clone();
            async move {
                let key = key_of(&d);
                let seq: usize = std::str::from_utf8(d.body()).unwrap().parse().unwrap();
                let start = Instant::now();
                {
                    let mut l = log.lock().unwrap();
                    let r = l.running.entry(key.clone()).or_default();
                    *r += 1;
                    if *r > 1 {
                        l.overlaps += 1;
                    }
                    l.now += 1;
                    l.max = l.max.max(l.now);
                    l.live.insert(seq);
                }
                tokio::time::sleep(work(seq)).await;
                let mut l = log.lock().unwrap();
                *l.running.get_mut(&key).unwrap() -= 1;
                l.now -= 1;
                l.live.remove(&seq);
                l.runs.push((key, seq, start, Instant::now()));
                Ok::<_, Infallible>(Decision::Ack)
            }
        })
}

/// How a delivery ended for the transport.
#[derive(Debug, PartialEq)]
enum Fate {
    Handled,
    HandedBack,
}

/// What acemq's consumer loop does with each request: awaits it, and at a
/// drain hands it back if it is still held.
async fn transport<F>(fut: F, d: Delivery, drain: CancellationToken) -> Fate
where
    F: std::future::Future<Output = Result<Decision, Infallible>>,
{
    tokio::pin!(fut);
    tokio::select! {
        biased;
        r = &mut fut => return fate(r),
        () = drain.cancelled() => {}
    }
    if d.hand_back_if_held() {
        return Fate::HandedBack;
    }
    fate(fut.await)
}

fn fate(r: Result<Decision, Infallible>) -> Fate {
    match r {
        Ok(Decision::Ack) => Fate::Handled,
        Ok(Decision::HandBack) => Fate::HandedBack,
        other => panic!("unexpected {other:?}"),
    }
}

/// A deterministic spread of `n` deliveries over keys: `hot` of every 2
/// on key "hot" if set, the rest over `keys` keys in a shuffled order.
fn keys(n: usize, keys: usize, hot: bool) -> Vec<String> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if hot && i % 2 == 0 {
                "hot".to_owned()
            } else {
                format!("k{}", x % keys as u64)
            }
        })
        .collect()
}

/// Feeds every delivery through `svc` as a transport does (ready, call,
/// spawn), until `drain` fires; returns each delivery's fate by seq.
async fn run<S>(
    mut svc: S,
    keys: &[String],
    lifeline: &Lifeline,
    drain: CancellationToken,
) -> Vec<Option<Fate>>
where
    S: Service<Delivery, Response = Decision, Error = Infallible>,
    S::Future: Send + 'static,
{
    let mut tasks = Vec::new();
    for (seq, key) in keys.iter().enumerate() {
        if drain.is_cancelled() {
            break;
        }
        let d = delivery(key, seq, lifeline);
        svc.ready().await.unwrap();
        let fut = svc.call(d.clone());
        tasks.push(tokio::spawn(transport(fut, d, drain.clone())));
    }
    let mut fates: Vec<Option<Fate>> = (0..keys.len()).map(|_| None).collect();
    for (seq, t) in tasks.into_iter().enumerate() {
        fates[seq] = Some(t.await.unwrap());
    }
    fates
}

/// Per key, handlers started in arrival order and never overlapped.
fn assert_ordered(log: &Log) {
    assert_eq!(log.overlaps, 0, "two deliveries of one key ran at once");
    let mut last: HashMap<&str, (usize, Instant)> = HashMap::new();
    let mut runs: Vec<_> = log.runs.iter().collect();
    runs.sort_by_key(|r| (r.2, r.1));
    for (key, seq, start, end) in runs {
        if let Some((prev, prev_end)) = last.get(key.as_str()) {
            assert!(seq > prev, "key {key}: delivery {seq} started after {prev}");
            assert!(
                start >= prev_end,
                "key {key}: {seq} started before {prev} ended"
            );
        }
        last.insert(key, (*seq, *end));
    }
}

fn large(layer: PartitionLayer<OrderedBy>) -> PartitionLayer<OrderedBy> {
    layer.max_waiting(1000).max_waiting_per_key(1000)
}

#[tokio::test(start_paused = true)]
async fn a_thousand_deliveries_over_fifty_keys_keep_each_keys_order_and_run_eight_at_once() {
    let log = Arc::new(Mutex::new(Log::default()));
    let layer = large(PartitionLayer::new(OrderedBy::header("k")));
    let svc = stack(
        log.clone(),
        |seq| Duration::from_millis(1 + (seq % 7) as u64),
        layer,
    );
    let keys = keys(1000, 50, false);
    let fates = run(svc, &keys, &Lifeline::new(), CancellationToken::new()).await;
    assert!(fates.iter().all(|f| f == &Some(Fate::Handled)));
    let log = log.lock().unwrap();
    assert_eq!(log.runs.len(), 1000, "each handled once");
    assert_ordered(&log);
    assert_eq!(
        log.max, CONCURRENCY,
        "different keys run up to the concurrency"
    );
}

#[tokio::test(start_paused = true)]
async fn with_half_the_deliveries_on_one_hot_key_the_other_keys_do_not_starve() {
    let log = Arc::new(Mutex::new(Log::default()));
    let layer = large(PartitionLayer::new(OrderedBy::header("k")));
    let svc = stack(log.clone(), |_| Duration::from_millis(10), layer);
    let keys = keys(1000, 49, true);
    let t0 = Instant::now();
    let fates = run(svc, &keys, &Lifeline::new(), CancellationToken::new()).await;
    assert!(fates.iter().all(|f| f == &Some(Fate::Handled)));
    let log = log.lock().unwrap();
    assert_ordered(&log);
    let mut hot_ends: Vec<Instant> = log
        .runs
        .iter()
        .filter(|r| r.0 == "hot")
        .map(|r| r.3)
        .collect();
    hot_ends.sort();
    assert_eq!(hot_ends.len(), 500);
    let others_done = log
        .runs
        .iter()
        .filter(|r| r.0 != "hot")
        .map(|r| r.3)
        .max()
        .unwrap();
    // The hot key runs one at a time (500 × 10 ms); the other 500 share the
    // other seven permits and are done long before it is.
    assert!(
        others_done < hot_ends[150],
        "the other keys finished at {:?}, the hot key's 150th at {:?}: waiting hot deliveries took the permits",
        others_done - t0,
        hot_ends[150] - t0
    );
    assert_eq!(log.max, CONCURRENCY);
}

#[tokio::test(start_paused = true)]
async fn a_drain_in_the_middle_hands_back_every_waiting_delivery_and_keeps_the_order_of_what_ran() {
    let log = Arc::new(Mutex::new(Log::default()));
    let layer = large(PartitionLayer::new(OrderedBy::header("k")));
    let waiting = layer.clone();
    let svc = stack(
        log.clone(),
        |seq| Duration::from_millis(3 + (seq % 5) as u64),
        layer,
    );
    let keys = keys(1000, 50, false);
    let lifeline = Lifeline::new();
    let drain = CancellationToken::new();
    let at = Arc::new(Mutex::new(None));
    let drainer = {
        let (lifeline, drain, at, log) = (lifeline.clone(), drain.clone(), at.clone(), log.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            // What acemq's drain does: what is held goes back.
            lifeline.hand_back_held();
            drain.cancel();
            *at.lock().unwrap() = Some((Instant::now(), log.lock().unwrap().live.clone()));
        })
    };
    let fates = run(svc, &keys, &lifeline, drain).await;
    drainer.await.unwrap();
    let (drained_at, running_then) = at.lock().unwrap().take().unwrap();
    let log = log.lock().unwrap();
    assert_ordered(&log);
    let handled = fates.iter().filter(|f| **f == Some(Fate::Handled)).count();
    let back = fates
        .iter()
        .filter(|f| **f == Some(Fate::HandedBack))
        .count();
    let never_called = fates.iter().filter(|f| f.is_none()).count();
    assert_eq!(handled, log.runs.len(), "what was handled ran once");
    assert_eq!(handled + back + never_called, 1000);
    assert!(back > 0, "deliveries waiting for their key went back");
    assert!(handled > 0);
    assert!(
        log.runs.iter().all(|r| r.2 <= drained_at),
        "no handler started after the drain"
    );
    assert!(!running_then.is_empty());
    for seq in running_then {
        assert_eq!(
            fates[seq],
            Some(Fate::Handled),
            "delivery {seq}, running at the drain, finished"
        );
    }
    assert_eq!(waiting.waiting(), 0, "no line is left");
}

#[tokio::test(start_paused = true)]
async fn a_full_line_makes_poll_ready_pending_until_the_key_moves() {
    let log = Arc::new(Mutex::new(Log::default()));
    let layer = PartitionLayer::new(OrderedBy::header("k")).max_waiting_per_key(2);
    let mut svc = stack(log.clone(), |_| Duration::from_millis(10), layer.clone());
    let lifeline = Lifeline::new();
    let mut running = Vec::new();
    for seq in 0..3 {
        svc.ready().await.unwrap();
        running.push(tokio::spawn(svc.call(delivery("a", seq, &lifeline))));
    }
    assert_eq!(layer.waiting(), 2);
    let mut ready = tokio_test_ready(&mut svc);
    assert!(!ready, "a full line takes nothing more in");
    tokio::time::sleep(Duration::from_millis(11)).await;
    ready = tokio_test_ready(&mut svc);
    assert!(ready, "the key moved: room again");
    for t in running {
        assert_eq!(t.await.unwrap().unwrap(), Decision::Ack);
    }
    assert_eq!(log.lock().unwrap().runs.len(), 3);
}

/// Whether `svc` is ready now (one poll).
fn tokio_test_ready<S: Service<Delivery>>(svc: &mut S) -> bool {
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    matches!(svc.poll_ready(&mut cx), std::task::Poll::Ready(Ok(())))
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_after_its_turn_came_passes_the_key_on() {
    let log = Arc::new(Mutex::new(Log::default()));
    let layer = PartitionLayer::new(OrderedBy::header("k"));
    let mut svc = stack(log.clone(), |_| Duration::from_millis(10), layer.clone());
    let lifeline = Lifeline::new();
    svc.ready().await.unwrap();
    let first = tokio::spawn(svc.call(delivery("a", 0, &lifeline)));
    svc.ready().await.unwrap();
    let second = svc.call(delivery("a", 1, &lifeline));
    svc.ready().await.unwrap();
    let third = tokio::spawn(svc.call(delivery("a", 2, &lifeline)));
    first.await.unwrap().unwrap();
    // The key has passed to `second`, which is never polled again.
    drop(second);
    assert_eq!(third.await.unwrap().unwrap(), Decision::Ack);
    let seqs: Vec<usize> = log.lock().unwrap().runs.iter().map(|r| r.1).collect();
    assert_eq!(seqs, [0, 2]);
    assert_eq!(layer.waiting(), 0);
}

#[test]
fn ready_made_keys_read_the_header_routing_key_and_message_id() {
    use super::{key_hash, Key};
    let mut headers = Headers::new();
    headers.insert("x-customer", Value::String(b"ada".to_vec()));
    headers.insert("n", 7i64);
    let d = Delivery::builder()
        .headers(headers)
        .routing_key("orders.eu")
        .properties(crate::Properties {
            message_id: Some("m-1".into()),
            ..Default::default()
        })
        .build();
    assert_eq!(
        OrderedBy::header("x-customer").key(&d),
        Some(key_hash(&b"ada"[..]))
    );
    assert_eq!(OrderedBy::header("n").key(&d), Some(key_hash(&7i64)));
    assert_eq!(OrderedBy::header("absent").key(&d), None);
    assert_eq!(OrderedBy::RoutingKey.key(&d), Some(key_hash("orders.eu")));
    assert_eq!(OrderedBy::MessageId.key(&d), Some(key_hash("m-1")));
    assert_eq!(OrderedBy::MessageId.key(&Delivery::builder().build()), None);
}

#[tokio::test]
async fn keys_sharing_a_slot_keep_their_order_and_the_slot_comes_back_free() {
    // 1 and 257 share a slot of the lock-free path (256 slots): the second
    // goes to the locked table, and the first with it.
    let layer = PartitionLayer::new(|d: &Delivery| {
        Some(u64::from_le_bytes(d.body()[..8].try_into().unwrap()))
    });
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service_fn(|_: Delivery| async { Ok::<_, Infallible>(()) });
    let keyed = |k: u64| Delivery::builder().body(k.to_le_bytes().to_vec()).build();
    let one = svc.ready().await.unwrap().call(keyed(1));
    assert_eq!(svc.keys_and_locked_slots(), (1, 0), "a free key: no lock");
    let other = svc.ready().await.unwrap().call(keyed(257));
    assert_eq!(svc.keys_and_locked_slots(), (2, 1), "a shared slot: locked");
    let one_again = svc.ready().await.unwrap().call(keyed(1));
    tokio::pin!(one_again);
    assert!(futures::poll!(one_again.as_mut()).is_pending());
    assert_eq!(layer.waiting(), 1);
    one.await.unwrap();
    one_again.await.unwrap();
    assert_eq!(svc.keys_and_locked_slots(), (1, 1), "257 still runs");
    other.await.unwrap();
    assert_eq!(
        svc.keys_and_locked_slots(),
        (0, 0),
        "the slot is free again"
    );
    let again = svc.ready().await.unwrap().call(keyed(1));
    assert_eq!(
        svc.keys_and_locked_slots(),
        (1, 0),
        "the lock-free path again"
    );
    again.await.unwrap();
}

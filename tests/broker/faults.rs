//! Faults on one connection or process, reproduced against the broker: a
//! lost connection with a full prefetch buffer, work of a lost connection
//! published on the new one, a queue deleted under its consumer, a loop
//! killed by a panic outside `call`, signals during start-up and other
//! signals, a drain whose `basic.cancel` hangs, and the shop's small faults
//! (plural, connection name).
//!
//! Connection faults go through a [`Proxy`] of the test's own (cut, stall):
//! no other test's connection is touched. Every queue is deleted by a drop
//! guard, also when a test fails half-way.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use acemq::config::QueueConfig;
use acemq::{App, BoxError, Config, Delivery, Health, Reject};
use lapin::options::BasicPublishOptions;
use lapin::types::FieldTable;
use lapin::BasicProperties;
use tracing_subscriber::layer::SubscriberExt;

use crate::proxy::Proxy;
use crate::support::{
    all_queues, eventually, queue_counts, shop_binary, unique, Broker, CapturedLogs, QueueCleanup,
    ShopProcess,
};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// Publishes `n` messages to `q`, message ids `{prefix}{i}`, pipelined, and
/// waits for every confirm.
async fn publish_with_ids(broker: &mut Broker, q: &str, prefix: &str, n: usize) {
    let mut confirms = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("{prefix}{i}");
        confirms.push(
            broker
                .ch
                .basic_publish(
                    "".into(),
                    q.into(),
                    BasicPublishOptions::default(),
                    id.as_bytes(),
                    BasicProperties::default().with_message_id(id.as_str().into()),
                )
                .await
                .expect("publish"),
        );
    }
    for c in confirms {
        c.await.expect("confirm");
    }
}

fn message_id(d: &Delivery) -> String {
    d.properties()
        .message_id
        .clone()
        .unwrap_or_else(|| String::from_utf8_lossy(d.body()).into_owned())
}

/// Samples `health` on a thread of its own every 250 µs until dropped:
/// whether readiness was ever seen false, and the most handlers in flight
/// seen on any queue.
struct HealthSampler {
    stop: Arc<AtomicBool>,
    saw_not_ready: Arc<AtomicBool>,
    max_in_flight: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HealthSampler {
    fn start(health: Health) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let saw_not_ready = Arc::new(AtomicBool::new(false));
        let max_in_flight = Arc::new(AtomicUsize::new(0));
        let (s, n, m) = (stop.clone(), saw_not_ready.clone(), max_in_flight.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let snap = health.snapshot();
                if !snap.ready {
                    n.store(true, Ordering::SeqCst);
                }
                for q in &snap.queues {
                    m.fetch_max(q.in_flight, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_micros(250));
            }
        });
        HealthSampler {
            stop,
            saw_not_ready,
            max_in_flight,
            thread: Some(thread),
        }
    }

    fn saw_not_ready(&self) -> bool {
        self.saw_not_ready.load(Ordering::SeqCst)
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }
}

impl Drop for HealthSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---- Item 1: a lost connection keeps starting work from its dead buffer.

/// What the counting handler saw: starts per message id, the ids that
/// finished, and how many handlers ran at once (now and at most).
#[derive(Default)]
struct Starts {
    per_id: Mutex<HashMap<String, usize>>,
    finished: Mutex<HashSet<String>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
    last_start: Mutex<Option<Instant>>,
}

impl Starts {
    fn total(&self) -> usize {
        self.per_id.lock().unwrap().values().sum()
    }

    fn finished(&self) -> usize {
        self.finished.lock().unwrap().len()
    }

    fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    fn since_last_start(&self) -> Duration {
        self.last_start
            .lock()
            .unwrap()
            .map_or(Duration::MAX, |t| t.elapsed())
    }

    /// Starts beyond the first, in all, and the ids started more than once.
    fn duplicates(&self) -> (usize, Vec<(String, usize)>) {
        let per_id = self.per_id.lock().unwrap();
        let mut twice: Vec<(String, usize)> = per_id
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, n)| (id.clone(), *n))
            .collect();
        twice.sort();
        (per_id.values().map(|n| n - 1).sum(), twice)
    }
}

/// Decrements the running count when a handler ends, returns or is dropped.
struct Running(Arc<Starts>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_with_a_full_prefetch_buffer_starts_no_more_work_from_it_and_concurrency_holds_across_generations(
) {
    const CONCURRENCY: usize = 2;
    const MESSAGES: usize = 40;
    const PREFETCH: usize = 20;
    let q = unique("faults-buffer");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let proxy = Proxy::start().await;
    let starts = Arc::new(Starts::default());
    let s = starts.clone();
    let handler = tower::service_fn(move |d: Delivery| {
        let s = s.clone();
        async move {
            let id = message_id(&d);
            *s.per_id.lock().unwrap().entry(id.clone()).or_default() += 1;
            *s.last_start.lock().unwrap() = Some(Instant::now());
            let now = s.running.fetch_add(1, Ordering::SeqCst) + 1;
            s.max_running.fetch_max(now, Ordering::SeqCst);
            let _running = Running(s.clone());
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                () = d.token().cancelled() => return Err::<(), BoxError>("cancelled".into()),
            }
            s.finished.lock().unwrap().insert(id);
            Ok(())
        }
    });
    let mut queue = QueueConfig::new(q.clone());
    queue.prefetch = PREFETCH as u16;
    queue.concurrency = CONCURRENCY;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    let app = App::new(config)
        .amqp_addr(proxy.amqp_addr())
        .connection_name(format!("acemq-test-{q}"))
        .consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts through the proxy");
    let sampler = HealthSampler::start(health.clone());
    publish_with_ids(&mut broker, &q, "m", MESSAGES).await;

    // Mid-flow: two handlers running, a full buffer behind them (the broker
    // still holds the rest, so prefetch is the limit). Cut within 100 ms of a
    // start, so no handler is about to finish (its ack in flight would be
    // one duplicate more: the bound is the handlers running at the cut), and
    // once the broker has every finished handler's ack: it has sent one
    // delivery more per ack, so it holds MESSAGES - PREFETCH - finished.
    // (Acks are held up to ack_batch's delay, 2 ms: a cut inside that would
    // redeliver a finished message, which at-least-once allows but this
    // bound does not count.)
    let deadline = Instant::now() + SECS(15);
    let ready_at_cut = loop {
        assert!(
            Instant::now() < deadline,
            "two handlers running after the first finished, their acks received by the broker"
        );
        let finished = starts.finished();
        if finished >= 2
            && starts.running() == CONCURRENCY
            && starts.since_last_start() < Duration::from_millis(100)
        {
            let ready = broker.ready(&q).await.unwrap_or(0) as usize;
            if ready + PREFETCH + finished == MESSAGES
                && starts.finished() == finished
                && starts.since_last_start() < Duration::from_millis(100)
            {
                break ready;
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let running_at_cut = starts.running();
    let started_at_cut = starts.total();
    proxy.cut();
    assert!(
        ready_at_cut > 0,
        "the buffer was full at the cut (the broker still held {ready_at_cut})"
    );
    assert!(
        eventually(SECS(10), || async { !health.is_ready() }).await,
        "readiness goes false once the connection is lost"
    );
    proxy.restore();
    assert!(
        eventually(SECS(20), || async { health.is_ready() }).await,
        "reconnected"
    );
    assert!(
        eventually(SECS(60), || async { starts.finished() == MESSAGES }).await,
        "every message handled after the reconnect: {} of {MESSAGES}",
        starts.finished()
    );
    let report = running.drain().await.expect("a clean drain");
    let (duplicates, twice) = starts.duplicates();
    let max_running = starts.max_running.load(Ordering::SeqCst);
    let max_in_flight = sampler.max_in_flight();
    drop(sampler);
    eprintln!(
        "--- at the cut: {running_at_cut} running, {started_at_cut} started, {ready_at_cut} still in the broker; \
         duplicate starts {duplicates} ({twice:?}); most handlers at once {max_running}, \
         most in_flight in the health snapshot {max_in_flight}; {report:?}"
    );
    assert!(
        duplicates <= CONCURRENCY && max_running <= CONCURRENCY && max_in_flight <= CONCURRENCY,
        "starts per id: {duplicates} duplicate starts, bound {CONCURRENCY} (the handlers running at the cut: \
         {running_at_cut}); concurrency {CONCURRENCY} across generations: at most {max_running} handlers ran at \
         once (health snapshot in_flight at most {max_in_flight}); started more than once: {twice:?}"
    );
    assert_eq!(broker.ready(&q).await, Some(0), "everything settled");
    broker.delete(&all_queues(&q)).await;
}

// ---- Item 2: work from a lost connection is published on the new one.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_from_a_handler_of_a_lost_connection_is_dropped_so_the_dead_letter_queue_holds_only_the_redelivered_attempts_copy(
) {
    let q = unique("faults-orphan");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let dlq = format!("{q}.dlq");
    let mut broker = Broker::new().await;
    let proxy = Proxy::start().await;
    let calls = Arc::new(Mutex::new(Vec::<bool>::new()));
    let returned = Arc::new(AtomicUsize::new(0));
    let reconnected = Arc::new(AtomicBool::new(false));
    let (c, r, rc) = (calls.clone(), returned.clone(), reconnected.clone());
    let handler = tower::service_fn(move |d: Delivery| {
        let (c, r, rc) = (c.clone(), r.clone(), rc.clone());
        async move {
            c.lock().unwrap().push(d.redelivered());
            if !d.redelivered() {
                // The first attempt: sleeps 1 s (the connection is cut
                // meanwhile), and returns once the runner has reconnected,
                // so its outcome meets a live new connection.
                tokio::time::sleep(SECS(1)).await;
                let end = Instant::now() + SECS(20);
                while !rc.load(Ordering::SeqCst) && Instant::now() < end {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            r.fetch_add(1, Ordering::SeqCst);
            Err::<(), BoxError>(Reject::new("not an order").into())
        }
    });
    let mut queue = QueueConfig::new(q.clone());
    queue.dead_letter = true;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    let app = App::new(config)
        .amqp_addr(proxy.amqp_addr())
        .consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts through the proxy");
    cut_once_the_first_attempt_runs(&mut broker, &proxy, &health, &q, "o-orphan", || {
        calls.lock().unwrap().len() == 1
    })
    .await;
    proxy.restore();
    assert!(
        eventually(SECS(20), || async { health.is_ready() }).await,
        "reconnected"
    );
    reconnected.store(true, Ordering::SeqCst);
    // The broker redelivers the message; that attempt rejects too.
    assert!(
        eventually(SECS(30), || async {
            calls.lock().unwrap().contains(&true) && returned.load(Ordering::SeqCst) >= 1
        })
        .await,
        "the redelivered attempt ran: {:?}",
        calls.lock().unwrap()
    );
    // The first attempt returns at once (reconnected), or was cancelled and
    // abandoned by the fix: wait for the copy of the redelivered attempt, then
    // (bounded) for a second copy that must not come.
    assert!(
        broker.wait_ready(&dlq, 1, SECS(10)).await || broker.ready(&dlq).await.unwrap_or(0) > 1,
        "the redelivered attempt's copy reached {dlq}: {:?} there",
        broker.ready(&dlq).await
    );
    let _ = eventually(SECS(3), || async { returned.load(Ordering::SeqCst) == 2 }).await;
    let second_copy = broker.wait_ready(&dlq, 2, SECS(3)).await;
    let copies = broker.ready(&dlq).await;
    eprintln!(
        "calls (redelivered?): {:?}; handlers returned {}; copies in {dlq}: {copies:?}",
        calls.lock().unwrap(),
        returned.load(Ordering::SeqCst)
    );
    let _ = tokio::time::timeout(SECS(15), running.drain()).await;
    assert!(
        !second_copy && copies == Some(1),
        "{dlq} holds {copies:?} copies, expected exactly 1 (the redelivered attempt's): \
         the first attempt's Reject, from the lost connection, was dead-lettered through the new one"
    );
    broker.delete(&all_queues(&q)).await;
}

/// Publishes one order (message id `id`) to `q`, waits until its first
/// attempt runs (`started`), then cuts the proxy and waits until readiness
/// is off: a connection lost under a running handler.
async fn cut_once_the_first_attempt_runs(
    broker: &mut Broker,
    proxy: &Proxy,
    health: &Health,
    q: &str,
    id: &str,
    started: impl Fn() -> bool,
) {
    broker
        .publish_props(
            q,
            b"order",
            BasicProperties::default().with_message_id(id.into()),
        )
        .await;
    assert!(
        eventually(SECS(10), || async { started() }).await,
        "the first attempt started"
    );
    proxy.cut();
    assert!(
        eventually(SECS(10), || async { !health.is_ready() }).await,
        "readiness goes false once the connection is lost"
    );
}

/// Sets its flag when dropped: shows the handler's future was dropped.
struct DroppedFlag(Arc<AtomicBool>);

impl Drop for DroppedFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_ignores_its_token_on_a_lost_connection_is_abandoned_and_its_message_handled_again(
) {
    let q = unique("faults-abandon-lost");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let proxy = Proxy::start().await;
    let attempts = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let (a, f) = (attempts.clone(), dropped.clone());
    let handler = tower::service_fn(move |_d: Delivery| {
        let first = a.fetch_add(1, Ordering::SeqCst) == 0;
        let flag = DroppedFlag(f.clone());
        async move {
            let _flag = flag;
            if first {
                // Ignores its token and never wakes on its own: only the
                // loop's wake at the loss lets the cancel layer abandon it.
                std::future::pending::<()>().await;
            }
            Ok::<(), BoxError>(())
        }
    });
    let mut queue = QueueConfig::new(q.clone());
    queue.prefetch = 1;
    queue.concurrency = 1;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    config.abandon_after = Duration::from_millis(500);
    let app = App::new(config)
        .amqp_addr(proxy.amqp_addr())
        .consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts through the proxy");
    cut_once_the_first_attempt_runs(&mut broker, &proxy, &health, &q, "o-ignores", || {
        attempts.load(Ordering::SeqCst) == 1 && !dropped.load(Ordering::SeqCst)
    })
    .await;
    let lost_at = Instant::now();
    assert!(
        eventually(SECS(10), || async { dropped.load(Ordering::SeqCst) }).await,
        "the handler that ignores its token is abandoned (its future dropped) after the loss"
    );
    let took = lost_at.elapsed();
    proxy.restore();
    assert!(
        eventually(SECS(30), || async { attempts.load(Ordering::SeqCst) >= 2 }).await,
        "the broker redelivered the message to the new connection"
    );
    assert!(
        eventually(SECS(10), || async {
            health.snapshot().queues[0].orphaned >= 1
        })
        .await,
        "the abandoned attempt's outcome was dropped as an orphan: {:?}",
        health.snapshot().queues[0]
    );
    let report = running.drain().await.expect("a clean drain");
    eprintln!("abandoned {took:?} after the loss was seen; {report:?}");
    assert_eq!(broker.ready(&q).await, Some(0), "everything settled");
    broker.delete(&all_queues(&q)).await;
}

// ---- Item 3: a queue deleted under its consumer is never consumed again.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_while_consumed_is_declared_again_and_consumed_within_fifteen_seconds() {
    let q = unique("faults-deleted");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let s = seen.clone();
    let handler = tower::service_fn(move |d: Delivery| {
        let s = s.clone();
        async move {
            s.lock().unwrap().push(message_id(&d));
            Ok::<(), BoxError>(())
        }
    });
    let mut queue = QueueConfig::new(q.clone());
    queue.dead_letter = true;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    let app = App::new(config).consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts");
    publish_with_ids(&mut broker, &q, "before-", 1).await;
    assert!(
        eventually(SECS(10), || async { seen.lock().unwrap().len() == 1 }).await,
        "handled before the queue is deleted"
    );

    broker.delete(std::slice::from_ref(&q)).await;
    let t0 = Instant::now();
    // (A passive declare of a missing queue closes the helper's channel; it
    // reopens the next.)
    let mut back = false;
    while t0.elapsed() < SECS(15) {
        if broker.ready(&q).await.is_some() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let declared_after = t0.elapsed();
    let ready = eventually(SECS(15).saturating_sub(t0.elapsed()), || async {
        health.is_ready()
    })
    .await;
    let consumers = broker.consumers(&q).await;
    let mut handled_after = false;
    if back {
        publish_with_ids(&mut broker, &q, "after-", 1).await;
        handled_after = eventually(SECS(10), || async {
            seen.lock().unwrap().iter().any(|id| id == "after-0")
        })
        .await;
    }
    eprintln!(
        "{q} declared again: {back} ({declared_after:?}); ready again: {ready}; consumers: {consumers:?}; \
         handled after: {handled_after}; snapshot: {:?}",
        health.snapshot()
    );
    let _ = tokio::time::timeout(SECS(15), running.drain()).await;
    assert!(
        back && ready && consumers == Some(1) && handled_after,
        "within 15 s of the deletion the queue must exist again (it does: {back}), readiness be back on ({ready}), \
         one consumer on it ({consumers:?}) and a new message be handled ({handled_after})"
    );
    broker.delete(&all_queues(&q)).await;
}

// ---- Item 4: a panic outside `call` kills a queue silently.

/// A handler whose `poll_ready` panics on its third call (counted across
/// every clone, so a rebuilt stack's calls are the fourth and later).
#[derive(Clone)]
struct PanicsOnThirdPollReady {
    polls: Arc<AtomicUsize>,
    handled: Arc<Mutex<Vec<String>>>,
}

impl tower::Service<Delivery> for PanicsOnThirdPollReady {
    type Response = ();
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.polls.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
            panic!("poll_ready bug: the third call panics");
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, d: Delivery) -> Self::Future {
        let handled = self.handled.clone();
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            handled.lock().unwrap().push(message_id(&d));
            Ok(())
        })
    }
}

// current_thread: the runner's tasks log to this thread's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_handler_whose_poll_ready_panics_is_noticed_logged_and_its_queue_restarted_with_nothing_left_unacked(
) {
    const MESSAGES: usize = 6;
    let logs = CapturedLogs::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
    let q = unique("faults-pollready");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let handler = PanicsOnThirdPollReady {
        polls: Arc::new(AtomicUsize::new(0)),
        handled: Arc::new(Mutex::new(Vec::new())),
    };
    let (polls, handled) = (handler.polls.clone(), handler.handled.clone());
    let mut queue = QueueConfig::new(q.clone());
    queue.prefetch = 10;
    queue.concurrency = 1;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = SECS(10);
    let app = App::new(config).consume(&q, handler);
    let health = app.health();
    let running = app.start().await.expect("starts");
    let sampler = HealthSampler::start(health.clone());
    publish_with_ids(&mut broker, &q, "m", MESSAGES).await;
    assert!(
        eventually(SECS(10), || async { polls.load(Ordering::SeqCst) >= 3 }).await,
        "poll_ready was called three times"
    );
    let all_handled = eventually(SECS(20), || async {
        handled.lock().unwrap().iter().collect::<HashSet<_>>().len() == MESSAGES
    })
    .await;
    let counts_ok = eventually(SECS(15), || async {
        queue_counts(&q).await == Some((0, 0))
    })
    .await;
    let counts = queue_counts(&q).await;
    let saw_not_ready = sampler.saw_not_ready();
    drop(sampler);
    let logged = logs
        .acemq_at_least(tracing::Level::ERROR)
        .into_iter()
        .any(|(_, _, text)| text.contains("poll_ready bug"));
    let ready_now = health.is_ready();
    let report = format!(
        "poll_ready calls {}; handled {:?} of {MESSAGES}; rabbitmqctl (ready, unacked): {counts:?}; \
         readiness seen false: {saw_not_ready}; ready now: {ready_now}; an acemq error names the panic: {logged}",
        polls.load(Ordering::SeqCst),
        handled.lock().unwrap()
    );
    eprintln!("{report}");
    let _ = tokio::time::timeout(SECS(15), running.drain()).await;
    assert!(
        saw_not_ready && logged && all_handled && counts_ok && ready_now,
        "a loop killed by a panic in poll_ready must be noticed (readiness off, an error naming the panic), \
         its queue restarted (every message handled, ready again) and nothing left unacked: {report}"
    );
    broker.delete(&all_queues(&q)).await;
}

// ---- Item 6: signals during start-up, SIGHUP and SIGQUIT.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_connect_that_never_completes_ends_start_up_at_once_logged_with_exit_0() {
    // Accepts TCP connections (the kernel's backlog) but never speaks AMQP.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = format!("amqp://guest:guest@{}/%2f", silent.local_addr().unwrap());
    let q = unique("faults-startterm");
    shop_binary(); // built before the clock starts
    let t_spawn = Instant::now();
    let mut shop = ShopProcess::spawn(
        &q,
        &format!("connect_timeout: 10\nqueues:\n  - name: {q}\n"),
        &[("AMQP_ADDR", &addr)],
    );
    shop.wait_stderr("connecting", SECS(10)).await;
    // The signal 2 s after start, while the connect hangs.
    tokio::time::sleep_until((t_spawn + SECS(2)).into()).await;
    shop.signal("-TERM");
    let t0 = Instant::now();
    let status = shop.exit_within(SECS(15)).await;
    let took = t0.elapsed();
    let stderr = shop.stderr();
    eprintln!("--- exit {status:?} {took:?} after SIGTERM; stderr:\n{stderr}");
    let logged = stderr
        .lines()
        .any(|l| l.to_lowercase().contains("signal") || l.contains("SIGTERM"));
    assert!(
        status.code() == Some(0) && took < SECS(1) && logged,
        "SIGTERM during the connect: exit {:?} {took:?} after the signal (expected 0 within 1 s), \
         a log line about the stop: {logged}; stderr:\n{stderr}",
        status.code()
    );
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_and_sigquit_drain_like_sigterm_and_exit_0() {
    use std::os::unix::process::ExitStatusExt;
    let mut broker = Broker::new().await;
    shop_binary();
    let mut shops = Vec::new();
    for sig in ["-HUP", "-QUIT"] {
        let q = unique("faults-hupquit");
        let cleanup = QueueCleanup::new(all_queues(&q));
        let shop = ShopProcess::spawn(
            &q,
            &format!("shutdown_timeout: 10\nqueues:\n  - name: {q}\n"),
            &[],
        );
        shops.push((sig, q, shop, cleanup));
    }
    for (_, q, shop, _) in &shops {
        shop.wait_ready().await;
        broker
            .publish(
                q,
                br#"{"id":"o-hup","work_ms":1000}"#,
                FieldTable::default(),
            )
            .await;
        shop.wait_in_flight(1).await;
    }
    let mut failures = Vec::new();
    for (sig, q, shop, _) in &mut shops {
        shop.signal(sig);
        let status = shop.exit_within(SECS(15)).await;
        let stderr = shop.stderr();
        let left = broker.ready(q).await;
        eprintln!(
            "--- {sig}: exit code {:?}, signal {:?}, {q} holds {left:?}",
            status.code(),
            status.signal()
        );
        if status.code() != Some(0)
            || !stderr.contains("drain started")
            || !stderr.contains("order handled")
            || left != Some(0)
        {
            failures.push(format!(
                "{sig}: exit code {:?} (killed by signal {:?}), expected a drain and exit 0 with the order handled; \
                 {q} holds {left:?}; stderr:\n{stderr}",
                status.code(),
                status.signal()
            ));
        }
    }
    for (_, q, _, _) in &shops {
        broker.delete(&all_queues(q)).await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// ---- Item 7: a second signal while `basic.cancel` hangs; drain honesty.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_while_basic_cancel_hangs_ends_the_drain_without_waiting_out_the_deadline()
{
    let q = unique("faults-cancelhang");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let proxy = Proxy::start().await;
    let mut shop = ShopProcess::spawn(
        &q,
        &format!(
            "shutdown_timeout: 60\nabandon_after: 1\nhost_timeout: 120\nqueues:\n  - name: {q}\n"
        ),
        &[("AMQP_ADDR", &proxy.amqp_addr())],
    );
    shop.wait_ready().await;
    broker
        .publish(
            q.as_str(),
            br#"{"id":"o-stalled","work_ms":60000}"#,
            FieldTable::default(),
        )
        .await;
    shop.wait_in_flight(1).await;

    // From now on nothing the shop sends reaches the broker, nor back:
    // its basic.cancel hangs.
    proxy.stall();
    shop.signal("-TERM");
    shop.wait_stderr("drain started", SECS(5)).await;
    let t0 = Instant::now();
    shop.signal("-TERM");
    // shutdown_timeout 60 s; abandon_after 1 s and the close bounds after
    // the second signal fit well within 15 s.
    let status = shop.exit_within(SECS(15)).await;
    let took = t0.elapsed();
    let stderr = shop.stderr();
    eprintln!("--- exit {status:?} {took:?} after the second SIGTERM");
    assert_eq!(
        status.code(),
        Some(75),
        "a second SIGTERM with the order in flight ends in a timeout of kind SecondSignal; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("second stop signal during the drain"),
        "stderr:\n{stderr}"
    );
    drop(proxy);
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_whose_consumer_never_answers_its_cancel_reports_a_timeout_naming_the_queue_not_success(
) {
    let q = unique("faults-stuckloop");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let proxy = Proxy::start().await;
    let mut config = Config::new([QueueConfig::new(q.clone())]);
    config.shutdown_timeout = SECS(2);
    config.abandon_after = SECS(1);
    let app = App::new(config).amqp_addr(proxy.amqp_addr()).consume(
        &q,
        tower::service_fn(|_d: Delivery| async { Ok::<(), BoxError>(()) }),
    );
    let health = app.health();
    let running = app.start().await.expect("starts through the proxy");
    assert!(health.is_ready());
    // Nothing in flight; the loop waits for a cancel-ok that never comes.
    proxy.stall();
    let t0 = Instant::now();
    let result = tokio::time::timeout(SECS(30), running.drain())
        .await
        .expect("the drain returns within 30 s");
    let took = t0.elapsed();
    eprintln!("--- the drain returned after {took:?}: {result:?}");
    drop(proxy);
    broker.delete(&all_queues(&q)).await;
    match result {
        Ok(report) => panic!(
            "the drain waited {took:?} for a loop stuck with nothing in flight and reported success: {report}"
        ),
        Err(timeout) => assert!(
            timeout.to_string().contains(&q),
            "the timeout names what it waited for ({q}): {timeout}"
        ),
    }
}

// ---- Item 10: plurals; connection names per process.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_line_of_one_buffered_delivery_says_1_delivery_was_fetched() {
    let q = unique("faults-plural");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let mut shop = ShopProcess::spawn(
        &q,
        &format!(
            "shutdown_timeout: 10\nqueues:\n  - name: {q}\n    prefetch: 20\n    concurrency: 1\n"
        ),
        &[],
    );
    shop.wait_ready().await;
    for i in 0..2 {
        broker
            .publish(
                &q,
                format!(r#"{{"id":"o-plural-{i}","work_ms":1500}}"#).as_bytes(),
                FieldTable::default(),
            )
            .await;
    }
    shop.wait_in_flight(1).await;
    assert!(
        broker.wait_ready(&q, 0, SECS(5)).await,
        "the broker sent the second order ahead"
    );
    shop.signal("-TERM");
    let status = shop.exit_within(SECS(15)).await;
    let stderr = shop.stderr();
    let line = stderr
        .lines()
        .find(|l| l.contains("fetched but never handled"))
        .unwrap_or("(no drain line about fetched deliveries)")
        .to_owned();
    eprintln!("--- {line}");
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(
        line.contains("1 delivery was fetched but never handled"),
        "one buffered delivery, in the singular: {line}"
    );
    assert!(
        broker.wait_ready(&q, 1, SECS(5)).await,
        "the buffered order is back"
    );
    broker.delete(&all_queues(&q)).await;
}

/// The client-provided connection name of every broker connection whose
/// `peer_port` is one of `ports` (`rabbitmqctl list_connections`).
async fn connection_names(ports: &[u16]) -> Vec<String> {
    crate::support::list_connections(&["peer_port", "client_properties"])
        .await
        .lines()
        .filter_map(|l| {
            let (port, props) = l.split_once('\t')?;
            if !ports.contains(&port.trim().parse().ok()?) {
                return None;
            }
            // ..."connection_name",longstr,<<"NAME">>... or ...,"NAME"...
            let rest = &props[props.find("connection_name\"")? + "connection_name\"".len()..];
            let start = rest.find('"')? + 1;
            let len = rest[start..].find('"')?;
            Some(rest[start..start + len].to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shops_connect_under_different_connection_names() {
    shop_binary();
    let mut shops = Vec::new();
    for _ in 0..2 {
        let q = unique("faults-names");
        let cleanup = QueueCleanup::new(all_queues(&q));
        // Each through a proxy of its own, so its connections can be told
        // apart from every other shop's on the broker (by peer port).
        let proxy = Proxy::start().await;
        let shop = ShopProcess::spawn(
            &q,
            &format!("queues:\n  - name: {q}\n"),
            &[("AMQP_ADDR", &proxy.amqp_addr())],
        );
        shops.push((q, proxy, shop, cleanup));
    }
    let mut names = Vec::new();
    for (_, proxy, shop, _) in &shops {
        shop.wait_ready().await;
        let ports = proxy.upstream_ports();
        let mut found = Vec::new();
        let end = Instant::now() + SECS(10);
        while found.is_empty() && Instant::now() < end {
            found = connection_names(&ports).await;
            if found.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        assert!(
            !found.is_empty(),
            "the broker lists the shop's connection (peer ports {ports:?})"
        );
        names.push(found);
    }
    eprintln!("--- connection names: {names:?}");
    for (_, _, shop, _) in &mut shops {
        shop.signal("-TERM");
        let _ = shop.exit_within(SECS(15)).await;
    }
    let mut broker = Broker::new().await;
    for (q, _, _, _) in &shops {
        broker.delete(&all_queues(q)).await;
    }
    let first: HashSet<&String> = names[0].iter().collect();
    assert!(
        names[1].iter().all(|n| !first.contains(n)),
        "two shop processes must not share a connection name (so an operator can tell them apart): {names:?}"
    );
}

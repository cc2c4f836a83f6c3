//! Reliability: a lost connection, a consumer cancelled by the broker, a
//! handler that always panics, secrets at trace level, bad configs, and a
//! second stop signal.
//!
//! Connection faults go through a [`Proxy`] of this test's own: only the
//! runner behind it loses its connection, never another test's (no
//! `close_all_connections`, no broker restart).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::config::QueueConfig;
use acemq::{App, BoxError, Config, Delivery, Headers, Health, Reject};
use bytes::Bytes;
use lapin::types::FieldTable;
use tower::service_fn;
use tracing_subscriber::layer::SubscriberExt;

use crate::proxy::Proxy;
use crate::support::{
    all_queues, eventually, message_headers, queue_counts, start_consuming, thread_cpu_time,
    unique, Broker, CapturedLogs, QueueCleanup, ShopProcess, TestHandler,
};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// What the recording handler saw: (body, redelivered) per call, in order,
/// and how many calls finished.
#[derive(Default)]
struct Seen {
    calls: Mutex<Vec<(Bytes, bool)>>,
    finished: AtomicUsize,
}

impl Seen {
    fn new() -> Arc<Self> {
        Arc::new(Seen::default())
    }

    fn calls(&self) -> Vec<(Bytes, bool)> {
        self.calls.lock().unwrap().clone()
    }

    fn saw(&self, body: &[u8]) -> bool {
        self.calls().iter().any(|(b, _)| &b[..] == body)
    }

    fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }
}

/// Records every call; a first delivery (not redelivered) of `hold` is held
/// for `hold_for` before it succeeds, everything else succeeds at once.
fn recording(seen: Arc<Seen>, hold_for: Duration) -> impl TestHandler {
    service_fn(move |d: Delivery| {
        let seen = seen.clone();
        async move {
            seen.calls
                .lock()
                .unwrap()
                .push((d.body().clone(), d.redelivered()));
            if &d.body()[..] == b"hold" && !d.redelivered() {
                tokio::time::sleep(hold_for).await;
            }
            if &d.body()[..] == b"reject" {
                return Err(Reject::new("not an order").into());
            }
            seen.finished.fetch_add(1, Ordering::SeqCst);
            Ok::<(), BoxError>(())
        }
    })
}

/// One queue with a dead-letter queue, `shutdown_timeout` as given.
fn dead_letter_config(q: &str, shutdown_timeout: Duration) -> Config {
    let mut queue = QueueConfig::new(q);
    queue.dead_letter = true;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = shutdown_timeout;
    config
}

/// Publishes a `hold` to `q` and waits until its handler has started.
async fn hold_one(broker: &mut Broker, q: &str, seen: &Seen) {
    broker.publish(q, b"hold", FieldTable::default()).await;
    assert!(
        eventually(SECS(10), || async { seen.calls().len() == 1 }).await,
        "the handler started"
    );
}

/// Cuts the runner behind `proxy` off the broker and waits until readiness
/// goes false.
async fn cut_off(proxy: &Proxy, health: &Health) {
    proxy.cut();
    assert!(
        eventually(SECS(10), || async { !health.is_ready() }).await,
        "readiness goes false once the connection is lost"
    );
    // Readiness goes false with the first of the two connections seen
    // lost (the publisher's, as often as not); the consumers' follows.
    assert!(
        eventually(SECS(10), || async { !health.snapshot().connected }).await,
        "the consumers' connection is seen lost: {:?}",
        health.snapshot()
    );
}

fn str_header<'a>(h: &'a Headers, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_turns_readiness_off_and_after_it_returns_the_topology_is_declared_again_and_consuming_resumes(
) {
    let q = unique("rel-reconnect");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let dlq = format!("{q}.dlq");
    let mut broker = Broker::new().await;
    let proxy = Proxy::start().await;
    let seen = Seen::new();
    let app = App::new(dead_letter_config(&q, SECS(10)))
        .amqp_addr(proxy.amqp_addr())
        .connection_name(format!("acemq-test-{q}"))
        .consume(&q, recording(seen.clone(), Duration::ZERO));
    let health = app.health();
    let running = app.start().await.expect("starts through the proxy");
    assert!(health.is_ready(), "ready once started");
    broker.publish(&q, b"before", FieldTable::default()).await;
    assert!(
        eventually(SECS(10), || async { seen.saw(b"before") }).await,
        "handled before the outage"
    );
    // And settled: an acknowledgement still on its way when the connection
    // drops is lost with it (a duplicate, counted in RELIABILITY.md), which
    // is not what this test is about.
    assert!(
        eventually(SECS(10), || async {
            queue_counts(&q).await == Some((0, 0))
        })
        .await,
        "acknowledged before the outage"
    );

    cut_off(&proxy, &health).await;
    assert!(!health.snapshot().connected, "{:?}", health.snapshot());
    // While the runner is cut off, delete part of its topology: the
    // reconnect must declare it again.
    broker.delete(std::slice::from_ref(&dlq)).await;
    assert_eq!(broker.ready(&dlq).await, None, "{dlq} is gone");
    // The outage lasts about a second; the reconnect attempts in it are refused.
    tokio::time::sleep(SECS(1)).await;
    assert!(
        !health.is_ready(),
        "not ready while the broker is unreachable"
    );
    let accepted_while_cut = proxy.accepted();

    proxy.restore();
    let t0 = Instant::now();
    assert!(
        eventually(SECS(20), || async { health.is_ready() }).await,
        "readiness comes back after the connection does"
    );
    eprintln!(
        "reconnected {:?} after restore; {} connection attempt(s) through the proxy before it",
        t0.elapsed(),
        accepted_while_cut
    );
    assert!(
        accepted_while_cut >= 2,
        "the runner tried to reconnect during the outage ({accepted_while_cut} connections in all)"
    );
    assert_eq!(
        broker.ready(&dlq).await,
        Some(0),
        "the topology was declared again: {dlq} exists"
    );
    let mut consumers = None;
    let end = Instant::now() + SECS(10);
    while Instant::now() < end {
        consumers = broker.consumers(&q).await;
        if consumers == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        consumers,
        Some(1),
        "exactly one consumer on {q} after the reconnect (the old one is gone)"
    );

    broker.publish(&q, b"after", FieldTable::default()).await;
    assert!(
        eventually(SECS(10), || async { seen.saw(b"after") }).await,
        "the consumer resumed: a message published after the reconnect is handled"
    );
    // The publisher moved to the new connection: dead-lettering works.
    broker.publish(&q, b"reject", FieldTable::default()).await;
    let m = broker
        .get_within(&dlq, SECS(10))
        .await
        .expect("a rejected message lands in the re-declared dead-letter queue");
    let h = message_headers(&m.delivery.properties);
    assert_eq!(str_header(&h, "x-acemq-reason"), Some("rejected"), "{h:?}");
    let report = running.drain().await.expect("a clean drain");
    assert_eq!(report.handed_back(), 0, "{report:?}");
    assert_eq!(broker.ready(&q).await, Some(0), "all settled");
    assert_eq!(seen.calls().len(), 3, "{:?}", seen.calls());
    broker.delete(&all_queues(&q)).await;
}

// current_thread: the runner's tasks log to this thread's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_handler_running_when_the_connection_drops_finishes_its_settle_is_skipped_and_the_broker_redelivers_its_message(
) {
    let logs = CapturedLogs::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
    let q = unique("rel-inflight");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let proxy = Proxy::start().await;
    let seen = Seen::new();
    let app = App::new(dead_letter_config(&q, SECS(10)))
        .amqp_addr(proxy.amqp_addr())
        .consume(&q, recording(seen.clone(), SECS(1)));
    let health = app.health();
    let running = app.start().await.expect("starts through the proxy");
    hold_one(&mut broker, &q, &seen).await;

    cut_off(&proxy, &health).await;
    assert_eq!(seen.finished(), 0, "the handler is still holding");
    // The handler finishes while the connection is down; its ack has no
    // channel to go to.
    assert!(
        eventually(SECS(5), || async { seen.finished() == 1 }).await,
        "the handler running when the connection dropped finished"
    );
    assert!(!health.is_ready(), "still cut off");

    proxy.restore();
    assert!(
        eventually(SECS(20), || async { health.is_ready() }).await,
        "reconnected"
    );
    assert!(
        eventually(SECS(10), || async { seen.finished() == 2 }).await,
        "the broker redelivered the message after the reconnect: {:?}",
        seen.calls()
    );
    let calls = seen.calls();
    assert_eq!(
        calls,
        vec![
            (Bytes::from_static(b"hold"), false),
            (Bytes::from_static(b"hold"), true)
        ],
        "handled once more, with redelivered set"
    );
    let report = running.drain().await.expect("a clean drain");
    assert_eq!(report.handed_back(), 0, "{report:?}");
    assert_eq!(
        broker.ready(&q).await,
        Some(0),
        "nothing left: the redelivered copy was acknowledged"
    );
    assert_eq!(broker.ready(&format!("{q}.dlq")).await, Some(0));
    broker.delete(&all_queues(&q)).await;

    let errors = logs.acemq_at_least(tracing::Level::ERROR);
    assert!(errors.is_empty(), "acemq logged errors: {errors:#?}");
    let lost = logs
        .acemq_at_least(tracing::Level::WARN)
        .into_iter()
        .any(|(_, _, text)| text.contains("connection to the broker was lost"));
    assert!(
        lost,
        "the loss was logged as a warning: {:#?}",
        logs.events()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_stays_on_after_a_reconnect_when_a_handler_of_the_old_connection_finishes_later()
{
    let q = unique("rel-late-old");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let proxy = Proxy::start().await;
    let seen = Seen::new();
    // Concurrency 1: with its one handler running, the old connection's loop
    // does not look at its (dead) stream until that handler returns, which is
    // after the new connection is installed.
    let mut config = dead_letter_config(&q, SECS(10));
    config.queues[0].concurrency = 1;
    let app = App::new(config)
        .amqp_addr(proxy.amqp_addr())
        .consume(&q, recording(seen.clone(), SECS(3)));
    let health = app.health();
    let running = app.start().await.expect("starts through the proxy");
    hold_one(&mut broker, &q, &seen).await;

    cut_off(&proxy, &health).await;
    proxy.restore();
    assert!(
        eventually(SECS(10), || async { health.is_ready() }).await,
        "reconnected while the old handler still holds"
    );
    // The redelivered copy may already be handled by the new consumer;
    // the old handler (3 s) is still holding.
    assert!(seen.finished() < 2, "the old handler is still holding");
    assert!(
        eventually(SECS(10), || async { seen.finished() == 2 }).await,
        "the old handler finished and the redelivered copy was handled: {:?}",
        seen.calls()
    );
    // Let the old loop see its stream end (it does once its handler returned).
    broker.publish(&q, b"after", FieldTable::default()).await;
    assert!(
        eventually(SECS(10), || async { seen.saw(b"after") }).await,
        "the new consumer handles new messages"
    );
    let snap = health.snapshot();
    assert!(
        snap.ready && snap.queues[0].consuming,
        "connected and consuming, so ready: {snap:?}"
    );
    let report = running.drain().await.expect("a clean drain");
    assert_eq!(report.handed_back(), 0, "{report:?}");
    assert_eq!(broker.ready(&q).await, Some(0));
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_starts_during_an_outage_ends_promptly_without_waiting_for_a_reconnect() {
    let q = unique("rel-outage-drain");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let proxy = Proxy::start().await;
    let name = format!("acemq-test-{q}");
    let seen = Seen::new();
    let app = App::new(dead_letter_config(&q, SECS(20)))
        .amqp_addr(proxy.amqp_addr())
        .connection_name(name.clone())
        .consume(&q, recording(seen.clone(), Duration::ZERO));
    let health = app.health();
    let running = app.start().await.expect("starts through the proxy");

    cut_off(&proxy, &health).await;
    let t0 = Instant::now();
    let result = tokio::time::timeout(SECS(25), running.drain())
        .await
        .expect("the drain returns");
    let took = t0.elapsed();
    let report = result.expect("nothing was in flight: a clean drain");
    assert!(
        took < SECS(3),
        "shutdown_timeout 20 s, nothing in flight, broker unreachable: the drain took {took:?}"
    );
    assert_eq!(report.finished(), 0, "{report:?}");
    assert!(!health.snapshot().connected);

    // The supervisor stopped with the drain: once the proxy forwards again,
    // nothing connects through it. A connect the supervisor made during the
    // outage may still wait in the listener's backlog when the drain
    // returns (seen under load): the count is read once it holds still.
    let mut accepted = proxy.accepted();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = proxy.accepted();
        if now == accepted {
            break;
        }
        accepted = now;
    }
    proxy.restore();
    tokio::time::sleep(SECS(2)).await;
    assert_eq!(
        proxy.accepted(),
        accepted,
        "no reconnect attempt after the drain"
    );
    assert!(
        !crate::support::connection_listed(&name).await,
        "the broker lists no connection named {name:?}"
    );
    broker.delete(&all_queues(&q)).await;
}

// current_thread: the runner's tasks log to this thread's subscriber and
// run on this thread, so its CPU time is theirs.
#[tokio::test(flavor = "current_thread")]
async fn a_consumer_cancelled_by_the_broker_logs_a_warning_is_consumed_again_and_does_not_spin() {
    let logs = CapturedLogs::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
    let q = unique("rel-cancelled");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let seen = Seen::new();
    let app = App::new(dead_letter_config(&q, SECS(20)))
        .consume(&q, recording(seen.clone(), Duration::ZERO));
    let health = app.health();
    let running = app.start().await.expect("starts");
    broker.publish(&q, b"before", FieldTable::default()).await;
    assert!(
        eventually(SECS(10), || async { seen.finished() == 1 }).await,
        "handled before the queue is deleted"
    );
    assert!(health.is_ready());

    broker.delete(std::slice::from_ref(&q)).await;
    assert!(
        eventually(SECS(5), || async {
            logs.acemq_at_least(tracing::Level::WARN)
                .iter()
                .any(|(_, _, text)| text.contains("the broker cancelled this consumer"))
        })
        .await,
        "a warning names the cancelled consumer: {:#?}",
        logs.events()
    );
    // The queue is declared again and consumed again.
    let deadline = Instant::now() + SECS(15);
    while !(broker.consumers(&q).await == Some(1) && health.is_ready()) {
        assert!(
            Instant::now() < deadline,
            "the queue is declared again and consumed: {:?}",
            health.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    broker.publish(&q, b"after", FieldTable::default()).await;
    assert!(
        eventually(SECS(10), || async { seen.finished() == 2 }).await,
        "a message published after the recovery is handled"
    );

    // Nothing spins: over two seconds, the runner's thread stays idle.
    let cpu0 = thread_cpu_time();
    let wall0 = Instant::now();
    tokio::time::sleep(SECS(2)).await;
    let cpu = thread_cpu_time() - cpu0;
    eprintln!("CPU over {:?} after the recovery: {cpu:?}", wall0.elapsed());
    assert!(
        cpu < Duration::from_millis(500),
        "the runner's thread used {cpu:?} of CPU in 2 s"
    );
    assert!(health.is_ready(), "still ready");

    let t0 = Instant::now();
    let report = tokio::time::timeout(SECS(25), running.drain())
        .await
        .expect("the drain returns")
        .expect("a clean drain");
    assert!(
        t0.elapsed() < SECS(3),
        "nothing in flight: the drain took {:?}",
        t0.elapsed()
    );
    assert_eq!(report.finished(), 0, "{report:?}");
    broker.delete(&all_queues(&q)).await;
    let errors = logs.acemq_at_least(tracing::Level::ERROR);
    assert!(errors.is_empty(), "acemq logged errors: {errors:#?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_handler_that_panics_on_every_message_dead_letters_all_twenty_with_reason_panic_and_keeps_consuming(
) {
    let q = unique("rel-panics");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let dlq = format!("{q}.dlq");
    let mut broker = Broker::new().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let fine = Arc::new(AtomicUsize::new(0));
    let (c, f) = (calls.clone(), fine.clone());
    let handler = service_fn(move |d: Delivery| {
        let (c, f) = (c.clone(), f.clone());
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            if d.body().starts_with(b"boom") {
                panic!("handler bug on {:?}", d.body());
            }
            f.fetch_add(1, Ordering::SeqCst);
            Ok::<(), BoxError>(())
        }
    });
    let running = start_consuming(dead_letter_config(&q, SECS(10)), &q, handler).await;
    let bodies: Vec<Vec<u8>> = (0..20).map(|i| format!("boom-{i}").into_bytes()).collect();
    broker
        .publish_many(&q, &bodies, lapin::BasicProperties::default())
        .await;
    assert!(
        broker.wait_ready(&dlq, 20, SECS(20)).await,
        "all 20 in {dlq}: {:?} there, {} calls",
        broker.ready(&dlq).await,
        calls.load(Ordering::SeqCst)
    );
    let mut got = Vec::new();
    for _ in 0..20 {
        let m = broker.get(&dlq).await.expect("a dead-lettered message");
        let h = message_headers(&m.delivery.properties);
        assert_eq!(str_header(&h, "x-acemq-reason"), Some("panic"), "{h:?}");
        got.push(String::from_utf8_lossy(&m.delivery.data).into_owned());
    }
    got.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("boom-{i}")).collect();
    want.sort();
    assert_eq!(got, want, "each message exactly once");
    assert_eq!(calls.load(Ordering::SeqCst), 20, "a panic is not retried");

    broker.publish(&q, b"fine", FieldTable::default()).await;
    assert!(
        eventually(SECS(10), || async { fine.load(Ordering::SeqCst) == 1 }).await,
        "the consumer kept going after 20 panics"
    );
    assert!(running.health().is_ready());
    let report = running.drain().await.expect("a clean drain");
    assert_eq!(report.handed_back(), 0, "{report:?}");
    assert_eq!(broker.ready(&q).await, Some(0));
    assert_eq!(broker.ready(&dlq).await, Some(0));
    broker.delete(&all_queues(&q)).await;
}

/// A random token (hex) from the standard library's random hash keys.
fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let word = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    };
    format!("{:016x}{:016x}", word(), word())
}

/// A broker user of this test, deleted when dropped (also when the test fails).
struct BrokerUser {
    name: String,
}

impl BrokerUser {
    async fn create(name: &str, password: &str) -> BrokerUser {
        let user = BrokerUser {
            name: name.to_owned(),
        };
        for args in [
            vec!["add_user", name, password],
            vec!["set_permissions", "-p", "/", name, ".*", ".*", ".*"],
        ] {
            let out = crate::support::rabbitmqctl()
                .args(&args)
                .output()
                .await
                .expect(crate::support::RABBITMQCTL_RUNS);
            assert!(
                out.status.success(),
                "rabbitmqctl {} failed: {}",
                args[0],
                String::from_utf8_lossy(&out.stderr)
            );
        }
        user
    }
}

impl Drop for BrokerUser {
    fn drop(&mut self) {
        let _ = crate::support::rabbitmqctl_blocking()
            .args(["delete_user", &self.name])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_never_appears_in_the_shops_output_at_trace_level_whether_it_is_right_or_wrong(
) {
    let user_name = format!("acemq-secret-{}", std::process::id());
    let password = format!("pw{}", random_hex());
    let wrong = format!("pw{}", random_hex());
    let _user = BrokerUser::create(&user_name, &password).await;
    let mut broker = Broker::new().await;

    // Right password: starts, handles an order, drains on SIGTERM.
    let q = unique("rel-secret");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let addr = crate::support::addr_as(&user_name, &password);
    let mut shop = ShopProcess::spawn(
        &q,
        &format!("shutdown_timeout: 10\nqueues:\n  - name: {q}\n"),
        &[("AMQP_ADDR", &addr), ("RUST_LOG", "trace")],
    );
    shop.wait_ready().await;
    broker
        .publish(&q, br#"{"id":"o-secret"}"#, FieldTable::default())
        .await;
    shop.wait_stderr("order handled", SECS(15)).await;
    shop.signal("-TERM");
    let status = shop.exit_within(SECS(15)).await;
    let (stdout, stderr) = (shop.stdout(), shop.stderr());
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(
        stderr.contains("TRACE") && stderr.lines().count() > 50,
        "trace level was on ({} lines)",
        stderr.lines().count()
    );
    assert!(
        stderr.contains(&format!("{user_name}:***@")),
        "the address is logged with the password hidden"
    );
    for (what, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        let leaks: Vec<&str> = text.lines().filter(|l| l.contains(&password)).collect();
        assert!(
            leaks.is_empty(),
            "the password appears in {what} ({} lines), e.g.:\n{}",
            leaks.len(),
            leaks
                .iter()
                .take(3)
                .map(|l| l.chars().take(400).collect::<String>())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert_eq!(
        broker.ready(&q).await,
        Some(0),
        "the order was acknowledged"
    );
    broker.delete(&all_queues(&q)).await;

    // Wrong password: exits 69, and neither password is printed.
    let q = unique("rel-secret-wrong");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let addr = crate::support::addr_as(&user_name, &wrong);
    let mut shop = ShopProcess::spawn(
        &q,
        &format!("connect_timeout: 5\nqueues:\n  - name: {q}\n"),
        &[("AMQP_ADDR", &addr), ("RUST_LOG", "trace")],
    );
    let status = shop.exit_within(SECS(15)).await;
    let (stdout, stderr) = (shop.stdout(), shop.stderr());
    assert_eq!(status.code(), Some(69), "stderr:\n{stderr}");
    assert!(
        stderr.contains("authentication failed"),
        "stderr:\n{stderr}"
    );
    for (what, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        for pw in [&wrong, &password] {
            let leaks: Vec<&str> = text.lines().filter(|l| l.contains(pw.as_str())).collect();
            assert!(
                leaks.is_empty(),
                "a password appears in {what} ({} lines), e.g.:\n{}",
                leaks.len(),
                leaks
                    .iter()
                    .take(3)
                    .map(|l| l.chars().take(400).collect::<String>())
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invalid_config_field_makes_the_shop_exit_78_naming_the_field() {
    // (what, the YAML given `{q}` as the queue name, what stderr must name)
    let cases: [(&str, &str, &str); 8] = [
        (
            "prefetch 0",
            "queues:\n  - name: {q}\n    prefetch: 0\n",
            "queues[0].prefetch",
        ),
        (
            "concurrency 0",
            "queues:\n  - name: {q}\n    concurrency: 0\n",
            "queues[0].concurrency",
        ),
        (
            "max_attempts 0",
            "queues:\n  - name: {q}\n    retries: { max_attempts: 0, initial_delay: 1, max_delay: 10 }\n",
            "queues[0].retries.max_attempts",
        ),
        (
            "max_delay below initial_delay",
            "queues:\n  - name: {q}\n    retries: { max_attempts: 3, initial_delay: 10, max_delay: 5 }\n",
            "queues[0].retries.max_delay",
        ),
        (
            "a duplicate queue name",
            "queues:\n  - name: {q}\n  - name: {q}\n",
            "queues[1].name",
        ),
        (
            "an empty queue name",
            "queues:\n  - name: \"\"\n  - name: {q}\n",
            "queues[0].name",
        ),
        (
            "an unknown key in a queue",
            "queues:\n  - name: {q}\n    prefetchh: 5\n",
            "prefetchh",
        ),
        (
            "an unknown top-level key",
            "shutdown_timout: 5\nqueues:\n  - name: {q}\n",
            "shutdown_timout",
        ),
    ];
    crate::support::shop_binary(); // built once, before the processes start
    let mut running = Vec::new();
    for (what, yaml, field) in cases {
        let q = unique("rel-badconfig");
        let shop = ShopProcess::spawn(&q, &yaml.replace("{q}", &q), &[]);
        running.push((what, field, shop));
    }
    let mut failures = Vec::new();
    for (what, field, mut shop) in running {
        let status = shop.exit_within(SECS(15)).await;
        let stderr = shop.stderr();
        if status.code() != Some(78) || !stderr.contains(field) {
            failures.push(format!(
                "{what}: exit {:?}, expected 78 naming {field:?}; stderr:\n{stderr}",
                status.code()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_during_the_drain_cancels_the_listening_handler_exits_75_at_once_and_the_order_is_back(
) {
    let q = unique("rel-second-term");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let mut shop = ShopProcess::spawn(
        &q,
        &format!("shutdown_timeout: 20\nqueues:\n  - name: {q}\n"),
        &[],
    );
    shop.wait_ready().await;
    let body = br#"{"id":"o-hurry","work_ms":60000}"#;
    broker.publish(&q, body, FieldTable::default()).await;
    shop.wait_in_flight(1).await;

    shop.signal("-TERM");
    shop.wait_stderr("drain started", SECS(5)).await;
    // The first signal's drain waits for the 60 s order (shutdown_timeout 20 s).
    let t0 = Instant::now();
    shop.signal("-TERM");
    let status = shop.exit_within(SECS(15)).await;
    let took = t0.elapsed();
    let stderr = shop.stderr();
    eprintln!("--- exited {took:?} after the second SIGTERM");
    // At the second signal the order is still in flight (its handler ends
    // only once its token is cancelled, which happens after): the drain
    // reports a timeout of kind SecondSignal, exit 75 (EX_TEMPFAIL).
    assert_eq!(status.code(), Some(75), "stderr:\n{stderr}");
    assert!(
        took < SECS(3),
        "exits promptly after the second signal, not at shutdown_timeout: {took:?}"
    );
    assert!(
        stderr.contains("second stop signal during the drain"),
        "stderr:\n{stderr}"
    );
    let last = stderr
        .lines()
        .find(|l| l.starts_with("acemq: "))
        .unwrap_or_else(|| panic!("no one-line reason on stderr:\n{stderr}"));
    assert!(
        last.contains("drain cut short by a second stop signal")
            && last.contains(&format!("{q}: 1 in flight")),
        "the reason names the second signal, the queue and the count: {last}"
    );
    assert!(
        stderr.contains("work cancelled by the drain"),
        "the handler saw its token cancelled: stderr:\n{stderr}"
    );
    let m = broker
        .get_within(&q, SECS(5))
        .await
        .expect("the order is back on the queue");
    assert!(m.delivery.redelivered, "redelivered is set");
    assert_eq!(&m.delivery.data[..], &body[..]);
    broker.delete(&all_queues(&q)).await;
}

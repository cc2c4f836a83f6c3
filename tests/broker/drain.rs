//! The drain against the real broker: what it finishes, what it hands back,
//! what it abandons, and how long each takes (DESIGN.md, "Start and stop").

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::config::{PrefetchPolicy, QueueConfig};
use acemq::drain::DeadlineKind;
use acemq::{App, BoxError, Config, Delivery, Running};
use lapin::types::{AMQPValue, FieldTable};
use tokio::sync::Notify;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::{
    all_queues, connection_listed, eventually, field_table, start_consuming, unique, Broker,
    CapturedLogs, TestHandler,
};

/// What the test handlers record: how many calls began and ended, and a
/// signal for "a handler has started".
#[derive(Default)]
struct Probe {
    calls: AtomicUsize,
    done: AtomicUsize,
    started: Notify,
    release: Notify,
}

impl Probe {
    fn new() -> Arc<Self> {
        Arc::new(Probe::default())
    }

    /// Waits (bounded) until a handler has started.
    async fn wait_started(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.started.notified())
            .await
            .expect("a handler started within 10 s");
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn done(&self) -> usize {
        self.done.load(Ordering::SeqCst)
    }
}

/// How a test handler behaves once it has started.
#[derive(Clone, Copy)]
enum Work {
    /// Sleeps this long and succeeds, whatever its token says.
    Sleep(Duration),
    /// Sleeps this long, or stops early with an error when its token is
    /// cancelled.
    Listening(Duration),
    /// Waits for `Probe::release`, then succeeds.
    UntilReleased,
}

fn handler(probe: Arc<Probe>, work: Work) -> impl TestHandler {
    tower::service_fn(move |d: Delivery| {
        let probe = probe.clone();
        async move {
            probe.calls.fetch_add(1, Ordering::SeqCst);
            probe.started.notify_one();
            match work {
                Work::Sleep(t) => tokio::time::sleep(t).await,
                Work::Listening(t) => {
                    tokio::select! {
                        () = tokio::time::sleep(t) => {}
                        () = d.token().cancelled() => {
                            return Err::<(), BoxError>("cancelled by the drain".into());
                        }
                    }
                }
                Work::UntilReleased => probe.release.notified().await,
            }
            probe.done.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    })
}

fn one_queue(q: &str, shutdown_timeout: Duration, abandon_after: Duration) -> Config {
    let mut config = Config::new([QueueConfig::new(q)]);
    config.shutdown_timeout = shutdown_timeout;
    config.abandon_after = abandon_after;
    config
}

/// A unique queue named after `tag`, a [`Broker`], a [`Probe`], and an app
/// on [`one_queue`] consuming the queue with a handler of `work`.
async fn one_queue_app(
    tag: &str,
    shutdown_timeout: Duration,
    abandon_after: Duration,
    work: Work,
) -> (String, Broker, Arc<Probe>, App) {
    let q = unique(tag);
    let broker = Broker::new().await;
    let probe = Probe::new();
    let app = App::new(one_queue(&q, shutdown_timeout, abandon_after))
        .consume(&q, handler(probe.clone(), work));
    (q, broker, probe, app)
}

/// Starts `app`, publishes one order to `q` with `headers`, and waits until
/// a handler has started on it.
async fn start_with_one_order(
    app: App,
    broker: &mut Broker,
    q: &str,
    headers: FieldTable,
    probe: &Probe,
) -> Running {
    let running = app.start().await.expect("starts");
    broker.publish(q, b"order", headers).await;
    probe.wait_started().await;
    running
}

fn attempt_header(n: i64) -> FieldTable {
    field_table(vec![("x-acemq-attempt", AMQPValue::LongLongInt(n))])
}

fn header_attempt(m: &lapin::message::BasicGetMessage) -> Option<i64> {
    let headers = m.delivery.properties.headers().as_ref()?;
    match headers.inner().get("x-acemq-attempt")? {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        _ => None,
    }
}

fn assert_between(what: &str, took: Duration, lo: Duration, hi: Duration) {
    assert!(
        took >= lo && took <= hi,
        "{what} took {took:?}, expected between {lo:?} and {hi:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_stays_pending_while_a_handler_runs_and_completes_once_the_handler_is_released() {
    let (q, mut broker, probe, app) = one_queue_app(
        "drain-release",
        Duration::from_secs(20),
        Duration::from_secs(5),
        Work::UntilReleased,
    )
    .await;
    let running = start_with_one_order(app, &mut broker, &q, FieldTable::default(), &probe).await;

    let mut drain = tokio::spawn(running.drain());
    // The handler holds: the drain must not finish on its own.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut drain)
            .await
            .is_err(),
        "the drain finished while a handler was still running"
    );
    probe.release.notify_one();
    let report = tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .expect("the drain ends once the handler is released")
        .expect("drain task")
        .expect("a clean drain");
    assert_eq!(report.finished(), 1, "{report:?}");
    assert_eq!(report.handed_back(), 0, "{report:?}");
    assert_eq!(probe.done(), 1);
    assert_eq!(
        broker.ready(&q).await,
        Some(0),
        "the message was acknowledged"
    );
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_holding_a_message_for_one_and_a_half_seconds_makes_the_drain_take_that_long_and_its_message_is_acknowledged(
) {
    let (q, mut broker, probe, app) = one_queue_app(
        "drain-finish",
        Duration::from_secs(10),
        Duration::from_secs(5),
        Work::Sleep(Duration::from_millis(1500)),
    )
    .await;
    let running = start_with_one_order(app, &mut broker, &q, FieldTable::default(), &probe).await;

    let t0 = Instant::now();
    let report = running.drain().await.expect("a clean drain");
    let took = t0.elapsed();
    assert_between(
        "the drain",
        took,
        Duration::from_millis(1200),
        Duration::from_secs(4),
    );
    assert_eq!(
        probe.done(),
        1,
        "the handler's completion is observed before the drain returns"
    );
    assert_eq!(report.finished(), 1, "{report:?}");
    assert_eq!(report.handed_back(), 0, "{report:?}");
    assert_eq!(
        broker.ready(&q).await,
        Some(0),
        "the message was acknowledged, not handed back"
    );
    assert_eq!(probe.calls(), 1, "handled exactly once");
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_listens_to_its_token_is_cancelled_at_the_deadline_and_its_message_goes_back_at_the_same_attempt(
) {
    let (q, mut broker, probe, app) = one_queue_app(
        "drain-cancel",
        Duration::from_secs(1),
        Duration::from_secs(5),
        Work::Listening(Duration::from_secs(60)),
    )
    .await;
    let running = start_with_one_order(app, &mut broker, &q, attempt_header(2), &probe).await;

    let t0 = Instant::now();
    let timeout = running
        .drain()
        .await
        .expect_err("the deadline expires with a handler running");
    let took = t0.elapsed();
    assert_between(
        "the drain",
        took,
        Duration::from_millis(900),
        Duration::from_millis(3500),
    );
    assert_eq!(timeout.kind, DeadlineKind::ShutdownTimeout);
    assert_eq!(timeout.in_flight, vec![(q.clone(), 1)]);
    assert_eq!(
        timeout.abandoned, 0,
        "the handler listened: nothing abandoned"
    );
    let text = timeout.to_string();
    assert!(text.contains(&q) && text.contains("1 in flight"), "{text}");
    assert_eq!(probe.done(), 0, "the handler stopped early");

    let m = broker
        .get_within(&q, Duration::from_secs(5))
        .await
        .expect("the message is back on the queue");
    assert_eq!(header_attempt(&m), Some(2), "same attempt number");
    assert!(m.delivery.redelivered);
    assert_eq!(broker.ready(&q).await, Some(0));
    broker.delete(&all_queues(&q)).await;
}

// current_thread: every task of this test (the consumer loop, lapin's I/O)
// runs on this thread, so the thread-local subscriber sees all their logs.
#[tokio::test(flavor = "current_thread")]
async fn a_handler_that_ignores_its_token_is_abandoned_after_the_grace_and_its_message_is_redelivered_without_an_error(
) {
    let captured = CapturedLogs::default();
    let _logs =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(captured.clone()));
    let (q, mut broker, probe, app) = one_queue_app(
        "drain-abandon",
        Duration::from_secs(1),
        Duration::from_secs(1),
        Work::Sleep(Duration::from_secs(60)),
    )
    .await;
    let name = format!("acemq-test-{q}");
    let app = app.connection_name(name.clone());
    let health = app.health();
    let running = start_with_one_order(app, &mut broker, &q, FieldTable::default(), &probe).await;
    assert!(
        connection_listed(&name).await,
        "rabbitmqctl lists the runner's connection {name:?} while it runs"
    );

    let t0 = Instant::now();
    let timeout = running
        .drain()
        .await
        .expect_err("the deadline expires with a handler running");
    let took = t0.elapsed();
    assert!(
        took <= Duration::from_millis(3500),
        "shutdown_timeout 1 s + abandon_after 1 s, yet the drain took {took:?}"
    );
    assert!(
        took >= Duration::from_millis(1900),
        "the drain abandoned before the deadline and the grace: {took:?}"
    );
    assert_eq!(timeout.abandoned, 1, "{timeout:?}");
    assert_eq!(timeout.in_flight, vec![(q.clone(), 1)]);
    assert!(!health.snapshot().connected, "the connection is closed");
    assert!(
        !connection_listed(&name).await,
        "the broker no longer lists the connection {name:?}"
    );
    let m = broker
        .get_within(&q, Duration::from_secs(5))
        .await
        .expect("the abandoned message is back on the queue");
    assert!(m.delivery.redelivered);
    assert_eq!(probe.done(), 0, "the abandoned handler never finished");
    broker.delete(&all_queues(&q)).await;

    let logs: Vec<(tracing::Level, String)> = captured
        .events()
        .into_iter()
        .map(|(level, target, text)| (level, format!("{target}:{text}")))
        .collect();
    let errors: Vec<_> = logs
        .iter()
        .filter(|(level, _)| *level == tracing::Level::ERROR)
        .collect();
    assert!(errors.is_empty(), "errors were logged: {errors:#?}");
    let acks: Vec<_> = logs
        .iter()
        .filter(|(level, text)| *level <= tracing::Level::WARN && text.contains("ack"))
        .collect();
    assert!(acks.is_empty(), "a late ack was reported: {acks:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_queues_share_one_deadline_so_three_stuck_handlers_cost_one_timeout_not_three() {
    let qs: Vec<String> = (0..3)
        .map(|i| unique(&format!("drain-shared-{i}")))
        .collect();
    let mut broker = Broker::new().await;
    let mut config = Config::new(qs.iter().map(QueueConfig::new));
    config.shutdown_timeout = Duration::from_secs(1);
    config.abandon_after = Duration::from_secs(1);
    let probes: Vec<Arc<Probe>> = qs.iter().map(|_| Probe::new()).collect();
    let mut app = App::new(config);
    for (q, p) in qs.iter().zip(&probes) {
        app = app.consume(q, handler(p.clone(), Work::Sleep(Duration::from_secs(60))));
    }
    let running = app.start().await.expect("starts");
    for q in &qs {
        broker.publish(q, b"order", FieldTable::default()).await;
    }
    for p in &probes {
        p.wait_started().await;
    }

    let t0 = Instant::now();
    let timeout = running
        .drain()
        .await
        .expect_err("the deadline expires with handlers running");
    let took = t0.elapsed();
    assert_between(
        "the drain of three queues",
        took,
        Duration::from_millis(1900),
        Duration::from_millis(3500),
    );
    assert_eq!(timeout.abandoned, 3, "{timeout:?}");
    let mut named: Vec<(String, usize)> = timeout.in_flight.clone();
    named.sort();
    let mut expected: Vec<(String, usize)> = qs.iter().map(|q| (q.clone(), 1)).collect();
    expected.sort();
    assert_eq!(named, expected, "each queue named with its one delivery");
    for q in &qs {
        assert!(
            broker.wait_ready(q, 1, Duration::from_secs(5)).await,
            "{q}: the abandoned message is back"
        );
        broker.delete(&all_queues(q)).await;
    }
}

/// Publishes 50 messages, starts a prefetch-50, concurrency-1 consumer with
/// `policy` and a handler of `work`, waits until the broker has sent all 50
/// and the first handler has started, then drains.
async fn fifty_buffered(
    tag: &str,
    policy: PrefetchPolicy,
    work: Duration,
) -> (String, Broker, Arc<Probe>, acemq::DrainReport) {
    let q = unique(tag);
    let mut broker = Broker::new().await;
    let mut queue = QueueConfig::new(q.clone());
    queue.prefetch = 50;
    queue.concurrency = 1;
    let mut config = Config::new([queue]);
    config.shutdown_timeout = Duration::from_secs(10);
    config.prefetch_policy = policy;
    // Declared by the runner; publish once it exists but before the handler
    // can take anything: the app starts, then the messages arrive together.
    let probe = Probe::new();
    let running = start_consuming(config, &q, handler(probe.clone(), Work::Sleep(work))).await;
    let bodies: Vec<Vec<u8>> = (0..50).map(|i| format!("m{i}").into_bytes()).collect();
    broker
        .publish_many(&q, &bodies, lapin::BasicProperties::default())
        .await;
    probe.wait_started().await;
    assert!(
        broker.wait_ready(&q, 0, Duration::from_secs(5)).await,
        "the broker sent all 50 ahead (prefetch 50)"
    );
    let report = running.drain().await.expect("a clean drain");
    (q, broker, probe, report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_hand_back_the_deliveries_buffered_behind_the_one_running_handler_go_back_to_the_broker_unhandled(
) {
    let (q, mut broker, probe, report) = fifty_buffered(
        "drain-handback",
        PrefetchPolicy::HandBack,
        Duration::from_millis(300),
    )
    .await;
    let handled = probe.done();
    assert_eq!(
        probe.calls(),
        handled,
        "every handler that started finished"
    );
    assert_eq!(
        report.finished(),
        1,
        "the one handler in flight: {report:?}"
    );
    let qd = &report.queues[0];
    assert_eq!(qd.handed_back, qd.buffered, "{report:?}");
    assert!(
        (1..=49).contains(&qd.handed_back),
        "the buffered deliveries are handed back: {report:?}"
    );
    assert_eq!(
        qd.handed_back + handled,
        50,
        "handled or handed back, each exactly once: {report:?}"
    );
    assert!(
        broker
            .wait_ready(&q, (50 - handled) as u32, Duration::from_secs(5))
            .await,
        "every unhandled message is back on the queue: {:?} ready, {handled} handled",
        broker.ready(&q).await
    );
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_handle_buffered_every_buffered_delivery_is_handled_before_the_drain_ends() {
    let (q, mut broker, probe, report) = fifty_buffered(
        "drain-handlebuffered",
        PrefetchPolicy::HandleBuffered,
        Duration::from_millis(20),
    )
    .await;
    assert_eq!(report.handed_back(), 0, "{report:?}");
    assert_eq!(probe.done(), 50, "all 50 handled: {report:?}");
    assert_eq!(probe.calls(), 50, "each exactly once");
    assert!(report.finished() >= 1, "{report:?}");
    assert_eq!(broker.ready(&q).await, Some(0), "the queue is empty");
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_false_from_the_first_step_of_the_drain_while_a_handler_still_runs() {
    let (q, mut broker, probe, app) = one_queue_app(
        "drain-ready",
        Duration::from_secs(20),
        Duration::from_secs(5),
        Work::UntilReleased,
    )
    .await;
    let health = app.health();
    let running = app.start().await.expect("starts");
    assert!(health.is_ready(), "ready once started");
    broker.publish(&q, b"order", FieldTable::default()).await;
    probe.wait_started().await;
    assert!(health.is_ready(), "ready while handling");

    let drain = tokio::spawn(running.drain());
    assert!(
        eventually(Duration::from_secs(5), || async { health.is_draining() }).await,
        "the drain began"
    );
    assert!(!health.is_ready(), "not ready once the drain began");
    let snap = health.snapshot();
    assert!(snap.draining && !snap.ready, "{snap:?}");
    assert_eq!(snap.queues[0].in_flight, 1, "{snap:?}");
    assert!(
        !drain.is_finished(),
        "the drain is still waiting for the handler"
    );
    // Readiness goes off a step before intake stops: the handler is let go
    // once the broker shows the consumer cancelled, so that it finishes
    // within the drain's count.
    let mut cancelled = false;
    for _ in 0..100 {
        if broker.consumers(&q).await == Some(0) {
            cancelled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(cancelled, "the drain cancels the consumer within 5 s");
    assert!(
        !drain.is_finished(),
        "the drain still waits for the handler"
    );

    probe.release.notify_one();
    let report = tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .expect("the drain ends")
        .expect("drain task")
        .expect("a clean drain");
    assert_eq!(report.finished(), 1, "{report:?}");
    assert!(!health.is_ready(), "still not ready after the drain");
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_cuts_the_drain_short_and_hands_the_message_back() {
    let (q, mut broker, probe, app) = one_queue_app(
        "drain-hurry",
        Duration::from_secs(20),
        Duration::from_secs(5),
        Work::Listening(Duration::from_secs(10)),
    )
    .await;
    let running = start_with_one_order(app, &mut broker, &q, FieldTable::default(), &probe).await;

    let t0 = Instant::now();
    let hurry = tokio::time::sleep(Duration::from_millis(200));
    let timeout = running
        .drain_with(hurry)
        .await
        .expect_err("a second signal with a handler running");
    let took = t0.elapsed();
    assert_between(
        "the hurried drain",
        took,
        Duration::from_millis(150),
        Duration::from_secs(3),
    );
    assert_eq!(timeout.kind, DeadlineKind::SecondSignal);
    assert_eq!(timeout.in_flight, vec![(q.clone(), 1)]);
    assert_eq!(timeout.abandoned, 0);
    assert!(
        broker.wait_ready(&q, 1, Duration::from_secs(5)).await,
        "the message is handed back"
    );
    assert_eq!(probe.done(), 0);
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_with_nothing_in_flight_is_fast() {
    let (q, mut broker, _probe, app) = one_queue_app(
        "drain-idle",
        Duration::from_secs(20),
        Duration::from_secs(5),
        Work::Sleep(Duration::ZERO),
    )
    .await;
    let running = app.start().await.expect("starts");
    let t0 = Instant::now();
    let report = running.drain().await.expect("a clean drain");
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(1), "an idle drain took {took:?}");
    assert_eq!(report.finished(), 0);
    assert_eq!(report.handed_back(), 0);
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_held_at_a_paused_gate_is_handed_back_at_the_drain_without_reaching_the_handler()
{
    let (q, mut broker, probe, app) = one_queue_app(
        "drain-paused",
        Duration::from_secs(20),
        Duration::from_secs(5),
        Work::Sleep(Duration::ZERO),
    )
    .await;
    let health = app.health();
    let running = app.start().await.expect("starts");
    for name in health.queue_names() {
        assert!(!health.is_paused(&name).unwrap(), "the gate was open");
        health.pause(&name).unwrap();
    }
    broker.publish(&q, b"order", FieldTable::default()).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            health.snapshot().queues[0].held == 1
        })
        .await,
        "the delivery is held at the gate"
    );

    let t0 = Instant::now();
    let report = running.drain().await.expect("a clean drain");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "a held delivery does not hold the drain: {:?}",
        t0.elapsed()
    );
    assert_eq!(report.handed_back(), 1, "{report:?}");
    assert_eq!(report.finished(), 0, "no handler ran: {report:?}");
    assert_eq!(probe.calls(), 0);
    assert!(
        broker.wait_ready(&q, 1, Duration::from_secs(5)).await,
        "the held message is back on the queue"
    );
    broker.delete(&all_queues(&q)).await;
}

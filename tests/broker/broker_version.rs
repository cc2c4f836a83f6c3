//! The broker's version, read at start over a short connection of acemq's
//! own (lapin keeps nothing of `connection.start`): logged, shown in
//! `/readyz`'s snapshot, and deciding what the config may hold. On RabbitMQ
//! 4.3 and later a queue argument 4.3 refuses is a config error before
//! anything is declared, and a consumed classic queue without
//! `consumer_timeout` is warned about; before 4.3 the arguments are
//! warnings. And acemq never asks for global QoS.

use std::time::Duration;

use acemq::config::{ArgValue, QueueConfig};
use acemq::{App, BoxError, Config, Delivery};
use tower::service_fn;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::{
    connection_listed, connection_pid, ctl_version, eventually, rabbitmqctl, start_consuming,
    unique, Broker, CapturedLogs, QueueCleanup, TestHandler,
};

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn ok_handler() -> impl TestHandler {
    service_fn(|_: Delivery| async { Ok::<(), BoxError>(()) })
}

#[tokio::test(flavor = "current_thread")]
async fn the_brokers_version_is_logged_at_start_shown_in_the_snapshot_and_its_connection_closed() {
    let logs = CapturedLogs::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
    let (said, _) = ctl_version().await;
    let q = unique("version.start");
    let name = unique("version-app");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    let mut queue = QueueConfig::new(&q);
    queue.consumer_timeout = Some(SECS(60)); // no 4.3 warning in this test
    let running = App::new(Config::new([queue]))
        .connection_name(&name)
        .consume(&q, ok_handler())
        .start()
        .await
        .expect("starts");
    let expected = format!("RabbitMQ {said}");
    assert_eq!(
        running.health().snapshot().broker_version.as_deref(),
        Some(expected.as_str())
    );
    let line = format!("broker version: {expected}");
    assert!(
        logs.events()
            .iter()
            .any(|(level, _, text)| *level == tracing::Level::INFO && text.contains(&line)),
        "no INFO line {line:?}: {:?}",
        logs.acemq_at_least(tracing::Level::INFO)
    );
    // The check's own connection said close and was closed: only the
    // app's connections stay.
    let check = format!("{name} (version check)");
    assert!(
        eventually(SECS(20), || async { !connection_listed(&check).await }).await,
        "the version check's connection {check:?} is still open"
    );
    assert!(connection_listed(&name).await, "the app's own connection");
    running.drain().await.expect("drains");
}

/// A config whose second queue (not consumed) carries `arg: value`.
fn with_argument(consumed: &str, idle: &str, arg: &str, value: ArgValue) -> Config {
    let mut other = QueueConfig::new(idle);
    other.consume = false;
    other.arguments.insert(arg.to_owned(), value);
    let mut q = QueueConfig::new(consumed);
    q.consumer_timeout = Some(SECS(60));
    Config::new([q, other])
}

#[tokio::test(flavor = "current_thread")]
async fn queue_arguments_4_3_refuses_end_the_start_with_exit_78_on_4_3_and_are_warnings_before() {
    let logs = CapturedLogs::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
    let (said, version) = ctl_version().await;
    for (arg, value) in [
        ("x-queue-mode", ArgValue::String("lazy".into())),
        ("x-queue-version", ArgValue::Int(1)),
    ] {
        let q = unique("version.args");
        let idle = unique("version.args.idle");
        let _cleanup = QueueCleanup::new(vec![q.clone(), idle.clone()]);
        let started = App::new(with_argument(&q, &idle, arg, value))
            .consume(&q, ok_handler())
            .start()
            .await;
        let mut broker = Broker::new().await;
        if version >= (4, 3) {
            let Err(e) = started else {
                panic!("a refused argument ends the start on 4.3");
            };
            assert_eq!(e.exit_code(), 78, "{e}");
            let text = e.to_string();
            assert!(
                text.contains(&format!("queues[1].arguments.{arg}"))
                    && text.contains(&format!("RabbitMQ {said}"))
                    && text.contains(&format!("remove {arg}")),
                "{text}"
            );
            assert!(!text.contains('\n'), "one line: {text}");
            // Nothing was declared.
            assert_eq!(broker.ready(&q).await, None, "{q} was declared");
            assert_eq!(broker.ready(&idle).await, None, "{idle} was declared");
        } else {
            let running = started.expect("before 4.3 the argument is a warning");
            assert!(
                logs.acemq_at_least(tracing::Level::WARN)
                    .iter()
                    .any(|(_, _, t)| t.contains(&format!("arguments.{arg}"))
                        && t.contains("RabbitMQ 4.3 refuses")),
                "no warning about {arg} on RabbitMQ {said}"
            );
            running.drain().await.expect("drains");
        }
        broker.delete(&[q, idle]).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn on_4_3_a_consumed_classic_queue_without_consumer_timeout_is_warned_about_at_start() {
    let logs = CapturedLogs::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
    let (said, version) = ctl_version().await;
    let q = unique("version.unbounded");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    let running = start_consuming(Config::new([QueueConfig::new(&q)]), &q, ok_handler()).await;
    let warned: Vec<_> = logs
        .acemq_at_least(tracing::Level::WARN)
        .into_iter()
        .filter(|(_, _, t)| t.contains("no broker bound applies to its handlers"))
        .collect();
    if version >= (4, 3) {
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(
            warned[0].2.contains(&format!("{q:?} is a classic queue"))
                && warned[0].2.contains(&format!("RabbitMQ {said}")),
            "{warned:?}"
        );
    } else {
        assert!(
            warned.is_empty(),
            "RabbitMQ {said} times out classic queues: {warned:?}"
        );
    }
    running.drain().await.expect("drains");
}

/// `rabbitmqctl list_channels connection prefetch_count
/// global_prefetch_count`, one line per channel; RabbitMQ 4.3 has no
/// `global_prefetch_count` any more (it refuses global QoS), so there the
/// last column is read as 0.
async fn channel_prefetches() -> Vec<(String, u32, u32)> {
    let run = |columns: &'static [&'static str]| async move {
        rabbitmqctl()
            .args(["list_channels", "-q", "--no-table-headers"])
            .args(columns)
            .output()
            .await
            .expect("rabbitmqctl runs")
    };
    let mut out = run(&["connection", "prefetch_count", "global_prefetch_count"]).await;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(err.contains("global_prefetch_count"), "{err}");
        out = run(&["connection", "prefetch_count"]).await;
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let pid = f.next()?.trim().to_owned();
            let per_consumer = f.next()?.trim().parse().ok()?;
            let global = f.next().map_or(Some(0), |g| g.trim().parse().ok())?;
            Some((pid, per_consumer, global))
        })
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn acemq_sets_its_prefetch_per_consumer_never_as_global_qos() {
    let q = unique("version.qos");
    let name = unique("version-qos");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    let mut queue = QueueConfig::new(&q);
    queue.prefetch = 37;
    queue.concurrency = 37;
    queue.consumer_timeout = Some(SECS(60));
    let running = App::new(Config::new([queue]))
        .connection_name(&name)
        .consume(&q, ok_handler())
        .start()
        .await
        .expect("starts");
    let publisher = format!("{name} (publisher)");
    let pids = [
        connection_pid(&name)
            .await
            .expect("the consumers' connection"),
        connection_pid(&publisher)
            .await
            .expect("the publishing connection"),
    ];
    let channels: Vec<_> = channel_prefetches()
        .await
        .into_iter()
        .filter(|(pid, _, _)| pids.contains(pid))
        .collect();
    assert!(
        channels
            .iter()
            .any(|(pid, per_consumer, _)| *pid == pids[0] && *per_consumer == 37),
        "no channel of the consumers' connection with basic.qos 37 per consumer: {channels:?}"
    );
    assert!(
        channels.iter().all(|(_, _, global)| *global == 0),
        "a channel with global QoS: {channels:?}"
    );
    running.drain().await.expect("drains");
}

//! Loading a config and starting (or refusing to start) against the broker.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq::config::{QueueConfig, RetriesConfig};
use acemq::{App, BoxError, Config, Delivery, StartError};
use lapin::types::FieldTable;
use tower::service_fn;

use crate::support::{
    connection_listed, eventually, plain_config, topology_queues, unique, Broker, TestHandler,
};

/// The YAML of DESIGN.md's Config section, with `shop.orders` renamed.
const DESIGN_YAML: &str = "\
shutdown_timeout: 20
queues:
  - name: shop.orders
    prefetch: 20
    concurrency: 4
    dead_letter: true
    retries: { max_attempts: 5, initial_delay: 10, max_delay: 300, broker_wait_threshold: 10 }
";

fn counting(calls: Arc<AtomicUsize>) -> impl TestHandler {
    service_fn(move |_: Delivery| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<(), BoxError>(())
        }
    })
}

#[tokio::test]
async fn the_designs_yaml_loads_and_starts_a_consumer_on_the_broker() {
    let q = unique("config.design");
    let mut broker = Broker::new().await;
    let config = Config::from_yaml_str(&DESIGN_YAML.replace("shop.orders", &q))
        .expect("the design's YAML is valid");
    let all = topology_queues(&config);
    // Q, Q.dlq and the rungs of 10s, 20s, 40s and 80s (all at or above the
    // 10 s threshold).
    let rungs: Vec<String> = ["10s", "20s", "40s", "80s"]
        .iter()
        .map(|d| format!("{q}.retry.{d}"))
        .collect();
    let mut expected = vec![q.clone(), format!("{q}.dlq")];
    expected.extend(rungs.iter().cloned());
    assert_eq!(all, expected);

    let calls = Arc::new(AtomicUsize::new(0));
    let connection_name = format!("{q}.app");
    let running = App::new(config)
        .connection_name(connection_name.clone())
        .consume(&q, counting(calls.clone()))
        .start()
        .await
        .expect("starts");
    assert!(
        connection_listed(&connection_name).await,
        "the broker lists the runner's connection by its name"
    );
    for name in &all {
        assert_eq!(broker.ready(name).await, Some(0), "{name} declared");
    }
    assert_eq!(broker.consumers(&q).await, Some(1), "one consumer on {q}");
    assert!(running.health().snapshot().ready);

    broker.publish(&q, b"order", FieldTable::default()).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            calls.load(Ordering::SeqCst) == 1
        })
        .await,
        "the consumer handled the order"
    );
    running.drain().await.expect("clean drain");
    assert_eq!(broker.ready(&q).await, Some(0), "acknowledged");
    assert_eq!(broker.consumers(&q).await, Some(0), "consumer gone");
    broker.delete(&all).await;
}

/// A queue config with retries that are valid.
fn with_retries(name: &str) -> QueueConfig {
    let mut q = QueueConfig::new(name);
    q.dead_letter = true;
    let mut retries = RetriesConfig::new(3, Duration::from_millis(200), Duration::from_millis(800));
    retries.broker_wait_threshold = Duration::from_millis(400);
    q.retries = Some(retries);
    q
}

#[tokio::test]
async fn every_invalid_config_fails_the_start_with_a_config_error_naming_the_field_and_exit_code_78(
) {
    let mut broker = Broker::new().await;
    type Edit = fn(&mut Vec<QueueConfig>);
    let cases: [(&str, Edit, &str); 6] = [
        ("prefetch 0", |qs| qs[0].prefetch = 0, "queues[0].prefetch"),
        (
            "concurrency 0",
            |qs| qs[0].concurrency = 0,
            "queues[0].concurrency",
        ),
        (
            "max_attempts 0",
            |qs| qs[0].retries.as_mut().unwrap().max_attempts = 0,
            "queues[0].retries.max_attempts",
        ),
        (
            "max_delay below initial_delay",
            |qs| {
                let r = qs[0].retries.as_mut().unwrap();
                r.initial_delay = Duration::from_millis(800);
                r.max_delay = Duration::from_millis(200);
            },
            "queues[0].retries.max_delay",
        ),
        (
            "duplicate names",
            |qs| {
                let again = qs[0].clone();
                qs.push(again);
            },
            "queues[1].name",
        ),
        ("empty name", |qs| qs[0].name.clear(), "queues[0].name"),
    ];
    let mut declared = Vec::new();
    for (case, edit, field) in cases {
        let q = unique("config.invalid");
        let mut queues = vec![with_retries(&q)];
        edit(&mut queues);
        let name = queues[0].name.clone();
        let config = Config::new(queues);
        let calls = Arc::new(AtomicUsize::new(0));
        let err = App::new(config)
            .consume(&name, counting(calls))
            .start()
            .await
            .expect_err(case);
        assert_eq!(err.exit_code(), 78, "{case}: EX_CONFIG: {err}");
        let StartError::Config(config_err) = &err else {
            panic!("{case}: expected a config error, got {err:?}");
        };
        assert_eq!(
            config_err.field(),
            Some(field),
            "{case}: the typed error keeps the field"
        );
        let message = config_err.to_string();
        assert!(message.contains(field), "{case}: names {field}: {message}");
        assert!(message.starts_with("invalid config: "), "{case}: {message}");
        // Rejected before anything was declared.
        assert_eq!(broker.ready(&q).await, None, "{case}: {q} not declared");
        declared.push(q);
    }
    broker.delete(&declared).await;
}

#[tokio::test]
async fn a_handler_for_a_queue_the_config_does_not_name_is_a_config_error() {
    let q = unique("config.unknown");
    let stranger = unique("config.stranger");
    let mut broker = Broker::new().await;
    let config = plain_config(&q);
    let calls = Arc::new(AtomicUsize::new(0));
    let err = App::new(config)
        .consume(&q, counting(calls.clone()))
        .consume(&stranger, counting(calls.clone()))
        .start()
        .await
        .expect_err("an unknown queue is refused");
    assert_eq!(err.exit_code(), 78, "{err}");
    let StartError::Config(config_err) = &err else {
        panic!("expected a config error, got {err:?}");
    };
    let message = config_err.to_string();
    assert!(message.contains(&stranger), "names the queue: {message}");
    assert_eq!(broker.ready(&q).await, None, "nothing declared");
    assert_eq!(broker.ready(&stranger).await, None, "nothing declared");
    broker.delete(&[q, stranger]).await;
}

#[tokio::test]
async fn a_queue_in_the_config_without_a_handler_is_a_config_error() {
    let q = unique("config.nohandler");
    let orphan = unique("config.orphan");
    let mut broker = Broker::new().await;
    let mut config = Config::default();
    config.queues.push(QueueConfig::new(q.clone()));
    config.queues.push(QueueConfig::new(orphan.clone()));
    let err = App::new(config)
        .consume(&q, counting(Arc::new(AtomicUsize::new(0))))
        .start()
        .await
        .expect_err("a queue with no handler is refused");
    assert_eq!(err.exit_code(), 78, "{err}");
    let StartError::Config(config_err) = &err else {
        panic!("expected a config error, got {err:?}");
    };
    let message = config_err.to_string();
    assert!(message.contains(&orphan), "names the queue: {message}");
    assert_eq!(broker.ready(&q).await, None, "nothing declared");
    broker.delete(&[q, orphan]).await;
}

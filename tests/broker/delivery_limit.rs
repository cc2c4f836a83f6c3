//! The delivery limit acemq gives its quorum queues (above
//! `max_redeliveries`, so its own bound with reason `redelivered` fires
//! first), and a quorum queue created without one — by an earlier acemq —
//! that keeps working after the upgrade: declared as it is, a warning once
//! with the `rabbitmqctl set_policy` command, never a startup error.

use std::time::Duration;

use acemq::config::{ArgValue, QueueConfig, QueueType};
use acemq::topology::Topology;
use acemq::{App, BoxError, Config, Delivery};
use lapin::types::{AMQPValue, FieldTable};
use tower::service_fn;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::{
    connect, eventually, field_table, long_str, rabbitmqctl, rabbitmqctl_argv, topology_queues,
    unique, Broker, CapturedLogs, QueueCleanup, RABBITMQCTL_RUNS,
};

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn quorum(name: &str) -> QueueConfig {
    let mut q = QueueConfig::new(name);
    q.kind = QueueType::Quorum;
    q.dead_letter = true;
    q
}

/// The arguments the previous acemq declared a quorum queue and its
/// dead-letter queue with (no `x-delivery-limit`).
fn old_arguments(q: &str) -> (FieldTable, FieldTable) {
    let main = field_table(vec![
        ("x-queue-type", long_str("quorum")),
        ("x-dead-letter-exchange", long_str("")),
        ("x-dead-letter-routing-key", long_str(&format!("{q}.dlq"))),
    ]);
    let dlq = field_table(vec![("x-queue-type", long_str("quorum"))]);
    (main, dlq)
}

fn with_limit(mut t: FieldTable, limit: i64) -> FieldTable {
    t.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(limit));
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_gets_a_delivery_limit_above_max_redeliveries_and_its_dlq_a_high_one() {
    let q = unique("limit.declared");
    let mut queue = quorum(&q);
    queue.max_redeliveries = 7;
    let config = Config::new([queue]);
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let conn = connect().await;
    Topology::from_config(&config)
        .declare(&conn)
        .await
        .expect("declared");
    let mut broker = Broker::new().await;
    let (main, dlq) = old_arguments(&q);
    // The broker checks x-delivery-limit for equivalence: these pass only
    // if the queues have exactly these limits.
    broker
        .declare(&q, with_limit(main.clone(), 17))
        .await
        .expect("Q has x-delivery-limit = max_redeliveries + 10");
    broker
        .declare(&format!("{q}.dlq"), with_limit(dlq, 10_000))
        .await
        .expect("Q.dlq has x-delivery-limit 10000");
    let err = broker.declare(&q, main).await.expect_err("not without it");
    assert!(err.to_string().contains("x-delivery-limit"), "{err}");

    // A limit in the config's own arguments wins.
    let q2 = unique("limit.own");
    let mut queue = quorum(&q2);
    queue
        .arguments
        .insert("x-delivery-limit".into(), ArgValue::Int(3));
    let config = Config::new([queue]);
    let _cleanup2 = QueueCleanup::new(topology_queues(&config));
    Topology::from_config(&config)
        .declare(&conn)
        .await
        .expect("declared");
    broker
        .declare(&q2, with_limit(old_arguments(&q2).0, 3))
        .await
        .expect("the config's own limit");
}

// current_thread: the runner's tasks log to this thread's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_quorum_queue_created_without_a_delivery_limit_keeps_working_and_warns_once_with_the_policy_command(
) {
    let logs = CapturedLogs::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
    let q = unique("limit.upgrade");
    let dlq = format!("{q}.dlq");
    let config = Config::new([quorum(&q)]);
    let _cleanup = QueueCleanup::new(topology_queues(&config));
    let mut broker = Broker::new().await;
    // Created the old way, with a message waiting.
    let (main, dlq_args) = old_arguments(&q);
    broker.declare(&q, main).await.expect("the old Q");
    broker.declare(&dlq, dlq_args).await.expect("the old Q.dlq");
    broker.publish(&q, b"waiting", FieldTable::default()).await;

    let handled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = handled.clone();
    let handler = service_fn(move |_: Delivery| {
        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Ok::<(), BoxError>(()) }
    });
    let running = App::new(config.clone())
        .consume(&q, handler)
        .start()
        .await
        .expect("starts: an existing queue without the limit is not a config error");
    assert!(
        eventually(SECS(10), || async {
            handled.load(std::sync::atomic::Ordering::SeqCst) == 1
        })
        .await,
        "the waiting message is handled"
    );
    // Declared again (as after a broker cancel or a lost channel): no
    // second warning.
    let conn = connect().await;
    Topology::from_config(&config)
        .declare(&conn)
        .await
        .expect("declared again");
    running.drain().await.expect("a clean drain");

    let warnings: Vec<String> = logs
        .acemq_at_least(tracing::Level::WARN)
        .into_iter()
        .map(|(_, _, text)| text)
        .filter(|t| t.contains("set_policy"))
        .collect();
    let for_q: Vec<&String> = warnings
        .iter()
        .filter(|t| t.contains(&format!("quorum queue \"{q}\" exists")))
        .collect();
    let for_dlq: Vec<&String> = warnings
        .iter()
        .filter(|t| t.contains(&format!("quorum queue \"{dlq}\" exists")))
        .collect();
    assert_eq!(for_q.len(), 1, "one warning for Q: {warnings:#?}");
    assert_eq!(for_dlq.len(), 1, "one warning for Q.dlq: {warnings:#?}");
    assert!(
        for_dlq[0].contains(r#"'{"delivery-limit":10000}'"#),
        "{}",
        for_dlq[0]
    );

    // The command in the warning is one an operator can paste: run it.
    let command = for_q[0]
        .split("with a policy: ")
        .nth(1)
        .and_then(|rest| rest.split(" (a queue follows").next())
        .expect("the command in the warning")
        .to_owned();
    let expected = format!(
        r#"rabbitmqctl set_policy 'acemq-delivery-limit-{q}' '^{}$' '{{"delivery-limit":60}}' --apply-to queues"#,
        q.replace('.', r"\.")
    );
    assert_eq!(command, expected);
    let line = command.replacen("rabbitmqctl", &rabbitmqctl_argv().join(" "), 1);
    let out = tokio::process::Command::new("sh")
        .args(["-c", &line])
        .output()
        .await
        .expect("sh runs");
    let policy = format!("acemq-delivery-limit-{q}");
    let _policy_cleanup = PolicyCleanup(policy.clone());
    assert!(out.status.success(), "{line}: {out:?}");
    let applied = eventually(SECS(10), || async {
        let out = rabbitmqctl()
            .args(["list_queues", "-q", "--no-table-headers", "name", "policy"])
            .output()
            .await
            .expect(RABBITMQCTL_RUNS);
        String::from_utf8_lossy(&out.stdout).lines().any(|l| {
            l.split('\t')
                .map(str::trim)
                .eq([q.as_str(), policy.as_str()])
        })
    })
    .await;
    assert!(applied, "the policy applies to {q}");
}

/// Clears a policy when dropped, also when the test failed half-way.
struct PolicyCleanup(String);

impl Drop for PolicyCleanup {
    fn drop(&mut self) {
        let _ = crate::support::rabbitmqctl_blocking()
            .args(["clear_policy", &self.0])
            .output();
    }
}

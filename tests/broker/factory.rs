//! A connection factory of the user's (`App::connection_factory`): every
//! connection the runner opens goes through it — both at start, and the
//! consumers' one again when the broker closes it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::connection::{ConnectRequest, ConnectionRole};
use acemq::lapin::types::LongString;
use acemq::{App, BoxError, Delivery};
use lapin::types::FieldTable;

use crate::support::{all_queues, eventually, plain_config, unique, Broker, QueueCleanup};

/// `(pid, client_properties)` of every broker connection
/// (`rabbitmqctl list_connections pid client_properties`).
async fn connections() -> Vec<(String, String)> {
    crate::support::list_connections(&["pid", "client_properties"])
        .await
        .lines()
        .filter_map(|l| {
            let (pid, props) = l.split_once('\t')?;
            Some((pid.trim().to_owned(), props.to_owned()))
        })
        .collect()
}

/// The connections whose client properties hold `marker`, with whether each
/// is the publishing one.
async fn marked(marker: &str) -> Vec<(String, bool)> {
    connections()
        .await
        .into_iter()
        .filter(|(_, props)| props.contains(marker))
        .map(|(pid, props)| (pid, props.contains("(publisher)")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_factory_opens_both_connections_and_the_consumers_one_again_after_a_close() {
    let q = unique("factory");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let mut broker = Broker::new().await;
    let name = format!("acemq-test-factory-{}", q.rsplit('.').next().unwrap_or("x"));
    let name = format!("{name}-{}", std::process::id());
    let marker = format!("marker-{q}");
    let calls: Arc<Mutex<Vec<(ConnectionRole, String, String)>>> = Arc::default();
    let seen = calls.clone();
    let tag = marker.clone();
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = handled.clone();
    let app = App::new(plain_config(&q))
        .connection_name(name.clone())
        .connection_factory(move |request: ConnectRequest| {
            let seen = seen.clone();
            let tag = tag.clone();
            async move {
                seen.lock().unwrap().push((
                    request.role(),
                    request.connection_name().to_owned(),
                    format!("{request:?}"),
                ));
                let properties = request
                    .properties()
                    .clone()
                    .with_client_property("acemq-test-factory".into(), LongString::from(tag));
                request.with_properties(properties).connect().await
            }
        })
        .consume(
            &q,
            tower::service_fn(move |_d: Delivery| {
                let h = h.clone();
                async move {
                    h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<(), BoxError>(())
                }
            }),
        );
    let health = app.health();
    let running = app.start().await.expect("starts through the factory");
    {
        let calls = calls.lock().unwrap();
        let roles: Vec<_> = calls.iter().map(|(r, n, _)| (*r, n.clone())).collect();
        assert_eq!(
            roles,
            [
                (ConnectionRole::Consumer, name.clone()),
                (ConnectionRole::Publisher, format!("{name} (publisher)")),
            ],
            "one call per connection at start"
        );
        for (_, _, debug) in calls.iter() {
            let password = url::Url::parse(&acemq::connection::amqp_addr_from_env())
                .ok()
                .and_then(|u| u.password().map(str::to_owned));
            if let Some(pw) = password {
                assert!(
                    !debug.contains(&format!(":{pw}@")),
                    "the request's Debug hides the password: {debug}"
                );
            }
        }
    }
    // The broker sees the factory's client property on both connections.
    let both = eventually(Duration::from_secs(10), || async {
        marked(&marker).await.len() == 2
    })
    .await;
    let listed = marked(&marker).await;
    assert!(
        both,
        "both connections carry the factory's property: {listed:?}"
    );
    let consumer_pid = listed
        .iter()
        .find(|(_, publisher)| !publisher)
        .map(|(pid, _)| pid.clone())
        .expect("the consumers' connection");

    // The broker closes the consumers' connection: the supervisor reopens it
    // through the factory, and readiness comes back.
    let out = crate::support::rabbitmqctl()
        .args([
            "close_connection",
            &consumer_pid,
            "acemq test: closed by the broker",
        ])
        .output()
        .await
        .expect(crate::support::RABBITMQCTL_RUNS);
    assert!(
        out.status.success(),
        "rabbitmqctl close_connection failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let consumer_calls = || {
        calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _, _)| *r == ConnectionRole::Consumer)
            .count()
    };
    assert!(
        eventually(Duration::from_secs(20), || async {
            consumer_calls() >= 2 && health.is_ready()
        })
        .await,
        "reopened through the factory ({} consumer calls) and ready again: {:?}",
        consumer_calls(),
        health.snapshot()
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            let now = marked(&marker).await;
            now.len() == 2 && now.iter().all(|(pid, _)| *pid != consumer_pid)
        })
        .await,
        "the new consumers' connection carries the property too: {:?}",
        marked(&marker).await
    );
    // And it consumes.
    broker.publish(&q, b"order", FieldTable::default()).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            handled.load(std::sync::atomic::Ordering::SeqCst) == 1
        })
        .await,
        "a message is handled on the reopened connection"
    );
    running.drain().await.expect("a clean drain");
}

//! Process tests: run the `shop` example binary against the real broker,
//! send it SIGTERM / SIGKILL, and count what the broker holds afterwards.
//!
//! Each test writes its own config naming a unique queue and runs
//! `shop --config FILE --no-seed --queue Q --http ADDR`; orders are JSON
//! bodies published to `Q`. `/readyz` (JSON) says when an order is in flight.

use std::time::{Duration, Instant};

use lapin::types::FieldTable;

use crate::support::{all_queues, example_binary, shop_binary, unique, Broker, ShopProcess};

/// A shop config naming `q`, with `extra` top-level keys and `queue_extra`
/// keys of the queue.
fn config_yaml(q: &str, extra: &str, queue_extra: &str) -> String {
    format!("{extra}\nqueues:\n  - name: {q}\n{queue_extra}\n")
}

/// Publishes one order to `q`.
async fn order(broker: &mut Broker, q: &str, json: &str) {
    broker
        .publish(q, json.as_bytes(), FieldTable::default())
        .await;
}

/// The drain's own log lines from a run (for the report and for failures).
fn drain_lines(stderr: &str) -> String {
    stderr
        .lines()
        .filter(|l| l.contains("drain") || l.contains("signal") || l.contains("acemq:"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_an_order_in_flight_waits_for_it_acknowledges_it_and_exits_0() {
    let q = unique("proc-term");
    let mut broker = Broker::new().await;
    let yaml = config_yaml(&q, "shutdown_timeout: 10", "");
    let mut shop = ShopProcess::spawn(&q, &yaml, &[]);
    shop.wait_ready().await;
    order(&mut broker, &q, r#"{"id":"o-term","work_ms":1500}"#).await;
    shop.wait_in_flight(1).await;

    let t0 = Instant::now();
    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(15)).await;
    let took = t0.elapsed();
    let stderr = shop.stderr();
    eprintln!(
        "--- shop drain, clean with an order in flight:\n{}",
        drain_lines(&stderr)
    );
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(
        took >= Duration::from_millis(1000) && took <= Duration::from_secs(4),
        "the drain should wait out the 1.5 s order: took {took:?}"
    );
    assert!(stderr.contains("order handled"), "stderr:\n{stderr}");
    assert!(
        stderr.contains("every handler finished (1 during the drain)"),
        "stderr:\n{stderr}"
    );
    assert_eq!(
        broker.ready(&q).await,
        Some(0),
        "the order was acknowledged"
    );
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_orders_buffered_behind_the_running_one_finishes_it_and_hands_the_rest_back() {
    let q = unique("proc-held");
    let mut broker = Broker::new().await;
    let yaml = config_yaml(
        &q,
        "shutdown_timeout: 10",
        "    prefetch: 20\n    concurrency: 1",
    );
    let mut shop = ShopProcess::spawn(&q, &yaml, &[]);
    shop.wait_ready().await;
    for i in 0..5 {
        order(
            &mut broker,
            &q,
            &format!(r#"{{"id":"o-held-{i}","work_ms":1500}}"#),
        )
        .await;
    }
    shop.wait_in_flight(1).await;
    assert!(
        broker.wait_ready(&q, 0, Duration::from_secs(5)).await,
        "the broker sent all five ahead"
    );

    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(15)).await;
    let stderr = shop.stderr();
    eprintln!("--- shop drain, deliveries held:\n{}", drain_lines(&stderr));
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(
        stderr.contains("every handler finished (1 during the drain); 4 deliveries were fetched but never handled"),
        "stderr:\n{stderr}"
    );
    assert!(
        broker.wait_ready(&q, 4, Duration::from_secs(5)).await,
        "the four unhandled orders are back"
    );
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_an_order_that_ignores_cancellation_exits_75_naming_the_queue_and_hands_the_order_back(
) {
    let q = unique("proc-timeout");
    let mut broker = Broker::new().await;
    let yaml = config_yaml(&q, "shutdown_timeout: 1", "");
    let mut shop = ShopProcess::spawn(&q, &yaml, &[]);
    shop.wait_ready().await;
    order(
        &mut broker,
        &q,
        r#"{"id":"o-stuck","work_ms":60000,"ignore_cancel":true}"#,
    )
    .await;
    shop.wait_in_flight(1).await;

    let t0 = Instant::now();
    shop.signal("-TERM");
    // shutdown_timeout 1 s + abandon_after 5 s + exit, with slack.
    let status = shop.exit_within(Duration::from_secs(12)).await;
    let took = t0.elapsed();
    let stderr = shop.stderr();
    eprintln!(
        "--- shop drain, deadline expired:\n{}",
        drain_lines(&stderr)
    );
    assert_eq!(status.code(), Some(75), "stderr:\n{stderr}");
    assert!(
        took >= Duration::from_millis(5500) && took <= Duration::from_secs(9),
        "1 s deadline + 5 s grace: took {took:?}"
    );
    let last = stderr
        .lines()
        .find(|l| l.starts_with("acemq: "))
        .unwrap_or_else(|| panic!("no one-line reason on stderr:\n{stderr}"));
    assert!(
        last.contains(&format!("{q}: 1 in flight")),
        "the reason names the queue and the count: {last}"
    );
    assert!(
        broker.wait_ready(&q, 1, Duration::from_secs(5)).await,
        "the order is back on the queue"
    );
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_handler_leaves_the_order_to_the_broker_which_redelivers_it() {
    let q = unique("proc-kill");
    let mut broker = Broker::new().await;
    let yaml = config_yaml(&q, "", "");
    let mut shop = ShopProcess::spawn(&q, &yaml, &[]);
    shop.wait_ready().await;
    order(&mut broker, &q, r#"{"id":"o-kill","work_ms":30000}"#).await;
    shop.wait_in_flight(1).await;

    shop.signal("-KILL");
    let status = shop.exit_within(Duration::from_secs(5)).await;
    assert_eq!(status.code(), None, "killed by a signal");
    let m = broker
        .get_within(&q, Duration::from_secs(10))
        .await
        .expect("the order is back on the queue");
    assert!(m.delivery.redelivered, "redelivered is set");
    assert_eq!(&m.delivery.data[..], br#"{"id":"o-kill","work_ms":30000}"#);
    broker.delete(&all_queues(&q)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_with_prefetch_zero_exits_78_naming_prefetch() {
    let q = unique("proc-badconfig");
    let yaml = config_yaml(&q, "", "    prefetch: 0");
    let mut shop = ShopProcess::spawn(&q, &yaml, &[]);
    let status = shop.exit_within(Duration::from_secs(10)).await;
    let stderr = shop.stderr();
    assert_eq!(status.code(), Some(78), "stderr:\n{stderr}");
    assert!(stderr.contains("prefetch"), "stderr:\n{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_exits_69_at_once_saying_rabbitmq_is_not_there() {
    let q = unique("proc-refused");
    let yaml = config_yaml(&q, "connect_timeout: 2", "");
    shop_binary(); // built before the clock starts
    let t0 = Instant::now();
    let mut shop = ShopProcess::spawn(
        &q,
        &yaml,
        &[("AMQP_ADDR", "amqp://guest:guest@127.0.0.1:1/%2f")],
    );
    let status = shop.exit_within(Duration::from_secs(10)).await;
    let stderr = shop.stderr();
    assert_eq!(status.code(), Some(69), "stderr:\n{stderr}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        stderr.contains("could not connect") && stderr.contains("is RabbitMQ running there"),
        "stderr:\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_address_where_nothing_answers_exits_69_after_connect_timeout_saying_no_broker_answered(
) {
    // Accepts TCP connections (the kernel's backlog) but never speaks AMQP.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = format!("amqp://guest:guest@{}/%2f", silent.local_addr().unwrap());
    let q = unique("proc-silent");
    let yaml = config_yaml(&q, "connect_timeout: 2", "");
    shop_binary(); // built before the clock starts
    let t0 = Instant::now();
    let mut shop = ShopProcess::spawn(&q, &yaml, &[("AMQP_ADDR", &addr)]);
    let status = shop.exit_within(Duration::from_secs(10)).await;
    let took = t0.elapsed();
    let stderr = shop.stderr();
    assert_eq!(status.code(), Some(69), "stderr:\n{stderr}");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(6),
        "connect_timeout 2 s: took {took:?}"
    );
    assert!(stderr.contains("no broker answered"), "stderr:\n{stderr}");
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_exits_69_saying_authentication_failed_and_never_prints_the_password() {
    let q = unique("proc-auth");
    let yaml = config_yaml(&q, "connect_timeout: 5", "");
    let mut shop = ShopProcess::spawn(
        &q,
        &yaml,
        &[(
            "AMQP_ADDR",
            &crate::support::addr_as("guest", "wrong-pass-XYZ"),
        )],
    );
    let status = shop.exit_within(Duration::from_secs(10)).await;
    let (stderr, stdout) = (shop.stderr(), shop.stdout());
    assert_eq!(status.code(), Some(69), "stderr:\n{stderr}");
    assert!(
        stderr.contains("authentication failed"),
        "stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("wrong-pass-XYZ") && !stdout.contains("wrong-pass-XYZ"),
        "the password leaked:\n{stdout}\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_query_parameter_or_a_non_amqp_address_in_amqp_addr_exits_78_with_one_line_each() {
    let q = unique("proc-badaddr");
    let yaml = config_yaml(&q, "connect_timeout: 5", "");
    let good = crate::support::addr_as("guest", "s3cret-XYZ");
    let bad_query = format!("{good}?heartbeat=notanumber");
    // The broker answers at the first address; the second is still an error.
    let list = format!("{good}, http://guest:s3cret-XYZ@127.0.0.1:15672/");
    for (amqp_addr, says) in [
        (
            bad_query.as_str(),
            "heartbeat=notanumber is not a whole number",
        ),
        (
            list.as_str(),
            "address 2 of 2: http://guest:***@127.0.0.1:15672/ is not a valid amqp:// URL (its scheme is \"http\")",
        ),
    ] {
        let mut shop = ShopProcess::spawn(&q, &yaml, &[("AMQP_ADDR", amqp_addr)]);
        let status = shop.exit_within(Duration::from_secs(10)).await;
        let (stderr, stdout) = (shop.stderr(), shop.stdout());
        assert_eq!(status.code(), Some(78), "stderr:\n{stderr}");
        // Told once, as the shop's ERROR line (it logs to stderr).
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("invalid config: AMQP_ADDR"))
            .collect();
        assert_eq!(lines.len(), 1, "one line:\n{stderr}");
        assert!(
            lines[0].contains(" ERROR ")
                && lines[0].contains("invalid config: AMQP_ADDR has 1 unusable address(es)")
                && lines[0].contains(says),
            "stderr:\n{stderr}"
        );
        assert!(!stderr.contains("is RabbitMQ running"), "stderr:\n{stderr}");
        assert!(
            !stderr.contains("s3cret-XYZ") && !stdout.contains("s3cret-XYZ"),
            "the password leaked:\n{stdout}\n{stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_above_prefetch_or_a_duration_above_its_maximum_exits_78_with_one_line() {
    let q = unique("proc-limits");
    for (extra, queue_extra, says) in [
        (
            "",
            "    concurrency: 4294967296",
            "shop: invalid config: queues[0].concurrency (4294967296) is above prefetch (32): \
             lower concurrency to at most 32",
        ),
        (
            "shutdown_timeout: \"99999999999999h\"",
            "",
            "shop: invalid config: shutdown_timeout (",
        ),
    ] {
        let yaml = config_yaml(&q, extra, queue_extra);
        let mut shop = ShopProcess::spawn(&q, &yaml, &[]);
        let status = shop.exit_within(Duration::from_secs(10)).await;
        let stderr = shop.stderr();
        assert_eq!(status.code(), Some(78), "stderr:\n{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line:\n{stderr}");
        assert!(stderr.starts_with(says), "stderr:\n{stderr}");
        if extra.contains("shutdown_timeout") {
            assert!(
                stderr.contains("above its maximum of 24h"),
                "stderr:\n{stderr}"
            );
        }
    }
}

/// The docs' pattern (`examples/admin_beside_app.rs`: the admin server
/// spawned until `health.drained()`, then `app.run()`, then the server
/// awaited) with no broker at `AMQP_ADDR`: the start fails, `drained`
/// resolves, the server stops, and the process exits 69 at once rather than
/// waiting for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_admin_pattern_exits_69_when_no_broker_is_there() {
    let bin = example_binary("admin_beside_app"); // built before the clock starts
    let t0 = Instant::now();
    let mut child = tokio::process::Command::new(bin)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("AMQP_ADDR", "amqp://guest:guest@127.0.0.1:1/%2f")
        .env("ADMIN_ADDR", "127.0.0.1:0")
        .env_remove("ACEMQ_ADMIN_TOKEN")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the example starts");
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .unwrap_or_else(|_| panic!("still running after 15 s: drained() never resolved"))
        .expect("waited");
    let took = t0.elapsed();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use tokio::io::AsyncReadExt;
        let _ = e.read_to_string(&mut stderr).await;
    }
    assert_eq!(status.code(), Some(69), "stderr:\n{stderr}");
    eprintln!("the docs' admin pattern with no broker exited 69 after {took:?}");
}

//! The `acemq` command against the real RabbitMQ at `AMQP_ADDR` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`): each test runs the built binary
//! on queues and exchanges of its own (unique names, deleted at the end), so
//! the tests run in parallel safely. No mock broker.

#![allow(unreachable_pub, missing_docs)]

mod support;

use std::time::Duration;

use acemq::lapin::types::AMQPValue;
use acemq::lapin::BasicProperties;
use support::{acemq, long_str, table, unique, Broker, Cleanup, ConfigFile};

/// A config with one exchange and one queue bound to it, with a
/// dead-letter queue and two retry rungs (2s and 4s).
fn shop_config(x: &str, q: &str) -> ConfigFile {
    ConfigFile::yaml(&format!(
        r#"
exchanges:
  - {{ name: {x}, type: topic }}
queues:
  - name: {q}
    dead_letter: true
    retries: {{ max_attempts: 4, initial_delay: 1, max_delay: 4, broker_wait_threshold: 2 }}
    bindings:
      - {{ exchange: {x}, routing_keys: ["orders.*"] }}
"#
    ))
}

/// Everything [`shop_config`] declares, for the cleanup.
fn shop_cleanup(x: &str, q: &str) -> Cleanup {
    Cleanup {
        queues: vec![
            q.to_owned(),
            format!("{q}.dlq"),
            format!("{q}.retry.2s"),
            format!("{q}.retry.4s"),
        ],
        exchanges: vec![x.to_owned()],
    }
}

/// The headers acemq's dead-letter layer writes.
fn dead_lettered(q: &str, reason: &str, attempts: i64, id: &str) -> BasicProperties {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    BasicProperties::default()
        .with_message_id(id.into())
        .with_headers(table(vec![
            ("x-acemq-reason", long_str(reason)),
            ("x-acemq-error", long_str("boom: the order has no lines")),
            ("x-acemq-attempts", AMQPValue::LongLongInt(attempts)),
            ("x-acemq-attempt", AMQPValue::LongLongInt(attempts)),
            ("x-acemq-queue", long_str(q)),
            (
                "x-acemq-dead-lettered-at",
                AMQPValue::LongLongInt(now_ms - 90_000),
            ),
            ("x-acemq-original-exchange", long_str("shop")),
            (
                "x-acemq-original-routing-key",
                long_str(&format!("orders.{id}")),
            ),
            ("x-custom", long_str("kept")),
        ]))
}

/// Message ids of `queue`'s messages, in order, taking them all.
async fn ids(broker: &mut Broker, queue: &str) -> Vec<String> {
    broker
        .drain(queue)
        .await
        .iter()
        .map(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default()
        })
        .collect()
}

// ---- topology plan and apply

#[tokio::test]
async fn plan_lists_what_is_missing_without_creating_it_and_apply_declares_it() {
    let (x, q) = (unique("plan.x"), unique("plan.q"));
    let _cleanup = shop_cleanup(&x, &q);
    let config = shop_config(&x, &q);
    let mut broker = Broker::new().await;

    let plan = acemq(&["topology", "plan", "--config", config.path()]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    for line in [
        format!("+ exchange {x} (missing)"),
        format!("+ queue {q} (missing)"),
        format!("+ queue {q}.dlq (missing)"),
        format!("+ queue {q}.retry.2s (missing)"),
        format!("+ queue {q}.retry.4s (missing)"),
        format!("+ binding {q} to exchange {x} key \"orders.*\""),
    ] {
        assert!(plan.stdout.contains(&line), "{line:?} in\n{plan}");
    }
    assert!(
        plan.stdout
            .contains("5 missing, 0 different, 0 as configured, 1 binding missing"),
        "{plan}"
    );
    assert_eq!(broker.ready(&q).await, None, "plan created nothing");
    assert_eq!(broker.ready(&format!("{q}.dlq")).await, None);
    assert!(!broker.exchange_exists(&x).await, "plan created nothing");

    let apply = acemq(&["topology", "apply", "--config", config.path()]).await;
    assert_eq!(apply.code, Some(0), "{apply}");
    assert!(
        apply
            .stdout
            .contains(&format!("+ queue {q}.retry.4s (created)")),
        "{apply}"
    );
    assert!(
        apply
            .stdout
            .contains("5 created, 0 already there, 1 binding applied"),
        "{apply}"
    );
    for name in [
        q.clone(),
        format!("{q}.dlq"),
        format!("{q}.retry.2s"),
        format!("{q}.retry.4s"),
    ] {
        assert_eq!(broker.ready(&name).await, Some(0), "{name} declared");
    }
    assert!(broker.exchange_exists(&x).await);

    let again = acemq(&["topology", "plan", "--config", config.path()]).await;
    assert_eq!(again.code, Some(0), "{again}");
    for line in [
        format!("= queue {q}"),
        format!("= queue {q}.retry.2s"),
        format!("= exchange {x}"),
    ] {
        assert!(again.stdout.contains(&line), "{line:?} in\n{again}");
    }
    assert!(
        again
            .stdout
            .contains("applied by `apply` (AMQP cannot read bindings)"),
        "{again}"
    );
    let json = acemq(&["topology", "plan", "--config", config.path(), "--json"]).await;
    assert_eq!(json.code, Some(0), "{json}");
    let v = json.json();
    assert_eq!(v["in_sync"], true, "{json}");
    assert_eq!(v["counts"]["same"], 5, "{json}");
    assert_eq!(v["items"].as_array().map(Vec::len), Some(6), "{json}");

    let twice = acemq(&["topology", "apply", "--config", config.path()]).await;
    assert_eq!(twice.code, Some(0), "{twice}");
    assert!(
        twice.stdout.contains("0 created, 5 already there"),
        "{twice}"
    );
}

#[tokio::test]
async fn a_conflicting_argument_shows_in_plan_and_apply_refuses_without_changing_anything() {
    let (x, q) = (unique("conflict.x"), unique("conflict.q"));
    let _cleanup = shop_cleanup(&x, &q);
    let config = shop_config(&x, &q);
    let mut broker = Broker::new().await;
    // The 2 s rung exists with another TTL; everything else is missing.
    let rung = format!("{q}.retry.2s");
    broker
        .declare(
            &rung,
            table(vec![
                ("x-message-ttl", AMQPValue::LongLongInt(5000)),
                ("x-dead-letter-exchange", long_str("")),
                ("x-dead-letter-routing-key", long_str(&q)),
            ]),
        )
        .await;

    let plan = acemq(&["topology", "plan", "--config", config.path()]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    let line = format!("~ queue {rung}: x-message-ttl differs (PRECONDITION_FAILED");
    assert!(plan.stdout.contains(&line), "{line:?} in\n{plan}");
    assert!(plan.stdout.contains("1 different"), "{plan}");

    let apply = acemq(&["topology", "apply", "--config", config.path()]).await;
    assert_eq!(apply.code, Some(78), "{apply}");
    for part in [
        format!("queue \"{rung}\" already exists with a different x-message-ttl"),
        format!("rabbitmqctl delete_queue {rung}"),
        "Nothing was changed.".to_owned(),
    ] {
        assert!(apply.stderr.contains(&part), "{part:?} in\n{apply}");
    }
    assert_eq!(broker.ready(&q).await, None, "apply declared nothing");
    assert_eq!(broker.ready(&format!("{q}.dlq")).await, None);
    assert!(!broker.exchange_exists(&x).await);
    // The conflicting queue is untouched: the probe's declare was refused.
    let again = acemq(&["topology", "plan", "--config", config.path()]).await;
    assert!(again.stdout.contains(&line), "{again}");

    let json = acemq(&["--json", "topology", "apply", "--config", config.path()]).await;
    assert_eq!(json.code, Some(78), "{json}");
    assert_eq!(json.json()["applied"], false, "{json}");
}

// ---- queues

#[tokio::test]
async fn queues_shows_each_queue_with_its_dead_letter_queue_and_rungs() {
    let (x, q) = (unique("depth.x"), unique("depth.q"));
    let _cleanup = shop_cleanup(&x, &q);
    let config = shop_config(&x, &q);
    let mut broker = Broker::new().await;

    let before = acemq(&["queues", "--config", config.path()]).await;
    assert_eq!(
        before.code,
        Some(0),
        "missing is shown, not an error: {before}"
    );
    assert!(before.stdout.contains("4 missing"), "{before}");
    let strict = acemq(&["queues", "--config", config.path(), "--strict"]).await;
    assert_eq!(strict.code, Some(1), "{strict}");

    let apply = acemq(&["topology", "apply", "--config", config.path()]).await;
    assert_eq!(apply.code, Some(0), "{apply}");
    for i in 0..3 {
        broker
            .publish(&q, format!("{i}").as_bytes(), BasicProperties::default())
            .await;
    }
    let dlq = format!("{q}.dlq");
    for id in ["a", "b"] {
        broker
            .publish(&dlq, b"x", dead_lettered(&q, "rejected", 1, id))
            .await;
    }

    let table = acemq(&["queues", "--config", config.path(), "--strict"]).await;
    assert_eq!(table.code, Some(0), "{table}");
    let row = |name: &str| {
        table
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>())
    };
    assert_eq!(row(&q), Some(vec!["3", "0"]), "{table}");
    assert_eq!(row(&dlq), Some(vec!["2", "0"]), "{table}");
    assert_eq!(
        row(&format!("{q}.retry.4s")),
        Some(vec!["0", "0"]),
        "{table}"
    );

    let json = acemq(&["queues", "--config", config.path(), "--json"]).await;
    let v = json.json();
    assert_eq!(v["queues"][0]["name"], q.as_str(), "{json}");
    assert_eq!(v["queues"][0]["ready"], 3, "{json}");
    assert_eq!(v["queues"][0]["dead_letter_queue"]["ready"], 2, "{json}");
    assert_eq!(
        v["queues"][0]["retry_rungs"].as_array().map(Vec::len),
        Some(2)
    );
}

// ---- dlq peek

async fn peek_leaves_the_queue_as_it_was(queue_type: &str) {
    let q = unique(&format!("peek.{queue_type}"));
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![dlq.clone()]);
    let mut broker = Broker::new().await;
    broker
        .declare(&dlq, table(vec![("x-queue-type", long_str(queue_type))]))
        .await;
    let reasons = ["rejected", "max-attempts", "rejected", "panic", "rejected"];
    for (i, reason) in reasons.iter().enumerate() {
        let id = format!("m{}", i + 1);
        broker
            .publish(
                &dlq,
                format!("{{\"order\":{i}}}").as_bytes(),
                dead_lettered(&q, reason, 3, &id),
            )
            .await;
    }

    let peek = acemq(&["dlq", "peek", &q, "--limit", "2"]).await;
    assert_eq!(peek.code, Some(0), "{peek}");
    for part in [
        "#1 message id m1, dead-lettered 1m3",
        "reason    rejected, after 3 attempts",
        "from      exchange \"shop\", routing key \"orders.m1\"",
        "error     boom: the order has no lines",
        "body      {\"order\":0} (11 bytes)",
        "#2 message id m2",
        "reason    max-attempts, after 3 attempts",
    ] {
        assert!(peek.stdout.contains(part), "{part:?} in\n{peek}");
    }
    assert!(!peek.stdout.contains("message id m3"), "--limit 2: {peek}");
    assert!(
        peek.stdout
            .contains(&format!("2 messages shown of 5 in {dlq}")),
        "{peek}"
    );

    // --reason filters; the dead-letter queue's own name works too.
    let rejected = acemq(&["dlq", "peek", &dlq, "--reason", "rejected", "--json"]).await;
    assert_eq!(rejected.code, Some(0), "{rejected}");
    let v = rejected.json();
    let shown: Vec<(&str, i64)> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["message_id"].as_str().unwrap(),
                m["position"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shown, [("m1", 1), ("m3", 3), ("m5", 5)], "{rejected}");
    assert_eq!(v["messages"][0]["attempts"], 3);
    assert_eq!(v["messages"][0]["origin"]["routing_key"], "orders.m1");
    assert_eq!(v["taken"], 5);

    // Every message is still there, in its order.
    assert!(broker.wait_ready(&dlq, 5, Duration::from_secs(5)).await);
    let left = broker.drain(&dlq).await;
    let got: Vec<String> = left
        .iter()
        .map(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        got,
        ["m1", "m2", "m3", "m4", "m5"],
        "{queue_type}: same messages, same order"
    );
    assert!(
        left.iter().all(|m| m.delivery.redelivered),
        "marked redelivered"
    );
}

#[tokio::test]
async fn peek_shows_reason_attempts_origin_and_id_and_leaves_a_classic_queue_as_it_was() {
    peek_leaves_the_queue_as_it_was("classic").await;
}

#[tokio::test]
async fn peek_leaves_a_quorum_queue_in_its_order_and_says_it_counted_a_delivery() {
    peek_leaves_the_queue_as_it_was("quorum").await;
    let q = unique("peek.count");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![dlq.clone()]);
    let mut broker = Broker::new().await;
    broker
        .declare(&dlq, table(vec![("x-queue-type", long_str("quorum"))]))
        .await;
    broker
        .publish(&dlq, b"x", dead_lettered(&q, "panic", 1, "only"))
        .await;
    for _ in 0..2 {
        let peek = acemq(&["dlq", "peek", &q]).await;
        assert_eq!(peek.code, Some(0), "{peek}");
    }
    let peek = acemq(&["dlq", "peek", &q, "--json"]).await;
    assert_eq!(
        peek.json()["max_delivery_count"],
        2,
        "each peek counts: {peek}"
    );
    let text = acemq(&["dlq", "peek", &q]).await;
    assert!(text.stdout.contains("delivery count 3"), "{text}");
    assert!(
        text.stderr.contains("counts deliveries (a quorum queue)"),
        "{text}"
    );
    assert_eq!(ids(&mut broker, &dlq).await, ["only"]);
}

#[tokio::test]
async fn a_peek_shows_a_message_the_broker_dead_lettered_by_its_x_death() {
    let q = unique("peek.xdeath");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&dlq, table(vec![])).await;
    // The broker's own dead-lettering: a TTL of 1 ms into the DLQ.
    broker
        .declare(
            &q,
            table(vec![
                ("x-message-ttl", AMQPValue::LongLongInt(1)),
                ("x-dead-letter-exchange", long_str("")),
                ("x-dead-letter-routing-key", long_str(&dlq)),
            ]),
        )
        .await;
    broker
        .publish(
            &q,
            b"\x00\x01binary\xff",
            BasicProperties::default().with_message_id("expired".into()),
        )
        .await;
    assert!(broker.wait_ready(&dlq, 1, Duration::from_secs(5)).await);
    let peek = acemq(&["dlq", "peek", &q]).await;
    assert_eq!(peek.code, Some(0), "{peek}");
    for part in [
        "reason    none (the broker dead-lettered it: expired)",
        &format!("from      exchange \"\", routing key \"{q}\""),
        "body      \\u{0}\\u{1}binary\\xff (9 bytes)",
    ] {
        assert!(peek.stdout.contains(part), "{part:?} in\n{peek}");
    }
    let none = acemq(&["dlq", "peek", &q, "--reason", "none", "--json"]).await;
    assert_eq!(
        none.json()["messages"][0]["broker_reason"],
        "expired",
        "{none}"
    );
}

#[tokio::test]
async fn peeking_at_a_queue_that_is_not_there_exits_65() {
    let q = unique("peek.none");
    let peek = acemq(&["dlq", "peek", &q]).await;
    assert_eq!(peek.code, Some(65), "{peek}");
    assert!(
        peek.stderr
            .contains(&format!("there is no queue \"{q}.dlq\"")),
        "{peek}"
    );
}

// ---- dlq replay

#[tokio::test]
async fn replay_moves_the_chosen_reason_back_with_the_attempt_reset_then_the_rest() {
    let q = unique("replay.moves");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&q, table(vec![])).await;
    broker.declare(&dlq, table(vec![])).await;
    for (id, reason) in [("a", "rejected"), ("b", "max-attempts"), ("c", "rejected")] {
        broker
            .publish(&dlq, id.as_bytes(), dead_lettered(&q, reason, 3, id))
            .await;
    }

    let rejected = acemq(&["dlq", "replay", &q, "--reason", "rejected"]).await;
    assert_eq!(rejected.code, Some(0), "{rejected}");
    assert!(
        rejected.stdout.contains(&format!(
            "moved 2 from {dlq} to {q} (rejected: 2); 1 left in {dlq} (other reasons)"
        )),
        "{rejected}"
    );
    assert_eq!(broker.ready(&dlq).await, Some(1), "the other reason stays");
    let moved = broker.drain(&q).await;
    assert_eq!(moved.len(), 2);
    for (m, id) in moved.iter().zip(["a", "c"]) {
        assert_eq!(&m.delivery.data[..], id.as_bytes(), "in order");
        let h =
            acemq::convert::headers_from_table(m.delivery.properties.headers().as_ref().unwrap());
        for gone in [
            "x-acemq-reason",
            "x-acemq-attempt",
            "x-acemq-attempts",
            "x-acemq-error",
        ] {
            assert!(
                h.get(gone).is_none(),
                "{gone} stripped: the attempt count is reset"
            );
        }
        assert_eq!(h.get("x-custom").and_then(|v| v.as_str()), Some("kept"));
        let key = format!("orders.{id}");
        assert_eq!(
            h.get("x-acemq-original-routing-key")
                .and_then(|v| v.as_str()),
            Some(key.as_str()),
            "where it came from is kept"
        );
    }

    let rest = acemq(&["dlq", "replay", &q, "--json"]).await;
    assert_eq!(rest.code, Some(0), "{rest}");
    let v = rest.json();
    assert_eq!(
        (v["moved"].as_i64(), v["skipped"].as_i64()),
        (Some(1), Some(0)),
        "{rest}"
    );
    assert_eq!(
        broker.ready(&dlq).await,
        Some(0),
        "the dead-letter queue is empty"
    );
    assert_eq!(ids(&mut broker, &q).await, ["b"]);
}

#[tokio::test]
async fn replay_without_a_queue_to_move_back_to_exits_65_and_moves_nothing() {
    let q = unique("replay.noqueue");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&dlq, table(vec![])).await;
    for id in ["a", "b"] {
        broker
            .publish(&dlq, b"x", dead_lettered(&q, "rejected", 1, id))
            .await;
    }
    let run = acemq(&["dlq", "replay", &q]).await;
    assert_eq!(run.code, Some(65), "{run}");
    assert!(
        run.stderr.contains(&format!("there is no queue \"{q}\"")),
        "{run}"
    );
    assert!(broker.wait_ready(&dlq, 2, Duration::from_secs(5)).await);
    assert_eq!(
        ids(&mut broker, &dlq).await,
        ["a", "b"],
        "nothing lost, order kept"
    );

    let nodlq = unique("replay.nodlq");
    let _nodlq = Cleanup::queues(vec![nodlq.clone()]);
    broker.declare(&nodlq, table(vec![])).await;
    let run = acemq(&["dlq", "replay", &nodlq]).await;
    assert_eq!(run.code, Some(65), "{run}");
    assert!(run.stderr.contains(&format!("{nodlq}.dlq")), "{run}");
}

#[tokio::test]
async fn a_replay_killed_half_way_loses_nothing() {
    const N: usize = 3000;
    let q = unique("replay.killed");
    let dlq = format!("{q}.dlq");
    let _cleanup = Cleanup::queues(vec![q.clone(), dlq.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&q, table(vec![])).await;
    broker.declare(&dlq, table(vec![])).await;
    for i in 0..N {
        let id = format!("{i:05}");
        broker
            .publish(&dlq, b"x", dead_lettered(&q, "rejected", 1, &id))
            .await;
    }
    let mut child = support::command(&["dlq", "replay", &q])
        .spawn()
        .expect("runs");
    // Killed once it has moved some, and (most likely) not all.
    let end = std::time::Instant::now() + Duration::from_secs(30);
    let mut started = false;
    while !started && std::time::Instant::now() < end {
        started = broker.ready(&q).await.unwrap_or(0) > 10;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.start_kill().expect("SIGKILL");
    let _ = child.wait().await;
    assert!(started, "the replay moved messages");
    // The broker gives back what the killed replay held.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let back = ids(&mut broker, &q).await;
    let left = ids(&mut broker, &dlq).await;
    let mut all: Vec<String> = back.iter().chain(left.iter()).cloned().collect();
    all.sort();
    all.dedup();
    assert_eq!(
        all.len(),
        N,
        "every message is in one queue or the other ({} moved, {} left)",
        back.len(),
        left.len()
    );
    assert!(back.len() + left.len() <= N + 1, "at most one in both");
    eprintln!("killed after moving {} of {N}", back.len());
}

// ---- errors and exit codes

#[tokio::test]
async fn a_bad_config_exits_78_naming_the_field() {
    let q = unique("badconfig");
    let config = ConfigFile::yaml(&format!("queues:\n  - name: {q}\n    prefetch: 0\n"));
    for verb in [
        &["topology", "plan"][..],
        &["topology", "apply"],
        &["queues"],
    ] {
        let mut args = verb.to_vec();
        args.extend(["--config", config.path()]);
        let run = acemq(&args).await;
        assert_eq!(run.code, Some(78), "{run}");
        assert!(
            run.stderr
                .contains("invalid config: queues[0].prefetch is 0"),
            "{run}"
        );
    }
    let typo = ConfigFile::yaml(&format!("queues:\n  - name: {q}\n    prefecth: 5\n"));
    let run = acemq(&["topology", "plan", "--config", typo.path()]).await;
    assert_eq!(run.code, Some(78), "{run}");
    assert!(
        run.stderr.contains("prefecth"),
        "the unknown key is named: {run}"
    );
    let missing = acemq(&["topology", "plan", "--config", "/nonexistent/acemq.yaml"]).await;
    assert_eq!(missing.code, Some(78), "{missing}");
    assert!(
        missing.stderr.contains("cannot read config file"),
        "{missing}"
    );
    let mut broker = Broker::new().await;
    assert_eq!(broker.ready(&q).await, None, "nothing declared");
}

#[tokio::test]
async fn an_unreachable_broker_exits_69_without_printing_the_password() {
    let q = unique("unreachable");
    let config = ConfigFile::yaml(&format!("queues:\n  - name: {q}\n"));
    let addr = "amqp://guest:s3cret-pw@127.0.0.1:1/%2f";
    let runs = [
        acemq(&[
            "topology",
            "plan",
            "--config",
            config.path(),
            "--amqp-addr",
            addr,
        ])
        .await,
        acemq(&["queues", "--config", config.path(), "--amqp-addr", addr]).await,
        acemq(&["dlq", "peek", &q, "--amqp-addr", addr]).await,
        acemq(&["dlq", "replay", &q, "--amqp-addr", addr]).await,
        {
            let mut cmd = support::command(&["topology", "apply", "--config", config.path()]);
            cmd.env("AMQP_ADDR", addr);
            support::run(cmd).await
        },
        acemq(&[
            "queues",
            "--config",
            config.path(),
            "--amqp-addr",
            "amqp://guest:guest@127.0.0.1:1/%2f",
        ])
        .await,
    ];
    for run in runs {
        assert_eq!(run.code, Some(69), "{run}");
        assert!(!run.all().contains("s3cret"), "no password: {run}");
        assert!(!run.all().contains("guest:guest"), "no password: {run}");
        assert!(
            run.stderr.contains("127.0.0.1:1"),
            "names the broker: {run}"
        );
    }
}

#[tokio::test]
async fn the_address_comes_from_the_flag_then_amqp_addr_then_the_config() {
    let q = unique("addr");
    let good = support::addr();
    let bad = "amqp://guest:s3cret@127.0.0.1:1/%2f";
    let with_bad = ConfigFile::yaml(&format!("addresses: [\"{bad}\"]\nqueues:\n  - name: {q}\n"));
    let plan = |env: Option<&str>, flag: Option<&str>| {
        let mut cmd = support::command(&["queues", "--config", with_bad.path()]);
        cmd.env_remove("AMQP_ADDR");
        if let Some(env) = env {
            cmd.env("AMQP_ADDR", env);
        }
        if let Some(flag) = flag {
            cmd.args(["--amqp-addr", flag]);
        }
        support::run(cmd)
    };
    assert_eq!(
        plan(None, None).await.code,
        Some(69),
        "the config's address"
    );
    assert_eq!(
        plan(Some(&good), None).await.code,
        Some(0),
        "AMQP_ADDR wins over the config"
    );
    assert_eq!(
        plan(Some(bad), Some(&good)).await.code,
        Some(0),
        "the flag wins over both"
    );
    let run = plan(None, Some("http://u:s3cret@h/")).await;
    assert_eq!(
        run.code,
        Some(64),
        "a malformed flag is a usage error: {run}"
    );
    assert!(!run.all().contains("s3cret"), "{run}");
}

#[tokio::test]
async fn usage_errors_exit_64_and_help_exits_0() {
    for args in [
        &["--frobnicate"][..],
        &[],
        &["topology"],
        &["topology", "plan"],
        &["queues", "--config"],
        &["dlq", "peek"],
        &["dlq", "replay", "q", "--reason", "oops"],
        &["dlq", "peek", "q", "--limit", "many"],
    ] {
        let run = acemq(args).await;
        assert_eq!(run.code, Some(64), "{args:?}: {run}");
    }
    let reason = acemq(&["dlq", "replay", "q", "--reason", "oops"]).await;
    assert!(
        reason.stderr.contains("not a reason acemq writes"),
        "{reason}"
    );
    for args in [&["--help"][..], &["dlq", "peek", "--help"], &["--version"]] {
        let run = acemq(args).await;
        assert_eq!(run.code, Some(0), "{args:?}: {run}");
    }
}

#[tokio::test]
async fn a_quorum_queue_with_its_rungs_plans_as_configured_once_applied() {
    let q = unique("quorum.q");
    let _cleanup = Cleanup::queues(vec![
        q.clone(),
        format!("{q}.dlq"),
        format!("{q}.retry.2s"),
        format!("{q}.retry.4s"),
    ]);
    let config = ConfigFile::yaml(&format!(
        "queues:\n  - name: {q}\n    type: quorum\n    dead_letter: true\n    \
         retries: {{ max_attempts: 4, initial_delay: 1, max_delay: 4, broker_wait_threshold: 2 }}\n"
    ));
    let apply = acemq(&["topology", "apply", "--config", config.path()]).await;
    assert_eq!(apply.code, Some(0), "{apply}");
    let plan = acemq(&["topology", "plan", "--config", config.path()]).await;
    assert_eq!(plan.code, Some(0), "{plan}");
    assert!(
        plan.stdout
            .contains("0 missing, 0 different, 4 as configured"),
        "{plan}"
    );
}

#[tokio::test]
async fn an_argument_only_the_broker_has_and_a_transient_queue_are_differences_too() {
    let (extra, transient) = (unique("extra.q"), unique("transient.q"));
    let _cleanup = Cleanup::queues(vec![extra.clone(), transient.clone()]);
    let mut broker = Broker::new().await;
    broker
        .declare(
            &extra,
            table(vec![("x-max-length", AMQPValue::LongLongInt(10))]),
        )
        .await;
    let ch = broker.conn.create_channel().await.expect("channel");
    ch.queue_declare(
        transient.as_str().into(),
        Default::default(), // not durable
        Default::default(),
    )
    .await
    .expect("declare");
    let config = ConfigFile::yaml(&format!(
        "queues:\n  - name: {extra}\n  - name: {transient}\n"
    ));
    let plan = acemq(&["topology", "plan", "--config", config.path()]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    for part in [
        format!("~ queue {extra}: x-max-length differs (PRECONDITION_FAILED"),
        "received none but current is the value '10'".to_owned(),
        format!("~ queue {transient}: durable differs"),
    ] {
        assert!(plan.stdout.contains(&part), "{part:?} in\n{plan}");
    }
    // The probes changed nothing: the same answer again.
    let again = acemq(&["topology", "plan", "--config", config.path()]).await;
    assert_eq!(again.stdout, plan.stdout);
}

#[tokio::test]
async fn a_passive_queue_is_only_checked_and_apply_will_not_create_it() {
    let (q, p) = (unique("passive.q"), unique("passive.p"));
    let _cleanup = Cleanup::queues(vec![q.clone(), p.clone()]);
    let config = ConfigFile::yaml(&format!(
        "queues:\n  - name: {q}\n    bindings: [{{ exchange: amq.topic, routing_keys: [\"{q}\"] }}]\n  \
         - name: {p}\n    passive: true\n"
    ));
    let plan = acemq(&["topology", "plan", "--config", config.path()]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    for part in [
        format!("+ queue {p} (missing; managed elsewhere: apply will not create it)"),
        "= exchange amq.topic (exists; managed elsewhere, only its existence is checked)"
            .to_owned(),
    ] {
        assert!(plan.stdout.contains(&part), "{part:?} in\n{plan}");
    }
    let apply = acemq(&["topology", "apply", "--config", config.path()]).await;
    assert_eq!(apply.code, Some(69), "as the service exits: {apply}");
    assert!(
        apply.stderr.contains(&format!(
            "queue {p:?} does not exist, and the config marks it passive"
        )),
        "{apply}"
    );
    let mut broker = Broker::new().await;
    assert_eq!(broker.ready(&q).await, None, "nothing declared");

    // Declared elsewhere (here, with an argument acemq does not check).
    broker
        .declare(&p, table(vec![("x-max-length", AMQPValue::LongLongInt(5))]))
        .await;
    let apply = acemq(&["topology", "apply", "--config", config.path()]).await;
    assert_eq!(apply.code, Some(0), "{apply}");
    assert!(
        apply.stdout.contains(&format!("+ queue {q} (created)")),
        "{apply}"
    );
    let plan = acemq(&["topology", "plan", "--config", config.path()]).await;
    assert_eq!(plan.code, Some(0), "{plan}");
    assert!(
        plan.stdout.contains(&format!(
            "= queue {p} (exists; managed elsewhere, only its existence is checked)"
        )),
        "{plan}"
    );
}

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn an_amqps_address_without_the_tls_feature_is_refused_not_sent_in_plain_text() {
    // The broker's plain port: lapin without a TLS backend would talk to it
    // in plain text under an amqps:// address.
    let amqps = support::addr().replacen("amqp://", "amqps://", 1);
    let run = acemq(&["dlq", "peek", "anything", "--amqp-addr", &amqps]).await;
    assert_eq!(run.code, Some(78), "{run}");
    assert!(
        run.stderr.contains("built without its `tls` feature"),
        "{run}"
    );
    assert!(!run.stderr.contains(":guest@"), "no password: {run}");
}

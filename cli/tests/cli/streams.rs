//! Streams: `acemq stream offsets` over the stream plugin (port
//! `ACEMQ_STREAM_PORT`, default 5552), and `topology plan` / `apply` of a
//! config with a stream and a super stream.

use std::time::{Duration, Instant};

use acemq::lapin::types::AMQPValue;
use acemq::lapin::BasicProperties;
use acemq::stream::{StreamClient, StreamOptions};

use crate::support::{acemq, long_str, table, unique, Broker, Cleanup, ConfigFile};

/// The stream plugin's port the tests use.
fn stream_port() -> u16 {
    std::env::var("ACEMQ_STREAM_PORT")
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(5552)
}

/// A plain stream `s` (offsets stored under `shop`) and a super stream
/// `sup` of two partitions.
fn streams_config(s: &str, sup: &str) -> ConfigFile {
    ConfigFile::yaml(&format!(
        "streams: {{ port: {} }}\nqueues:\n  - name: {s}\n    type: stream\n    \
         consumer_name: shop\n    max_age: 1h\n  - name: {sup}\n    type: stream\n    \
         partitions: 2\n    max_length_bytes: 10000000\n",
        stream_port()
    ))
}

/// Everything [`streams_config`] declares, for the cleanup.
fn streams_cleanup(s: &str, sup: &str) -> Cleanup {
    Cleanup {
        queues: vec![s.to_owned(), format!("{sup}-0"), format!("{sup}-1")],
        exchanges: vec![sup.to_owned()],
    }
}

/// Stores `offset` for `reference` on `stream` and waits (at most 10 s)
/// until the broker gives it back: it stores asynchronously.
async fn store_offset(reference: &str, stream: &str, offset: u64) {
    let opts = StreamOptions {
        port: stream_port(),
        ..StreamOptions::default()
    };
    let (client, _events) = StreamClient::connect(&opts)
        .await
        .expect("the stream plugin answers");
    client
        .store_offset(reference, stream, offset)
        .expect("store the offset");
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let stored = client
            .query_offset(reference, stream)
            .await
            .expect("query the offset");
        if stored == Some(offset) {
            break;
        }
        assert!(
            Instant::now() < end,
            "the offset {offset} of {reference:?} on {stream} was not stored within 10 s (now {stored:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = client.close().await;
}

#[tokio::test]
async fn offsets_show_none_then_what_was_stored_and_the_json_has_every_partition() {
    let (s, sup) = (unique("offsets.s"), unique("offsets.sup"));
    let _cleanup = streams_cleanup(&s, &sup);
    let config = streams_config(&s, &sup);
    let apply = acemq(&["topology", "apply", "--config", config.path()]).await;
    assert_eq!(apply.code, Some(0), "{apply}");
    let mut broker = Broker::new().await;
    for n in 0..10 {
        broker
            .publish(
                &s,
                format!("order {n}").as_bytes(),
                BasicProperties::default(),
            )
            .await;
    }

    let before = acemq(&["stream", "offsets", "--config", config.path()]).await;
    assert_eq!(before.code, Some(0), "{before}");
    let row = before
        .stdout
        .lines()
        .find(|l| l.starts_with(&s))
        .unwrap_or_else(|| panic!("a row for {s} in\n{before}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[..3], [s.as_str(), "shop", "none"], "{before}");
    assert!(
        before
            .stdout
            .lines()
            .any(|l| l.starts_with(&sup) && l.ends_with("  (super stream, 2 partitions)")),
        "{before}"
    );
    assert!(
        before.stdout.contains(&format!("  {sup}-1")),
        "partitions indented under their super stream: {before}"
    );
    assert!(
        before
            .stdout
            .contains("3 partitions of 2 streams on 127.0.0.1:"),
        "{before}"
    );

    store_offset("shop", &s, 6).await;
    store_offset(&sup, &format!("{sup}-1"), 41).await;

    let after = acemq(&["stream", "offsets", "--config", config.path()]).await;
    assert_eq!(after.code, Some(0), "{after}");
    let cells = |name: &str| -> Vec<String> {
        let row = after
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("a row for {name} in\n{after}"));
        row.split_whitespace().map(str::to_owned).collect()
    };
    assert_eq!(cells(&s)[..3], [s.clone(), "shop".into(), "6".into()]);
    let p0 = format!("{sup}-0");
    let p1 = format!("{sup}-1");
    assert_eq!(cells(&p0)[..3], [p0.clone(), sup.clone(), "none".into()]);
    assert_eq!(cells(&p1)[..3], [p1.clone(), sup.clone(), "41".into()]);

    let json = acemq(&["--json", "stream", "offsets", "--config", config.path()]).await;
    assert_eq!(json.code, Some(0), "{json}");
    let v = json.json();
    assert_eq!(v["missing"], 0, "{json}");
    assert_eq!(
        v["broker"],
        format!("127.0.0.1:{}", stream_port()).as_str(),
        "{json}"
    );
    assert!(v["broker_version"].is_string(), "{json}");
    let rows = v["partitions"].as_array().expect("partitions");
    assert_eq!(rows.len(), 3, "{json}");
    assert_eq!(rows[0]["stream"], s.as_str());
    assert_eq!(rows[0]["partition"], s.as_str());
    assert_eq!(rows[0]["consumer"], "shop");
    assert_eq!(rows[0]["exists"], true);
    assert_eq!(rows[0]["stored_offset"], 6);
    assert_eq!(rows[1]["partition"], p0.as_str());
    assert_eq!(rows[1]["stream"], sup.as_str());
    assert_eq!(rows[1]["consumer"], sup.as_str());
    assert!(rows[1]["stored_offset"].is_null(), "{json}");
    assert_eq!(rows[2]["stored_offset"], 41);
    let version = v["broker_version"].as_str().unwrap_or_default();
    if version.starts_with("3.10.") {
        // No stream stats before 3.11: the lag is unknown, and says why.
        assert!(rows[0]["lag"].is_null(), "{json}");
        assert_eq!(
            rows[0]["lag_unknown"], "RabbitMQ 3.10 has no stream stats",
            "{json}"
        );
        assert!(
            after
                .stdout
                .contains("unknown (RabbitMQ 3.10 has no stream stats)"),
            "{after}"
        );
    } else {
        // 3.11 and later: offsets 7..=9 follow the stored 6, and the
        // store itself took offset 10 (a tracking entry).
        let row = &rows[0];
        assert!(row["lag_unknown"].is_null(), "{json}");
        match row["committed_offset"].as_i64() {
            Some(end) => {
                assert_eq!(end, 10, "{json}");
                assert_eq!(row["lag"], 4, "{json}");
                assert_eq!(row["lag_is_lower_bound"], false, "{json}");
                assert!(
                    after
                        .stdout
                        .lines()
                        .any(|l| l.starts_with(&s) && l.ends_with(" 4")),
                    "{after}"
                );
            }
            None => {
                let chunk = row["committed_chunk_id"].as_i64().expect("stats");
                assert_eq!(row["lag"], (chunk - 6).max(0), "{json}");
                assert_eq!(row["lag_is_lower_bound"], true, "{json}");
            }
        }
        // An empty partition with nothing stored, and one holding only the
        // store's tracking entry: nothing to read.
        assert_eq!(rows[1]["lag"], 0, "{json}");
        assert_eq!(rows[2]["lag"], 0, "{json}");
    }
}

#[tokio::test]
async fn a_stream_missing_on_the_broker_exits_65_after_showing_the_others() {
    let (s, sup) = (unique("missing.s"), unique("missing.sup"));
    let _cleanup = streams_cleanup(&s, &sup);
    let config = streams_config(&s, &sup);
    let mut broker = Broker::new().await;
    // Only the plain stream exists.
    broker
        .declare(&s, table(vec![("x-queue-type", long_str("stream"))]))
        .await;

    let run = acemq(&["stream", "offsets", "--config", config.path()]).await;
    assert_eq!(run.code, Some(65), "{run}");
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with(&s) && l.contains("none")),
        "the stream that exists is shown: {run}"
    );
    assert!(
        run.stdout.contains("missing") && run.stdout.contains("2 missing"),
        "{run}"
    );
    assert!(
        run.stderr.contains(&format!(
            "stream \"{sup}-0\" does not exist on the broker (nor do 1 more): declare it with \
             `acemq topology apply"
        )),
        "{run}"
    );
    let json = acemq(&["stream", "offsets", "--config", config.path(), "--json"]).await;
    assert_eq!(json.code, Some(65), "{json}");
    let v = json.json();
    assert_eq!(v["missing"], 2, "{json}");
    assert_eq!(v["partitions"][1]["exists"], false, "{json}");
    assert!(v["partitions"][1]["stored_offset"].is_null(), "{json}");
    assert_eq!(
        broker.ready(&format!("{sup}-0")).await,
        None,
        "nothing declared"
    );
}

#[tokio::test]
async fn a_closed_stream_port_exits_69_saying_to_enable_the_plugin() {
    let s = unique("closed.s");
    // A port nothing listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let config = ConfigFile::yaml(&format!(
        "streams: {{ port: {port} }}\nqueues:\n  - name: {s}\n    type: stream\n"
    ));
    let run = acemq(&[
        "stream",
        "offsets",
        "--config",
        config.path(),
        "--amqp-addr",
        "amqp://guest:s3cret-pw@127.0.0.1:5672/%2f",
    ])
    .await;
    assert_eq!(run.code, Some(69), "{run}");
    for part in [
        format!("the stream plugin is not listening on 127.0.0.1:{port}"),
        "rabbitmq-plugins enable rabbitmq_stream".to_owned(),
    ] {
        assert!(run.stderr.contains(&part), "{part:?} in\n{run}");
    }
    assert!(!run.all().contains("s3cret-pw"), "{run}");
}

#[tokio::test]
async fn a_config_without_streams_or_with_an_amqps_address_exits_78() {
    let q = unique("nostream.q");
    let config = ConfigFile::yaml(&format!("queues:\n  - name: {q}\n"));
    let run = acemq(&["stream", "offsets", "--config", config.path()]).await;
    assert_eq!(run.code, Some(78), "{run}");
    assert!(run.stderr.contains("names no stream"), "{run}");
    let s = unique("tls.s");
    let config = ConfigFile::yaml(&format!(
        "addresses: [\"amqps://guest:s3cret-pw@127.0.0.1:5671/%2f\"]\n\
         queues:\n  - name: {s}\n    type: stream\n"
    ));
    let run = acemq(&["stream", "offsets", "--config", config.path()]).await;
    assert_eq!(run.code, Some(78), "{run}");
    assert!(!run.all().contains("s3cret-pw"), "{run}");
}

#[tokio::test]
async fn plan_and_apply_cover_a_stream_and_a_super_stream() {
    let (s, sup) = (unique("topo.s"), unique("topo.sup"));
    let mut cleanup = streams_cleanup(&s, &sup);
    cleanup.queues.extend([
        format!("{s}.dlq"),
        format!("{s}.retry.1s"),
        format!("{s}.retry.2s"),
        format!("{s}.work"),
    ]);
    let config = ConfigFile::yaml(&format!(
        "streams: {{ port: {} }}\nqueues:\n  - name: {s}\n    type: stream\n    max_age: 1h\n    \
         max_length_bytes: 10000000\n    stream_max_segment_size_bytes: 500000\n    \
         dead_letter: true\n    retries: {{ max_attempts: 3, initial_delay: 1, max_delay: 2, \
         broker_wait_threshold: 1 }}\n  - name: {sup}\n    type: stream\n    partitions: 2\n",
        stream_port()
    ));
    let mut broker = Broker::new().await;

    let plan = acemq(&["topology", "plan", "--config", config.path()]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    for line in [
        format!("+ exchange {sup} (missing)"),
        format!("+ stream {s} (missing)"),
        format!("+ queue {s}.dlq (missing)"),
        format!("+ queue {s}.retry.1s (missing)"),
        format!("+ queue {s}.retry.2s (missing)"),
        format!("+ queue {s}.work (missing)"),
        format!("+ stream {sup}-0 (missing)"),
        format!("+ stream {sup}-1 (missing)"),
        format!(
            "+ binding {sup}-1 to exchange {sup} key \"1\" matching x-stream-partition-order \
             (missing: its queue or exchange is missing)"
        ),
    ] {
        assert!(plan.stdout.contains(&line), "{line:?} in\n{plan}");
    }
    assert!(
        plan.stdout
            .contains("8 missing, 0 different, 0 as configured, 2 bindings missing"),
        "{plan}"
    );
    assert_eq!(broker.ready(&s).await, None, "plan created nothing");
    assert!(!broker.exchange_exists(&sup).await, "plan created nothing");

    let apply = acemq(&["topology", "apply", "--config", config.path()]).await;
    assert_eq!(apply.code, Some(0), "{apply}");
    assert!(
        apply
            .stdout
            .contains("8 created, 0 already there, 2 bindings applied"),
        "{apply}"
    );
    assert!(broker.exchange_exists(&sup).await);
    for name in [s.clone(), format!("{sup}-0"), format!("{sup}-1")] {
        assert!(broker.ready(&name).await.is_some(), "{name} declared");
    }
    // The partitions are bound by their routing keys: a mandatory publish
    // with key "1" is routed, one with key "2" is not.
    for (key, code) in [("1", 0), ("2", 65)] {
        let run = acemq(&["publish", "order", "--exchange", &sup, "--routing-key", key]).await;
        assert_eq!(run.code, Some(code), "key {key}: {run}");
    }

    let again = acemq(&["topology", "plan", "--config", config.path()]).await;
    assert_eq!(again.code, Some(0), "{again}");
    for line in [
        format!("= stream {s}"),
        format!("= stream {sup}-0"),
        format!("= queue {s}.work"),
        format!("= exchange {sup}"),
    ] {
        assert!(again.stdout.contains(&line), "{line:?} in\n{again}");
    }
    assert!(
        again
            .stdout
            .contains("0 missing, 0 different, 8 as configured, 2 bindings left to apply"),
        "{again}"
    );
    let json = acemq(&["--json", "topology", "plan", "--config", config.path()]).await;
    assert_eq!(json.code, Some(0), "{json}");
    let v = json.json();
    assert_eq!(v["in_sync"], true, "{json}");
    let roles: Vec<&str> = v["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["role"].as_str())
        .collect();
    for role in ["stream", "work-queue", "retry-rung", "dead-letter-queue"] {
        assert!(roles.contains(&role), "{role} in {json}");
    }

    let twice = acemq(&["topology", "apply", "--config", config.path()]).await;
    assert_eq!(twice.code, Some(0), "{twice}");
    assert!(
        twice.stdout.contains("0 created, 8 already there"),
        "{twice}"
    );

    // `queues` shows the super stream's partitions under it, the work
    // queue with the rungs, and nothing missing.
    let queues = acemq(&["queues", "--strict", "--config", config.path()]).await;
    assert_eq!(queues.code, Some(0), "{queues}");
    assert!(
        queues.stdout.contains("7 queues on amqp://guest:***@"),
        "{queues}"
    );
    assert!(queues.stdout.contains(", 0 missing"), "{queues}");
    for line in [format!("  {sup}-1 "), format!("  {s}.work ")] {
        assert!(queues.stdout.contains(&line), "{line:?} in\n{queues}");
    }
    let json = acemq(&["queues", "--json", "--config", config.path()]).await;
    let v = json.json();
    assert_eq!(v["missing"], 0, "{json}");
    assert_eq!(v["queues"][0]["work_queue"]["name"], format!("{s}.work"));
    assert_eq!(
        v["queues"][0]["retry_rungs"].as_array().map(Vec::len),
        Some(2)
    );
    assert_eq!(v["queues"][1]["name"], sup.as_str(), "{json}");
    assert_eq!(v["queues"][1]["exists"], true, "{json}");
    assert_eq!(v["queues"][1]["partitions"][1]["name"], format!("{sup}-1"));
}

#[tokio::test]
async fn a_stream_with_other_retention_differs_in_plan_and_apply_refuses() {
    let s = unique("retention.s");
    let _cleanup = Cleanup::queues(vec![s.clone()]);
    let mut broker = Broker::new().await;
    broker
        .declare(
            &s,
            table(vec![
                ("x-queue-type", long_str("stream")),
                ("x-max-age", long_str("7200s")),
                ("x-max-length-bytes", AMQPValue::LongLongInt(10_000_000)),
            ]),
        )
        .await;
    let config = |keys: &str| {
        ConfigFile::yaml(&format!(
            "queues:\n  - name: {s}\n    type: stream\n    {keys}\n"
        ))
    };
    let age = config("max_age: 1h\n    max_length_bytes: 10000000");
    let plan = acemq(&["topology", "plan", "--config", age.path()]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    let line = format!("~ stream {s}: x-max-age differs (PRECONDITION_FAILED");
    assert!(plan.stdout.contains(&line), "{line:?} in\n{plan}");
    let apply = acemq(&["topology", "apply", "--config", age.path()]).await;
    assert_eq!(apply.code, Some(78), "{apply}");
    assert!(
        apply.stderr.contains(&format!(
            "queue \"{s}\" already exists with a different x-max-age"
        )),
        "{apply}"
    );
    // Without the retention the stream has, it differs too.
    let bare = config("max_age: 2h");
    let plan = acemq(&["topology", "plan", "--config", bare.path()]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    assert!(
        plan.stdout
            .contains(&format!("~ stream {s}: x-max-length-bytes differs")),
        "{plan}"
    );
    // A classic queue where the config has a stream.
    let q = unique("retention.classic");
    let _classic = Cleanup::queues(vec![q.clone()]);
    broker.declare(&q, table(vec![])).await;
    let classic = ConfigFile::yaml(&format!("queues:\n  - name: {q}\n    type: stream\n"));
    let plan = acemq(&["topology", "plan", "--config", classic.path()]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    assert!(
        plan.stdout
            .contains(&format!("~ stream {q}: x-queue-type differs")),
        "{plan}"
    );
    let ok = config("max_age: 2h\n    max_length_bytes: 10000000");
    let plan = acemq(&["topology", "plan", "--config", ok.path()]).await;
    assert_eq!(plan.code, Some(0), "{plan}");
}

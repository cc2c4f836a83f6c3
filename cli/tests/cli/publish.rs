//! `acemq publish`: to a queue or an exchange, the body from an argument, a
//! file or stdin, headers and properties, and a clear exit code when the
//! message reaches no queue or the broker refuses it.

use std::process::Stdio;
use std::time::Duration;

use acemq::lapin::types::AMQPValue;
use tokio::io::AsyncWriteExt;

use crate::support::{acemq, command, table, unique, Broker, Cleanup};

#[tokio::test]
async fn publish_to_a_queue_carries_the_body_headers_and_properties_confirmed() {
    let q = unique("publish.queue");
    let _cleanup = Cleanup::queues(vec![q.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&q, table(vec![])).await;

    let run = acemq(&[
        "publish",
        "--queue",
        &q,
        r#"{"order":42}"#,
        "--header",
        "tenant=acme",
        "-H",
        "trace=a=b",
        "--content-type",
        "application/json",
        "--message-id",
        "order-42-created",
        "--correlation-id",
        "req-7f3a",
        "--type",
        "order.created",
        "--priority",
        "3",
        "--expiration",
        "60000",
        "--persistent",
    ])
    .await;
    assert_eq!(run.code, Some(0), "{run}");
    assert!(
        run.stdout
            .contains(&format!("published 12 bytes to queue {q} on amqp://")),
        "{run}"
    );
    assert!(run.stdout.contains("confirmed"), "{run}");
    assert!(!run.all().contains("guest:guest"), "no password: {run}");
    let got = broker.drain(&q).await;
    assert_eq!(got.len(), 1);
    let d = &got[0].delivery;
    assert_eq!(&d.data[..], br#"{"order":42}"#);
    let p = &d.properties;
    assert_eq!(
        p.message_id().as_ref().map(|s| s.as_str()),
        Some("order-42-created")
    );
    assert_eq!(
        p.correlation_id().as_ref().map(|s| s.as_str()),
        Some("req-7f3a")
    );
    assert_eq!(
        p.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(p.kind().as_ref().map(|s| s.as_str()), Some("order.created"));
    assert_eq!(p.expiration().as_ref().map(|s| s.as_str()), Some("60000"));
    assert_eq!(*p.priority(), Some(3));
    assert_eq!(*p.delivery_mode(), Some(2), "--persistent");
    let h = acemq::convert::headers_from_table(p.headers().as_ref().expect("headers"));
    assert_eq!(h.get("tenant").and_then(|v| v.as_str()), Some("acme"));
    assert_eq!(h.get("trace").and_then(|v| v.as_str()), Some("a=b"));

    // Transient without --persistent; JSON for scripts.
    let run = acemq(&["publish", "-q", &q, "x", "--json"]).await;
    assert_eq!(run.code, Some(0), "{run}");
    let v = run.json();
    assert_eq!(v["exchange"], "");
    assert_eq!(v["routing_key"], q.as_str());
    assert_eq!(v["body_bytes"], 1);
    assert_eq!(v["confirmed"], true);
    let got = broker.drain(&q).await;
    assert_eq!(*got[0].delivery.properties.delivery_mode(), Some(1));
}

#[tokio::test]
async fn the_body_comes_from_stdin_or_a_file_byte_for_byte() {
    let q = unique("publish.stdin");
    let _cleanup = Cleanup::queues(vec![q.clone()]);
    let mut broker = Broker::new().await;
    broker.declare(&q, table(vec![])).await;
    let bytes: &[u8] = b"line one\nline two\x00\xff";

    for args in [
        vec!["publish", "-q", &q, "-"],
        vec!["publish", "-q", &q, "--file", "-"],
    ] {
        let mut child = command(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("runs");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(bytes).await.expect("write stdin");
        drop(stdin);
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("finishes")
            .expect("runs");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
    }
    let path = std::env::temp_dir().join(format!("{}.bin", unique("body")));
    std::fs::write(&path, bytes).expect("write the body file");
    let run = acemq(&["publish", "-q", &q, "--file", path.to_str().unwrap()]).await;
    let _ = std::fs::remove_file(&path);
    assert_eq!(run.code, Some(0), "{run}");
    let got = broker.drain(&q).await;
    assert_eq!(got.len(), 3);
    for m in &got {
        assert_eq!(&m.delivery.data[..], bytes);
    }

    let run = acemq(&["publish", "-q", &q, "--file", "/nonexistent/body.json"]).await;
    assert_eq!(run.code, Some(64), "{run}");
    assert!(run.stderr.contains("/nonexistent/body.json"), "{run}");
    let run = acemq(&["publish", "-q", &q, "-H", "no-equals", "x"]).await;
    assert_eq!(run.code, Some(64), "{run}");
    assert!(run.stderr.contains("NAME=VALUE"), "{run}");
    assert_eq!(broker.ready(&q).await, Some(0), "nothing published");
}

#[tokio::test]
async fn publish_to_an_exchange_routes_by_key_and_an_unroutable_one_exits_65() {
    let x = unique("publish.x");
    let q = unique("publish.bound");
    let mut cleanup = Cleanup::queues(vec![q.clone()]);
    cleanup.exchanges.push(x.clone());
    let mut broker = Broker::new().await;
    broker.declare(&q, table(vec![])).await;
    {
        let ch = broker.conn.create_channel().await.unwrap();
        ch.exchange_declare(
            x.as_str().into(),
            acemq::lapin::ExchangeKind::Topic,
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
        ch.queue_bind(
            q.as_str().into(),
            x.as_str().into(),
            "orders.*".into(),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    }

    let run = acemq(&["publish", "-x", &x, "-k", "orders.new", "o1"]).await;
    assert_eq!(run.code, Some(0), "{run}");
    assert!(
        run.stdout
            .contains(&format!("to exchange {x} with routing key \"orders.new\"")),
        "{run}"
    );
    assert!(broker.wait_ready(&q, 1, Duration::from_secs(5)).await);

    let run = acemq(&["publish", "-x", &x, "-k", "invoices.new", "o2"]).await;
    assert_eq!(run.code, Some(65), "{run}");
    assert!(
        run.stderr.contains("routed \"invoices.new\" to no queue"),
        "{run}"
    );
    assert!(run.stderr.contains("NO_ROUTE"), "{run}");

    let missing = unique("publish.noqueue");
    let run = acemq(&["publish", "--queue", &missing, "o3"]).await;
    assert_eq!(run.code, Some(65), "{run}");
    assert!(
        run.stderr
            .contains(&format!("no queue named \"{missing}\"")),
        "{run}"
    );

    let nox = unique("publish.nox");
    let run = acemq(&["publish", "--exchange", &nox, "--routing-key", "k", "o4"]).await;
    assert_eq!(run.code, Some(65), "{run}");
    assert!(
        run.stderr
            .contains(&format!("there is no exchange \"{nox}\"")),
        "{run}"
    );
    assert_eq!(
        broker.ready(&q).await,
        Some(1),
        "only the routed one arrived"
    );
}

#[tokio::test]
async fn a_message_the_broker_nacks_exits_75() {
    let q = unique("publish.full");
    let _cleanup = Cleanup::queues(vec![q.clone()]);
    let mut broker = Broker::new().await;
    broker
        .declare(
            &q,
            table(vec![
                ("x-max-length", AMQPValue::LongLongInt(1)),
                ("x-overflow", crate::support::long_str("reject-publish")),
            ]),
        )
        .await;
    let first = acemq(&["publish", "-q", &q, "one"]).await;
    assert_eq!(first.code, Some(0), "{first}");
    let second = acemq(&["publish", "-q", &q, "two"]).await;
    assert_eq!(second.code, Some(75), "{second}");
    assert!(second.stderr.contains("basic.nack"), "{second}");
    let got = broker.drain(&q).await;
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].delivery.data[..], b"one");
}

#[tokio::test]
async fn publish_has_help() {
    let run = acemq(&["publish", "--help"]).await;
    assert_eq!(run.code, Some(0), "{run}");
    for flag in [
        "--queue",
        "--exchange",
        "--routing-key",
        "--header",
        "--file",
        "--persistent",
    ] {
        assert!(run.stdout.contains(flag), "{flag}: {run}");
    }
}

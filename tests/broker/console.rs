//! The console's dead-letter pages (feature `console`) against the real
//! broker: counts by reason and error from a read that loses and reorders
//! nothing, repeated ids marked, a message escaped, replay by reason and
//! purge (through the bearer token, as a script would).

use acemq::admin::{AdminRouter, AdminToken, ConsoleConfig};
use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use lapin::types::AMQPValue;
use lapin::BasicProperties;
use tower::ServiceExt;

use crate::support::{field_table, long_str, now_ms, unique, Broker};

const TOKEN: &str = "console-broker-test-token";

async fn call(router: &axum::Router, method: &str, uri: &str, body: &str) -> (StatusCode, String) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body.to_owned()))
        .expect("request");
    let resp = router.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 4 << 20)
        .await
        .expect("body");
    (status, String::from_utf8(body.to_vec()).expect("utf-8"))
}

/// The message ids in `queue`, taken and acknowledged (it is emptied).
async fn drain_ids(broker: &mut Broker, queue: &str) -> Vec<String> {
    let mut ids = Vec::new();
    while let Some(m) = broker.get(queue).await {
        ids.push(
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default(),
        );
    }
    ids
}

/// `section[data-dlq=…]`'s part of `page`.
fn section<'a>(page: &'a str, dlq: &str) -> &'a str {
    let start = page
        .find(&format!("data-dlq=\"{dlq}\""))
        .unwrap_or_else(|| panic!("no section for {dlq}: {page}"));
    let rest = &page[start..];
    &rest[..rest.find("</section>").unwrap_or(rest.len())]
}

#[tokio::test]
async fn dead_letters_are_counted_without_loss_then_replayed_by_reason_and_purged() {
    let q = unique("console");
    let dlq = format!("{q}.dlq");
    let mut broker = Broker::new().await;
    broker.declare(&q, Default::default()).await.expect("queue");
    broker.declare(&dlq, Default::default()).await.expect("dlq");
    let now = now_ms();
    let copies = [
        (
            "o-1",
            "rejected",
            "order o-1 cannot be fulfilled",
            1,
            "{\"id\":\"o-1\"}",
        ),
        (
            "o-2",
            "max-attempts",
            "timeout after 30 ms",
            4,
            "{\"id\":\"o-2\"}",
        ),
        (
            "o-1",
            "rejected",
            "order o-1 cannot be fulfilled",
            1,
            "{\"id\":\"o-1\"}",
        ),
        (
            "o-3",
            "rejected",
            "order 17 <script>alert(1)</script>",
            1,
            "<img src=x onerror=alert(1)>",
        ),
    ];
    for (i, (id, reason, error, attempts, body)) in copies.iter().enumerate() {
        let headers = field_table(vec![
            ("x-acemq-reason", long_str(reason)),
            ("x-acemq-error", long_str(error)),
            ("x-acemq-attempts", AMQPValue::LongLongInt(*attempts)),
            ("x-acemq-queue", long_str(&q)),
            (
                "x-acemq-dead-lettered-at",
                AMQPValue::LongLongInt(now - 60_000 + i as i64),
            ),
        ]);
        let props = BasicProperties::default()
            .with_message_id((*id).into())
            .with_headers(headers);
        broker.publish_props(&dlq, body.as_bytes(), props).await;
    }
    assert!(
        broker
            .wait_ready(&dlq, 4, std::time::Duration::from_secs(5))
            .await
    );

    let mut qc = acemq::config::QueueConfig::new(&q);
    qc.dead_letter = true;
    let config = acemq::Config::new([qc]);
    let console =
        ConsoleConfig::new(&config, acemq::connection::amqp_addr_from_env()).read_limit(3);
    let admin = AdminRouter::new(acemq::Health::new())
        .token(AdminToken::new(TOKEN).expect("token"))
        .console(console)
        .build();

    // The page: the first 3 read (the limit), said so; by reason, by error.
    let (status, page) = call(&admin, "GET", "/console/dead-letters", "").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let s = section(&page, &dlq);
    assert!(s.contains("data-held=\"4\""), "{s}");
    assert!(s.contains("at most 3 are read"), "{s}");
    assert!(
        s.contains(
            "<tr data-reason=\"rejected\"><th scope=\"row\">rejected</th><td class=\"n\">2</td>"
        ),
        "{s}"
    );
    assert!(s.contains("<tr data-reason=\"max-attempts\"><th scope=\"row\">max-attempts</th><td class=\"n\">1</td>"), "{s}");
    assert!(
        s.contains("order o-# cannot be fulfilled</code></td><td class=\"n\">2</td>"),
        "{s}"
    );
    assert!(s.contains("⚠ repeated"), "o-1 twice: {s}");
    // Nothing taken for good, nothing reordered.
    assert_eq!(broker.ready(&dlq).await, Some(4));

    // A message: its body and error escaped.
    let (status, m) = call(
        &admin,
        "GET",
        &format!("/console/dead-letters/{q}/messages/4"),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "past the read limit: {m}");
    let admin_all = AdminRouter::new(acemq::Health::new())
        .token(AdminToken::new(TOKEN).expect("token"))
        .console(ConsoleConfig::new(
            &config,
            acemq::connection::amqp_addr_from_env(),
        ))
        .build();
    let (status, m) = call(
        &admin_all,
        "GET",
        &format!("/console/dead-letters/{q}/messages/4"),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{m}");
    assert!(m.contains("&lt;img src=x onerror=alert(1)&gt;"), "{m}");
    assert!(m.contains("order 17 &lt;script&gt;"), "{m}");
    assert!(!m.contains("<img") && !m.contains("<script"), "{m}");
    assert!(
        m.contains(&format!("<dt>First seen in queue</dt><dd>{q}</dd>")),
        "{m}"
    );

    // The replay's confirmation counts, then the replay moves the rejected.
    let (status, c) = call(
        &admin_all,
        "GET",
        &format!("/console/dead-letters/{q}/replay?reason=rejected"),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{c}");
    assert!(c.contains("data-count=\"3\""), "{c}");
    let (status, done) = call(
        &admin_all,
        "POST",
        &format!("/console/dead-letters/{q}/replay"),
        "reason=rejected",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("moved 3 from"), "{done}");
    assert_eq!(drain_ids(&mut broker, &q).await, ["o-1", "o-1", "o-3"]);
    assert_eq!(broker.ready(&dlq).await, Some(1));

    // Purge: the confirmation says 1, the purge removes it.
    let (_, c) = call(
        &admin_all,
        "GET",
        &format!("/console/dead-letters/{q}/purge"),
        "",
    )
    .await;
    assert!(c.contains("data-count=\"1\""), "{c}");
    let (status, done) = call(
        &admin_all,
        "POST",
        &format!("/console/dead-letters/{q}/purge"),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("purged 1 messages"), "{done}");
    assert_eq!(broker.ready(&dlq).await, Some(0));
    let (_, page) = call(&admin_all, "GET", "/console/dead-letters", "").await;
    assert!(section(&page, &dlq).contains("data-held=\"0\""), "{page}");

    broker.delete(&[q, dlq]).await;
}

#[tokio::test]
async fn a_read_gives_every_message_back_in_order() {
    let q = unique("console-order");
    let dlq = format!("{q}.dlq");
    let mut broker = Broker::new().await;
    broker.declare(&dlq, Default::default()).await.expect("dlq");
    for i in 0..20 {
        let props = BasicProperties::default().with_message_id(format!("m-{i}").into());
        broker.publish_props(&dlq, b"{}", props).await;
    }
    assert!(
        broker
            .wait_ready(&dlq, 20, std::time::Duration::from_secs(5))
            .await
    );
    let mut qc = acemq::config::QueueConfig::new(&q);
    qc.dead_letter = true;
    let console = ConsoleConfig::new(
        &acemq::Config::new([qc]),
        acemq::connection::amqp_addr_from_env(),
    );
    let admin = AdminRouter::new(acemq::Health::new())
        .token(AdminToken::new(TOKEN).expect("token"))
        .console(console)
        .build();
    for _ in 0..2 {
        let (status, page) = call(&admin, "GET", "/console/dead-letters", "").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            section(&page, &dlq).contains("<tr data-reason=\"none\">"),
            "{page}"
        );
    }
    let want: Vec<String> = (0..20).map(|i| format!("m-{i}")).collect();
    assert_eq!(drain_ids(&mut broker, &dlq).await, want);
    broker.delete(&[dlq]).await;
}

#[tokio::test]
async fn a_selection_of_messages_is_replayed_alone_and_the_rest_stay_in_order() {
    let q = unique("console-select");
    let dlq = format!("{q}.dlq");
    let mut broker = Broker::new().await;
    broker.declare(&q, Default::default()).await.expect("queue");
    broker.declare(&dlq, Default::default()).await.expect("dlq");
    for id in ["s-1", "s-2", "s-3", "s-4"] {
        let headers = field_table(vec![("x-acemq-reason", long_str("rejected"))]);
        let props = BasicProperties::default()
            .with_message_id(id.into())
            .with_headers(headers);
        broker.publish_props(&dlq, id.as_bytes(), props).await;
    }
    // One copy without an id: it cannot be selected.
    let headers = field_table(vec![("x-acemq-reason", long_str("rejected"))]);
    broker
        .publish_props(
            &dlq,
            b"no id",
            BasicProperties::default().with_headers(headers),
        )
        .await;
    assert!(
        broker
            .wait_ready(&dlq, 5, std::time::Duration::from_secs(5))
            .await
    );
    let mut qc = acemq::config::QueueConfig::new(&q);
    qc.dead_letter = true;
    let config = acemq::Config::new([qc]);
    let admin = AdminRouter::new(acemq::Health::new())
        .token(AdminToken::new(TOKEN).expect("token"))
        .console(ConsoleConfig::new(
            &config,
            acemq::connection::amqp_addr_from_env(),
        ))
        .build();

    // Each message with an id can be selected; a message's page replays it.
    let (_, page) = call(&admin, "GET", "/console/dead-letters", "").await;
    let s = section(&page, &dlq);
    assert_eq!(s.matches("type=\"checkbox\" name=\"id\"").count(), 4, "{s}");
    assert!(s.contains("Replay selected"), "{s}");
    let (_, m) = call(
        &admin,
        "GET",
        &format!("/console/dead-letters/{q}/messages/2"),
        "",
    )
    .await;
    assert!(m.contains("name=\"id\" value=\"s-2\""), "{m}");
    assert!(m.contains("Replay this message"), "{m}");

    // The confirmation counts the selection; the replay moves only it.
    let (status, c) = call(
        &admin,
        "GET",
        &format!("/console/dead-letters/{q}/replay?id=s-2&id=s-4"),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{c}");
    assert!(c.contains("data-count=\"2\""), "{c}");
    assert!(c.contains("name=\"id\" value=\"s-4\""), "{c}");
    let (status, done) = call(
        &admin,
        "POST",
        &format!("/console/dead-letters/{q}/replay"),
        "id=s-2&id=s-4",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("moved 2 from"), "{done}");
    assert!(done.contains("3 left in"), "{done}");
    assert_eq!(drain_ids(&mut broker, &q).await, ["s-2", "s-4"]);
    assert_eq!(drain_ids(&mut broker, &dlq).await, ["s-1", "s-3", ""]);
    broker.delete(&[q, dlq]).await;
}

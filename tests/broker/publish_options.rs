//! `Publisher::publish_json_with`: what the consumer sees of a message
//! published with `PublishOptions` — its message id, correlation id, type,
//! headers and content type — against the real broker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::publisher::PublishOptions;
use acemq::Delivery;

use crate::support::{all_queues, eventually, plain_config, start_consuming, unique, QueueCleanup};

#[tokio::test]
async fn publish_json_with_options_reaches_the_consumer_with_its_message_id_headers_and_properties()
{
    let q = unique("publish-options");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let seen: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let s = seen.clone();
    let handler = tower::service_fn(move |d: Delivery| {
        s.lock().unwrap().push(d);
        async { Ok::<_, acemq::BoxError>(()) }
    });
    let running = start_consuming(plain_config(&q), &q, handler).await;
    let publisher = running.publisher();
    let order = serde_json::json!({ "id": "o-42", "item": "book" });
    publisher
        .publish_json_with(
            "",
            &q,
            &order,
            PublishOptions::new()
                .message_id("order-o-42-created")
                .correlation_id("req-7f3a")
                .kind("order.created")
                .header("tenant", "acme"),
        )
        .await
        .expect("confirmed");
    // The plain call is unchanged: JSON, no message id.
    publisher
        .publish_json("", &q, &order)
        .await
        .expect("confirmed");
    // Another content type wins over JSON's.
    publisher
        .publish_json_with(
            "",
            &q,
            &order,
            PublishOptions::new().content_type("application/vnd.shop.order+json"),
        )
        .await
        .expect("confirmed");
    assert!(
        eventually(Duration::from_secs(10), || async {
            seen.lock().unwrap().len() == 3
        })
        .await,
        "three deliveries consumed"
    );
    running.drain().await.expect("clean drain");

    let seen = seen.lock().unwrap();
    let with = seen
        .iter()
        .find(|d| d.properties().message_id.is_some())
        .expect("the delivery published with options");
    let p = with.properties();
    assert_eq!(p.message_id.as_deref(), Some("order-o-42-created"));
    assert_eq!(p.correlation_id.as_deref(), Some("req-7f3a"));
    assert_eq!(p.kind.as_deref(), Some("order.created"));
    assert_eq!(p.content_type.as_deref(), Some("application/json"));
    assert_eq!(p.delivery_mode, Some(2), "persistent");
    assert_eq!(
        with.headers().get("tenant").and_then(|v| v.as_str()),
        Some("acme")
    );
    let body: serde_json::Value = serde_json::from_slice(with.body()).expect("JSON");
    assert_eq!(body, order);

    let types: Vec<Option<&str>> = seen
        .iter()
        .filter(|d| d.properties().message_id.is_none())
        .map(|d| d.properties().content_type.as_deref())
        .collect();
    assert_eq!(types.len(), 2, "{types:?}");
    assert!(types.contains(&Some("application/json")), "{types:?}");
    assert!(
        types.contains(&Some("application/vnd.shop.order+json")),
        "{types:?}"
    );
}

//! `acemq queues`: depths of the queues, dead-letter queues and rungs.

use acemq::lapin::BasicProperties;

use crate::support::{acemq, dead_lettered, shop_cleanup, shop_config, unique, Broker};

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

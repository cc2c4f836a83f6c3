//! `acemq asyncapi`: the shop's document, and a `schema:` file that is
//! missing or not JSON. No broker is asked.

use crate::support::{acemq, unique, ConfigFile};

fn shop_config() -> String {
    format!("{}/../examples/shop.yaml", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn the_shops_document_has_its_queues_rungs_dlq_operations_and_headers() {
    let shop = shop_config();
    let run = acemq(&["asyncapi", "--config", &shop, "--format", "json"]).await;
    assert_eq!(run.code, Some(0), "{run}");
    let doc = run.json();
    assert_eq!(doc["asyncapi"], "3.0.0", "{run}");
    assert_eq!(doc["info"]["title"], "shop");
    let channels = &doc["channels"];
    for (name, is_dlq) in [
        ("shop.orders", false),
        ("shop.orders.retry.2s", false),
        ("shop.orders.retry.4s", false),
        ("shop.orders.dlq", true),
    ] {
        let amqp = &channels[name]["bindings"]["amqp"];
        assert_eq!(channels[name]["address"], name, "{name}");
        assert_eq!(amqp["is"], "queue", "{name}");
        assert_eq!(amqp["bindingVersion"], "0.3.0", "{name}");
        assert_eq!(amqp["queue"]["name"], name, "{name}");
        assert_eq!(amqp["queue"]["durable"], true, "{name}");
        assert_eq!(amqp["queue"]["exclusive"], false, "{name}");
        assert_eq!(amqp["queue"]["autoDelete"], false, "{name}");
        assert_eq!(amqp["x-queue-type"], "classic", "{name}");
        let description = channels[name]["description"].as_str().unwrap_or("");
        assert_eq!(
            description.contains("dead-letter queue"),
            is_dlq,
            "{description}"
        );
    }
    assert!(
        channels["shop.orders.retry.1s"].is_null(),
        "the 1 s wait is spent in the process: no rung"
    );
    let ops = &doc["operations"];
    let receive = &ops["receive.shop.orders"];
    assert_eq!(receive["action"], "receive");
    assert_eq!(receive["channel"]["$ref"], "#/channels/shop.orders");
    assert_eq!(receive["bindings"]["amqp"]["ack"], true);
    assert_eq!(ops["deadLetter.shop.orders.dlq"]["action"], "send");
    assert_eq!(ops["retry.shop.orders.retry.4s"]["action"], "send");
    assert_eq!(
        ops.as_object()
            .map(|o| o.values().filter(|op| op["action"] == "receive").count()),
        Some(1),
        "one consumed queue: {ops}"
    );

    let messages = &doc["components"]["messages"];
    let dead = &messages["shop.orders.dead-letter"]["headers"]["properties"];
    let reasons = dead["x-acemq-reason"]["enum"].as_array().expect("an enum");
    for reason in ["max-attempts", "rejected", "panic", "consumer-timeout"] {
        assert!(reasons.iter().any(|r| r == reason), "{reason}: {reasons:?}");
    }
    for header in [
        "x-acemq-error",
        "x-acemq-attempts",
        "x-acemq-queue",
        "x-acemq-dead-lettered-at",
        "x-acemq-original-exchange",
        "x-acemq-original-routing-key",
    ] {
        assert!(dead[header].is_object(), "{header}: {dead}");
    }
    let delivery = &messages["shop.orders"];
    assert_eq!(
        delivery["headers"]["properties"]["x-acemq-attempt"]["type"],
        "integer"
    );
    // The shop's `schema:` file, relative to the config, is the payload.
    let payload = &delivery["payload"];
    assert_eq!(
        payload["schemaFormat"],
        "application/schema+json;version=draft-07"
    );
    assert_eq!(payload["schema"]["required"][0], "id");
    assert_eq!(
        messages["shop.orders.dead-letter"]["payload"]["schema"]["title"],
        "Order"
    );

    // YAML by default, the same document.
    let yaml = acemq(&["asyncapi", "--config", &shop]).await;
    assert_eq!(yaml.code, Some(0), "{yaml}");
    let from_yaml: serde_json::Value =
        serde_yaml_ng::from_str(&yaml.stdout).expect("stdout is YAML");
    assert_eq!(from_yaml, doc);

    // --output writes it to a file, nothing on stdout.
    let out = std::env::temp_dir().join(format!("{}.asyncapi.json", unique("doc")));
    let out_s = out.to_str().expect("a UTF-8 temporary path");
    let run = acemq(&["--json", "asyncapi", "-c", &shop, "--output", out_s]).await;
    assert_eq!(run.code, Some(0), "{run}");
    assert_eq!(run.stdout, "");
    let written = std::fs::read_to_string(&out).expect("the document was written");
    let _ = std::fs::remove_file(&out);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&written).expect("--json writes JSON"),
        doc
    );
}

#[tokio::test]
async fn a_missing_or_malformed_schema_file_exits_78_naming_it() {
    let q = unique("schema");
    let config = ConfigFile::yaml(&format!(
        "queues:\n  - name: {q}\n    schema: no-such.schema.json\n"
    ));
    let run = acemq(&["asyncapi", "--config", config.path()]).await;
    assert_eq!(run.code, Some(78), "{run}");
    assert!(run.stderr.contains("queues[0].schema"), "{run}");
    assert!(run.stderr.contains("no-such.schema.json"), "{run}");
    assert_eq!(run.stdout, "", "no document: {run}");

    let bad = std::env::temp_dir().join(format!("{}.schema.json", unique("bad")));
    std::fs::write(&bad, "{ not json").expect("write the schema");
    let config = ConfigFile::yaml(&format!(
        "queues:\n  - name: {q}\n    schema: {}\n",
        bad.file_name().and_then(|n| n.to_str()).expect("a name")
    ));
    let run = acemq(&["asyncapi", "--config", config.path()]).await;
    let _ = std::fs::remove_file(&bad);
    assert_eq!(run.code, Some(78), "{run}");
    assert!(run.stderr.contains("is not JSON"), "{run}");
}

//! `acemq topology plan` and `apply`: what is missing, what differs, what
//! apply declares and what it refuses.

use acemq::lapin::types::AMQPValue;

use crate::support::{
    acemq, long_str, shop_cleanup, shop_config, table, unique, Broker, Cleanup, ConfigFile,
};

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

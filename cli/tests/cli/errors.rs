//! Exit codes, the broker address, and what never reaches the output.

use crate::support::{acemq, unique, Broker, ConfigFile};

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
            let mut cmd =
                crate::support::command(&["topology", "apply", "--config", config.path()]);
            cmd.env("AMQP_ADDR", addr);
            crate::support::run(cmd).await
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
    let good = crate::support::addr();
    let bad = "amqp://guest:s3cret@127.0.0.1:1/%2f";
    let with_bad = ConfigFile::yaml(&format!("addresses: [\"{bad}\"]\nqueues:\n  - name: {q}\n"));
    let plan = |env: Option<&str>, flag: Option<&str>| {
        let mut cmd = crate::support::command(&["queues", "--config", with_bad.path()]);
        cmd.env_remove("AMQP_ADDR");
        if let Some(env) = env {
            cmd.env("AMQP_ADDR", env);
        }
        if let Some(flag) = flag {
            cmd.args(["--amqp-addr", flag]);
        }
        crate::support::run(cmd)
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
    let echoed = acemq(&["amqp://guest:s3cret@127.0.0.1:5672/%2f", "queues"]).await;
    assert_eq!(echoed.code, Some(64), "{echoed}");
    assert!(
        !echoed.all().contains("s3cret"),
        "an echoed address hides its password: {echoed}"
    );
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

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn an_amqps_address_without_the_tls_feature_is_refused_not_sent_in_plain_text() {
    // The broker's plain port: lapin without a TLS backend would talk to it
    // in plain text under an amqps:// address.
    let amqps = crate::support::addr().replacen("amqp://", "amqps://", 1);
    let run = acemq(&["dlq", "peek", "anything", "--amqp-addr", &amqps]).await;
    assert_eq!(run.code, Some(78), "{run}");
    assert!(
        run.stderr.contains("built without its `tls` feature"),
        "{run}"
    );
    assert!(!run.stderr.contains(":guest@"), "no password: {run}");
}

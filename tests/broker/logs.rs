//! The logs a person reads, through the `shop` example binary and its
//! default filter (`acemq::log::DEFAULT_FILTER`, `RUST_LOG` unset): a
//! handled delivery's line is short and names what a person looks for; a
//! lost connection is told once, at WARN, with none of lapin's own ERROR
//! events; a failed start ends stderr with acemq's reason, told once.

use std::time::Duration;

use crate::proxy::Proxy;
use crate::support::{eventually, unique, QueueCleanup, ShopProcess};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The default shop's queue: line lengths are counted as if the queue had
/// this name, so a test's longer unique name does not count against them.
const SHOP_QUEUE: &str = "shop.orders";

/// The longest line a handled delivery may take with the shop's queue name.
const MAX_LINE: usize = 200;

fn config_yaml(q: &str) -> String {
    format!("shutdown_timeout: 10\nqueues:\n  - name: {q}\n")
}

/// Lines of `stderr` written by lapin (its targets, or its io_loop thread's
/// name) or at ERROR.
fn lapin_or_error_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("lapin") || l.contains(" ERROR "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handled_delivery_is_one_short_line_naming_queue_tag_message_id_attempt_and_outcome() {
    let q = unique("logs-line");
    // The demo batch's delayed order declares the default exchange's 2 s
    // bucket.
    let _cleanup = QueueCleanup::new(vec![q.clone(), "acemq.delay.2s".to_owned()]);
    // The demo batch, seeded into `q`.
    let mut shop = ShopProcess::spawn_with_args(&q, &config_yaml(&q), &["--queue", &q], &[]);
    shop.wait_stderr("order handled order=o-ok-4", SECS(20))
        .await;
    shop.signal("-TERM");
    let status = shop.exit_within(SECS(20)).await;
    let stderr = shop.stderr();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("order handled order=o-ok-1 "))
        .unwrap_or_else(|| panic!("no line for o-ok-1; stderr:\n{stderr}"));
    let as_shop = line.len() - line.matches(q.as_str()).count() * (q.len() - SHOP_QUEUE.len());
    println!(
        "{as_shop} characters with the queue {SHOP_QUEUE} ({} here): {line}",
        line.len()
    );
    for needle in [
        format!("queue={q} "),
        "delivery_tag=".to_owned(),
        "message_id=\"o-ok-1\"".to_owned(),
        "attempt=1".to_owned(),
        "outcome=\"handled\"".to_owned(),
    ] {
        assert!(line.contains(&needle), "{needle:?} missing: {line}");
    }
    assert!(
        !line.contains("messaging.") && !line.contains("otel."),
        "OpenTelemetry attributes in a log line: {line}"
    );
    assert!(as_shop <= MAX_LINE, "{as_shop} characters: {line}");
    // The queue has no dead_letter: start says so, naming it.
    let dropped = format!("dead_letter is off for {q}: ");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(" WARN ") && l.contains(&dropped)),
        "no start warning naming {q}; stderr:\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_is_one_warning_per_connection_and_none_of_lapins_errors() {
    let q = unique("logs-loss");
    let _cleanup = QueueCleanup::new(vec![q.clone()]);
    let proxy = Proxy::start().await;
    let addr = proxy.amqp_addr();
    let mut shop = ShopProcess::spawn(&q, &config_yaml(&q), &[("AMQP_ADDR", &addr)]);
    shop.wait_ready().await;
    let before = shop.stderr().lines().count();
    proxy.cut();
    assert!(
        eventually(SECS(15), || async {
            !matches!(shop.readyz().await, Some((200, _)))
        })
        .await,
        "readiness goes off once the connection is lost; stderr:\n{}",
        shop.stderr()
    );
    proxy.restore();
    for role in ["consumer", "publisher"] {
        let lost = format!("the {role} connection to the broker was lost");
        shop.wait_stderr(&lost, SECS(15)).await;
    }
    shop.wait_ready().await;
    shop.signal("-TERM");
    let status = shop.exit_within(SECS(20)).await;
    let stderr = shop.stderr();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    let outage: Vec<&str> = stderr.lines().skip(before).collect();
    println!("the outage in the shop's log:\n{}", outage.join("\n"));
    let noisy = lapin_or_error_lines(&stderr);
    assert!(noisy.is_empty(), "lapin's or ERROR lines:\n{noisy:#?}");
    // Each connection's loss is told once, at WARN, with lapin's error in
    // the same line; failed reconnect attempts would be lines of their own.
    let warnings: Vec<&str> = outage
        .iter()
        .copied()
        .filter(|l| l.contains(" WARN ") && !l.contains("reconnect failed"))
        .collect();
    assert_eq!(warnings.len(), 2, "one per connection:\n{warnings:#?}");
    for role in ["consumer", "publisher"] {
        let told: Vec<&str> = warnings
            .iter()
            .copied()
            .filter(|l| l.contains(&format!("connection=\"{role}\"")))
            .collect();
        assert_eq!(
            told.len(),
            1,
            "the {role} connection's loss:\n{warnings:#?}"
        );
        assert!(
            told[0].contains(&format!("the {role} connection to the broker was lost (")),
            "the loss and lapin's error in one line: {}",
            told[0]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_ends_stderr_with_acemqs_one_line_reason_and_no_lapin_line() {
    let q = unique("logs-start");
    let vhost = format!("acemq-test-no-such-vhost-{}", std::process::id());
    let url = url::Url::parse(&crate::support::addr()).expect("AMQP_ADDR is a URL");
    let wrong_vhost = format!(
        "amqp://guest:guest@{}:{}/{vhost}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port().unwrap_or(5672)
    );
    for (addr, code, reason) in [
        // lapin logs three ERROR events of its own on this one.
        (wrong_vhost.as_str(), 69, vhost.as_str()),
        (
            "amqp://guest:guest@127.0.0.1:1/%2f",
            69,
            "is RabbitMQ running there",
        ),
        ("http://127.0.0.1:5672/", 78, "not a valid amqp://"),
    ] {
        let mut shop = ShopProcess::spawn(&q, &config_yaml(&q), &[("AMQP_ADDR", addr)]);
        let status = shop.exit_within(SECS(20)).await;
        let stderr = shop.stderr();
        assert_eq!(status.code(), Some(code), "{addr}: stderr:\n{stderr}");
        // Told once: the shop logs, so as its ERROR line, the last one.
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.contains(" ERROR ") && last.contains(reason),
            "{addr}: the last line is acemq's reason; stderr:\n{stderr}"
        );
        let told = stderr
            .lines()
            .filter(|l| l.contains(reason) && (l.contains(" ERROR ") || l.starts_with("acemq: ")))
            .count();
        assert_eq!(told, 1, "{addr}: the reason told once; stderr:\n{stderr}");
        let lapin: Vec<&str> = stderr.lines().filter(|l| l.contains("lapin")).collect();
        assert!(lapin.is_empty(), "{addr}: lapin's lines:\n{lapin:#?}");
    }
}

/// Runs the shop against a broker address nothing listens on (a failed
/// start), `NO_COLOR` empty (which counts as unset), and returns its exit
/// code and its stderr as written, escapes and all.
async fn failed_start_raw_stderr(q: &str) -> (Option<i32>, String) {
    let config = std::env::temp_dir().join(format!("{q}.yaml"));
    std::fs::write(&config, config_yaml(q)).expect("write the config");
    let out = tokio::process::Command::new(crate::support::shop_binary())
        .arg("--config")
        .arg(&config)
        .args(["--no-seed", "--queue", q, "--http", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "")
        .env("AMQP_ADDR", "amqp://guest:guest@127.0.0.1:1/%2f")
        .stdin(std::process::Stdio::null())
        .output();
    let out = tokio::time::timeout(SECS(30), out)
        .await
        .expect("the shop exits within 30 s")
        .expect("the shop runs");
    let _ = std::fs::remove_file(&config);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_written_to_a_pipe_carries_no_colour_codes_and_a_failed_start_is_told_once() {
    let (code, stderr) = failed_start_raw_stderr(&unique("logs-colour")).await;
    assert_eq!(code, Some(69), "stderr:\n{stderr}");
    assert!(stderr.contains("ERROR"), "stderr:\n{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "ANSI escapes in a log written to a pipe:\n{stderr:?}"
    );
    let told = stderr
        .lines()
        .filter(|l| l.contains("is RabbitMQ running there"))
        .count();
    assert_eq!(told, 1, "the reason told once:\n{stderr}");
}

//! The console in a real browser: Debian's headless `chromium`, driven
//! through `chromedriver` (the W3C WebDriver protocol, `webdriver.rs`),
//! against the shop example started with `--no-seed`, `--http` and
//! `ACEMQ_ADMIN_TOKEN`, on the real broker at `AMQP_ADDR`.
//!
//! They are `#[ignore]`d in `cargo test --workspace` (they need the
//! browser); `.ci/run` installs it and runs them:
//! `cargo test -p acemq --test console -- --ignored`.
//! Screenshots of each page go to `target/console-screenshots/`, and to
//! the folder in `ACEMQ_CONSOLE_SCREENSHOTS` when set (README's come from
//! `ACEMQ_CONSOLE_SCREENSHOTS=docs/console`).
#![allow(unreachable_pub, missing_docs, clippy::disallowed_methods)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../broker/support.rs"]
mod support;
mod webdriver;

use std::path::PathBuf;
use std::time::Duration;

use lapin::BasicProperties;
use support::{eventually, now_ms, unique, Broker, ShopProcess};
use webdriver::{Browser, ChromeDriver, ENTER};

const TOKEN: &str = "console-browser-test-token-4f2a9c";

/// Where the screenshots go: `target/console-screenshots/NAME.png`, and
/// `$ACEMQ_CONSOLE_SCREENSHOTS/NAME.png` when set.
async fn keep(browser: &Browser, name: &str) {
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    browser
        .screenshot(&target.join(format!("{name}.png")))
        .await;
    if let Ok(dir) = std::env::var("ACEMQ_CONSOLE_SCREENSHOTS") {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
        browser.screenshot(&dir.join(format!("{name}.png"))).await;
    }
}

/// Asserts the page is the login form alone: one input, a password
/// field, no navigation and no queue.
async fn only_the_login_form(browser: &Browser, q: &str) {
    let inputs = browser.find_all("input").await;
    assert_eq!(inputs.len(), 1, "{}", browser.source().await);
    assert_eq!(
        browser.attr(&inputs[0], "type").await.as_deref(),
        Some("password")
    );
    assert!(browser.find_all("nav").await.is_empty());
    assert!(!browser.source().await.contains(q));
}

/// The text of the count of `reason` in `dlq`'s section, or `None` when
/// the section has no such row.
async fn reason_count(browser: &Browser, dlq: &str, reason: &str) -> Option<String> {
    let css = format!("section[data-dlq=\"{dlq}\"] tr[data-reason=\"{reason}\"] td");
    let cells = browser.find_all(&css).await;
    match cells.first() {
        Some(c) => Some(browser.text(c).await),
        None => None,
    }
}

#[tokio::test]
#[ignore = "a browser test: needs chromium and chromium-driver (.ci/run installs and runs it)"]
async fn an_operator_logs_in_sees_a_rejected_order_replays_it_and_pauses_a_queue() {
    let started = std::time::Instant::now();
    let q = unique("console-web");
    let dlq = format!("{q}.dlq");
    let yaml = format!("queues:\n  - name: {q}\n    dead_letter: true\n");
    let shop = ShopProcess::spawn(&q, &yaml, &[("ACEMQ_ADMIN_TOKEN", TOKEN)]);
    shop.wait_ready().await;
    let mut broker = Broker::new().await;

    // One order the shop rejects for the next few seconds: dead-lettered.
    let until = now_ms() + 8_000;
    let body = format!(r#"{{"id":"o-web-1","reject_until_ms":{until}}}"#);
    let props = BasicProperties::default().with_message_id("o-web-1".into());
    broker.publish_props(&q, body.as_bytes(), props).await;
    assert!(
        broker.wait_ready(&dlq, 1, Duration::from_secs(10)).await,
        "the order was not dead-lettered; stderr:\n{}",
        shop.stderr()
    );

    let driver = ChromeDriver::start().await;
    let profile = std::env::temp_dir().join(format!("{q}.chromium"));
    let browser = driver.session(&profile).await;
    let base = format!("http://{}", shop.http());

    // Without the cookie: the login form alone. Type the token, press Enter.
    browser.goto(&format!("{base}/console/")).await;
    only_the_login_form(&browser, &q).await;
    keep(&browser, "login").await;
    let field = browser.find("input[type=password]").await;
    let focused = browser.active().await;
    assert_eq!(
        browser.attr(&focused, "id").await.as_deref(),
        Some("token"),
        "the password field has the focus"
    );
    browser.send_keys(&field, &format!("{TOKEN}{ENTER}")).await;
    browser.find(&format!("tr[data-queue=\"{q}\"]")).await;
    let cookies = browser.cookies().await;
    let cookie = cookies
        .iter()
        .find(|c| c["name"] == "acemq_console")
        .expect("the session cookie");
    assert_eq!(cookie["httpOnly"], true);
    assert_eq!(cookie["sameSite"], "Strict");
    assert!(!cookie["value"].as_str().unwrap_or("").contains(TOKEN));
    keep(&browser, "queues").await;

    // The dead letters: the order under its reason.
    browser.goto(&format!("{base}/console/dead-letters")).await;
    assert_eq!(
        reason_count(&browser, &dlq, "rejected").await.as_deref(),
        Some("1")
    );
    assert!(browser.source().await.contains("o-web-1"));
    keep(&browser, "dead-letters").await;

    // At 200 % zoom (a 1280-pixel screen shows 640 CSS pixels), the pages
    // fit the window's width: nothing but a table's own box scrolls sideways.
    browser.set_window(640, 900).await;
    for (path, name) in [("dead-letters", "dead-letters-200"), ("", "queues-200")] {
        browser.goto(&format!("{base}/console/{path}")).await;
        let overflow = browser
            .execute(
                "const d = document.documentElement; \
                 return [d.scrollWidth, d.clientWidth];",
            )
            .await;
        let (scroll, client) = (overflow[0].as_u64(), overflow[1].as_u64());
        assert!(
            client.is_some_and(|c| c <= 660) && scroll <= client,
            "/console/{path} at 640 CSS pixels: scrollWidth {scroll:?} > clientWidth {client:?}"
        );
        keep(&browser, name).await;
    }
    browser.set_window(1280, 900).await;
    browser.goto(&format!("{base}/console/dead-letters")).await;
    let link = browser
        .find(&format!(
            "section[data-dlq=\"{dlq}\"] a[href$=\"/messages/1\"]"
        ))
        .await;
    browser.click(&link).await;
    browser.find("dl").await;
    assert!(browser.source().await.contains("reject_until_ms"));
    keep(&browser, "message").await;

    // After reject_until_ms: Replay, then the confirmation.
    let wait = (until - now_ms()).max(0) as u64 + 200;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    browser.goto(&format!("{base}/console/dead-letters")).await;
    let replay = browser
        .find(&format!(
            "section[data-dlq=\"{dlq}\"] tr[data-reason=\"rejected\"] button"
        ))
        .await;
    assert_eq!(browser.text(&replay).await, "Replay");
    browser.click(&replay).await;
    let confirm = browser.find("main form[method=post] button").await;
    assert!(browser.source().await.contains("data-count=\"1\""));
    keep(&browser, "confirm-replay").await;
    browser.click(&confirm).await;
    let status = browser.find("p[role=status]").await;
    assert!(
        browser.text(&status).await.contains("moved 1"),
        "{}",
        browser.source().await
    );
    shop.wait_stderr("order handled", Duration::from_secs(10))
        .await;
    browser.goto(&format!("{base}/console/dead-letters")).await;
    let section = browser.find(&format!("section[data-dlq=\"{dlq}\"]")).await;
    assert_eq!(
        browser.attr(&section, "data-held").await.as_deref(),
        Some("0")
    );
    assert_eq!(reason_count(&browser, &dlq, "rejected").await, None);

    // Pause the queue: its state changes; resume it.
    browser.goto(&format!("{base}/console/")).await;
    let row = format!("tr[data-queue=\"{q}\"]");
    let pause = browser.find(&format!("{row} button")).await;
    assert_eq!(browser.text(&pause).await, "Pause");
    browser.click(&pause).await;
    let paused = eventually(Duration::from_secs(10), || async {
        let rows = browser
            .find_all(&format!("{row}[data-state=\"paused\"]"))
            .await;
        !rows.is_empty()
    })
    .await;
    assert!(paused, "{}", browser.source().await);
    let (_, snap) = shop
        .get_json(&format!("/queues/{q}"))
        .await
        .expect("/queues");
    assert_eq!(snap["paused"], true);
    keep(&browser, "queues-paused").await;
    let resume = browser.find(&format!("{row} button")).await;
    assert_eq!(browser.text(&resume).await, "Resume");
    browser.click(&resume).await;
    browser
        .find(&format!("{row}[data-state=\"consuming\"]"))
        .await;

    // Without the cookie: the login form alone, on every page.
    browser.delete_cookies().await;
    for page in ["/console/", "/console/dead-letters"] {
        browser.goto(&format!("{base}{page}")).await;
        only_the_login_form(&browser, &q).await;
    }

    browser.quit().await;
    drop(driver);
    let _ = std::fs::remove_dir_all(&profile);
    broker.delete(&[q, dlq]).await;
    eprintln!("the browser test took {:?}", started.elapsed());
}

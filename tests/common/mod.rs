//! What every integration test crate shares: the broker address from the
//! environment, unique queue names, and a bounded wait on a condition.
//! Each crate includes it as `#[path = "../common/mod.rs"] mod common;`
//! and its own support module re-exports what it uses.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The broker address the tests use: `AMQP_ADDR`, or the local broker.
pub fn addr() -> String {
    acemq::connection::amqp_addr_from_env()
}

/// A queue name unique to this test run and call:
/// `acemq-test.{prefix}.{process id}.{counter}`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "acemq-test.{prefix}.{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Waits for `cond` to hold, checking every 20 ms, up to `within`; whether
/// it held.
pub async fn eventually<F, Fut>(within: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + within;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Builds the example `name` (with `features`) beside the test binary, as
/// the test binary was built (debug or release), and returns its path.
pub fn example_binary(name: &str, features: &[&str]) -> std::path::PathBuf {
    // The test binary is <target>/<profile>/deps/<test>-<hash>; the
    // example goes to <target>/<profile>/examples/<name>.
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("<target>/<profile>/deps");
    let target_dir = profile_dir.parent().expect("<target>");
    let mut build = std::process::Command::new(env!("CARGO"));
    build.args(["build", "--example", name]);
    if !features.is_empty() {
        build.args(["--features", &features.join(",")]);
    }
    build
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    let status = build.status().expect("cargo build --example runs");
    assert!(status.success(), "cargo build --example {name} failed");
    let bin = profile_dir.join("examples").join(name);
    assert!(bin.exists(), "no {name} binary at {}", bin.display());
    bin
}

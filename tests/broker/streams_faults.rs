//! Faults under a shop consuming a stream, as a black box: the stream
//! deleted under it (it is declared again and consumed), a SIGKILL (a
//! restart resumes from the stored offset), and a lost stream connection
//! (the shop connects again and resumes from the stored offset). Nothing
//! is lost; what is handled twice stays within the store bound
//! (`offset_store.every` + `prefetch`).
//!
//! Needs the stream plugin (`ACEMQ_STREAM_PORT`, see `streams.rs`); runs on
//! every broker version.

use std::time::Duration;

use lapin::BasicProperties;

use crate::proxy::Proxy;
use crate::streams::handled_counts;
use crate::streams_sac::{
    all_handled, declared, duplicates, lines_with, lines_within, orders, shop_yaml,
};
use crate::support::stream_port;
use crate::support::{eventually, unique, Broker, QueueCleanup, ShopProcess};

const EVERY: usize = 50;
const PREFETCH: usize = 50;

fn yaml(s: &str, port: u16) -> String {
    shop_yaml(
        s,
        port,
        PREFETCH,
        &format!("    offset_store: {{ every: {EVERY}, within: 200ms }}\n"),
    )
}

fn shop(tag: &str, s: &str, yaml: &str) -> ShopProcess {
    ShopProcess::spawn_with_args(
        tag,
        yaml,
        &["--no-seed", "--queue", s],
        &[("RUST_LOG", "info")],
    )
}

/// Waits until `shop` handled at least `n` distinct orders.
async fn handled_at_least(shop: &ShopProcess, n: usize) {
    let ok = eventually(Duration::from_secs(60), || async {
        handled_counts(&[shop.stderr()]).len() >= n
    })
    .await;
    assert!(ok, "the shop never handled {n}; stderr:\n{}", shop.stderr());
}

#[tokio::test]
async fn stream_fault_deleted_under_the_shop_is_declared_again_and_consumed() {
    let s = unique("stream-deleted");
    let _cleanup = QueueCleanup::new(declared(&s, 0));
    let mut broker = Broker::new().await;
    let yaml = yaml(&s, stream_port());
    let mut shop = shop(&s, &s, &yaml);
    lines_within(&shop, "consuming the stream", 1, Duration::from_secs(30)).await;
    broker
        .publish_many(&s, &orders("a", 100, 0), BasicProperties::default())
        .await;
    all_handled(&[&shop], &[], 100, Duration::from_secs(60)).await;

    // Deleted over AMQP under the consuming shop.
    broker.delete(std::slice::from_ref(&s)).await;
    lines_within(&shop, "declaring it again", 1, Duration::from_secs(30)).await;
    lines_within(&shop, "consuming the stream", 2, Duration::from_secs(60)).await;
    broker
        .publish_many(&s, &orders("b", 100, 0), BasicProperties::default())
        .await;
    all_handled(&[&shop], &[], 200, Duration::from_secs(60)).await;
    let dup = duplicates(&handled_counts(&[shop.stderr()]));
    assert_eq!(
        dup, 0,
        "the new stream holds only the orders published after"
    );

    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
}

#[tokio::test]
async fn stream_fault_sigkill_mid_stream_a_restart_loses_nothing_within_the_store_bound() {
    let s = unique("stream-killed");
    let _cleanup = QueueCleanup::new(declared(&s, 0));
    let mut broker = Broker::new().await;
    let yaml = yaml(&s, stream_port());
    let mut first = shop(&format!("{s}-1"), &s, &yaml);
    lines_within(&first, "consuming the stream", 1, Duration::from_secs(30)).await;
    broker
        .publish_many(&s, &orders("o", 2000, 2), BasicProperties::default())
        .await;
    handled_at_least(&first, 500).await;
    first.signal("-KILL");
    let _ = first.exit_within(Duration::from_secs(10)).await;
    let before = first.stderr();

    let mut second = shop(&format!("{s}-2"), &s, &yaml);
    all_handled(
        &[&second],
        std::slice::from_ref(&before),
        2000,
        Duration::from_secs(120),
    )
    .await;
    let counts = handled_counts(&[before.clone(), second.stderr()]);
    let dup = duplicates(&counts);
    eprintln!(
        "measured: killed after {} of 2000; handled again after the restart: {dup} (bound {})",
        handled_counts(std::slice::from_ref(&before)).len(),
        EVERY + PREFETCH
    );
    assert_eq!(counts.len(), 2000);
    assert!(
        dup <= EVERY + PREFETCH,
        "{dup} duplicates over every + prefetch"
    );
    second.signal("-TERM");
    let status = second.exit_within(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", second.stderr());
}

#[tokio::test]
async fn stream_fault_a_lost_stream_connection_resumes_from_the_stored_offset() {
    let s = unique("stream-cut");
    let _cleanup = QueueCleanup::new(declared(&s, 0));
    let mut broker = Broker::new().await;
    let proxy = Proxy::start_to(&format!("127.0.0.1:{}", stream_port())).await;
    let yaml = yaml(&s, proxy.port());
    let mut shop = shop(&s, &s, &yaml);
    lines_within(&shop, "consuming the stream", 1, Duration::from_secs(30)).await;
    broker
        .publish_many(&s, &orders("o", 2000, 2), BasicProperties::default())
        .await;
    handled_at_least(&shop, 500).await;

    // The stream connection cut mid-stream, and kept refused a moment.
    proxy.cut();
    lines_within(
        &shop,
        "the stream connection was lost",
        1,
        Duration::from_secs(30),
    )
    .await;
    let at_cut = handled_counts(&[shop.stderr()]).len();
    let ok = eventually(Duration::from_secs(30), || async {
        lines_with(&shop.stderr(), "could not consume the stream") >= 1
    })
    .await;
    assert!(
        ok,
        "no refused reconnection while cut; stderr:\n{}",
        shop.stderr()
    );
    proxy.restore();
    lines_within(&shop, "consuming the stream", 2, Duration::from_secs(60)).await;
    all_handled(&[&shop], &[], 2000, Duration::from_secs(120)).await;

    let counts = handled_counts(&[shop.stderr()]);
    let dup = duplicates(&counts);
    eprintln!(
        "measured: cut after {at_cut} of 2000; handled again after the reconnection: {dup} (bound {})",
        EVERY + PREFETCH
    );
    assert_eq!(counts.len(), 2000);
    assert!(
        dup <= EVERY + PREFETCH,
        "{dup} duplicates over every + prefetch"
    );
    shop.signal("-TERM");
    let status = shop.exit_within(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", shop.stderr());
}

//! The shop's handler: a plain function behind `tower::service_fn`, shared
//! by the example (`main.rs`) and its in-memory tests (`tests/shop.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use acemq::config::JsonBody;
use acemq::layers::Escaped;
use acemq::{BoxError, Delivery, Reject};
use serde::Deserialize;
use tracing::{info, warn};

/// One order, as published to `shop.orders`.
#[derive(Debug, Deserialize)]
struct Order {
    id: String,
    #[serde(default)]
    work_ms: u64,
    #[serde(default)]
    ignore_cancel: bool,
    #[serde(default)]
    fail_attempts: u32,
    #[serde(default)]
    fail: Option<Fail>,
    /// Every attempt fails (transiently) until this time, in milliseconds
    /// since the Unix epoch: a downstream outage that ends by itself.
    #[serde(default)]
    fail_until_ms: u64,
    /// Every attempt is rejected (permanently: dead-lettered at once) until
    /// this time, in milliseconds since the Unix epoch; handled after it.
    /// A replay after that time succeeds.
    #[serde(default)]
    reject_until_ms: u64,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Fail {
    Permanent,
    Panic,
}

#[derive(Debug, thiserror::Error)]
#[error("order {id}: simulated failure on attempt {attempt} of the first {fail_attempts}")]
struct Transient {
    id: String,
    attempt: u32,
    fail_attempts: u32,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "order {id}: simulated outage, {left_ms} ms left (until {until_ms} ms since the Unix epoch)"
)]
struct Outage {
    id: String,
    until_ms: u64,
    left_ms: u64,
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Counts for the status line.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Orders handled.
    pub(crate) ok: AtomicU64,
    /// Attempts that failed (transient, permanent, panic, not an order).
    pub(crate) failed: AtomicU64,
}

async fn handle(stats: Arc<Stats>, delivery: Delivery) -> Result<(), BoxError> {
    let attempt = delivery.attempt();
    // Ordered by a field of the body (`ordered_by: { json: /customer }`),
    // the body was parsed for its key: read the order from that.
    let parsed = match delivery.extensions().get::<JsonBody>() {
        Some(body) => Order::deserialize(body.value()),
        None => serde_json::from_slice(delivery.body()),
    };
    let order: Order = match parsed {
        Ok(o) => o,
        Err(e) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            warn!(
                delivery_tag = delivery.delivery_tag(),
                attempt,
                outcome = "rejected",
                "not an order ({e}); dead-lettering"
            );
            return Err(Reject::new(format!("body is not an order: {e}")).into());
        }
    };
    if order.work_ms > 0 {
        let work = tokio::time::sleep(Duration::from_millis(order.work_ms));
        if order.ignore_cancel {
            work.await;
        } else {
            tokio::select! {
                () = work => {}
                () = delivery.token().cancelled() => {
                    info!(order = %Escaped(&order.id), attempt, outcome = "cancelled", "work cancelled by the drain; handing the order back");
                    return Err("cancelled by the drain".into());
                }
            }
        }
    }
    match order.fail {
        Some(Fail::Permanent) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            info!(order = %Escaped(&order.id), attempt, outcome = "rejected", "permanent failure");
            return Err(Reject::new(format!("order {} cannot be fulfilled", order.id)).into());
        }
        Some(Fail::Panic) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            info!(order = %Escaped(&order.id), attempt, outcome = "panic", "about to panic");
            panic!("order {} hit a bug", Escaped(&order.id));
        }
        None => {}
    }
    let now = now_ms();
    if order.reject_until_ms > now {
        stats.failed.fetch_add(1, Ordering::Relaxed);
        info!(order = %order.id, attempt, outcome = "rejected", "rejected until reject_until_ms");
        return Err(Reject::new(format!(
            "order {} is rejected for {} ms more (until {} ms since the Unix epoch)",
            order.id,
            order.reject_until_ms - now,
            order.reject_until_ms
        ))
        .into());
    }
    if order.fail_until_ms > now {
        stats.failed.fetch_add(1, Ordering::Relaxed);
        info!(order = %Escaped(&order.id), attempt, outcome = "failed", "transient failure (simulated outage)");
        return Err(Outage {
            id: order.id,
            until_ms: order.fail_until_ms,
            left_ms: order.fail_until_ms - now,
        }
        .into());
    }
    if attempt <= order.fail_attempts {
        stats.failed.fetch_add(1, Ordering::Relaxed);
        info!(order = %Escaped(&order.id), attempt, outcome = "failed", "transient failure");
        return Err(Transient {
            id: order.id,
            attempt,
            fail_attempts: order.fail_attempts,
        }
        .into());
    }
    stats.ok.fetch_add(1, Ordering::Relaxed);
    info!(order = %Escaped(&order.id), attempt, outcome = "handled", "order handled");
    Ok(())
}

/// The handler as the service `App::consume` takes, counting into `stats`.
pub(crate) fn orders(
    stats: Arc<Stats>,
) -> impl tower::Service<Delivery, Response = (), Error = BoxError, Future: Send + 'static>
       + Clone
       + Send
       + 'static {
    tower::service_fn(move |d: Delivery| handle(stats.clone(), d))
}

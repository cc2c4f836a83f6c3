//! Drain latency on the real broker: how long `Running::drain()` takes to
//! return, from the call.
//!
//! - **idle**: a started consumer with nothing to do; the whole drain
//!   (readiness, basic.cancel, wait, close channels and connection).
//! - **one 500 ms handler in flight**: one message whose handler sleeps
//!   500 ms; the drain is called ~100 ms into it. Reported: the handler's
//!   remaining time (from the call to its return) and the excess of the
//!   drain over it (from the handler's return to `drain()` returning).
//!
//! Medians of `ACEMQ_BENCH_DRAIN_RUNS` runs (default 7). Targets: idle
//! < 50 ms, excess < 50 ms.
//!
//! Run with: `cargo bench --bench drain`

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::{App, Delivery};
use tokio::sync::Notify;

use support::{median, Broker};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn idle(broker: &Broker) -> f64 {
    let queue = support::unique("drain-idle");
    let config = support::config(&queue, 32, 8);
    let running = App::new(config.clone())
        .amqp_addr(support::addr())
        .connection_name("acemq-bench-drain")
        .consume(
            &queue,
            tower::service_fn(|_: Delivery| async { Ok::<_, std::convert::Infallible>(()) }),
        )
        .start()
        .await
        .expect("start");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    running.drain().await.expect("drain");
    let took = t0.elapsed();
    broker.delete(&config).await;
    ms(took)
}

#[derive(Default)]
struct Seen {
    started: Notify,
    ended: Mutex<Option<Instant>>,
}

/// Returns (drain total, handler remaining after the call, excess), in ms.
async fn busy(broker: &Broker) -> (f64, f64, f64) {
    let queue = support::unique("drain-busy");
    let config = support::config(&queue, 32, 8);
    broker.declare(&config).await;
    broker.publish(&queue, 1, b"slow").await;
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let handler = tower::service_fn(move |_: Delivery| {
        let s = s.clone();
        async move {
            s.started.notify_one();
            tokio::time::sleep(Duration::from_millis(500)).await;
            *s.ended.lock().unwrap() = Some(Instant::now());
            Ok::<_, std::convert::Infallible>(())
        }
    });
    let running = App::new(config.clone())
        .amqp_addr(support::addr())
        .connection_name("acemq-bench-drain")
        .consume(&queue, handler)
        .start()
        .await
        .expect("start");
    seen.started.notified().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = Instant::now();
    running.drain().await.expect("drain");
    let t1 = Instant::now();
    let ended = seen.ended.lock().unwrap().expect("the handler finished");
    broker.delete(&config).await;
    (
        ms(t1 - t0),
        ms(ended.saturating_duration_since(t0)),
        ms(t1.saturating_duration_since(ended)),
    )
}

fn main() {
    let runs: usize = support::env_or("ACEMQ_BENCH_DRAIN_RUNS", 7);
    support::runtime().block_on(async {
        let broker = support::start("drain latency", &format!(", {runs} runs each")).await;
        let mut idle_ms = Vec::new();
        let (mut total, mut remaining, mut excess) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..runs {
            let a = idle(&broker).await;
            let (t, r, e) = busy(&broker).await;
            eprintln!("run {i}: idle {a:.1} ms; busy drain {t:.1} ms = handler {r:.1} ms + excess {e:.1} ms");
            idle_ms.push(a);
            total.push(t);
            remaining.push(r);
            excess.push(e);
        }
        let list = |v: &[f64]| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", ");
        println!("\n| case | median ms | runs (ms) | target |");
        println!("|---|---:|---|---|");
        println!("| idle consumer: drain() call → return | {:.1} | {} | < 50 |", median(&idle_ms), list(&idle_ms));
        println!("| 500 ms handler in flight: drain() call → return | {:.1} | {} | — |", median(&total), list(&total));
        println!("| … of which the handler's remaining time | {:.1} | {} | — |", median(&remaining), list(&remaining));
        println!("| … excess over the handler (handler return → drain return) | {:.1} | {} | < 50 |", median(&excess), list(&excess));
    });
}

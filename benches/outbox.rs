//! The outbox relay's throughput and the inbox layer's cost per delivery,
//! against the real PostgreSQL (`ACEMQ_TEST_PG`, default
//! `host=127.0.0.1 user=postgres`) and RabbitMQ (`AMQP_ADDR`).
//!
//! - **relay**: `ACEMQ_BENCH_ROWS` (default 20,000) committed rows; time
//!   from `Relay::spawn` until every row is published, confirmed and marked
//!   sent: rows/s, per relay shape. Beside the default shape (one relay,
//!   batch 200), in the same runs, a plain lapin publisher of the same
//!   messages from memory (same bodies, a message id each, persistent,
//!   mandatory) with the same confirm window: 200 published at once, then
//!   their confirms awaited, then the next 200 — the relay's ceiling. Like
//!   the relay's `StandalonePublisher`, it opens its connection in the
//!   timed window.
//! - **inbox**: the same work (one `INSERT` into a table) done by a plain
//!   handler (autocommit) and by the handler behind `InboxLayer<PgInbox>`
//!   (BEGIN + mark, the insert, COMMIT), interleaved in one run, one
//!   delivery at a time and 8 at a time: µs per delivery and the ratio. And
//!   the layer's own mechanics in memory (`MemoryInbox`) beside a bare
//!   `service_fn`.
//!
//! Medians of `ACEMQ_BENCH_RUNS` runs (default 5). Creates its own database
//! and queue and drops them.
//!
//! Run with: `cargo bench --features postgres --bench outbox`

#![allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::disallowed_methods
)]

use std::time::{Duration, Instant};

use acemq::inbox::{PgInbox, PgTransaction};
use acemq::layers::inbox::{InboxLayer, MemoryInbox};
use acemq::layers::Properties;
use acemq::outbox::{self, Outbox, OutboxMessage, Relay, RelayConfig, StandalonePublisher};
use acemq::{BoxError, Delivery};
use deadpool_postgres::Pool;
use futures::StreamExt;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation};
use tower::{Service, ServiceBuilder, ServiceExt};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

fn pg_base() -> String {
    std::env::var("ACEMQ_TEST_PG").unwrap_or_else(|_| "host=127.0.0.1 user=postgres".to_owned())
}

async fn admin() -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(
        &format!("{} dbname=postgres", pg_base()),
        tokio_postgres::NoTls,
    )
    .await
    .expect("PostgreSQL reachable");
    tokio::spawn(conn);
    c
}

async fn enqueue(pool: &Pool, queue: &str, n: usize) -> f64 {
    let mut client = pool.get().await.expect("connection");
    let t0 = Instant::now();
    let tx = client.transaction().await.expect("begin");
    let messages: Vec<OutboxMessage> = (0..n)
        .map(|i| OutboxMessage::to_queue(queue, format!("{{\"id\":\"o-{i}\",\"item\":\"bench\"}}")))
        .collect();
    for chunk in messages.chunks(500) {
        for r in futures::future::join_all(chunk.iter().map(|m| Outbox::enqueue(&tx, m))).await {
            r.expect("enqueue");
        }
    }
    tx.commit().await.expect("commit");
    n as f64 / t0.elapsed().as_secs_f64()
}

/// One relay run: rows/s from spawn to every row marked sent.
async fn relay_run(pool: &Pool, queue: &str, rows: usize, relays: usize, batch: usize) -> f64 {
    let mut config = RelayConfig::default();
    config.batch_size = batch;
    config.poll_interval = Duration::from_millis(5);
    let t0 = Instant::now();
    let handles: Vec<_> = (0..relays)
        .map(|i| {
            Relay::new(
                pool.clone(),
                StandalonePublisher::new(
                    acemq::connection::amqp_addr_from_env(),
                    format!("acemq-bench-relay-{i}"),
                ),
            )
            .config(config.clone())
            .spawn()
        })
        .collect();
    loop {
        let published: u64 = handles.iter().map(|h| h.stats().published).sum();
        if published >= rows as u64 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "relay run took over 5 minutes"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    for h in handles {
        h.stop().await;
    }
    let _ = queue;
    rows as f64 / secs
}

/// The same messages as `enqueue` writes, in memory: (message id, body).
fn plain_messages(rows: usize) -> Vec<(String, Vec<u8>)> {
    (0..rows)
        .map(|i| {
            (
                format!("00000000-0000-4000-8000-{i:012}"),
                format!("{{\"id\":\"o-{i}\",\"item\":\"bench\"}}").into_bytes(),
            )
        })
        .collect()
}

/// A plain lapin publisher of `messages` to `queue`: `window` published
/// at once on a confirm channel, their confirms awaited, then the next
/// `window`. Rows/s, opening its connection in the timed window as the
/// relay's `StandalonePublisher` does.
async fn plain_run(queue: &str, messages: &[(String, Vec<u8>)], window: usize) -> f64 {
    let t0 = Instant::now();
    let conn = lapin::Connection::connect(
        &acemq::connection::amqp_addr_from_env(),
        lapin::ConnectionProperties::default().with_connection_name("acemq-bench-plain".into()),
    )
    .await
    .expect("RabbitMQ reachable");
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm mode");
    for chunk in messages.chunks(window.max(1)) {
        let confirms = futures::future::join_all(chunk.iter().map(|(id, body)| {
            let ch = &ch;
            async move {
                ch.basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    body,
                    BasicProperties::default()
                        .with_message_id(id.as_str().into())
                        .with_delivery_mode(2),
                )
                .await?
                .await
            }
        }))
        .await;
        for c in confirms {
            assert!(
                matches!(c.expect("published"), Confirmation::Ack(None)),
                "confirmed and routed"
            );
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let _ = conn.close(200, "OK".into()).await;
    messages.len() as f64 / secs
}

fn delivery(i: usize) -> Delivery {
    let mut props = Properties::default();
    props.message_id = Some(format!("m-{i}"));
    Delivery::builder()
        .queue("bench")
        .body(format!("o-{i}"))
        .properties(props)
        .build()
}

async fn plain_work(pool: Pool, d: Delivery) -> Result<(), BoxError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached("INSERT INTO shipments (order_id, message_id) VALUES ($1, $2)")
        .await?;
    let id = d.properties().message_id.clone().unwrap_or_default();
    client
        .execute(
            &stmt,
            &[&String::from_utf8_lossy(d.body()).into_owned(), &id],
        )
        .await?;
    Ok(())
}

async fn inbox_work(d: Delivery) -> Result<(), BoxError> {
    let tx = PgTransaction::of(&d)?;
    let client = tx.client().await;
    let stmt = client
        .prepare_cached("INSERT INTO shipments (order_id, message_id) VALUES ($1, $2)")
        .await?;
    let id = d.properties().message_id.clone().unwrap_or_default();
    client
        .execute(
            &stmt,
            &[&String::from_utf8_lossy(d.body()).into_owned(), &id],
        )
        .await?;
    Ok(())
}

/// µs per delivery for `n` deliveries, `concurrency` at a time.
async fn drive<S>(svc: S, start: usize, n: usize, concurrency: usize) -> f64
where
    S: Service<Delivery> + Clone,
    S::Error: std::fmt::Debug,
{
    let t0 = Instant::now();
    futures::stream::iter(start..start + n)
        .map(|i| svc.clone().oneshot(delivery(i)))
        .buffer_unordered(concurrency)
        .for_each(|r| async {
            r.expect("handled");
        })
        .await;
    t0.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn main() {
    let runs: usize = env_or("ACEMQ_BENCH_RUNS", 5);
    let rows: usize = env_or("ACEMQ_BENCH_ROWS", 20_000);
    let deliveries: usize = env_or("ACEMQ_BENCH_DELIVERIES", 2_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let db = format!("acemq_bench_{}_{nanos}", std::process::id());
        admin().await.batch_execute(&format!("CREATE DATABASE {db}")).await.expect("create db");
        let pool = outbox::pool(&format!("{} dbname={db}", pg_base()), 16).expect("pool");
        outbox::migrate(&pool.get().await.expect("conn")).await.expect("migrate");
        pool.get()
            .await
            .expect("conn")
            .batch_execute("CREATE TABLE shipments (id bigserial PRIMARY KEY, order_id text NOT NULL, message_id text NOT NULL)")
            .await
            .expect("shipments");
        let conn = lapin::Connection::connect(
            &acemq::connection::amqp_addr_from_env(),
            lapin::ConnectionProperties::default().with_connection_name("acemq-bench-outbox".into()),
        )
        .await
        .expect("RabbitMQ reachable");
        let ch = conn.create_channel().await.expect("channel");
        let queue = format!("acemq-bench.outbox.{}.{nanos}", std::process::id());
        ch.queue_declare(queue.as_str().into(), QueueDeclareOptions { durable: true, ..Default::default() }, FieldTable::default())
            .await
            .expect("declare");

        println!("# outbox relay: {rows} rows per run, {runs} runs, ~30 B JSON bodies");
        println!("| shape | median rows/s | runs (rows/s) |");
        println!("|---|---:|---|");
        let mut enqueue_rates = Vec::new();
        let messages = plain_messages(rows);
        let runs_of = |rates: &[f64]| rates.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ");
        for (relays, batch) in [(1, 100), (1, 200), (1, 1000), (2, 200)] {
            // The plain publisher runs beside the default shape, alternating with it.
            let with_plain = (relays, batch) == (1, RelayConfig::default().batch_size);
            let (mut rates, mut plain, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..runs {
                enqueue_rates.push(enqueue(&pool, &queue, rows).await);
                let relay = relay_run(&pool, &queue, rows, relays, batch).await;
                rates.push(relay);
                ch.queue_purge(queue.as_str().into(), QueuePurgeOptions::default()).await.expect("purge");
                pool.get().await.expect("conn").batch_execute("TRUNCATE acemq_outbox").await.expect("truncate");
                if with_plain {
                    let p = plain_run(&queue, &messages, batch).await;
                    plain.push(p);
                    ratios.push(relay / p);
                    ch.queue_purge(queue.as_str().into(), QueuePurgeOptions::default()).await.expect("purge");
                }
            }
            println!("| {relays} relay(s), batch {batch} | {:.0} | {} |", median(&rates), runs_of(&rates));
            if with_plain {
                println!(
                    "| plain lapin from memory, confirm window {batch} | {:.0} | {} |",
                    median(&plain),
                    runs_of(&plain)
                );
                println!(
                    "| relay ÷ plain, batch {batch} (per run, same run's pair) | {:.2} | {} |",
                    median(&ratios),
                    ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ")
                );
            }
        }
        println!("\nenqueue (pipelined, 500 in flight, one transaction): median {:.0} rows/s", median(&enqueue_rates));

        println!("\n# inbox: {deliveries} deliveries per run, {runs} runs, interleaved");
        println!("| case | concurrency | median µs/delivery | ratio to plain |");
        println!("|---|---:|---:|---:|");
        let store = PgInbox::new(pool.clone());
        let mut next = 0;
        for concurrency in [1, 8] {
            // Warm-up: the pool opens its connections, statements get prepared.
            let p = pool.clone();
            drive(tower::service_fn(move |d: Delivery| plain_work(p.clone(), d)), next, 200, concurrency).await;
            next += 200;
            let warm = ServiceBuilder::new().layer(InboxLayer::new(store.clone())).service_fn(inbox_work);
            drive(warm, next, 200, concurrency).await;
            next += 200;
            let (mut plain, mut inboxed) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                let p = pool.clone();
                let plain_svc = tower::service_fn(move |d: Delivery| plain_work(p.clone(), d));
                plain.push(drive(plain_svc, next, deliveries, concurrency).await);
                next += deliveries;
                let inbox_svc = ServiceBuilder::new()
                    .layer(InboxLayer::new(store.clone()))
                    .service_fn(inbox_work);
                inboxed.push(drive(inbox_svc, next, deliveries, concurrency).await);
                next += deliveries;
            }
            let (p, i) = (median(&plain), median(&inboxed));
            println!("| plain handler, INSERT autocommit | {concurrency} | {p:.1} | 1.00 |");
            println!("| InboxLayer<PgInbox>, INSERT in its transaction | {concurrency} | {i:.1} | {:.2} |", i / p);
        }
        // The layer's own mechanics, in memory.
        let n = 200_000;
        let (mut bare, mut mem) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let svc = tower::service_fn(|_d: Delivery| async { Ok::<_, BoxError>(()) });
            bare.push(drive(svc, next, n, 1).await * 1e3);
            next += n;
            let svc = ServiceBuilder::new()
                .layer(InboxLayer::new(MemoryInbox::new()))
                .service_fn(|_d: Delivery| async { Ok::<_, BoxError>(()) });
            mem.push(drive(svc, next, n, 1).await * 1e3);
            next += n;
        }
        let (b, m) = (median(&bare), median(&mem));
        println!("| bare service_fn (in memory, incl. building the delivery) | 1 | {:.3} | 1.00 |", b / 1e3);
        println!("| InboxLayer<MemoryInbox> (in memory) | 1 | {:.3} | {:.2} |", m / 1e3, m / b);

        let _ = ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await;
        let _ = conn.close(200, "OK".into()).await;
        drop(pool);
        let _ = admin().await.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await;
    });
}

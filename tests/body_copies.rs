//! How often acemq copies a large body, counted: `allocation-counter`'s
//! counting global allocator (linked into this test binary only) counts
//! the bytes allocated on the thread of a `current_thread` runtime — where
//! acemq's tasks, its handler, its publishes and lapin's `basic_publish`
//! run — while a 1 MiB message travels, against the real broker at
//! `AMQP_ADDR`:
//!
//! - plain lapin, the baseline: a consumer receives the message and
//!   publishes the same body to another queue, confirmed;
//! - acemq: the message received, handed to the handler, which rejects it,
//!   and its copy published to the dead-letter queue;
//! - acemq: the message received, the handler fails, and its copy published
//!   to a retry rung;
//! - acemq: the dead-lettered copy replayed (`acemq::replay`);
//! - with the `postgres` feature, the outbox relay publishing a 1 MiB row,
//!   against a plain read of the row (tokio-postgres, whose connection task
//!   runs on the same thread) published with lapin.
//!
//! lapin gathers a received body on its own I/O thread (not counted, the
//! same for everyone) and cuts a published one into frames on the caller's
//! thread (counted: about one body's worth, in the baseline too). A copy of
//! the body by acemq would add a mebibyte; each acemq path must stay within
//! [`SLACK`] of the baseline. Each path is measured [`TRIES`] times; the
//! least counts (a copy is in every try, noise is not).
//!
//! The count is per thread, and the tests take turns. Queues (and the
//! outbox test's database) are unique and deleted at the end.

#![allow(missing_docs, clippy::disallowed_methods)]

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use acemq::config::{QueueConfig, RetriesConfig};
use acemq::{App, BoxError, Config, Delivery, Reject};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::runtime::Runtime;
use tower::service_fn;

const BODY: usize = 1 << 20;
const BOUND: Duration = Duration::from_secs(30);

/// What an acemq path may allocate beyond the baseline's bytes: its own
/// small structures (the delivery, headers, the copy's properties, tasks),
/// far below a copy of the body.
const SLACK: u64 = 256 * 1024;

/// Measurements per path; the least counts. The first ones also pay for
/// warming up: a connection's first large read or write grows its buffers.
const TRIES: usize = 6;

/// The tests of this binary take turns (each builds its own runtime).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The bytes allocated on this thread while `rt` runs `f` to completion
/// (and every task of `rt` with it).
fn bytes_allocated<F: std::future::Future<Output = ()>>(rt: &Runtime, f: F) -> u64 {
    allocation_counter::measure(|| rt.block_on(f)).bytes_total
}

/// The least of [`TRIES`] measurements of `f()`.
fn least<F, Fut>(rt: &Runtime, mut f: F) -> u64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    (0..TRIES)
        .map(|_| bytes_allocated(rt, f()))
        .min()
        .expect("at least one try")
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn unique(what: &str) -> String {
    common::unique(&format!("body-copies.{what}"))
}

async fn connect(name: &str) -> Connection {
    Connection::connect(
        &acemq::connection::amqp_addr_from_env(),
        ConnectionProperties::default().with_connection_name(name.into()),
    )
    .await
    .expect("RabbitMQ reachable at AMQP_ADDR")
}

async fn confirm_channel(conn: &Connection) -> Channel {
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm mode");
    ch
}

async fn declare(ch: &Channel, q: &str) {
    ch.queue_declare(
        q.into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("declare");
}

async fn publish(ch: &Channel, q: &str, body: &[u8]) {
    let confirm = ch
        .basic_publish(
            "".into(),
            q.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body,
            BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id("big".into()),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    assert_eq!(confirm, Confirmation::Ack(None), "routed to {q}");
}

/// Messages ready in `q` (a passive declare: nothing is read).
async fn ready(ch: &Channel, q: &str) -> u32 {
    ch.queue_declare(
        q.into(),
        QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("passive declare")
    .message_count()
}

/// Waits (bounded, polling) until `q` holds `n` messages.
async fn wait_ready(ch: &Channel, q: &str, n: u32) {
    let t0 = Instant::now();
    while ready(ch, q).await != n {
        assert!(
            t0.elapsed() < BOUND,
            "{q} did not hold {n} message(s) within {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Plain lapin: consume one message from `from`, publish its body to `to`
/// on a confirm channel of another connection, ack it.
async fn plain_copy(consuming: &Connection, publishing: &Channel, from: &str, to: &str) {
    let ch = consuming.create_channel().await.expect("channel");
    let mut consumer = ch
        .basic_consume(
            from.into(),
            "acemq-test-body-copies".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let delivery = tokio::time::timeout(BOUND, consumer.next())
        .await
        .expect("a delivery within the bound")
        .expect("the consumer is open")
        .expect("a delivery");
    let confirm = publishing
        .basic_publish(
            "".into(),
            to.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            &delivery.data,
            delivery.properties.clone(),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    assert_eq!(confirm, Confirmation::Ack(None));
    delivery.ack(BasicAckOptions::default()).await.expect("ack");
    let _ = ch.close(200, "OK".into()).await;
}

/// A config of `queue`, dead-lettering on; with `rung`, a first retry
/// waiting on a 30 s rung (30 s is the default threshold from which a wait
/// is in the broker).
fn config(queue: &str, rung: bool) -> Config {
    let mut q = QueueConfig::new(queue);
    q.dead_letter = true;
    if rung {
        q.retries = Some(RetriesConfig::new(
            3,
            Duration::from_secs(30),
            Duration::from_secs(30),
        ));
    } else {
        q.retries = None;
    }
    let mut config = Config::new([q]);
    config.shutdown_timeout = Duration::from_secs(10);
    config
}

/// Starts an `App` consuming the queue of `config` with `handler`, and
/// measures [`TRIES`] times a message's way from its publish to its copy
/// in `copy_queue` (the copies stay there); drains it. The least bytes
/// allocated.
fn acemq_path<H>(
    rt: &Runtime,
    ch: &Channel,
    body: &[u8],
    config: Config,
    handler: H,
    copy_queue: &str,
) -> u64
where
    H: tower::Service<Delivery, Response = (), Error = BoxError> + Clone + Send + 'static,
    H::Future: Send + 'static,
{
    let queue = config.queues[0].name.clone();
    let running = rt.block_on(async {
        App::new(config)
            .consume(&queue, handler)
            .start()
            .await
            .expect("starts")
    });
    let mut copies = 0;
    let bytes = least(rt, || {
        copies += 1;
        let (queue, n) = (&queue, copies);
        async move {
            publish(ch, queue, body).await;
            wait_ready(ch, copy_queue, n).await;
        }
    });
    rt.block_on(async {
        running.drain().await.expect("a clean drain");
    });
    bytes
}

fn topology(config: &Config) -> Vec<String> {
    acemq::topology::Topology::from_config(config)
        .decls()
        .iter()
        .map(|d| d.name.clone())
        .collect()
}

#[test]
fn acemq_adds_no_copy_of_a_one_mebibyte_body_to_what_lapin_makes_on_receive_handler_dead_letter_rung_and_replay(
) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let body = vec![0x5a_u8; BODY];
    let (conn, ch, consuming, publishing, publishing_ch) = rt.block_on(async {
        let conn = connect("acemq-test-body-copies").await;
        let ch = confirm_channel(&conn).await;
        let consuming = connect("acemq-test-body-copies-consumer").await;
        let publishing = connect("acemq-test-body-copies-publisher").await;
        let publishing_ch = confirm_channel(&publishing).await;
        (conn, ch, consuming, publishing, publishing_ch)
    });
    let (plain_from, plain_to) = (unique("plain-from"), unique("plain-to"));
    let (dead, rung) = (unique("dead"), unique("rung"));
    let dead_config = config(&dead, false);
    let rung_config = config(&rung, true);
    let first_rung = rung_config.queues[0]
        .rungs()
        .first()
        .expect("a rung")
        .0
        .clone();
    let mut queues = vec![plain_from.clone(), plain_to.clone()];
    queues.extend(topology(&dead_config));
    queues.extend(topology(&rung_config));
    rt.block_on(async {
        declare(&ch, &plain_from).await;
        declare(&ch, &plain_to).await;
    });

    // The baseline: plain lapin consumes it and publishes the same body.
    let baseline = least(&rt, || async {
        publish(&ch, &plain_from, &body).await;
        plain_copy(&consuming, &publishing_ch, &plain_from, &plain_to).await;
        let _ = ch
            .queue_purge(plain_to.as_str().into(), QueuePurgeOptions::default())
            .await;
    });

    // acemq: received, rejected by the handler, copied to the dead-letter queue.
    let dlq = format!("{dead}.dlq");
    let reject = service_fn(|d: Delivery| async move {
        assert_eq!(d.body().len(), BODY);
        Err::<(), BoxError>(Reject::new("too big to handle").into())
    });
    let dead_lettered = acemq_path(&rt, &ch, &body, dead_config, reject, &dlq);

    // acemq: received, failed, copied to a retry rung.
    let fail = service_fn(|d: Delivery| async move {
        assert_eq!(d.body().len(), BODY);
        Err::<(), BoxError>("the downstream service is down".into())
    });
    let on_rung = acemq_path(&rt, &ch, &body, rung_config, fail, &first_rung);

    // acemq: the dead-lettered copies replayed into their queue, one a try.
    let replayed = least(&rt, || async {
        let report =
            acemq::replay::replay_on(&conn, &dead, acemq::replay::ReplayOptions::new().limit(1))
                .await
                .expect("replayed");
        assert_eq!(report.moved, 1, "{report:?}");
    });

    rt.block_on(async {
        for q in &queues {
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = conn.close(200, "OK".into()).await;
        let _ = consuming.close(200, "OK".into()).await;
        let _ = publishing.close(200, "OK".into()).await;
    });

    eprintln!(
        "bytes allocated on the runtime's thread for one 1 MiB message (least of {TRIES}): \
         plain lapin consume + publish {baseline}; acemq receive + handler + dead-letter copy \
         {dead_lettered}; receive + handler + rung copy {on_rung}; replay {replayed}"
    );
    assert!(
        baseline >= BODY as u64,
        "lapin cuts the published body into frames on the caller's thread: {baseline} bytes"
    );
    for (path, n) in [
        ("dead-letter copy", dead_lettered),
        ("rung copy", on_rung),
        ("replay", replayed),
    ] {
        assert!(
            n <= baseline + SLACK,
            "{path}: {n} bytes allocated, plain lapin {baseline} (+ {SLACK} allowed): acemq copied the body"
        );
    }
}

#[cfg(feature = "postgres")]
mod outbox {
    use super::*;
    use acemq::outbox::{self, Outbox, OutboxMessage, Relay, RelayConfig, StandalonePublisher};

    fn pg_base() -> String {
        std::env::var("ACEMQ_TEST_PG").unwrap_or_else(|_| "host=127.0.0.1 user=postgres".to_owned())
    }

    async fn admin() -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(
            &format!("{} dbname=postgres", pg_base()),
            tokio_postgres::NoTls,
        )
        .await
        .expect("PostgreSQL reachable at ACEMQ_TEST_PG");
        tokio::spawn(conn);
        client
    }

    #[test]
    fn the_outbox_relay_publishes_a_one_mebibyte_body_from_the_claimed_row_with_no_copy_of_its_own()
    {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let rt = runtime();
        let db = format!("acemq_test_body_copies_{}", std::process::id());
        let q = unique("outbox");
        let (pool, conn, ch) = rt.block_on(async {
            admin()
                .await
                .batch_execute(&format!("CREATE DATABASE {db}"))
                .await
                .expect("create the test database");
            // Two connections: the relay's two batches in flight; the
            // first tries warm both up.
            let pool = outbox::pool(&format!("{} dbname={db}", pg_base()), 2).expect("pool");
            outbox::migrate(&pool.get().await.expect("a connection"))
                .await
                .expect("migrate");
            let conn = connect("acemq-test-body-copies-outbox").await;
            let ch = confirm_channel(&conn).await;
            declare(&ch, &q).await;
            (pool, conn, ch)
        });
        let enqueue = || async {
            let mut client = pool.get().await.expect("a connection");
            let tx = client.transaction().await.expect("begin");
            Outbox::enqueue(
                &tx,
                &OutboxMessage::to_queue(q.as_str(), vec![0x5a_u8; BODY]),
            )
            .await
            .expect("enqueue");
            tx.commit().await.expect("commit");
        };

        // The baseline: the row read with tokio-postgres (claimed as the
        // relay claims it), its body published with lapin, the row deleted.
        let baseline = least(&rt, || async {
            opt_out(enqueue()).await;
            let mut client = pool.get().await.expect("a connection");
            let tx = client.transaction().await.expect("begin");
            let row = tx
                .query_one(
                    "SELECT id, body FROM acemq_outbox WHERE status = 'pending' \
                     ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
                    &[],
                )
                .await
                .expect("the row");
            publish(&ch, &q, row.get::<_, &[u8]>(1)).await;
            let id: i64 = row.get(0);
            drop(row);
            tx.execute("DELETE FROM acemq_outbox WHERE id = $1", &[&id])
                .await
                .expect("delete");
            tx.commit().await.expect("commit");
        });

        let relay = rt.block_on(async {
            let mut config = RelayConfig::default();
            config.poll_interval = Duration::from_millis(10);
            Relay::new(
                pool.clone(),
                StandalonePublisher::new(
                    acemq::connection::amqp_addr_from_env(),
                    "acemq-test-body-copies-relay",
                ),
            )
            .config(config)
            .spawn()
        });
        let relayed = least(&rt, || async {
            let before = relay.stats().published;
            opt_out(enqueue()).await;
            let t0 = Instant::now();
            while relay.stats().published == before {
                assert!(
                    t0.elapsed() < BOUND,
                    "the row was not relayed within {BOUND:?}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });

        rt.block_on(async {
            relay.stop().await;
            wait_ready(&ch, &q, 2 * TRIES as u32).await;
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = conn.close(200, "OK".into()).await;
            drop(pool);
            let _ = admin()
                .await
                .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
                .await;
        });
        eprintln!(
            "bytes allocated on the runtime's thread for one 1 MiB outbox row (least of {TRIES}): \
             tokio-postgres read + lapin publish {baseline}; the relay {relayed}"
        );
        assert!(
            relayed <= baseline + SLACK,
            "the relay: {relayed} bytes allocated, a plain read and publish {baseline} (+ {SLACK} allowed): the relay copied the body"
        );
    }

    /// Runs `f` without counting what it allocates on this thread (the
    /// enqueue of the next row; what the runtime's other tasks do meanwhile
    /// is not counted either, hence the slack).
    async fn opt_out<F: std::future::Future<Output = ()>>(f: F) {
        let mut f = std::pin::pin!(f);
        std::future::poll_fn(|cx| {
            let mut out = std::task::Poll::Pending;
            allocation_counter::opt_out(|| out = f.as_mut().poll(cx));
            out
        })
        .await
    }
}

//! The admin server a stranger cannot starve (`acemq::admin::serve`) and
//! the token in front of the control routes, through the shop as a black
//! box: half-sent requests are closed, `/healthz` answers beside them, and
//! pause needs `ACEMQ_ADMIN_TOKEN`'s token.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{all_queues, eventually, unique, QueueCleanup, ShopProcess};

/// One HTTP/1.0 request, `extra` header lines included: the status, or
/// `None` when nothing answers.
async fn status(addr: &str, method: &str, path: &str, extra: &str, body: &str) -> Option<u16> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: shop\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Opens `n` connections to `addr`, each with a request head that never
/// ends; returns how many the server has closed so far, counted as they
/// close, and the tasks that wait for it.
async fn hold_half_sent(
    addr: &str,
    n: usize,
) -> (Arc<AtomicUsize>, Vec<tokio::task::JoinHandle<()>>) {
    let closed = Arc::new(AtomicUsize::new(0));
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: shop\r\nX-Slow: {i}\r\n").as_bytes())
            .await
            .expect("half a request");
        let closed = closed.clone();
        held.push(tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            // EOF or a reset: the server closed it (a 408 or nothing first).
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
            closed.fetch_add(1, Ordering::SeqCst);
        }));
    }
    (closed, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_closes_300_half_sent_requests_answers_healthz_beside_them_and_pauses_only_with_its_token(
) {
    let q = unique("shop-admin-serve");
    let _cleanup = QueueCleanup::new(all_queues(&q));
    let token = "shop-admin-serve-token-0123456789";
    let yaml = format!("queues:\n  - name: {q}\n");
    let shop = ShopProcess::spawn(&q, &yaml, &[("ACEMQ_ADMIN_TOKEN", token)]);
    shop.wait_ready().await;
    let http = shop.http().to_owned();
    let pause = format!("/queues/{q}/pause");

    // The token: none, a wrong one, a cross-site text/plain POST, then the right one.
    assert_eq!(status(&http, "POST", &pause, "", "").await, Some(401));
    let wrong = "Authorization: Bearer shop-admin-serve-token-012345678X\r\n";
    assert_eq!(status(&http, "POST", &pause, wrong, "").await, Some(401));
    let cross_site = "Origin: https://evil.example\r\nContent-Type: text/plain\r\n";
    assert_eq!(
        status(&http, "POST", &pause, cross_site, "x").await,
        Some(401)
    );
    assert_eq!(
        status(&http, "POST", "/queues/not-here/pause", "", "").await,
        Some(401),
        "an unknown queue without the token: 401, not 404"
    );
    assert_eq!(
        shop.get_json(&format!("/queues/{q}"))
            .await
            .map(|r| r.1["paused"].clone()),
        Some(serde_json::json!(false))
    );
    let right = format!("Authorization: Bearer {token}\r\n");
    assert_eq!(status(&http, "POST", &pause, &right, "").await, Some(200));
    let resume = format!("/queues/{q}/resume");
    assert_eq!(status(&http, "POST", &resume, &right, "").await, Some(200));
    let stderr = shop.stderr();
    assert!(
        stderr.contains("queue paused by an operator") && stderr.contains("peer=127.0.0.1:"),
        "the pause is logged with its peer; stderr:\n{stderr}"
    );
    assert!(!stderr.contains(token), "the token is never logged");

    // 300 half-sent requests held open: /healthz still answers, and the
    // header-read timeout (10 s) closes them.
    let t0 = Instant::now();
    let (closed, held) = hold_half_sent(&http, 300).await;
    assert_eq!(
        status(&http, "GET", "/healthz", "", "").await,
        Some(200),
        "/healthz beside 300 half-sent requests"
    );
    let all_but_ten = eventually(Duration::from_secs(45), || async {
        closed.load(Ordering::SeqCst) >= 290
    })
    .await;
    let took = t0.elapsed();
    assert!(
        all_but_ten,
        "only {} of 300 half-sent requests closed within 45 s",
        closed.load(Ordering::SeqCst)
    );
    eprintln!(
        "300 half-sent requests: {} closed {took:?} after the first was opened",
        closed.load(Ordering::SeqCst)
    );
    for h in held {
        h.abort();
    }
    assert_eq!(status(&http, "GET", "/healthz", "", "").await, Some(200));
}

/// A server with short bounds: a connection that says nothing is closed
/// after the header-read timeout; over the cap, a connection waits (it is
/// not accepted) until a slot frees; a kept-alive connection that goes
/// quiet is closed too.
#[tokio::test]
async fn serve_closes_silent_and_quiet_connections_and_holds_new_ones_over_the_cap() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        acemq::admin::Server::new()
            .header_read_timeout(Duration::from_millis(500))
            .idle_timeout(Duration::from_secs(30))
            .max_connections(2)
            .serve(
                listener,
                acemq::admin::router(acemq::Health::new()),
                async move {
                    let _ = stopped.await;
                },
            ),
    );
    let addr_s = addr.to_string();

    // Two silent connections fill the cap; a third request waits, and is
    // answered once the silent ones are closed by the header-read timeout.
    let t0 = Instant::now();
    let (closed, held) = hold_half_sent(&addr_s, 2).await;
    let healthz = status(&addr_s, "GET", "/healthz", "", "").await;
    let waited = t0.elapsed();
    assert_eq!(healthz, Some(200));
    assert!(
        waited >= Duration::from_millis(400),
        "over the cap the request waited for a slot: {waited:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            closed.load(Ordering::SeqCst) == 2
        })
        .await,
        "the silent connections were closed"
    );
    for h in held {
        h.abort();
    }

    // A kept-alive connection: one request answered, then quiet; the
    // header-read timeout bounds its wait for the next request.
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("write");
    let t1 = Instant::now();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .expect("closed within 5 s of going quiet")
        .ok();
    assert!(
        String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200"),
        "{buf:?}"
    );
    assert!(
        t1.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t1.elapsed()
    );

    stop.send(()).expect("serving");
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("stops")
        .expect("no panic")
        .expect("served");
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

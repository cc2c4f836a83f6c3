//! A server for the admin routes that a stranger cannot starve: every
//! connection has a deadline for its request head and an idle bound, and
//! there is a cap on how many are open at once.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, warn};

/// Serves `router` on `listener` with [`Server`]'s defaults until
/// `shutdown` resolves, then lets the requests in progress finish (up to
/// [`Server::grace`]).
///
/// ```no_run
/// # async fn demo(health: acemq::Health) -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// let admin = acemq::admin::router(health.clone());
/// acemq::admin::serve(listener, admin, health.drained()).await
/// # }
/// ```
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    Server::new().serve(listener, router, shutdown).await
}

/// The admin server's bounds; [`Server::serve`] runs it.
///
/// HTTP/1.1 only, through hyper with tokio's timer, so the bounds fire:
///
/// - **header read timeout** (10 s): a connection must deliver a whole
///   request head within this of connecting, and within this of the end of
///   its previous response (so it also bounds a kept-alive connection's
///   wait for its next request); else it is closed;
/// - **idle timeout** (30 s): a connection on which no byte moves either
///   way for this long is closed (a client that stops reading a response,
///   a body that stops arriving);
/// - **connection cap** (1,024 open at once): over it, new connections
///   are not accepted but wait in the listener's backlog until one closes;
///   those that wait past the backlog are refused by the kernel;
/// - **grace** (5 s): after the shutdown future resolves, how long the
///   requests in progress have before their connections are dropped.
///
/// Every request carries the peer's address as
/// `axum::extract::ConnectInfo<SocketAddr>`, which the admin routes log.
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn demo(health: acemq::Health) -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// acemq::admin::Server::new()
///     .header_read_timeout(Duration::from_secs(5))
///     .max_connections(256)
///     .serve(listener, acemq::admin::router(health.clone()), health.drained())
///     .await
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Server {
    header_read_timeout: Duration,
    idle_timeout: Duration,
    max_connections: usize,
    grace: Duration,
}

impl Default for Server {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            max_connections: 1024,
            grace: Duration::from_secs(5),
        }
    }
}

impl Server {
    /// The defaults: 10 s, 30 s, 1,024 connections, 5 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a connection has to send a whole request head (at least
    /// 1 ms).
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a connection may move no byte before it is closed (at least
    /// 1 ms).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How many connections may be open at once (at least 1).
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// How long the requests in progress have once `shutdown` resolved.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Serves `router` on `listener` until `shutdown` resolves, then stops
    /// accepting and lets the requests in progress finish within the grace.
    /// An error accepting a connection (out of file descriptors, say) is
    /// logged and accepting goes on; this returns `Ok` once stopped.
    pub async fn serve(
        self,
        listener: TcpListener,
        router: Router,
        shutdown: impl Future<Output = ()> + Send,
    ) -> io::Result<()> {
        let slots = Arc::new(Semaphore::new(self.max_connections));
        let graceful = GracefulShutdown::new();
        let mut conns = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = accept(&listener, &slots) => accepted,
            };
            while conns.try_join_next().is_some() {}
            let Some((stream, peer, slot)) = accepted else {
                continue;
            };
            let conn = self.connection(stream, peer, router.clone(), &graceful);
            conns.spawn(async move {
                conn.await;
                drop(slot);
            });
        }
        drop(listener);
        if tokio::time::timeout(self.grace, graceful.shutdown())
            .await
            .is_err()
        {
            warn!(
                open = conns.len(),
                "admin server: requests still in progress after the {:?} grace; their connections are dropped",
                self.grace
            );
        }
        conns.shutdown().await;
        Ok(())
    }

    /// One connection, served until it ends or its idle bound passes.
    fn connection(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        router: Router,
        graceful: &GracefulShutdown,
    ) -> impl Future<Output = ()> + Send + 'static {
        let activity = Activity::new();
        let io = TokioIo::new(Watched {
            inner: stream,
            activity: activity.clone(),
        });
        let service = tower::util::MapRequest::new(
            router,
            move |req: hyper::Request<hyper::body::Incoming>| {
                let mut req = req.map(axum::body::Body::new);
                req.extensions_mut().insert(ConnectInfo(peer));
                req
            },
        );
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .serve_connection(io, TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        let idle = self.idle_timeout;
        async move {
            tokio::select! {
                served = conn => {
                    if let Err(e) = served {
                        debug!(%peer, error = %e, "admin server: connection ended");
                    }
                }
                () = activity.idle_for(idle) => {
                    debug!(%peer, "admin server: connection idle for {idle:?}; closed");
                }
            }
        }
    }
}

/// The next connection, once a slot is free; `None` after an accept error
/// (logged, and followed by a short pause so that a full descriptor table
/// is not spun on).
async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> Option<(TcpStream, SocketAddr, tokio::sync::OwnedSemaphorePermit)> {
    let slot = slots.clone().acquire_owned().await.ok()?;
    match listener.accept().await {
        Ok((stream, peer)) => {
            let _ = stream.set_nodelay(true);
            Some((stream, peer, slot))
        }
        Err(e) => {
            warn!(error = %e, "admin server: accepting a connection failed; retrying");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

/// When a connection last moved a byte, in milliseconds after its start.
#[derive(Clone)]
struct Activity {
    start: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once no byte has moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A stream that records when a byte last moved.
struct Watched {
    inner: TcpStream,
    activity: Activity,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

//! A fault-injection TCP proxy between one test's runner and the broker.
//!
//! It listens on an ephemeral local port and forwards every connection to
//! the broker (its AMQP port, or another such as the stream plugin's:
//! [`Proxy::start_to`]). [`Proxy::cut`] drops every live connection at once (both
//! sides: the broker sees its client go away and requeues what it had
//! sent) and refuses new ones until [`Proxy::restore`]; the listener stays
//! bound, so the port never changes and a refused connection is closed as
//! soon as it is accepted. Only the connections through this proxy are
//! touched: other tests' connections to the broker never notice.
//!
//! [`Proxy::stall`] stops forwarding in both directions without closing
//! anything (a network that silently drops packets, or a broker that stopped
//! answering): every request through it hangs until a cut.
//! [`Proxy::upstream_ports`] names the local ports of the proxy's
//! connections to the broker (the `peer_port` that `rabbitmqctl
//! list_connections` shows for them), so a test can find its own
//! connections in the broker's list.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The proxy's state: whether it forwards, and the cut count. A forwarding
/// task ends when the count moves past the value it started with, so a cut
/// followed at once by a restore still drops it.
#[derive(Clone, Copy, Debug)]
struct State {
    open: bool,
    cuts: u64,
    stalled: bool,
}

pub struct Proxy {
    addr: SocketAddr,
    state: watch::Sender<State>,
    accepted: Arc<AtomicUsize>,
    upstream_ports: Arc<Mutex<Vec<u16>>>,
    accept_loop: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to the broker of `AMQP_ADDR` (host and port).
    pub async fn start() -> Proxy {
        let url = url::Url::parse(&crate::support::addr()).expect("AMQP_ADDR is a URL");
        let upstream = format!(
            "{}:{}",
            url.host_str().unwrap_or("127.0.0.1"),
            url.port().unwrap_or(5672)
        );
        Proxy::start_to(&upstream).await
    }

    /// Starts a proxy to `upstream` (`host:port`), e.g. the broker's stream
    /// plugin.
    pub async fn start_to(upstream: &str) -> Proxy {
        let upstream = upstream.to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (state, _) = watch::channel(State {
            open: true,
            cuts: 0,
            stalled: false,
        });
        let accepted = Arc::new(AtomicUsize::new(0));
        let upstream_ports = Arc::new(Mutex::new(Vec::new()));
        let accept_loop = tokio::spawn(accept(
            listener,
            upstream,
            state.clone(),
            accepted.clone(),
            upstream_ports.clone(),
        ));
        Proxy {
            addr,
            state,
            accepted,
            upstream_ports,
            accept_loop,
        }
    }

    /// `AMQP_ADDR` with the proxy's address in place of the broker's.
    pub fn amqp_addr(&self) -> String {
        let mut url = url::Url::parse(&crate::support::addr()).expect("AMQP_ADDR is a URL");
        url.set_host(Some("127.0.0.1")).expect("host");
        url.set_port(Some(self.addr.port())).expect("port");
        url.to_string()
    }

    /// The port the proxy listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Drops every live connection at once and refuses new ones.
    pub fn cut(&self) {
        self.state.send_modify(|s| {
            s.open = false;
            s.cuts += 1;
        });
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.state.send_modify(|s| s.open = true);
    }

    /// Connections accepted so far, refused ones included.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Stops forwarding bytes, both ways, on every live and new connection,
    /// without closing any: whatever is sent through the proxy hangs.
    pub fn stall(&self) {
        self.state.send_modify(|s| s.stalled = true);
    }

    /// The local ports of the proxy's connections to the broker so far: the
    /// `peer_port` the broker lists for each connection made through it.
    pub fn upstream_ports(&self) -> Vec<u16> {
        self.upstream_ports.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept_loop.abort();
    }
}

async fn accept(
    listener: TcpListener,
    upstream: String,
    state: watch::Sender<State>,
    accepted: Arc<AtomicUsize>,
    upstream_ports: Arc<Mutex<Vec<u16>>>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        accepted.fetch_add(1, Ordering::SeqCst);
        let now = *state.borrow();
        if !now.open {
            // Refused: closed at once, before a byte is read.
            drop(client);
            continue;
        }
        let rx = state.subscribe();
        let upstream = upstream.clone();
        tokio::spawn(forward(
            client,
            upstream,
            rx,
            now.cuts,
            upstream_ports.clone(),
        ));
    }
}

/// Copies both ways until either side closes or the proxy is cut; then both
/// sockets are dropped. While the proxy is stalled, nothing is read or
/// written (the sockets stay open).
async fn forward(
    client: TcpStream,
    upstream: String,
    state: watch::Receiver<State>,
    cuts: u64,
    upstream_ports: Arc<Mutex<Vec<u16>>>,
) {
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    if let Ok(local) = server.local_addr() {
        upstream_ports.lock().unwrap().push(local.port());
    }
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let mut cut = state.clone();
    tokio::select! {
        () = pump(client_read, server_write, state.clone()) => {}
        () = pump(server_read, client_write, state) => {}
        _ = cut.wait_for(|s| s.cuts != cuts) => {}
    }
}

/// Copies `from` to `to` until either ends, never while the proxy is stalled.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<State>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if state.wait_for(|s| !s.stalled).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes read just before a stall are held until it ends.
        if state.wait_for(|s| !s.stalled).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

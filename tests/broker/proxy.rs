//! A fault-injection TCP proxy between one test's runner and the broker.
//!
//! It listens on an ephemeral local port and forwards every connection to
//! the broker. [`Proxy::cut`] drops every live connection at once (both
//! sides: the broker sees its client go away and requeues what it had
//! sent) and refuses new ones until [`Proxy::restore`]; the listener stays
//! bound, so the port never changes and a refused connection is closed as
//! soon as it is accepted. Only the connections through this proxy are
//! touched: other tests' connections to the broker never notice.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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
}

pub struct Proxy {
    addr: SocketAddr,
    state: watch::Sender<State>,
    accepted: Arc<AtomicUsize>,
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
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (state, _) = watch::channel(State {
            open: true,
            cuts: 0,
        });
        let accepted = Arc::new(AtomicUsize::new(0));
        let accept_loop = tokio::spawn(accept(listener, upstream, state.clone(), accepted.clone()));
        Proxy {
            addr,
            state,
            accepted,
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
        tokio::spawn(forward(client, upstream, rx, now.cuts));
    }
}

/// Copies both ways until either side closes or the proxy is cut; then both
/// sockets are dropped.
async fn forward(
    mut client: TcpStream,
    upstream: String,
    mut state: watch::Receiver<State>,
    cuts: u64,
) {
    let Ok(mut server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = state.wait_for(|s| s.cuts != cuts) => {}
    }
}

//! Stop signals: SIGTERM, SIGINT, SIGHUP and SIGQUIT only push to a queue;
//! whoever waits on it (start-up, the reconnect backoff, the drain) acts.

use tokio::sync::mpsc;
use tracing::error;

/// Stop-signal handlers that only push to a channel; the drain runs on the
/// task that waits on them ([`Running::run_with`](super::Running::run_with)).
///
/// SIGTERM, SIGINT, SIGHUP and SIGQUIT are all a stop: a terminal hangup or
/// `docker kill -s HUP` drains like SIGTERM instead of killing the process
/// mid-flight.
///
/// Example: the [`app` module](crate::app)'s `main`; the whole service is `examples/shop/main.rs`.
#[derive(Debug)]
pub struct Signals {
    rx: mpsc::UnboundedReceiver<&'static str>,
}

impl Signals {
    /// Installs the handlers (needs a tokio runtime). From now on these
    /// signals no longer end the process by themselves.
    pub fn install() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        spawn_listener(tx);
        Signals { rx }
    }

    /// The next stop signal's name (`"SIGTERM"`, …); `None` if the handlers
    /// could not be installed.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: a signal not yet received stays queued.
    pub async fn recv(&mut self) -> Option<&'static str> {
        self.rx.recv().await
    }

    /// The next stop signal's name; never resolves if the handlers could not
    /// be installed. Made for [`App::start_until`](super::App::start_until):
    /// `app.start_until(signals.stop())`.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn stop(&mut self) -> &'static str {
        match self.rx.recv().await {
            Some(sig) => sig,
            None => std::future::pending().await,
        }
    }
}

fn spawn_listener(tx: mpsc::UnboundedSender<&'static str>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        // Registered here, synchronously, so a signal that arrives before
        // the listener task first runs is not lost.
        let kinds = [
            (SignalKind::terminate(), "SIGTERM"),
            (SignalKind::interrupt(), "SIGINT"),
            (SignalKind::hangup(), "SIGHUP"),
            (SignalKind::quit(), "SIGQUIT"),
        ];
        for (kind, name) in kinds {
            match signal(kind) {
                Ok(mut s) => {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        while s.recv().await.is_some() {
                            if tx.send(name).is_err() {
                                return;
                            }
                        }
                    });
                }
                Err(e) => error!("could not install the {name} handler: {e}"),
            }
        }
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        loop {
            if tokio::signal::ctrl_c().await.is_err() || tx.send("ctrl-c").is_err() {
                return;
            }
        }
    });
}

//! [`Running`]: a started runner, until it is drained.

use std::future::Future;
use std::process::ExitCode;

use tracing::{info, warn};

use super::exit::finish;
use super::signals::Signals;
use crate::app::drain::{Drain, DrainReport, DrainTimeout};
use crate::app::health::Health;
use crate::publisher::Publisher;

/// A started runner: consumers running, topology declared.
///
/// Run it until a stop signal ([`run`](Self::run)), until a future of yours
/// ([`run_until`](Self::run_until)), or drain it when you decide
/// ([`drain`](Self::drain), [`into_drain`](Self::into_drain)).
///
/// ```no_run
/// use acemq::{App, Config, Delivery};
/// use tower::service_fn;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let config = Config::from_path("examples/shop.yaml")?;
/// let running = App::new(config)
///     .consume(
///         "shop.orders",
///         service_fn(|_d: Delivery| async { Ok::<_, acemq::BoxError>(()) }),
///     )
///     .start()
///     .await?;
/// // Consuming now; publish on the publishing connection.
/// running
///     .publisher()
///     .publish_json("", "shop.orders", &serde_json::json!({ "id": "o-1" }))
///     .await?;
/// // Drain on Ctrl-C; the report says what finished and what went back.
/// tokio::signal::ctrl_c().await?;
/// let report = running.drain().await?;
/// println!("{} finished, {} handed back", report.finished(), report.handed_back());
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "drop it and the consumers run until the process exits; call drain() to stop"]
pub struct Running {
    pub(super) drain: Drain,
    pub(super) publisher: Publisher,
    pub(super) health: Health,
}

impl Running {
    /// Waits for SIGTERM, SIGINT, SIGHUP or SIGQUIT, then drains and returns the exit code:
    /// 0 clean, 75 when the stop was not clean (the deadline expired, or a
    /// channel was lost during the drain). A second signal during the
    /// drain skips straight to cancellation and abandon. The signal handlers
    /// only push to a channel; the drain runs on the task that called `run`.
    pub async fn run(self) -> ExitCode {
        self.run_with(Signals::install()).await
    }

    /// As [`Running::run`], with signal handlers installed earlier (before
    /// [`App::start`](crate::App::start), so that a signal during start-up is
    /// not lost).
    pub async fn run_with(self, signals: Signals) -> ExitCode {
        let mut rx = signals;
        let Some(sig) = rx.recv().await else {
            return finish(self.drain().await);
        };
        info!(signal = sig, "stop signal received; draining");
        let hurry = async move {
            if let Some(sig) = rx.recv().await {
                warn!(
                    signal = sig,
                    "second stop signal during the drain: skipping to cancellation and abandon"
                );
            } else {
                std::future::pending::<()>().await;
            }
        };
        finish(self.drain_with(hurry).await)
    }

    /// Waits for `stop`, then drains and returns the exit code.
    pub async fn run_until(self, stop: impl Future<Output = ()>) -> ExitCode {
        stop.await;
        finish(self.drain().await)
    }

    /// The confirm-mode publisher (on its own connection).
    pub fn publisher(&self) -> Publisher {
        self.publisher.clone()
    }

    /// The health handle.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Reports not ready at once (the drain does this as its first step;
    /// call it earlier to stop an HTTP server before the consumers).
    pub fn stop_readiness(&self) {
        self.health.set_draining();
    }

    /// Drains and closes everything.
    pub async fn drain(self) -> Result<DrainReport, DrainTimeout> {
        self.drain.run(std::future::pending()).await
    }

    /// Drains; `hurry` resolving skips to cancellation and abandon.
    pub async fn drain_with(
        self,
        hurry: impl Future<Output = ()>,
    ) -> Result<DrainReport, DrainTimeout> {
        self.drain.run(hurry).await
    }

    /// The drain, to run yourself.
    pub fn into_drain(self) -> Drain {
        self.drain
    }
}

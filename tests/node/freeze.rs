//! Freezing a process (Jepsen's pause): SIGSTOP, and a guard that sends
//! SIGCONT when it is dropped, also when the test panicked. A `beam.smp` is
//! found by the `RABBITMQ_NODENAME` in its `/proc/PID/environ`. Also a
//! capture of the test process's own log lines (acemq's and lapin's), with
//! the time since the capture began, for the figures and for failures.
//!
//! Shared by `tests/node/` and `tests/cluster/` (`#[path]`).

#![allow(dead_code)]

use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The pid of the `beam.smp` whose environment has
/// `RABBITMQ_NODENAME=<node>` (its arguments do not name it reliably).
pub fn beam_pid_of(node: &str) -> Option<u32> {
    let want = format!("RABBITMQ_NODENAME={node}");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim() != "beam.smp" {
            continue;
        }
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// The state letter of `pid` (`/proc/PID/stat`, after the command's
/// closing parenthesis): `T` stopped, `S` sleeping, `R` running, …
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// `kill -<sig> pid`; whether it was delivered.
pub fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Waits (checking every 5 ms, up to 5 s) until `pid`'s state is or is not
/// `T`; whether it got there.
fn wait_state(pid: u32, stopped: bool) -> bool {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        match state(pid) {
            None => return !stopped, // gone: not stopped
            Some(s) if (s == 'T') == stopped => return true,
            Some(_) => {}
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A process frozen with SIGSTOP. [`Frozen::thaw`] (or dropping it) sends
/// SIGCONT, so a failing test never leaves a node or the shop stopped.
pub struct Frozen {
    pub pid: u32,
    what: String,
    /// When SIGSTOP was sent.
    pub at: Instant,
    thawed: Option<Instant>,
}

impl Frozen {
    /// Sends SIGSTOP to `pid` (`what` names it in messages) and waits until
    /// the kernel shows it stopped.
    pub fn stop(pid: u32, what: &str) -> Frozen {
        let at = Instant::now();
        assert!(signal(pid, "STOP"), "kill -STOP {pid} ({what})");
        let frozen = Frozen {
            pid,
            what: what.to_owned(),
            at,
            thawed: None,
        };
        assert!(
            wait_state(pid, true),
            "{what} (pid {pid}) is not shown stopped: state {:?}",
            state(pid)
        );
        frozen
    }

    /// Sends SIGCONT and waits until it runs again; how long it was frozen.
    pub fn thaw(&mut self) -> Duration {
        if self.thawed.is_none() {
            let ok = signal(self.pid, "CONT");
            self.thawed = Some(Instant::now());
            assert!(ok, "kill -CONT {} ({})", self.pid, self.what);
            assert!(
                wait_state(self.pid, false),
                "{} (pid {}) still stopped after SIGCONT",
                self.what,
                self.pid
            );
        }
        self.thawed.unwrap_or_else(Instant::now) - self.at
    }

    /// When SIGCONT was sent, if it was.
    pub fn thawed_at(&self) -> Option<Instant> {
        self.thawed
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if self.thawed.is_none() {
            let ok = signal(self.pid, "CONT");
            eprintln!(
                "{} (pid {}) thawed by its guard after {:?} (SIGCONT {})",
                self.what,
                self.pid,
                self.at.elapsed(),
                if ok { "sent" } else { "failed" }
            );
        }
    }
}

/// SIGCONT to `pid` if it is stopped (a guard's fallback: before a node is
/// restored or stopped, it must run).
pub fn ensure_running(pid: u32, what: &str) {
    if state(pid) == Some('T') {
        let ok = signal(pid, "CONT");
        eprintln!("{what} (pid {pid}) was stopped: SIGCONT {ok}");
    }
}

/// One log line of the test process: time since [`Logs::install`], level,
/// target, text with its fields.
pub type Line = (Duration, tracing::Level, String, String);

/// The test process's log lines from acemq (INFO, and its connect attempts
/// at DEBUG) and lapin (WARN) (a global subscriber, installed once per
/// test binary).
#[derive(Clone)]
pub struct Logs {
    t0: Instant,
    lines: Arc<Mutex<Vec<Line>>>,
}

impl Logs {
    /// The capture (installed on first use).
    pub fn install() -> Logs {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            use tracing_subscriber::layer::SubscriberExt;
            let logs = Logs {
                t0: Instant::now(),
                lines: Arc::default(),
            };
            let filter = tracing_subscriber::filter::Targets::new()
                // Which address each connect attempt tried, and why it failed.
                .with_target("acemq::connection", tracing::Level::DEBUG)
                .with_target("acemq", tracing::Level::INFO)
                .with_target("acemq_layers", tracing::Level::INFO)
                .with_target("lapin", tracing::Level::WARN);
            let subscriber = tracing_subscriber::registry().with(
                tracing_subscriber::Layer::with_filter(Capture(logs.clone()), filter),
            );
            let _ = tracing::subscriber::set_global_default(subscriber);
            logs
        })
        .clone()
    }

    /// Time since the capture began (the clock of [`Line`]s).
    pub fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    /// The clock of [`Line`]s at `at`.
    pub fn at(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.t0)
    }

    /// Lines from `from` on.
    pub fn since(&self, from: Duration) -> Vec<Line> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.0 >= from)
            .cloned()
            .collect()
    }

    /// The first line at or after `from` whose text contains `needle`.
    pub fn first(&self, from: Duration, needle: &str) -> Option<Line> {
        self.since(from).into_iter().find(|l| l.3.contains(needle))
    }

    /// Lines from `from` on, one per line of text, times relative to `from`.
    pub fn render(&self, from: Duration) -> String {
        self.since(from)
            .iter()
            .map(|(t, level, target, text)| {
                format!(
                    "  +{:>7.3}s {level:>5} {target}:{text}",
                    t.saturating_sub(from).as_secs_f64()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

struct Capture(Logs);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                use std::fmt::Write;
                if field.name() == "message" {
                    let _ = write!(self.0, " {value:?}");
                } else {
                    let _ = write!(self.0, " {}={:?}", field.name(), value);
                }
            }
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        self.0.lines.lock().unwrap().push((
            self.0.t0.elapsed(),
            *event.metadata().level(),
            event.metadata().target().to_owned(),
            text.0,
        ));
    }
}

//! Each acemq layer's added cost as a ratio to a yardstick's, from one run
//! with the cases interleaved: robust on a machine whose load moves.
//!
//! The cases are the criterion bench's (`layers.rs`, `support/cases.rs`):
//! `bare` (the handler alone), `yardstick` (tower's own `ConcurrencyLimit`
//! around the same handler), each layer alone, the full stack; in two
//! groups, one delivery at a time and 8 tasks whose handler yields once.
//! Instead of criterion's 4 s per case one after the other, every round
//! times a short slice of each case (~`ACEMQ_LAYER_SLICE_MS`, default 20 ms
//! of deliveries), the order rotated each round, `ACEMQ_LAYER_ROUNDS`
//! rounds (default 31). Per round, a layer's ratio is
//! `(layer − bare) / (yardstick − bare)` from that round's own slices, so a
//! change of load between rounds cancels out; the table gives the median
//! of those per-round ratios beside the medians of the times. Times are the
//! thread's CPU time (`support/cases.rs`), so preemption is not counted.
//!
//! Writes the figures as JSON to `$CARGO_TARGET_DIR/layer-ratios.json`
//! (default `target/`), which `scripts/layer_chart.py` draws:
//!
//! ```sh
//! cargo bench -p acemq-layers --bench layer_ratios
//! python3 scripts/layer_chart.py target/layer-ratios.json docs/layer-overhead.png
//! ```
//!
//! Target: each layer ≤ 1.0× the yardstick's added cost.

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

use std::fmt::Debug;
use std::time::{Duration, Instant};

use acemq_layers::Delivery;
use tokio::runtime::Runtime;
use tower::Service;

#[path = "support/success_path.rs"]
mod success_path;
use success_path::run_in;

#[path = "support/cases.rs"]
mod cases;
use cases::{delivery, runtime, time_concurrent, time_sequential, Visit};

/// Times `iters` deliveries of one case.
type Timer<'a> = Box<dyn FnMut(u64) -> Duration + 'a>;

/// Collects each case as a timer.
struct Collect<'a> {
    rt: &'a Runtime,
    d: &'a Delivery,
    concurrent: bool,
    cases: Vec<(&'static str, Timer<'a>)>,
}

impl<'a> Visit for Collect<'a> {
    fn case<S>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Delivery> + Clone + Send + 'static,
        S::Future: Send,
        S::Error: Debug,
    {
        let (rt, d) = (self.rt, self.d);
        let timer: Timer<'a> = if self.concurrent {
            Box::new(move |iters| time_concurrent(rt, &svc, d, iters))
        } else {
            let mut svc = svc;
            Box::new(move |iters| time_sequential(rt, &mut svc, d, iters))
        };
        self.cases.push((name, timer));
    }
}

/// Times `iters` deliveries through `svc` as a transport runs them: 8 at a
/// time in one task, the next started as one finishes, in `FuturesUnordered`
/// with each future in a `Wakeable` (what a transport reaches for first) or
/// in `Slots` (acemq's consumer loop's container).
fn time_in_container<S>(
    rt: &Runtime,
    svc: &mut S,
    d: &Delivery,
    iters: u64,
    slots: bool,
) -> Duration
where
    S: Service<Delivery>,
    S::Error: Debug,
{
    use acemq_layers::cancel::{Slots, Wakeable};
    use futures::stream::FuturesUnordered;
    const AT_ONCE: u64 = cases::TASKS;
    rt.block_on(async {
        let start = cases::thread_cpu();
        if slots {
            let mut running = Slots::with_capacity(AT_ONCE as usize);
            run_in(svc, d, iters, AT_ONCE, &mut running, Slots::push).await;
        } else {
            let mut running = FuturesUnordered::new();
            run_in(svc, d, iters, AT_ONCE, &mut running, |r, fut| {
                r.push(Wakeable::new(fut));
            })
            .await;
        }
        cases::thread_cpu() - start
    })
}

/// The full stack's case (8-task group's handler), timed in both
/// containers.
struct Containers<'a> {
    rt: &'a Runtime,
    d: &'a Delivery,
    timers: Vec<(&'static str, Timer<'a>)>,
}

impl<'a> Visit for Containers<'a> {
    fn case<S>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Delivery> + Clone + Send + 'static,
        S::Future: Send,
        S::Error: Debug,
    {
        if name != "full_stack" {
            return;
        }
        let (rt, d) = (self.rt, self.d);
        for (label, slots) in [("FuturesUnordered + Wakeable", false), ("Slots", true)] {
            let mut svc = svc.clone();
            self.timers.push((
                label,
                Box::new(move |iters| time_in_container(rt, &mut svc, d, iters, slots)),
            ));
        }
    }
}

/// The consumer loop's container of running handlers, per delivery: the
/// full stack run 8 at a time in one task, in each container, interleaved.
/// Returns per container (label, median ns per delivery) and the median of
/// the per-round ratios Slots ÷ FuturesUnordered.
fn run_containers(rounds: usize, slice: Duration) -> (Vec<(&'static str, f64)>, f64) {
    let rt = runtime();
    let d = delivery();
    let mut c = Containers {
        rt: &rt,
        d: &d,
        timers: Vec::new(),
    };
    cases::concurrent_8_tasks(&mut c);
    let mut timers = c.timers;
    let probe = 2_000;
    let took = timers[0].1(probe);
    let iters = ((slice.as_secs_f64() / took.as_secs_f64()) * probe as f64).max(1_000.0) as u64;
    for (_, t) in timers.iter_mut() {
        t(iters / 4);
    }
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); timers.len()];
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let mut this = [0.0; 2];
        for i in 0..2 {
            let idx = (i + round) % 2;
            this[idx] = timers[idx].1(iters).as_secs_f64() * 1e9 / iters as f64;
            ns[idx].push(this[idx]);
        }
        ratios.push(this[1] / this[0]);
    }
    (
        timers
            .iter()
            .zip(&ns)
            .map(|((label, _), v)| (*label, median(v)))
            .collect(),
        median(&ratios),
    )
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One group's figures: per case, the median ns per delivery and the median
/// of the per-round ratios to the yardstick.
struct Group {
    name: &'static str,
    label: &'static str,
    rows: Vec<(&'static str, f64, f64)>,
    /// (25th, 75th) percentile of the per-round ratios, per case.
    spread: Vec<(f64, f64)>,
}

fn percentile(xs: &[f64], p: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn run_group(
    name: &'static str,
    label: &'static str,
    concurrent: bool,
    visit: fn(&mut Collect<'_>),
    rounds: usize,
    slice: Duration,
) -> Group {
    let rt = runtime();
    let d = delivery();
    let mut c = Collect {
        rt: &rt,
        d: &d,
        concurrent,
        cases: Vec::new(),
    };
    visit(&mut c);
    let mut cases = c.cases;
    // Calibrate on the slowest case (the full stack, last) so that no slice
    // runs much longer than `slice`; warm every case up.
    let probe = 2_000;
    let full = cases.last_mut().expect("cases").1(probe);
    let iters = ((slice.as_secs_f64() / full.as_secs_f64()) * probe as f64).max(1_000.0) as u64;
    for (_, t) in cases.iter_mut() {
        t(iters / 4);
    }
    let n = cases.len();
    let mut ns: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); n];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); n];
    let started = Instant::now();
    for round in 0..rounds {
        let mut this = vec![0.0; n];
        for i in 0..n {
            let idx = (i + round) % n;
            let took = cases[idx].1(iters);
            this[idx] = took.as_secs_f64() * 1e9 / iters as f64;
        }
        let (bare, yard) = (this[0], this[1]);
        for idx in 0..n {
            ns[idx].push(this[idx]);
            ratios[idx].push((this[idx] - bare) / (yard - bare));
        }
    }
    eprintln!(
        "{name}: {rounds} rounds × {n} cases × {iters} deliveries in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Group {
        name,
        label,
        rows: cases
            .iter()
            .enumerate()
            .map(|(i, (case, _))| (*case, median(&ns[i]), median(&ratios[i])))
            .collect(),
        spread: ratios
            .iter()
            .map(|r| (percentile(r, 0.25), percentile(r, 0.75)))
            .collect(),
    }
}

const LABELS: [(&str, &str); 14] = [
    ("bare", "bare service_fn"),
    ("yardstick", "yardstick: tower ConcurrencyLimit"),
    ("in_flight", "in-flight"),
    ("claim", "claim (in-flight + concurrency permit)"),
    ("partition", "partition (a free key)"),
    ("pause_open", "pause (open)"),
    ("cancel", "cancel (woken by the loop, as App runs it)"),
    ("cancel_self_waking", "cancel (waking itself)"),
    ("retry", "retry (success)"),
    ("dead_letter", "dead-letter (success)"),
    (
        "dl_limit_retry_stacked",
        "dead-letter, redelivery limit, retry: stacked (success)",
    ),
    (
        "dead_letter_retry",
        "dead-letter, redelivery limit, retry: one service, as App runs it (success)",
    ),
    ("breaker_closed", "circuit breaker (closed)"),
    ("full_stack", "full stack (as App builds it)"),
];

fn label(case: &str) -> &str {
    LABELS
        .iter()
        .find(|(k, _)| *k == case)
        .map_or(case, |(_, l)| l)
}

fn main() {
    let rounds = std::env::var("ACEMQ_LAYER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(31usize)
        .max(1);
    let slice = Duration::from_millis(
        std::env::var("ACEMQ_LAYER_SLICE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20),
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("?").to_owned();
    let groups = [
        run_group(
            "per_delivery",
            "sequential",
            false,
            |c| cases::per_delivery(c),
            rounds,
            slice,
        ),
        run_group(
            "concurrent_8_tasks",
            "8 tasks",
            true,
            |c| cases::concurrent_8_tasks(c),
            rounds,
            slice,
        ),
    ];

    println!(
        "# layer ratios: {rounds} interleaved rounds, 1-min load average {load} at the start\n"
    );
    let mut head = String::from("| case |");
    let mut rule = String::from("|---|");
    for g in &groups {
        head.push_str(&format!(
            " {}: ns (median) | added over bare | × yardstick's added (median of rounds) |",
            g.label
        ));
        rule.push_str("---:|---:|---:|");
    }
    println!("{head} target |\n{rule}---|");
    for (i, (case, _, _)) in groups[0].rows.iter().enumerate() {
        let mut line = format!("| {} |", label(case));
        for g in &groups {
            let (_, ns, ratio) = g.rows[i];
            let bare = g.rows[0].1;
            let (q1, q3) = g.spread[i];
            if i == 0 {
                line.push_str(&format!(" {ns:.1} | — | — |"));
            } else if i == 1 {
                line.push_str(&format!(" {ns:.1} | {:.1} | 1.00 |", ns - bare));
            } else {
                line.push_str(&format!(
                    " {ns:.1} | {:.1} | {ratio:.2} ({q1:.2}–{q3:.2}) |",
                    ns - bare
                ));
            }
        }
        // The three layers' work is not one layer's: no per-layer target.
        let target = if matches!(
            *case,
            "bare" | "yardstick" | "full_stack" | "dl_limit_retry_stacked" | "dead_letter_retry"
        ) {
            "—"
        } else {
            "≤ 1.0×"
        };
        println!("{line} {target} |");
    }
    println!("\n(in brackets: the 25th–75th percentile of the per-round ratios)");

    // The consumer loop's own container, per delivery (not a layer: what
    // the loop adds around the stack).
    let (containers, ratio) = run_containers(rounds, slice);
    let yard_added = groups[1].rows[1].1 - groups[1].rows[0].1;
    println!(
        "\n# the consumer loop's container: the full stack, 8 at a time in one task ({rounds} interleaved rounds)\n"
    );
    println!("| container | ns per delivery (median) | × the 8-task yardstick's added cost |\n|---|---:|---:|");
    let base = containers[0].1;
    for (label, ns) in &containers {
        println!("| {label} | {ns:.1} | {:+.2} |", (ns - base) / yard_added);
    }
    println!("\nSlots ÷ FuturesUnordered + Wakeable, median of the per-round ratios: {ratio:.2}");

    // JSON for scripts/layer_chart.py.
    let mut json = String::from("{\n");
    for (gi, g) in groups.iter().enumerate() {
        json.push_str(&format!("  \"{}\": {{\n", g.name));
        for (i, (case, ns, ratio)) in g.rows.iter().enumerate() {
            let ratio = if i == 0 || !ratio.is_finite() {
                "null".to_owned()
            } else {
                format!("{ratio:.4}")
            };
            json.push_str(&format!(
                "    \"{case}\": {{ \"median_ns\": {ns:.3}, \"ratio\": {ratio} }}{}\n",
                if i + 1 < g.rows.len() { "," } else { "" }
            ));
        }
        json.push_str(&format!(
            "  }}{}\n",
            if gi + 1 < groups.len() { "," } else { "" }
        ));
    }
    json.push_str("}\n");
    let dir = std::env::var("CARGO_TARGET_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target").to_owned());
    let path = std::path::Path::new(&dir).join("layer-ratios.json");
    match std::fs::write(&path, json) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}

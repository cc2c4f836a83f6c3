//! One `App` consuming many queues: how long it takes to start, what each
//! queue costs in memory, what the process spends while idle, how long the
//! drain takes.
//!
//! For each size `K` (10, 100, 1,000 queues) the bench runs a fresh process
//! of its own (itself, re-run with `ACEMQ_BENCH_MQ_CHILD=K`), so that no size
//! reuses the heap another one freed. That process:
//!
//! 1. generates a `Config` of `K` uniquely named classic queues (prefetch 10,
//!    concurrency at acemq's default unless `ACEMQ_BENCH_CONCURRENCY` says;
//!    no dead-letter queue unless `ACEMQ_BENCH_DEAD_LETTER=1`; each with
//!    `x-expires` 15 min, so that a crashed run's queues go away by
//!    themselves) and one `App` consuming all of them with the same trivial
//!    handler — one consumers' connection (a channel per queue) and one
//!    publishing connection;
//! 2. reads its RSS (`VmRSS`, and `RssAnon`, the heap's part, from
//!    `/proc/self/status`), then calls `start()` — the App connects and
//!    declares the queues itself — and polls the health snapshot every
//!    millisecond until it is `ready` with every queue `consuming`: **start**
//!    is the time `start()` took to return, **ready** the time from the call
//!    until ready;
//! 3. reads its RSS again (**RSS growth**, total and per queue), waits 2 s,
//!    then sleeps through the **idle window** (`ACEMQ_BENCH_IDLE_SECS`,
//!    default 60) and reports the process CPU time spent in it
//!    (`CLOCK_PROCESS_CPUTIME_ID`) as a percentage of one core, and the
//!    voluntary context switches of its threads (`/proc/self/task/*/status`;
//!    a thread that exits during the window takes its own with it), one per
//!    wake-up, also by thread name on stderr: a timer armed while idle shows
//!    here. Target: < 0.1 % of a core. A count flat across sizes is fixed
//!    cost (the heartbeats, every 30 s per connection at RabbitMQ's default
//!    60 s; the runtime); one that grows with `K` is something per queue
//!    waking while idle;
//! 4. calls `drain()` (**drain**: the call until it returns), then deletes
//!    the queues on a connection of its own.
//!
//! The parent waits for the 1-min load average (bounded) before each child,
//! rotates the order of the sizes from round to round, and prints per size
//! the medians of the rounds, then whether the start time grows linearly
//! with `K` (per queue, and the marginal cost between consecutive sizes).
//!
//! Run with: `cargo bench --bench many_queues`. Environment:
//!
//! | variable | default | what |
//! |---|---|---|
//! | `ACEMQ_BENCH_QUEUES` | `10,100,1000` | the sizes `K` |
//! | `ACEMQ_BENCH_ROUNDS` | 3 | rounds (medians of these) |
//! | `ACEMQ_BENCH_IDLE_SECS` | 60 | the idle window, seconds (0: none) |
//! | `ACEMQ_BENCH_PREFETCH` | 10 | every queue's prefetch |
//! | `ACEMQ_BENCH_CONCURRENCY` | acemq's default (8) | every queue's concurrency |
//! | `ACEMQ_BENCH_DEAD_LETTER` | unset | `1`: `dead_letter: true` (a `.dlq` per queue, declared too) |
//! | `ACEMQ_BENCH_MAX_LOAD` | 1.5 | wait before a child until the 1-min load ≤ this |
//! | `ACEMQ_BENCH_LOAD_WAIT` | 90 | … for at most this many seconds, then warn |
//! | `ACEMQ_BENCH_ADDR` | `AMQP_ADDR` | the broker's AMQP address |

#![allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::disallowed_methods
)]

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use acemq::{App, Config, Delivery};

use support::{median, Cpu};

/// The line a child prints its figures on: `RESULT key=value …`.
const RESULT: &str = "ACEMQ_MANY_QUEUES_RESULT";
/// Idle CPU target, percent of one core.
const IDLE_TARGET_PCT: f64 = 0.1;

fn fail(msg: &str) -> ! {
    eprintln!("many_queues bench: {msg}");
    std::process::exit(2);
}

/// `VmRSS` and `RssAnon` of this process, KiB.
fn rss_kib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (field("VmRSS:"), field("RssAnon:"))
}

/// Voluntary context switches per thread of this process, with the thread's
/// name: a thread that sleeps again after each wake-up switches voluntarily
/// once per wake-up (being preempted by other processes, the involuntary
/// kind, is not counted).
fn switches_by_thread() -> HashMap<u32, (String, u64)> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let n: u64 = status
            .lines()
            .filter(|l| l.starts_with("voluntary_ctxt_switches:"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        let name = status
            .lines()
            .find_map(|l| l.strip_prefix("Name:"))
            .unwrap_or("?")
            .trim()
            .to_owned();
        out.insert(tid, (name, n));
    }
    out
}

/// The switches since `before`, over the threads alive now (a thread born
/// since counts from 0): the total, how many threads are alive, and the
/// switches by thread name (most first).
fn switches_since(before: &HashMap<u32, (String, u64)>) -> (u64, usize, Vec<(String, u64)>) {
    let now = switches_by_thread();
    let mut by_name: HashMap<String, u64> = HashMap::new();
    for (tid, (name, n)) in &now {
        let d = n.saturating_sub(before.get(tid).map_or(0, |(_, n)| *n));
        *by_name.entry(name.clone()).or_default() += d;
    }
    let total = by_name.values().sum();
    let mut by_name: Vec<(String, u64)> = by_name.into_iter().filter(|(_, n)| *n > 0).collect();
    by_name.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    (total, now.len(), by_name)
}

/// The generated config of `names`.
fn config(names: &[String]) -> Config {
    let prefetch: u16 = support::env_or("ACEMQ_BENCH_PREFETCH", 10);
    let concurrency: Option<usize> = std::env::var("ACEMQ_BENCH_CONCURRENCY")
        .ok()
        .and_then(|c| c.trim().parse().ok());
    let dead_letter = support::env_flag("ACEMQ_BENCH_DEAD_LETTER");
    let mut yaml = String::from("shutdown_timeout: 20\nqueues:\n");
    for name in names {
        yaml.push_str(&format!(
            "  - name: {name}\n    prefetch: {prefetch}\n    arguments: {{ x-expires: 900000 }}\n"
        ));
        if let Some(c) = concurrency {
            yaml.push_str(&format!("    concurrency: {c}\n"));
        }
        if dead_letter {
            yaml.push_str("    dead_letter: true\n");
        }
    }
    Config::from_yaml_str(&yaml).expect("generated config")
}

/// The child: one App with `k` queues; prints one `RESULT` line.
fn child(k: usize) {
    let idle = Duration::from_secs(support::env_or("ACEMQ_BENCH_IDLE_SECS", 60));
    let rt = support::runtime();
    rt.block_on(async {
        let names: Vec<String> = (0..k).map(|_| support::unique("mq")).collect();
        let config = config(&names);
        let handler =
            tower::service_fn(|_: Delivery| async { Ok::<_, std::convert::Infallible>(()) });
        let (rss0, anon0) = rss_kib();

        let t0 = Instant::now();
        let mut app = App::new(config.clone())
            .amqp_addr(support::addr())
            .connection_name("acemq-bench-many-queues");
        for name in &names {
            app = app.consume(name, handler);
        }
        let running = match app.start().await {
            Ok(r) => r,
            Err(e) => {
                eprintln!(
                    "many_queues child ({k} queues): start failed: {e}; queues named \
                     acemq-bench.mq.{}.* expire by themselves within 15 min",
                    std::process::id()
                );
                std::process::exit(1);
            }
        };
        let started = t0.elapsed();
        let health = running.health();
        let deadline = Instant::now() + Duration::from_secs(600);
        let ready = loop {
            let snap = health.snapshot();
            if snap.ready && snap.queues.len() == k && snap.queues.iter().all(|q| q.consuming) {
                break t0.elapsed();
            }
            if Instant::now() > deadline {
                eprintln!("many_queues child ({k} queues): not ready after 600 s: {snap:?}");
                std::process::exit(1);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let (rss1, anon1) = rss_kib();

        // Let anything start-up left behind (the last consume-oks, a
        // blocking thread of the address lookup) settle first.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let sw0 = switches_by_thread();
        let cpu0 = Cpu::now();
        let w0 = Instant::now();
        tokio::time::sleep(idle).await;
        let wall = w0.elapsed();
        let idle_cpu = Cpu::now().since(cpu0);
        let (wakeups, threads, by_name) = switches_since(&sw0);
        let by_name: Vec<String> = by_name.iter().map(|(t, n)| format!("{t} {n}")).collect();
        eprintln!(
            "  {k} queues: idle wake-ups by thread name over {:.0} s: {}",
            wall.as_secs_f64(),
            if by_name.is_empty() {
                "none".to_owned()
            } else {
                by_name.join(", ")
            }
        );
        let (rss2, anon2) = rss_kib();

        let t1 = Instant::now();
        let report = running.drain().await;
        let drain = t1.elapsed();
        if let Err(e) = &report {
            eprintln!("many_queues child ({k} queues): the drain timed out: {e}");
        }

        let t2 = Instant::now();
        let broker = support::Broker::new().await;
        broker.delete(&config).await;
        let _ = broker.conn.close(200, "bench done".into()).await;
        let delete = t2.elapsed();

        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{RESULT} queues={k} start_ms={:.3} ready_ms={:.3} rss0_kib={rss0} rss1_kib={rss1} \
             rss2_kib={rss2} anon0_kib={anon0} anon1_kib={anon1} anon2_kib={anon2} \
             idle_s={:.3} idle_cpu_ms={:.3} idle_user_ms={:.0} idle_sys_ms={:.0} \
             wakeups={wakeups} threads={threads} drain_ms={:.3} drain_ok={} delete_ms={:.3}",
            ms(started),
            ms(ready),
            wall.as_secs_f64(),
            ms(idle_cpu.total),
            ms(idle_cpu.user),
            ms(idle_cpu.sys),
            ms(drain),
            u8::from(report.is_ok()),
            ms(delete),
        );
    });
}

/// One child's figures.
type Sample = HashMap<String, f64>;

/// Runs the child for `k` queues and parses its `RESULT` line.
fn run_child(k: usize) -> Sample {
    let exe = std::env::current_exe().expect("the bench's own executable");
    let mut proc = Command::new(exe)
        .env("ACEMQ_BENCH_MQ_CHILD", k.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let stdout = proc.stdout.take().expect("piped stdout");
    let mut sample = None;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix(RESULT) {
            sample = Some(
                rest.split_whitespace()
                    .filter_map(|kv| {
                        let (key, v) = kv.split_once('=')?;
                        Some((key.to_owned(), v.parse::<f64>().ok()?))
                    })
                    .collect::<Sample>(),
            );
        } else {
            println!("{line}");
        }
    }
    let status = proc.wait().expect("wait for the child");
    match sample {
        Some(s) if status.success() => s,
        _ => fail(&format!("the child for {k} queues failed ({status})")),
    }
}

fn get(s: &Sample, key: &str) -> f64 {
    s.get(key).copied().unwrap_or(f64::NAN)
}

/// The median over `v` of `f`.
fn med(v: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(&v.iter().map(f).collect::<Vec<_>>())
}

fn fmt(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "-".to_owned()
    }
}

fn parent() {
    let sizes: Vec<usize> = std::env::var("ACEMQ_BENCH_QUEUES")
        .unwrap_or_else(|_| "10,100,1000".into())
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .ok()
                .filter(|&k: &usize| k > 0)
                .unwrap_or_else(|| fail(&format!("ACEMQ_BENCH_QUEUES: {s:?} is not a size")))
        })
        .collect();
    if sizes.is_empty() {
        fail("ACEMQ_BENCH_QUEUES: no size");
    }
    let rounds: usize = support::env_or("ACEMQ_BENCH_ROUNDS", 3usize).max(1);
    let idle: u64 = support::env_or("ACEMQ_BENCH_IDLE_SECS", 60);
    let max_load: f64 = support::env_or("ACEMQ_BENCH_MAX_LOAD", 1.5);
    let load_wait = Duration::from_secs(support::env_or("ACEMQ_BENCH_LOAD_WAIT", 90));
    let prefetch: u16 = support::env_or("ACEMQ_BENCH_PREFETCH", 10);
    let concurrency = std::env::var("ACEMQ_BENCH_CONCURRENCY")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| "acemq's default".to_owned());
    let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
    println!(
        "# many queues: {} cores, RabbitMQ {}, one App with {} queues (prefetch {prefetch}, \
         concurrency {concurrency}{}), idle window {idle} s, {rounds} rounds, a fresh process per run",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        support::rabbitmq_version(),
        list.join(" / "),
        if support::env_flag("ACEMQ_BENCH_DEAD_LETTER") {
            ", dead_letter: true"
        } else {
            ""
        },
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); sizes.len()];
    for round in 0..rounds {
        for i in 0..sizes.len() {
            let si = (i + round) % sizes.len();
            let k = sizes[si];
            let (load, _) = rt.block_on(support::wait_for_load(max_load, load_wait));
            let mut s = run_child(k);
            s.insert("load".to_owned(), load);
            let per_q = |a: &str, b: &str| (get(&s, b) - get(&s, a)) / k as f64;
            eprintln!(
                "round {round} {k:>5} queues: start {:>8.1} ms, ready {:>8.1} ms, RSS +{:.1} KiB/queue \
                 (anon +{:.1}), idle {:.4} % of a core ({:.0} wake-ups over {:.0} s), drain {:.1} ms \
                 (load {load:.2})",
                get(&s, "start_ms"),
                get(&s, "ready_ms"),
                per_q("rss0_kib", "rss1_kib"),
                per_q("anon0_kib", "anon1_kib"),
                idle_pct(&s),
                get(&s, "wakeups"),
                get(&s, "idle_s"),
                get(&s, "drain_ms"),
            );
            samples[si].push(s);
        }
    }

    println!("\n## per size: medians of {rounds} rounds\n");
    println!(
        "| queues | start() ms | ready ms | ready ms/queue | RSS growth MiB | RSS KiB/queue | \
         anon KiB/queue | RSS change idle KiB | idle CPU % of a core | idle wake-ups/min | \
         drain ms | delete ms |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (si, &k) in sizes.iter().enumerate() {
        let v = &samples[si];
        let kf = k as f64;
        println!(
            "| {k} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            fmt(med(v, |s| get(s, "start_ms")), 1),
            fmt(med(v, |s| get(s, "ready_ms")), 1),
            fmt(med(v, |s| get(s, "ready_ms") / kf), 3),
            fmt(
                med(v, |s| (get(s, "rss1_kib") - get(s, "rss0_kib")) / 1024.0),
                2
            ),
            fmt(
                med(v, |s| (get(s, "rss1_kib") - get(s, "rss0_kib")) / kf),
                1
            ),
            fmt(
                med(v, |s| (get(s, "anon1_kib") - get(s, "anon0_kib")) / kf),
                1
            ),
            fmt(med(v, |s| get(s, "rss2_kib") - get(s, "rss1_kib")), 0),
            fmt(med(v, idle_pct), 4),
            fmt(med(v, |s| get(s, "wakeups") / get(s, "idle_s") * 60.0), 0),
            fmt(med(v, |s| get(s, "drain_ms")), 1),
            fmt(med(v, |s| get(s, "delete_ms")), 0),
        );
    }
    println!("\nruns (ready ms; idle % of a core; drain ms), in round order:\n");
    for (si, &k) in sizes.iter().enumerate() {
        let v = &samples[si];
        let list = |f: &dyn Fn(&Sample) -> f64, d: usize| {
            v.iter()
                .map(|s| fmt(f(s), d))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "- {k} queues: ready {}; idle {}; drain {}",
            list(&|s| get(s, "ready_ms"), 1),
            list(&idle_pct, 4),
            list(&|s| get(s, "drain_ms"), 1),
        );
    }
    let loads: Vec<f64> = samples.iter().flatten().map(|s| get(s, "load")).collect();
    println!(
        "\n1-min load average before each run: median {:.2}, max {:.2} (waited for ≤ {max_load} up to {} s)",
        median(&loads),
        loads.iter().copied().fold(f64::NAN, f64::max),
        load_wait.as_secs()
    );

    // Idle target.
    if idle > 0 {
        println!("\nidle CPU target: < {IDLE_TARGET_PCT} % of a core over the window");
        for (si, &k) in sizes.iter().enumerate() {
            let pct = med(&samples[si], idle_pct);
            let verdict = if !pct.is_finite() {
                "-"
            } else if pct < IDLE_TARGET_PCT {
                "met"
            } else {
                "MISSED"
            };
            println!("- {k} queues: {} % — {verdict}", fmt(pct, 4));
        }
    }

    // Linearity of the start.
    let mut by_size: Vec<(usize, f64, f64)> = sizes
        .iter()
        .enumerate()
        .map(|(si, &k)| {
            (
                k,
                med(&samples[si], |s| get(s, "ready_ms")),
                med(&samples[si], |s| get(s, "rss1_kib") - get(s, "rss0_kib")),
            )
        })
        .collect();
    by_size.sort_by_key(|(k, _, _)| *k);
    by_size.dedup_by_key(|(k, _, _)| *k);
    if by_size.len() >= 2 {
        println!("\n## does the start grow linearly with the queues?\n");
        println!("| from → to | ready ms per added queue | RSS KiB per added queue |");
        println!("|---|---:|---:|");
        let mut slopes = Vec::new();
        for w in by_size.windows(2) {
            let ((k0, t0, r0), (k1, t1, r1)) = (w[0], w[1]);
            let dk = (k1 - k0) as f64;
            let slope = (t1 - t0) / dk;
            slopes.push(slope);
            println!(
                "| {k0} → {k1} | {} | {} |",
                fmt(slope, 3),
                fmt((r1 - r0) / dk, 1)
            );
        }
        let (first, last) = (slopes[0], slopes[slopes.len() - 1]);
        let growth = last / first;
        let verdict = if slopes.len() < 2 {
            "one segment only: run three sizes or more to tell".to_owned()
        } else if !growth.is_finite() || first <= 0.0 {
            "undecided (the first segment's slope is not positive: noise dominates the small sizes)"
                .to_owned()
        } else if growth <= 1.5 {
            format!(
                "linear: the last segment costs {} × the first per added queue (≤ 1.5)",
                fmt(growth, 2)
            )
        } else {
            format!(
                "NOT linear: the last segment costs {} × the first per added queue (> 1.5)",
                fmt(growth, 2)
            )
        };
        println!("\nstart time: {verdict}");
        let (k_lo, t_lo, _) = by_size[0];
        let (k_hi, t_hi, _) = by_size[by_size.len() - 1];
        println!(
            "ready ms per queue at {k_lo}: {}, at {k_hi}: {} (ratio {})",
            fmt(t_lo / k_lo as f64, 3),
            fmt(t_hi / k_hi as f64, 3),
            fmt((t_hi / k_hi as f64) / (t_lo / k_lo as f64), 2)
        );
    }
}

/// Idle CPU as a percentage of one core.
fn idle_pct(s: &Sample) -> f64 {
    let wall_s = get(s, "idle_s");
    if wall_s < 1e-3 {
        return f64::NAN;
    }
    get(s, "idle_cpu_ms") / (wall_s * 1e3) * 100.0
}

fn main() {
    // `cargo bench` passes `--bench`; nothing is read from the arguments.
    match std::env::var("ACEMQ_BENCH_MQ_CHILD") {
        Ok(k) => child(
            k.trim()
                .parse()
                .unwrap_or_else(|_| fail(&format!("ACEMQ_BENCH_MQ_CHILD: {k:?} is not a size"))),
        ),
        Err(_) => parent(),
    }
}

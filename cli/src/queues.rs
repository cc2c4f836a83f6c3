//! `acemq queues`: each configured queue's depth and consumers, with its
//! dead-letter queue and retry rungs, from passive declares (no management
//! plugin needed).

use std::path::Path;

use acemq::connection::close_connection;
use acemq::topology::Topology;
use serde::Serialize;

use crate::connect::{load_config, Target};
use crate::exit::{Exit, Failure};
use crate::probe::{Found, Prober};

/// One queue's numbers as a passive declare gives them.
#[derive(Debug, Serialize)]
struct Depth {
    name: String,
    /// False when the queue does not exist (the numbers are then absent).
    exists: bool,
    /// Messages ready for delivery (not counting those delivered and not
    /// yet acknowledged).
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    consumers: Option<u32>,
}

/// A configured queue with what acemq declares for it.
#[derive(Debug, Serialize)]
struct Row {
    /// The queue; for a super stream, the sums of its partitions (it is no
    /// queue itself: it exists when every partition does).
    #[serde(flatten)]
    queue: Depth,
    /// A super stream's partitions, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    partitions: Vec<Depth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dead_letter_queue: Option<Depth>,
    retry_rungs: Vec<Depth>,
    /// A stream's work queue, where its rungs lead.
    #[serde(skip_serializing_if = "Option::is_none")]
    work_queue: Option<Depth>,
}

impl Row {
    /// Every queue of the row: a super stream's partitions, not its sums.
    fn all(&self) -> impl Iterator<Item = &Depth> {
        self.partitions
            .is_empty()
            .then_some(&self.queue)
            .into_iter()
            .chain(self.below())
    }

    /// What is shown indented below the row's first line.
    fn below(&self) -> impl Iterator<Item = &Depth> {
        self.partitions
            .iter()
            .chain(self.dead_letter_queue.iter())
            .chain(self.retry_rungs.iter())
            .chain(self.work_queue.iter())
    }
}

/// A super stream's line: its partitions' sums, there when all are.
fn sums(name: &str, partitions: &[Depth]) -> Depth {
    let exists = partitions.iter().all(|d| d.exists);
    let sum = |f: fn(&Depth) -> Option<u32>| -> Option<u32> {
        partitions
            .iter()
            .map(f)
            .try_fold(0u32, |acc, n| n.map(|n| acc.saturating_add(n)))
    };
    Depth {
        name: name.to_owned(),
        exists,
        ready: if exists { sum(|d| d.ready) } else { None },
        consumers: if exists { sum(|d| d.consumers) } else { None },
    }
}

async fn depth(prober: &mut Prober<'_>, name: &str) -> Result<Depth, Failure> {
    Ok(match prober.queue(name).await? {
        Found::Present(q) => Depth {
            name: name.to_owned(),
            exists: true,
            ready: Some(q.messages),
            consumers: Some(q.consumers),
        },
        // An exclusive queue of another connection exists; its numbers are
        // not given to us.
        Found::Locked { .. } => Depth {
            name: name.to_owned(),
            exists: true,
            ready: None,
            consumers: None,
        },
        Found::Missing { .. } => Depth {
            name: name.to_owned(),
            exists: false,
            ready: None,
            consumers: None,
        },
    })
}

/// `acemq queues`: exit 0 (a missing queue is shown as missing), or 1 with
/// `strict` when one is missing.
pub(crate) async fn queues(
    config_path: &Path,
    strict: bool,
    amqp_addr: Option<&str>,
    json: bool,
) -> Result<Exit, Failure> {
    let config = load_config(config_path)?;
    let target = Target::new(amqp_addr, Some(&config))?;
    let (conn, broker) = target.connect("queues").await?;
    let mut prober = Prober::new(&conn);
    let mut rows = Vec::new();
    let mut failed = None;
    'queues: for q in &config.queues {
        let mut row = Row {
            queue: Depth {
                name: q.name.clone(),
                exists: false,
                ready: None,
                consumers: None,
            },
            partitions: Vec::new(),
            dead_letter_queue: None,
            retry_rungs: Vec::new(),
            work_queue: None,
        };
        let dlq = q.dead_letter.then(|| q.dlq_name());
        let work = q.work_queue_name();
        let partitions: Vec<String> = if q.is_super_stream() {
            q.stream_partitions().into_iter().map(|(n, _)| n).collect()
        } else {
            Vec::new()
        };
        for d in Topology::for_queue(q) {
            let found = match depth(&mut prober, &d.name).await {
                Ok(found) => found,
                Err(e) => {
                    failed = Some(e);
                    break 'queues;
                }
            };
            if d.name == q.name {
                row.queue = found;
            } else if partitions.contains(&d.name) {
                row.partitions.push(found);
            } else if Some(&d.name) == dlq.as_ref() {
                row.dead_letter_queue = Some(found);
            } else if Some(&d.name) == work.as_ref() {
                row.work_queue = Some(found);
            } else {
                row.retry_rungs.push(found);
            }
        }
        if !row.partitions.is_empty() {
            row.queue = sums(&q.name, &row.partitions);
        }
        rows.push(row);
    }
    prober.close().await;
    let _ = close_connection(&conn, "OK").await;
    if let Some(e) = failed {
        return Err(e);
    }
    let missing = rows.iter().flat_map(Row::all).filter(|d| !d.exists).count();
    let total = rows.iter().flat_map(Row::all).count();
    if json {
        crate::output::json(&serde_json::json!({
            "broker": broker,
            "missing": missing,
            "queues": rows,
        }));
    } else {
        print_table(&rows);
        println!(
            "{total} queue{} on {broker}, {missing} missing{}",
            if total == 1 { "" } else { "s" },
            if missing > 0 {
                " (`acemq topology apply` declares them)"
            } else {
                ""
            }
        );
    }
    Ok(if strict && missing > 0 {
        Exit::Differences
    } else {
        Exit::Ok
    })
}

fn print_table(rows: &[Row]) {
    let width = rows
        .iter()
        .flat_map(|r| std::iter::once(&r.queue).chain(r.below()))
        .map(|d| d.name.len() + 2)
        .max()
        .unwrap_or(0)
        .max("QUEUE".len());
    println!("{:<width$}  {:>7}  {:>9}", "QUEUE", "READY", "CONSUMERS");
    for row in rows {
        let first = std::iter::once((&row.queue, String::new()));
        for (d, indent) in first.chain(row.below().map(|d| (d, "  ".to_owned()))) {
            let name = format!("{indent}{}", d.name);
            match (d.exists, d.ready, d.consumers) {
                (true, Some(ready), Some(consumers)) => {
                    println!("{name:<width$}  {ready:>7}  {consumers:>9}")
                }
                (true, _, _) => println!("{name:<width$}  {:>7}", "locked"),
                (false, _, _) => println!("{name:<width$}  {:>7}", "missing"),
            }
        }
    }
}

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
    #[serde(flatten)]
    queue: Depth,
    #[serde(skip_serializing_if = "Option::is_none")]
    dead_letter_queue: Option<Depth>,
    retry_rungs: Vec<Depth>,
}

impl Row {
    fn all(&self) -> impl Iterator<Item = &Depth> {
        std::iter::once(&self.queue)
            .chain(self.dead_letter_queue.iter())
            .chain(self.retry_rungs.iter())
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
            dead_letter_queue: None,
            retry_rungs: Vec::new(),
        };
        let dlq = q.dead_letter.then(|| q.dlq_name());
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
            } else if Some(&d.name) == dlq.as_ref() {
                row.dead_letter_queue = Some(found);
            } else {
                row.retry_rungs.push(found);
            }
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
        .flat_map(Row::all)
        .map(|d| d.name.len() + 2)
        .max()
        .unwrap_or(0)
        .max("QUEUE".len());
    println!("{:<width$}  {:>7}  {:>9}", "QUEUE", "READY", "CONSUMERS");
    for row in rows {
        for (i, d) in row.all().enumerate() {
            let name = if i == 0 {
                d.name.clone()
            } else {
                format!("  {}", d.name)
            };
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

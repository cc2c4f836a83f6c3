//! `acemq dlq replay`: moves dead letters back through the library's
//! [`acemq::replay`], as the `replay` example does: the attempt count
//! reset, each message confirmed in the work queue before it is
//! acknowledged in the dead-letter queue, so a replay killed half-way loses
//! nothing (at worst one message is in both queues).

use acemq::connection::close_connection;
use acemq::lapin::Connection;
use acemq::replay::{replay_on, ReplayError, ReplayOptions, ReplayReport};
use serde::Serialize;

use crate::cli::{queue_pair, ReplayArgs};
use crate::connect::{load_config, Target};
use crate::exit::{Exit, Failure};
use crate::probe::{Found, Prober};

#[derive(Debug, Serialize)]
struct Report<'a> {
    broker: &'a str,
    from: &'a str,
    to: &'a str,
    moved: usize,
    skipped: usize,
    repeats_left: usize,
    moved_by_reason: &'a std::collections::BTreeMap<String, usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn print(report: &ReplayReport, broker: &str, error: Option<String>, json: bool) {
    if json {
        crate::output::json(&Report {
            broker,
            from: &report.from,
            to: &report.to,
            moved: report.moved,
            skipped: report.skipped,
            repeats_left: report.repeats_left,
            moved_by_reason: &report.moved_by_reason,
            error,
        });
    } else {
        println!("{report}");
    }
}

/// Whether queue `name` exists (a passive declare on a channel of its own).
async fn exists(conn: &Connection, name: &str) -> Result<bool, Failure> {
    let mut prober = Prober::new(conn);
    let found = prober.queue(name).await;
    prober.close().await;
    Ok(!matches!(found?, Found::Missing { .. }))
}

/// `acemq dlq replay`.
pub(crate) async fn replay(
    args: &ReplayArgs,
    amqp_addr: Option<&str>,
    json: bool,
) -> Result<Exit, Failure> {
    let config = args.config.as_deref().map(load_config).transpose()?;
    let target = Target::new(amqp_addr, config.as_ref())?;
    let (dlq, queue) = queue_pair(&args.queue);
    let mut options = ReplayOptions::new();
    if let Some(reason) = args.reason {
        options = options.only_reason(reason);
    }
    if let Some(n) = args.limit {
        options = options.limit(n);
    }
    if args.skip_repeated {
        options = options.skip_repeated();
    }
    let (conn, broker) = target.connect("dlq replay").await?;
    let result = async {
        // Refused up front rather than after the first message: the replay
        // publishes back to the queue by name, through the default exchange.
        if !exists(&conn, &queue).await? {
            return Err(Failure::data(format!(
                "there is no queue {queue:?} to move {dlq:?}'s messages back to; declare it \
                 (acemq topology apply) or name the work queue"
            )));
        }
        Ok(replay_on(&conn, &queue, options).await)
    }
    .await;
    let _ = close_connection(&conn, "OK").await;
    match result? {
        Ok(report) => {
            print(&report, &broker, None, json);
            Ok(Exit::Ok)
        }
        Err(e @ ReplayError::NoDeadLetterQueue { .. }) => Err(Failure::data(e.to_string())),
        Err(e) => {
            if let Some(report) = e.report() {
                print(report, &broker, Some(e.to_string()), json);
            }
            Err(Failure::unavailable(e.to_string()))
        }
    }
}

//! Moves dead-lettered messages from `QUEUE.dlq` back to `QUEUE`, with the
//! attempt count reset, once the bug that sent them there is fixed.
//!
//! Run with:
//!
//! ```text
//! cargo run --example replay -- QUEUE [--reason REASON] [--limit N] [--log-format text|json]
//! ```
//!
//! `AMQP_ADDR` names the broker (default `amqp://guest:guest@127.0.0.1:5672/%2f`).
//! `REASON` is one of `rejected`, `max-attempts`, `panic`, `timeout`,
//! `redelivered`, `transaction-ended`: only messages dead-lettered for it are moved, the rest
//! stay. Each message is published back with a confirm before it is removed
//! from the dead-letter queue, so stopping the command at any point loses
//! nothing (at worst one message is in both queues).
//!
//! The report goes to stdout; log lines to stderr, as one JSON object per
//! line with `--log-format json` (`text` is the default).
//!
//! Exit codes: 0 done, 64 bad usage, 69 broker unreachable or the replay
//! stopped on an error (what was moved is printed either way).

#[path = "common/logging.rs"]
mod logging;

use std::process::ExitCode;

use acemq::connection::amqp_addr_from_env;
use acemq::replay::{replay_dead_letters, ReplayOptions};
use acemq::Reason;

const USAGE: &str = "usage: replay QUEUE [--reason rejected|max-attempts|panic|timeout|redelivered|transaction-ended|consumer-timeout] [--limit N] [--log-format text|json]";

fn parse(args: &[String]) -> Result<(String, ReplayOptions), String> {
    let mut queue = None;
    let mut options = ReplayOptions::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--reason" => {
                let r = it.next().ok_or("--reason needs a value")?;
                let reason = Reason::from_header(r)
                    .ok_or_else(|| format!("--reason {r:?} is not a reason acemq writes"))?;
                options = options.only_reason(reason);
            }
            "--limit" => {
                let n = it.next().ok_or("--limit needs a value")?;
                let n = n
                    .parse()
                    .map_err(|_| format!("--limit {n:?} is not a whole number"))?;
                options = options.limit(n);
            }
            "-h" | "--help" => return Err(String::new()),
            other if other.starts_with('-') => return Err(format!("unknown option {other}")),
            name if queue.is_none() => queue = Some(name.to_owned()),
            extra => return Err(format!("one queue at a time ({extra:?} is extra)")),
        }
    }
    let queue = queue.ok_or("name the queue whose .dlq to replay")?;
    Ok((queue, options))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let parsed = logging::take_log_format(std::env::args().skip(1).collect())
        .and_then(|(format, args)| Ok((format, parse(&args)?)));
    let (log_format, (queue, options)) = match parsed {
        Ok(parsed) => parsed,
        Err(why) => {
            if !why.is_empty() {
                eprintln!("replay: {why}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(64);
        }
    };
    logging::init(log_format, acemq::log::DEFAULT_FILTER, std::io::stderr);
    match replay_dead_letters(&amqp_addr_from_env(), &queue, options).await {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("replay: {e}");
            if let Some(report) = e.report() {
                println!("{report}");
            }
            ExitCode::from(acemq::app::EXIT_UNAVAILABLE)
        }
    }
}

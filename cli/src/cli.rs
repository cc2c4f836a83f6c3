//! The command line, one subcommand per verb (clap derive).

use std::path::PathBuf;

use acemq::layers::dead_letter::{dlq_name, DLQ_SUFFIX};
use clap::{Args, Parser, Subcommand};

/// What `--reason` accepts: the reasons acemq writes to `x-acemq-reason`.
const REASONS: &str =
    "max-attempts, rejected, panic, timeout, redelivered, transaction-ended, consumer-timeout, \
     malformed-headers";

/// acemq's operator command: the topology a config names, queue depths, dead
/// letters, streams' stored offsets, and a message published by hand.
///
/// Exit codes: 0 ok, 1 `topology plan` found differences (or `queues
/// --strict` a missing queue), 64 usage, 65 a queue or exchange named on the
/// command line is not there (or `publish` found nothing to route to, or a
/// stream of the config is not on the broker), 69 broker (or stream plugin)
/// unavailable, 75 `publish` was nacked by the broker, 78 config error (or a
/// broker queue that contradicts the config, or a `schema:` file `asyncapi`
/// cannot read).
#[derive(Debug, Parser)]
#[command(name = "acemq", version, propagate_version = true)]
pub(crate) struct Cli {
    /// The broker, as amqp://user:password@host:port/vhost (amqps:// for
    /// TLS); several separated by commas. Wins over AMQP_ADDR, which wins
    /// over the config's `addresses`; the default is
    /// amqp://guest:guest@127.0.0.1:5672/%2f.
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) amqp_addr: Option<String>,

    /// Print one JSON document on stdout, for scripts, instead of text for
    /// a person.
    #[arg(long, global = true)]
    pub(crate) json: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Compare the broker with a config, or declare what it lacks.
    #[command(subcommand)]
    Topology(TopologyCommand),
    /// Each configured queue's ready messages and consumers, with its
    /// dead-letter queue's and retry rungs' depths.
    Queues(QueuesArgs),
    /// Look at a dead-letter queue without taking anything, or move its
    /// messages back.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Publish one message to a queue or to an exchange, mandatory, and
    /// wait for the broker's confirm.
    Publish(Box<PublishArgs>),
    /// The config's streams, over the stream plugin: stored offsets and lag.
    #[command(subcommand)]
    Stream(StreamCommand),
    /// Write the config's AsyncAPI 3.0 document (AMQP 0.9.1 bindings): its
    /// queues, retry rungs, dead-letter queues and exchanges as channels,
    /// what the service consumes and publishes, the headers acemq sets, and
    /// each queue's `schema:` as its payload. Asks nothing of the broker.
    Asyncapi(AsyncApiArgs),
}

/// `acemq asyncapi`
#[derive(Debug, Args)]
pub(crate) struct AsyncApiArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// Write the document to FILE instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// yaml (the default) or json (the default with --json).
    #[arg(long, value_enum)]
    pub(crate) format: Option<DocFormat>,
    /// The document's info.title (default: the config file's name without
    /// its extension).
    #[arg(long, value_name = "TEXT")]
    pub(crate) title: Option<String>,
    /// The document's info.version: the version of the service's API.
    #[arg(long, value_name = "VERSION", default_value = "1.0.0")]
    pub(crate) api_version: String,
}

/// The document's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DocFormat {
    /// YAML.
    Yaml,
    /// JSON.
    Json,
}

/// `acemq topology ...`
#[derive(Debug, Subcommand)]
pub(crate) enum TopologyCommand {
    /// List what the broker lacks or holds differently from the config
    /// (queues and their arguments, streams and super streams' partitions,
    /// dead-letter queues, retry rungs, exchanges), creating nothing. Exit 0 when they agree, 1 when not.
    Plan(ConfigArg),
    /// Declare what the broker lacks; refuse (exit 78, nothing changed) when
    /// a queue or exchange exists with other arguments.
    Apply(ConfigArg),
}

/// `acemq stream ...`
#[derive(Debug, Subcommand)]
pub(crate) enum StreamCommand {
    /// Each stream's stored offset and lag, partition by partition.
    ///
    /// For each stream of the config (each partition of a super stream):
    /// the consumer name, the offset stored under it (`none` when nothing
    /// is stored) and the lag where the broker can tell (RabbitMQ 3.11 and
    /// later): the offsets after the stored one up to the stream's last
    /// committed offset, the tracking entries offset stores write included
    /// (a consumer that has read everything shows 1 or a few); `at least`
    /// where the broker gives only the last committed chunk's first offset.
    /// Connects to the stream plugin at the config's `streams` port (5552)
    /// with the broker address's host and credentials. Exit 0, 65 when a
    /// stream is not on the broker, 69 when the stream plugin does not
    /// answer, 78 a config error.
    Offsets(ConfigArg),
}

/// The config file every topology verb reads.
#[derive(Debug, Args)]
pub(crate) struct ConfigArg {
    /// The acemq config (.yaml, .yml, .toml or .json), as the service
    /// loads it.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub(crate) config: PathBuf,
}

/// `acemq queues`
#[derive(Debug, Args)]
pub(crate) struct QueuesArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// Exit 1 when a queue, dead-letter queue or rung is missing (by
    /// default a missing queue is shown as missing and the exit is 0).
    #[arg(long)]
    pub(crate) strict: bool,
}

/// `acemq dlq ...`
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Show the first messages of QUEUE.dlq — reason, attempts, where they
    /// came from, error, body — and give every one back, in order.
    Peek(PeekArgs),
    /// Move the messages of QUEUE.dlq back to QUEUE with their attempt
    /// count reset, each confirmed in QUEUE before it leaves QUEUE.dlq.
    Replay(ReplayArgs),
}

/// `acemq dlq peek`
#[derive(Debug, Args)]
pub(crate) struct PeekArgs {
    /// The work queue (its dead letters are in QUEUE.dlq); a name ending in
    /// `.dlq` is read as the dead-letter queue itself.
    pub(crate) queue: String,
    /// Show at most N messages.
    #[arg(long, short = 'n', value_name = "N", default_value_t = 10)]
    pub(crate) limit: usize,
    /// Show only messages dead-lettered for REASON (max-attempts, rejected,
    /// panic, timeout, redelivered, transaction-ended; `none` for those without the header,
    /// dead-lettered by the broker itself).
    #[arg(long, value_name = "REASON", value_parser = parse_peek_reason)]
    pub(crate) reason: Option<String>,
    /// Show at most this many bytes of each body.
    #[arg(long, value_name = "BYTES", default_value_t = 96)]
    pub(crate) body_bytes: usize,
    /// Take the broker addresses and TLS files from this config.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
}

/// `acemq dlq replay`
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// The work queue to move QUEUE.dlq's messages back to (a name ending
    /// in `.dlq` is read as the dead-letter queue itself).
    pub(crate) queue: String,
    /// Move only messages dead-lettered for REASON (max-attempts, rejected,
    /// panic, timeout, redelivered, transaction-ended); the others stay, in order.
    #[arg(long, value_name = "REASON", value_parser = parse_replay_reason)]
    pub(crate) reason: Option<acemq::Reason>,
    /// Take at most N messages from QUEUE.dlq (moved or skipped).
    #[arg(long, short = 'n', value_name = "N")]
    pub(crate) limit: Option<usize>,
    /// Move only the first copy of each message id; later copies (repeats,
    /// as `dlq peek` marks them) stay in QUEUE.dlq, in order.
    #[arg(long)]
    pub(crate) skip_repeated: bool,
    /// Take the broker addresses and TLS files from this config.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
}

/// `acemq publish`
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("to").required(true).args(["queue", "exchange"])))]
#[command(group(clap::ArgGroup::new("source").required(true).args(["body", "file"])))]
pub(crate) struct PublishArgs {
    /// The body; `-` reads it from stdin.
    #[arg(value_name = "BODY", allow_hyphen_values = true)]
    pub(crate) body: Option<String>,
    /// Read the body from FILE (`-`: stdin), byte for byte.
    #[arg(long, short = 'f', value_name = "FILE")]
    pub(crate) file: Option<PathBuf>,
    /// Publish to queue Q (through the default exchange, routing key Q).
    #[arg(long, short = 'q', value_name = "Q", conflicts_with_all = ["exchange", "routing_key"])]
    pub(crate) queue: Option<String>,
    /// Publish to exchange X (with --routing-key).
    #[arg(long, short = 'x', value_name = "X", requires = "routing_key")]
    pub(crate) exchange: Option<String>,
    /// The routing key to publish to exchange X with.
    #[arg(long, short = 'k', value_name = "KEY", requires = "exchange")]
    pub(crate) routing_key: Option<String>,
    /// A header, as NAME=VALUE (a string); repeat for more.
    #[arg(long = "header", short = 'H', value_name = "NAME=VALUE", value_parser = parse_header)]
    pub(crate) headers: Vec<(String, String)>,
    /// The `content_type` property, e.g. application/json.
    #[arg(long, value_name = "TYPE")]
    pub(crate) content_type: Option<String>,
    /// The `content_encoding` property, e.g. gzip.
    #[arg(long, value_name = "ENCODING")]
    pub(crate) content_encoding: Option<String>,
    /// The `message_id` property (what acemq's inbox keys on).
    #[arg(long, value_name = "ID")]
    pub(crate) message_id: Option<String>,
    /// The `correlation_id` property.
    #[arg(long, value_name = "ID")]
    pub(crate) correlation_id: Option<String>,
    /// The `reply_to` property.
    #[arg(long, value_name = "QUEUE")]
    pub(crate) reply_to: Option<String>,
    /// The `type` property.
    #[arg(long = "type", value_name = "TYPE")]
    pub(crate) kind: Option<String>,
    /// The `app_id` property.
    #[arg(long, value_name = "ID")]
    pub(crate) app_id: Option<String>,
    /// The `priority` property (0 to 255).
    #[arg(long, value_name = "N")]
    pub(crate) priority: Option<u8>,
    /// The `expiration` property: a per-message TTL in milliseconds.
    #[arg(long, value_name = "MS")]
    pub(crate) expiration: Option<u64>,
    /// The `timestamp` property, in seconds since the Unix epoch; `now`
    /// for the current time.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timestamp)]
    pub(crate) timestamp: Option<u64>,
    /// `delivery_mode` 2: the message survives a broker restart in a
    /// durable queue (without it: 1, transient).
    #[arg(long)]
    pub(crate) persistent: bool,
    /// Give up waiting for the broker's confirm after SECONDS (exit 69).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub(crate) confirm_timeout: u64,
    /// Take the broker addresses and TLS files from this config.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!(
            "{s:?} is not NAME=VALUE: give the header's name, `=`, then its value (`--header tenant=acme`)"
        )),
    }
}

fn parse_timestamp(s: &str) -> Result<u64, String> {
    if s == "now" {
        return Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()));
    }
    s.parse()
        .map_err(|_| "not a number of seconds since the Unix epoch, nor `now`".to_owned())
}

fn parse_replay_reason(s: &str) -> Result<acemq::Reason, String> {
    acemq::Reason::from_header(s)
        .ok_or_else(|| format!("not a reason acemq writes (one of {REASONS})"))
}

fn parse_peek_reason(s: &str) -> Result<String, String> {
    if s == "none" {
        return Ok(s.to_owned());
    }
    parse_replay_reason(s).map(|r| r.as_str().to_owned())
}

/// The dead-letter queue and the work queue a QUEUE argument names.
pub(crate) fn queue_pair(queue: &str) -> (String, String) {
    match queue.strip_suffix(DLQ_SUFFIX) {
        Some(work) if !work.is_empty() => (queue.to_owned(), work.to_owned()),
        _ => (dlq_name(queue), queue.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_queue_argument_names_its_dead_letter_queue() {
        assert_eq!(
            queue_pair("shop.orders"),
            ("shop.orders.dlq".to_owned(), "shop.orders".to_owned())
        );
        assert_eq!(
            queue_pair("shop.orders.dlq"),
            ("shop.orders.dlq".to_owned(), "shop.orders".to_owned())
        );
    }

    #[test]
    fn reasons_are_the_ones_acemq_writes() {
        assert!(parse_replay_reason("rejected").is_ok());
        assert!(parse_replay_reason("none").is_err());
        assert_eq!(parse_peek_reason("none").as_deref(), Ok("none"));
        assert!(parse_peek_reason("oops").is_err());
    }

    #[test]
    fn a_header_is_name_equals_value() {
        assert_eq!(
            parse_header("tenant=acme=1"),
            Ok(("tenant".to_owned(), "acme=1".to_owned()))
        );
        assert_eq!(
            parse_header("empty="),
            Ok(("empty".to_owned(), String::new()))
        );
        assert!(parse_header("=x").is_err());
        assert!(parse_header("tenant").is_err());
    }
}

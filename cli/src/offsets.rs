//! `acemq stream offsets`: for each stream of the config (each partition of
//! a super stream), the offset stored under the consumer's name and how far
//! behind it the stream is, where the broker can tell, over the stream
//! plugin (the library's own client, the service's host, port and
//! credentials).

use std::path::Path;

use acemq::config::{QueueConfig, StreamOffset};
use acemq::layers::escape;
use acemq::stream::{ResponseCode, StreamClient, StreamError, StreamOptions, StreamStats};
use serde::Serialize;

use crate::connect::{connection_name, load_config, Target};
use crate::exit::{Exit, Failure};

/// One partition (a plain stream is its own one partition).
#[derive(Debug, Serialize)]
struct Row {
    /// The config's entry: the stream, or the super stream.
    stream: String,
    /// The stream read: the entry's own name, or one partition of it.
    partition: String,
    /// The name offsets are stored under.
    consumer: String,
    /// False when the broker has no such stream (the rest is then absent).
    exists: bool,
    /// The offset stored under `consumer`: the last message the consumer
    /// settled; `null` when none is stored.
    stored_offset: Option<u64>,
    /// The lag in offsets: those after the stored offset (or, with none
    /// stored and `offset: first`, from the stream's first) up to the
    /// stream's last committed offset.
    lag: Option<u64>,
    /// True when the broker gives only the last committed chunk's first
    /// offset (no `committed_offset`): the lag is then at least `lag`.
    #[serde(skip_serializing_if = "Option::is_none")]
    lag_is_lower_bound: Option<bool>,
    /// Why `lag` is `null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    lag_unknown: Option<String>,
    /// The first offset the stream still holds (RabbitMQ 3.11 and later).
    #[serde(skip_serializing_if = "Option::is_none")]
    first_offset: Option<i64>,
    /// The first offset of the last committed chunk (RabbitMQ 3.11 and
    /// later).
    #[serde(skip_serializing_if = "Option::is_none")]
    committed_chunk_id: Option<i64>,
    /// The last committed offset (brokers that give it).
    #[serde(skip_serializing_if = "Option::is_none")]
    committed_offset: Option<i64>,
}

/// How far behind a consumer is, in offsets.
#[derive(Debug, PartialEq, Eq)]
struct Lag {
    offsets: u64,
    /// Counted only up to the last committed chunk's first offset.
    lower_bound: bool,
}

/// A statistic by its name.
fn stat(stats: &StreamStats, name: &str) -> Option<i64> {
    stats.all.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
}

/// The lag in offsets: from the one the consumer reads next to the
/// stream's last committed offset (`committed_offset`; where the broker
/// does not give it, the last committed chunk's first offset, and the lag
/// is at least that). The consumer reads next the offset after `stored`,
/// or with none stored the stream's first when it starts at `first`;
/// offsets retention removed are not counted. Offsets count the stream's
/// entries, the tracking entries offset stores write included: a consumer
/// that has read everything shows 1 (its own last store) or a few.
fn lag(stats: &StreamStats, stored: Option<u64>, start: StreamOffset) -> Result<Lag, String> {
    let (end, lower_bound) = match (stat(stats, "committed_offset"), stats.committed_chunk_id) {
        (Some(offset), _) => (offset, false),
        (None, Some(chunk)) => (chunk, true),
        (None, None) => return Err("the broker's stream stats give no committed offset".to_owned()),
    };
    let first = stats.first_offset.map_or(0, |f| f.max(0).unsigned_abs());
    let next = match (stored, start) {
        (Some(s), _) => s.saturating_add(1),
        (None, StreamOffset::First) => first,
        (None, StreamOffset::Last) => {
            return Err("nothing stored, and the consumer starts at the last chunk".to_owned())
        }
        (None, StreamOffset::Next) => {
            return Err("nothing stored, and the consumer starts at the next message".to_owned())
        }
        (None, _) => {
            return Err("nothing stored, and the consumer starts at a timestamp".to_owned())
        }
    };
    // -1: the stream holds nothing yet.
    let end = u64::try_from(end).ok();
    let next = next.max(first);
    let offsets = match end {
        Some(end) if end >= next => end - next + 1,
        _ => 0,
    };
    Ok(Lag {
        offsets,
        lower_bound,
    })
}

/// Why the lag is unknown on a broker without stream stats.
fn no_stats(version: Option<&str>) -> String {
    match version {
        Some(v) => {
            let minor: Vec<&str> = v.split('.').take(2).collect();
            format!("RabbitMQ {} has no stream stats", escape(&minor.join(".")))
        }
        None => "the broker did not say its version; stream stats need RabbitMQ 3.11 or later"
            .to_owned(),
    }
}

/// A stream error as the command's failure: 65 for a stream that does not
/// exist, 69 for the rest; the broker's text escaped.
fn failure(e: &StreamError, doing: &str) -> Failure {
    let message = format!("{doing}: {}", escape(&e.to_string()));
    match e {
        StreamError::StreamDoesNotExist { .. } => Failure::data(message),
        _ => Failure::unavailable(message),
    }
}

/// Reads every partition of `streams`.
async fn read_all(client: &StreamClient, streams: &[&QueueConfig]) -> Result<Vec<Row>, Failure> {
    let mut rows = Vec::new();
    for q in streams {
        let consumer = q.stream_consumer_name();
        let partitions = q.stream_partitions();
        let names: Vec<&str> = partitions.iter().map(|(n, _)| n.as_str()).collect();
        let metadata = client
            .metadata(&names)
            .await
            .map_err(|e| failure(&e, &format!("reading the metadata of {:?}", q.name)))?;
        for (partition, _) in &partitions {
            let mut row = Row {
                stream: q.name.clone(),
                partition: partition.clone(),
                consumer: consumer.to_owned(),
                exists: false,
                stored_offset: None,
                lag: None,
                lag_is_lower_bound: None,
                lag_unknown: None,
                first_offset: None,
                committed_chunk_id: None,
                committed_offset: None,
            };
            let missing = metadata
                .iter()
                .find(|m| &m.stream == partition)
                .is_none_or(|m| m.code == ResponseCode::StreamDoesNotExist);
            if missing {
                rows.push(row);
                continue;
            }
            row.exists = true;
            let doing = |what: &str| format!("{what} of stream {partition:?}");
            row.stored_offset = client
                .query_offset(consumer, partition)
                .await
                .map_err(|e| failure(&e, &doing("reading the stored offset")))?;
            match client.stream_stats(partition).await {
                Ok(Some(stats)) => {
                    row.first_offset = stats.first_offset;
                    row.committed_chunk_id = stats.committed_chunk_id;
                    row.committed_offset = stat(&stats, "committed_offset");
                    match lag(&stats, row.stored_offset, q.offset.unwrap_or_default()) {
                        Ok(lag) => {
                            row.lag = Some(lag.offsets);
                            row.lag_is_lower_bound = Some(lag.lower_bound);
                        }
                        Err(why) => row.lag_unknown = Some(why),
                    }
                }
                Ok(None) => row.lag_unknown = Some(no_stats(client.server_version())),
                Err(e) => return Err(failure(&e, &doing("reading the stats"))),
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// `acemq stream offsets`: exit 0, or 65 when a stream of the config is not
/// on the broker (after showing the others).
pub(crate) async fn offsets(
    config_path: &Path,
    amqp_addr: Option<&str>,
    json: bool,
) -> Result<Exit, Failure> {
    let config = load_config(config_path)?;
    let streams: Vec<&QueueConfig> = config.queues.iter().filter(|q| q.is_stream()).collect();
    if streams.is_empty() {
        return Err(Failure::config(format!(
            "{} names no stream: a stream is a queue entry with `type: stream`",
            config_path.display()
        )));
    }
    let target = Target::new(amqp_addr, Some(&config))?;
    let mut opts = StreamOptions::from_config(&config, target.addresses(), "acemq")
        .map_err(|why| Failure::config(format!("streams: {why}")))?;
    opts.connection_name = connection_name("stream offsets");
    let plugin = format!("{}:{}", opts.host, opts.port);
    let (client, _events) = StreamClient::connect(&opts)
        .await
        .map_err(|e| failure(&e, "connecting to the stream plugin"))?;
    let version = client.server_version().map(str::to_owned);
    let read = read_all(&client, &streams).await;
    let _ = client.close().await;
    let rows = read?;
    let missing: Vec<&Row> = rows.iter().filter(|r| !r.exists).collect();
    if json {
        crate::output::json(&serde_json::json!({
            "broker": plugin,
            "broker_version": version,
            "missing": missing.len(),
            "partitions": rows,
        }));
    } else {
        print_table(&rows);
        println!(
            "{} partition{} of {} stream{} on {}{}, {} missing",
            rows.len(),
            if rows.len() == 1 { "" } else { "s" },
            streams.len(),
            if streams.len() == 1 { "" } else { "s" },
            escape(&plugin),
            version.map_or_else(String::new, |v| format!(" (RabbitMQ {})", escape(&v))),
            missing.len()
        );
    }
    match missing.first() {
        None => Ok(Exit::Ok),
        Some(first) => Err(Failure::data(format!(
            "stream {:?} does not exist on the broker{}: declare it with `acemq topology apply \
             --config {}`, or fix its name in the config",
            first.partition,
            match missing.len() {
                1 => String::new(),
                n => format!(" (nor do {} more)", n - 1),
            },
            config_path.display()
        ))),
    }
}

fn print_table(rows: &[Row]) {
    // A super stream's partitions are indented under its name.
    let name = |r: &Row| {
        if r.partition == r.stream {
            escape(&r.partition).to_string()
        } else {
            format!("  {}", escape(&r.partition))
        }
    };
    let width = rows
        .iter()
        .map(|r| {
            name(r)
                .chars()
                .count()
                .max(escape(&r.stream).chars().count())
        })
        .max()
        .unwrap_or(0)
        .max("STREAM".len());
    let consumers = rows
        .iter()
        .map(|r| escape(&r.consumer).chars().count())
        .max()
        .unwrap_or(0)
        .max("CONSUMER".len());
    println!(
        "{:<width$}  {:<consumers$}  {:>12}  LAG",
        "STREAM", "CONSUMER", "STORED"
    );
    let mut last_super = None;
    for r in rows {
        if r.partition != r.stream && last_super != Some(&r.stream) {
            last_super = Some(&r.stream);
            let n = rows.iter().filter(|o| o.stream == r.stream).count();
            println!(
                "{:<width$}  (super stream, {n} partitions)",
                escape(&r.stream)
            );
        }
        let consumer = escape(&r.consumer).to_string();
        if !r.exists {
            println!(
                "{:<width$}  {consumer:<consumers$}  {:>12}",
                name(r),
                "missing"
            );
            continue;
        }
        let stored = r
            .stored_offset
            .map_or_else(|| "none".to_owned(), |o| o.to_string());
        let lag = match (&r.lag, &r.lag_unknown) {
            (Some(n), _) if r.lag_is_lower_bound == Some(true) => format!("at least {n}"),
            (Some(n), _) => n.to_string(),
            (None, Some(why)) => format!("unknown ({})", escape(why)),
            (None, None) => "unknown".to_owned(),
        };
        println!(
            "{:<width$}  {consumer:<consumers$}  {stored:>12}  {lag}",
            name(r)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(first: i64, committed: i64) -> StreamStats {
        let mut s = StreamStats::default();
        s.first_offset = Some(first);
        s.committed_chunk_id = Some(committed);
        s
    }

    fn at(n: u64) -> Result<Lag, String> {
        Ok(Lag {
            offsets: n,
            lower_bound: false,
        })
    }

    #[test]
    fn the_lag_counts_the_offsets_after_the_stored_one() {
        let mut s = stats(0, 150);
        s.all.push(("committed_offset".to_owned(), 160));
        // Stored 99, the last committed offset 160: 100..=160.
        assert_eq!(lag(&s, Some(99), StreamOffset::First), at(61));
        assert_eq!(lag(&s, Some(160), StreamOffset::First), at(0));
        assert_eq!(lag(&s, Some(170), StreamOffset::First), at(0));
        // Nothing stored, starting at first: the whole stream.
        s.first_offset = Some(40);
        assert_eq!(lag(&s, None, StreamOffset::First), at(121));
        // Retention removed 100..=119: not counted.
        s.first_offset = Some(120);
        assert_eq!(lag(&s, Some(99), StreamOffset::First), at(41));
        assert!(lag(&s, None, StreamOffset::Next).is_err());
        assert!(lag(&s, None, StreamOffset::Last).is_err());
        // An empty stream.
        let mut empty = stats(-1, -1);
        empty.all.push(("committed_offset".to_owned(), -1));
        assert_eq!(lag(&empty, None, StreamOffset::First), at(0));
        assert_eq!(lag(&empty, Some(41), StreamOffset::First), at(0));
        assert!(lag(&StreamStats::default(), Some(1), StreamOffset::First).is_err());
    }

    #[test]
    fn without_the_committed_offset_the_lag_is_a_lower_bound() {
        // Only the last chunk's first offset, 150: at least 100..=150.
        assert_eq!(
            lag(&stats(0, 150), Some(99), StreamOffset::First),
            Ok(Lag {
                offsets: 51,
                lower_bound: true
            })
        );
    }

    #[test]
    fn without_stats_the_lag_says_why_it_is_unknown() {
        assert_eq!(
            no_stats(Some("3.10.8")),
            "RabbitMQ 3.10 has no stream stats"
        );
        assert!(no_stats(None).contains("3.11 or later"));
        assert!(!no_stats(Some("3.10\x1b[2J")).contains('\x1b'));
    }
}

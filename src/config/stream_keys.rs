//! The types of a stream's keys (`type: stream`): where to start, how
//! stored offsets are coalesced, and the top-level `streams` section (the
//! stream plugin's port and advertised host).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::duration;

/// Where a stream consumer starts when no offset is stored under its
/// name (key `offset`; default [`StreamOffset::First`]): once an offset is
/// stored, the consumer always resumes after it.
///
/// ```
/// use acemq::config::StreamOffset;
///
/// assert_eq!(StreamOffset::parse("first"), Ok(StreamOffset::First));
/// assert_eq!(
///     StreamOffset::parse("2026-12-07T16:00:00Z"),
///     Ok(StreamOffset::Timestamp(1_796_659_200_000))
/// );
/// assert!(StreamOffset::parse("yesterday").is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamOffset {
    /// The first message the stream still holds.
    #[default]
    First,
    /// The last chunk written: its messages and those after it.
    Last,
    /// Only messages written after the consumer subscribes.
    Next,
    /// The first chunk written at or after this time, in milliseconds since
    /// the Unix epoch (an RFC 3339 timestamp in config).
    Timestamp(i64),
}

impl StreamOffset {
    /// Reads `first`, `last`, `next` or an RFC 3339 timestamp
    /// (`2026-12-07T16:00:00Z`, `2026-12-07T17:00:00.5+01:00`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "first" => Ok(StreamOffset::First),
            "last" => Ok(StreamOffset::Last),
            "next" => Ok(StreamOffset::Next),
            other => rfc3339_millis(other).map(StreamOffset::Timestamp).ok_or_else(|| {
                format!(
                    "{other:?} is not first, last, next or an RFC 3339 timestamp such as 2026-12-07T16:00:00Z"
                )
            }),
        }
    }

    /// The timestamp `at` as an offset.
    pub fn at(at: SystemTime) -> Self {
        let ms = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        StreamOffset::Timestamp(ms)
    }
}

impl<'de> Deserialize<'de> for StreamOffset {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        StreamOffset::parse(&s).map_err(de::Error::custom)
    }
}

/// Milliseconds since the epoch of an RFC 3339 date-time.
fn rfc3339_millis(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut millis = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let first3: String = frac[..digits]
            .chars()
            .chain("000".chars())
            .take(3)
            .collect();
        millis = first3.parse::<i64>().ok()?;
        rest = &frac[digits..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && matches!(&rest[..1], "+" | "-") && &rest[3..4] == ":" => {
            let h: i64 = rest[1..3].parse().ok()?;
            let m: i64 = rest[4..6].parse().ok()?;
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            sign * (h * 60 + m)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_min * 60;
    Some(secs * 1_000 + millis)
}

/// How a stream consumer's stored offset is coalesced (key
/// `offset_store`): one store when `every` more messages are settled with
/// everything before them, or `within` after the first of them, whichever
/// comes first — and always at the drain. After a SIGKILL, what was
/// settled but not stored is read again: at most `every` messages, or
/// what settled within `within`.
///
/// ```yaml
/// offset_store: { every: 1000, within: 1s }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct OffsetStore {
    /// Settled messages per store (default 1,000; at least 1).
    pub every: u32,
    /// The longest a settled message waits for its store (default 1 s; at
    /// least 1 ms).
    #[serde(deserialize_with = "duration::deserialize")]
    pub within: Duration,
}

impl OffsetStore {
    /// The default `every`: 1,000.
    pub const DEFAULT_EVERY: u32 = 1_000;
    /// The default `within`: 1 s.
    pub const DEFAULT_WITHIN: Duration = Duration::from_secs(1);
}

impl Default for OffsetStore {
    fn default() -> Self {
        OffsetStore {
            every: OffsetStore::DEFAULT_EVERY,
            within: OffsetStore::DEFAULT_WITHIN,
        }
    }
}

/// The stream plugin's listener (top-level key `streams`): the credentials
/// and virtual host are the broker address's (`AMQP_ADDR`).
///
/// ```yaml
/// streams:
///   port: 5552                 # the rabbitmq_stream plugin's port
///   advertised_host: null      # connect here instead of the AMQP address's host
///   max_chunk_bytes: 67108864  # the largest chunk read (64 MiB)
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct StreamsConfig {
    /// The stream plugin's port (default 5552).
    pub port: u16,
    /// The host to connect to for streams (default: the host of the AMQP
    /// address acemq connected to). Set it where the plugin's
    /// `advertised_host` differs from the AMQP address, behind a load
    /// balancer say.
    pub advertised_host: Option<String>,
    /// The largest chunk a stream connection reads (default 64 MiB; at
    /// least 1 MiB). The broker sends a chunk whole, whatever frame size
    /// was negotiated, and a chunk holds at least one message: raise it
    /// above the broker's `max_message_size` where messages are larger.
    pub max_chunk_bytes: u32,
}

impl StreamsConfig {
    /// The default `port`: 5552.
    pub const DEFAULT_PORT: u16 = 5552;
    /// The default `max_chunk_bytes`: 64 MiB.
    pub const DEFAULT_MAX_CHUNK_BYTES: u32 = 64 * 1024 * 1024;
}

impl Default for StreamsConfig {
    fn default() -> Self {
        StreamsConfig {
            port: StreamsConfig::DEFAULT_PORT,
            advertised_host: None,
            max_chunk_bytes: StreamsConfig::DEFAULT_MAX_CHUNK_BYTES,
        }
    }
}

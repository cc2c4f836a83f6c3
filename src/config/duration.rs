//! serde helpers for [`Duration`] fields: a number of seconds (`10`, `0.5`)
//! or a string with a unit (`"400ms"`, `"10s"`, `"1.5s"`, `"2m"`, `"1h"`).
//!
//! Use with `#[serde(deserialize_with = "acemq::config::duration::deserialize")]`,
//! or `duration::option::deserialize` (with `#[serde(default)]`) for an
//! `Option<Duration>`.
//!
//! ```
//! use std::time::Duration;
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Settings {
//!     #[serde(deserialize_with = "acemq::config::duration::deserialize")]
//!     timeout: Duration,
//!     #[serde(default, deserialize_with = "acemq::config::duration::option::deserialize")]
//!     grace: Option<Duration>,
//! }
//!
//! let s: Settings = serde_json::from_str(r#"{ "timeout": "400ms" }"#).unwrap();
//! assert_eq!(s.timeout, Duration::from_millis(400));
//! assert_eq!(s.grace, None);
//! assert_eq!(acemq::config::duration::parse("1.5s"), Ok(Duration::from_millis(1500)));
//! ```

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

const EXPECTING: &str = "a duration: a number of seconds (10, 0.5) or a string with a unit \
                         (\"400ms\", \"10s\", \"1.5s\", \"2m\", \"1h\")";

/// Deserialises a [`Duration`] from a number of seconds or a string with
/// a unit.
///
/// See the example in the [module docs](self).
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    deserializer.deserialize_any(DurationVisitor)
}

/// The same for an `Option<Duration>`: absent (with `#[serde(default)]`)
/// or null is `None`. See the example in the [module docs](super).
pub mod option {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    use crate::config::duration::Seconds;

    /// Deserialises an `Option<Duration>`: null is `None`, anything else
    /// as [`super::deserialize`]. See the example in the [module
    /// docs](super).
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<Seconds>::deserialize(deserializer)?.map(|s| s.0))
    }
}

/// A newtype so `Option<Duration>` can be deserialised through serde's
/// own `Option` handling.
struct Seconds(Duration);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize(deserializer).map(Seconds)
    }
}

/// Parses `"10"` (seconds), `"0.5"`, `"400ms"`, `"10s"`, `"1.5s"`, `"2m"`
/// or `"1h"`. Whitespace around the number and unit is ignored, so
/// `"300 ms"` is accepted as 300 ms. The error is a message for a human.
///
/// ```
/// use std::time::Duration;
/// use acemq::config::duration::parse;
///
/// assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
/// assert_eq!(parse("300 ms"), Ok(Duration::from_millis(300)));
/// assert!(parse("soon").is_err());
/// ```
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim());
    let unit_nanos: u128 = match unit {
        "" | "s" => 1_000_000_000,
        "ms" => 1_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return Err(format!("invalid duration {text:?}: expected {EXPECTING}")),
    };
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) {
        return Err(format!("invalid duration {text:?}: expected {EXPECTING}"));
    }
    let too_long = || format!("duration {text:?} is too long");
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_long())?
    };
    // Up to 18 decimal places count; nanoseconds are the resolution.
    let frac = &frac[..frac.len().min(18)];
    let frac_nanos = if frac.is_empty() {
        0
    } else {
        let value: u128 = frac.parse().map_err(|_| too_long())?;
        value * unit_nanos / 10u128.pow(frac.len() as u32)
    };
    let nanos = whole
        .checked_mul(unit_nanos)
        .and_then(|n| n.checked_add(frac_nanos))
        .ok_or_else(too_long)?;
    from_nanos(nanos).ok_or_else(too_long)
}

fn from_nanos(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

struct DurationVisitor;

impl<'de> Visitor<'de> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTING)
    }

    fn visit_u64<E: de::Error>(self, secs: u64) -> Result<Duration, E> {
        Ok(Duration::from_secs(secs))
    }

    fn visit_i64<E: de::Error>(self, secs: i64) -> Result<Duration, E> {
        u64::try_from(secs)
            .map(Duration::from_secs)
            .map_err(|_| E::custom(format!("invalid duration {secs}: it is negative")))
    }

    fn visit_f64<E: de::Error>(self, secs: f64) -> Result<Duration, E> {
        if !secs.is_finite() || secs < 0.0 {
            return Err(E::custom(format!(
                "invalid duration {secs}: expected a finite, non-negative number of seconds"
            )));
        }
        // Round to the nanosecond, so 0.3 is 300 ms and not 299.999999 ms.
        let nanos = (secs * 1e9).round();
        if nanos >= u128::MAX as f64 {
            return Err(E::custom(format!("duration {secs} is too long")));
        }
        from_nanos(nanos as u128).ok_or_else(|| E::custom(format!("duration {secs} is too long")))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        parse(text).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::Deserialize;

    use crate::config::test_support::rejected;
    use crate::config::*;

    #[test]
    fn numbers_of_seconds_and_strings_with_units_parse_as_durations() {
        let cases = [
            ("10", Duration::from_secs(10)),
            ("\"10s\"", Duration::from_secs(10)),
            ("10s", Duration::from_secs(10)),
            ("\"400ms\"", Duration::from_millis(400)),
            ("0.5", Duration::from_millis(500)),
            ("0.3", Duration::from_millis(300)),
            ("\"1.5s\"", Duration::from_millis(1500)),
            ("\"0.3s\"", Duration::from_millis(300)),
            ("\"2m\"", Duration::from_secs(120)),
            ("\"1h\"", Duration::from_secs(3600)),
            ("\"10\"", Duration::from_secs(10)),
            ("\" 10 s \"", Duration::from_secs(10)),
            // A space between the number and the unit: accepted, documented.
            ("\"300 ms\"", Duration::from_millis(300)),
            ("300 ms", Duration::from_millis(300)),
        ];
        for (text, want) in cases {
            let config = Config::from_yaml_str(&format!(
                "shutdown_timeout: {text}\nqueues: [{{ name: q }}]"
            ))
            .unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(config.shutdown_timeout, want, "{text}");
        }
        let toml = Config::from_toml_str(
            "shutdown_timeout = \"400ms\"\nabandon_after = 0.5\n[[queues]]\nname = \"q\"",
        )
        .unwrap();
        assert_eq!(toml.shutdown_timeout, Duration::from_millis(400));
        assert_eq!(toml.abandon_after, Duration::from_millis(500));
    }

    #[test]
    fn a_malformed_or_negative_duration_is_rejected_naming_the_key_and_the_forms() {
        for text in ["\"10x\"", "\"ten\"", "\"1.2.3s\"", "\"s\"", "-1", "-0.5"] {
            let err = rejected(&format!("queues: [{{ name: q }}]\nabandon_after: {text}\n"));
            let message = err.to_string();
            assert!(
                matches!(
                    err,
                    ConfigError::Parse {
                        format: Format::Yaml,
                        ..
                    }
                ),
                "{message}"
            );
            assert!(message.contains("abandon_after"), "{text}: {message}");
            assert!(message.contains("duration"), "{text}: {message}");
        }
    }

    #[test]
    fn the_option_helper_reads_null_absent_and_present_durations() {
        #[derive(Deserialize)]
        struct Holder {
            #[serde(default, deserialize_with = "duration::option::deserialize")]
            wait: Option<Duration>,
        }
        let read = |yaml: &str| serde_yaml_ng::from_str::<Holder>(yaml).unwrap().wait;
        assert_eq!(read("{}"), None);
        assert_eq!(read("wait: null"), None);
        assert_eq!(read("wait: 3"), Some(Duration::from_secs(3)));
        assert_eq!(read("wait: 250ms"), Some(Duration::from_millis(250)));
    }
}

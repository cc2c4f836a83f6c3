//! The `duration` target's property: arbitrary text through
//! `acemq::config::duration::parse`, and through the serde helper
//! (`duration::deserialize`) as a JSON string and as JSON text.
//!
//! Shared by `fuzz/fuzz_targets/duration.rs` and the replay test
//! (`tests/fuzz_corpus.rs`).

use std::time::Duration;

use acemq::config::duration;
use acemq_layers::delay_label;

/// The units `parse` documents, with their length in nanoseconds.
const UNITS: [(&str, u128); 5] = [
    ("", 1_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// The property, on raw bytes (the fuzz target and the replay both call
/// this): the bytes as text, lossily.
pub(crate) fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    check_text(&text);
}

/// The property on one text.
pub(crate) fn check_text(text: &str) {
    let parsed = duration::parse(text);
    match &parsed {
        Ok(d) => check_accepted(text, *d),
        Err(message) => assert!(!message.is_empty()),
    }

    // Through serde, as a string: the same answer as `parse`.
    let as_string = serde_json::Value::String(text.to_owned());
    let via_serde = duration::deserialize(as_string);
    match (&parsed, &via_serde) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(_), Err(_)) => {}
        _ => panic!("parse and deserialize disagree on {text:?}: {parsed:?} / {via_serde:?}"),
    }

    // Through serde, as JSON text (numbers of seconds, negative and huge
    // ones included).
    let mut de = serde_json::Deserializer::from_str(text);
    if let Ok(d) = duration::deserialize(&mut de) {
        if let Ok(n) = text.trim().parse::<f64>() {
            // A number of seconds, rounded to the nanosecond.
            assert!(n >= 0.0, "{text:?} gave {d:?}");
            let diff = (d.as_secs_f64() - n).abs();
            assert!(diff <= 1e-9 + n * 1e-12, "{text:?} gave {d:?}");
        }
    }
}

/// An accepted text: a number and one of the documented units; the value
/// is the number times the unit, to the nanosecond below; printing it back
/// gives it again.
fn check_accepted(text: &str, d: Duration) {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    let unit_nanos = UNITS
        .iter()
        .find(|(u, _)| *u == unit)
        .unwrap_or_else(|| panic!("{text:?} accepted with the unit {unit:?}"))
        .1;
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    assert!(
        !whole.is_empty() || !frac.is_empty(),
        "{text:?} accepted without a number"
    );
    assert!(!frac.contains('.'), "{text:?} accepted with two points");

    // An independent reading, as an f64: within its precision (and the
    // truncation to the nanosecond) of the value.
    let n: f64 = format!("0{whole}.{frac}0").parse().unwrap_or(f64::NAN);
    let want = n * unit_nanos as f64 / 1e9;
    if want.is_finite() {
        let diff = (d.as_secs_f64() - want).abs();
        assert!(
            diff <= 1e-9 + want * 1e-12,
            "{text:?} gave {d:?}, not ~{want} s"
        );
    }

    // Printed back to the nanosecond, it parses to itself.
    let exact = format!("{}.{:09}s", d.as_secs(), d.subsec_nanos());
    assert_eq!(duration::parse(&exact), Ok(d), "{exact}");
    // And as a rung's label, when that is exact (whole seconds or ms).
    if d.subsec_nanos().is_multiple_of(1_000_000) {
        let label = delay_label(d);
        assert_eq!(duration::parse(&label), Ok(d), "{label}");
    }
}

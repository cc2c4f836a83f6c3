//! Printing: one JSON document for scripts, and the small text helpers a
//! person's output needs (bodies escaped, long texts cut, ages).

use std::time::Duration;

use serde::Serialize;

/// Prints `value` as one pretty JSON document on stdout.
pub(crate) fn json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        // Only a map with non-string keys fails; none is built here.
        Err(e) => eprintln!("acemq: could not write JSON: {e}"),
    }
}

/// At most `max` bytes of `bytes`, printable: UTF-8 text escaped as
/// [`acemq::layers::escape`] does (`\n`, `\\`, ESC as `\u{1b}`) and bytes
/// that are not UTF-8 as `\xNN`; `…` when cut.
pub(crate) fn escape_bytes(bytes: &[u8], max: usize) -> String {
    let (head, cut) = if bytes.len() > max {
        // Not in the middle of a character: back off over continuation
        // bytes (at most three).
        let mut end = max;
        while end > 0 && max - end < 3 && bytes[end] & 0xC0 == 0x80 {
            end -= 1;
        }
        (&bytes[..end], true)
    } else {
        (bytes, false)
    };
    let mut out = String::with_capacity(head.len() + 8);
    for chunk in head.utf8_chunks() {
        for c in chunk.valid().chars() {
            push_escaped(&mut out, c);
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    if cut {
        out.push('…');
    }
    out
}

/// One character as a person may see it: the escaping of every text from
/// a message ([`acemq::layers::escape`]).
fn push_escaped(out: &mut String, c: char) {
    // Writing to a String cannot fail.
    let _ = acemq::layers::escape::push_escaped(out, c);
}

/// `text` escaped as [`escape_bytes`] does, cut to at most `max` characters.
pub(crate) fn cut(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == max {
            out.push('…');
            break;
        }
        push_escaped(&mut out, c);
    }
    out
}

/// An age a person reads: `42s`, `3m12s`, `5h02m`, `3d04h`.
pub(crate) fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// `text` with the password of every `scheme://user:password@host` in it
/// replaced by `***` (for text that may echo what was typed, such as a
/// usage error naming an argument it did not expect).
pub(crate) fn scrub_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '/' | '`'))
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority
            .rfind('@')
            .map(|i| (&authority[..i], &authority[i..]))
        {
            Some((userinfo, host)) if userinfo.contains(':') => {
                let user = &userinfo[..userinfo.find(':').unwrap_or(0)];
                out.push_str(user);
                out.push_str(":***");
                out.push_str(host);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_echoed_text_are_hidden() {
        assert_eq!(
            scrub_passwords("unrecognized subcommand 'amqp://guest:s3cret@h:5672/%2f' found"),
            "unrecognized subcommand 'amqp://guest:***@h:5672/%2f' found"
        );
        assert_eq!(
            scrub_passwords("a amqps://u:p@x, b amqp://h/v"),
            "a amqps://u:***@x, b amqp://h/v"
        );
        assert_eq!(scrub_passwords("no url here"), "no url here");
    }

    #[test]
    fn bodies_are_shown_printable_and_cut() {
        assert_eq!(escape_bytes(b"{\"a\":1}", 64), "{\"a\":1}");
        assert_eq!(escape_bytes(b"a\nb\x00\xff", 64), "a\\nb\\u{0}\\xff");
        assert_eq!(escape_bytes(b"abcdef", 3), "abc…");
        assert_eq!(escape_bytes("héllo".as_bytes(), 2), "h…");
        assert_eq!(escape_bytes(b"a\xff\x80\x80\x80\x80", 5), "a\\xff…");
    }

    #[test]
    fn ages_read_as_a_person_writes_them() {
        assert_eq!(age(Duration::from_secs(42)), "42s");
        assert_eq!(age(Duration::from_secs(192)), "3m12s");
        assert_eq!(age(Duration::from_secs(5 * 3600 + 120)), "5h02m");
        assert_eq!(age(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d04h");
    }

    #[test]
    fn long_texts_are_cut() {
        assert_eq!(cut("boom\nbang", 100), "boom\\nbang");
        assert_eq!(cut("abcdef", 3), "abc…");
    }
}

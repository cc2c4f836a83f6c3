//! Text from a message, made safe for a person to read.
//!
//! Anything a publisher controls (a message id, a header, a handler's error
//! that quotes the body) may hold terminal escapes (`ESC [ 2 J` clears an
//! operator's screen), a newline that forges a whole log line, or Unicode
//! that reorders what is shown. Such text reaches a person only escaped:
//! - in the `acemq` command's output and in summaries written for a person
//!   (`acemq::replay::ReplayReport`'s `Display`, the topology plan),
//!   through [`escape`];
//! - in log lines, as a string field (`error = text.as_str()`), never in
//!   the event's message or a `%` (Display) field: tracing-subscriber's text
//!   format writes string fields in their Debug form (quoted, `\n`,
//!   `\u{1b}`) and its JSON format as JSON strings. A value that is not a
//!   string goes through [`Escaped`] (`order = %Escaped(&order.id)`).
//!
//! What is escaped, in the manner of [`char::escape_debug`]:
//! - `\n`, `\r`, `\t` as those two characters;
//! - `\` as `\\`, so an escaped text cannot pass for an escape;
//! - every other control character as `\u{..}` (ESC is `\u{1b}`);
//! - the line and paragraph separators (U+2028, U+2029) and the
//!   bidirectional controls (U+061C, U+200E, U+200F, U+202A to U+202E,
//!   U+2066 to U+2069) as `\u{..}`.
//!
//! Everything else is shown as it is, quotes included.
//!
//! ```
//! use acemq_layers::escape::{escape, Escaped};
//!
//! assert_eq!(escape("card declined\n\x1b[2J"), "card declined\\n\\u{1b}[2J");
//! assert_eq!(format!("{}", Escaped("it's \"fine\"")), "it's \"fine\"");
//! ```

use std::borrow::Cow;
use std::fmt;

/// `text` with what a terminal or a log reader would act on escaped (see
/// the [module docs](self)); borrowed when nothing needed escaping.
pub fn escape(text: &str) -> Cow<'_, str> {
    if text.chars().any(needs_escape) {
        Cow::Owned(Escaped(text).to_string())
    } else {
        Cow::Borrowed(text)
    }
}

/// Displays a string escaped (see the [module docs](self)), for a log
/// field: `error = %Escaped(&text)`. Its `Debug` is the same text in
/// double quotes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(needs_escape) {
            f.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            push_escaped(f, c)?;
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// Writes `c`, escaped when it needs it.
///
/// # Errors
///
/// The writer's.
pub fn push_escaped<W: fmt::Write + ?Sized>(out: &mut W, c: char) -> fmt::Result {
    match c {
        '\n' => out.write_str("\\n"),
        '\r' => out.write_str("\\r"),
        '\t' => out.write_str("\\t"),
        '\\' => out.write_str("\\\\"),
        c if needs_escape(c) => write!(out, "\\u{{{:x}}}", c as u32),
        c => out.write_char(c),
    }
}

/// Whether `c` is written escaped.
pub fn needs_escape(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_escapes_and_newlines_are_shown_not_acted_on() {
        let hostile = "boom\x1b[2J\r\nERROR forged line\u{7f}\u{9b}";
        let shown = escape(hostile);
        assert_eq!(shown, "boom\\u{1b}[2J\\r\\nERROR forged line\\u{7f}\\u{9b}");
        assert!(!shown.chars().any(char::is_control), "{shown}");
    }

    #[test]
    fn bidirectional_controls_and_separators_are_escaped() {
        assert_eq!(
            escape("a\u{202e}b\u{2028}c\u{2066}"),
            "a\\u{202e}b\\u{2028}c\\u{2066}"
        );
    }

    #[test]
    fn a_backslash_cannot_pass_for_an_escape() {
        assert_eq!(escape("a\\nb"), "a\\\\nb");
        assert_ne!(escape("a\\nb"), escape("a\nb"));
    }

    #[test]
    fn plain_text_is_borrowed_as_it_is() {
        assert!(matches!(
            escape("order 42: it's \"declined\" — héllo"),
            Cow::Borrowed(_)
        ));
        assert_eq!(format!("{:?}", Escaped("a\nb")), "\"a\\nb\"");
    }
}

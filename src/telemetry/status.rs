//! The status an OpenTelemetry span records when its delivery is
//! dead-lettered: the reason and the error, cut to a bound.

/// The longest span status description recorded on dead-letter (the full
/// error chain is in the copy's `x-acemq-error` header).
pub(crate) const MAX_STATUS_LEN: usize = 512;

/// A dead-lettered delivery's status description: the reason and the error,
/// cut to [`MAX_STATUS_LEN`] bytes.
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
pub(crate) fn status_description(reason: &str, error: &str) -> String {
    let mut description = format!("{reason}: {error}");
    truncate(&mut description, MAX_STATUS_LEN);
    description
}

/// Cuts `s` to at most `max` bytes on a character boundary, ending in `…`.
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max.saturating_sub('…'.len_utf8());
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn a_long_status_is_cut_on_a_character_boundary() {
        let mut s = "é".repeat(400);
        truncate(&mut s, 512);
        assert!(s.len() <= 512);
        assert!(s.ends_with('…'));
        let mut short = String::from("max-attempts: boom");
        truncate(&mut short, 512);
        assert_eq!(short, "max-attempts: boom");
    }
}

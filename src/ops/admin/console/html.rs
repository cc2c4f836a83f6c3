//! The console's HTML: escaping, the page frame, the style sheet and the
//! security headers every answer carries.

use std::fmt::Write as _;

use acemq_layers::escape::escape as escape_controls;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The `Content-Security-Policy` of every console answer: nothing from
/// anywhere but the style sheet of this server, no script at all, forms
/// posted to this server only, never framed.
pub(crate) const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The console's style sheet (`GET /console/style.css`): system fonts,
/// sizes in `rem` so that a 200 % zoom reflows rather than overflows, a
/// visible focus ring for keyboard use.
pub(crate) const STYLE: &str = r#"
:root { color-scheme: light dark; --fg: #1b1f24; --bg: #fff; --muted: #57606a; --line: #d0d7de; --accent: #0b5cad; --warn: #9a3412; --ok: #166534; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --bg: #0d1117; --muted: #9da7b3; --line: #30363d; --accent: #6cb6ff; --warn: #f0883e; --ok: #56d364; } }
* { box-sizing: border-box; }
body { margin: 0; font: 1rem/1.5 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
header, main, footer { padding: 0.75rem 1.25rem; max-width: 80rem; margin: 0 auto; }
header { display: flex; flex-wrap: wrap; gap: 1rem; align-items: center; border-bottom: 1px solid var(--line); }
header strong { font-size: 1.15rem; margin-right: auto; }
nav { display: flex; flex-wrap: wrap; gap: 1rem; align-items: center; }
a { color: var(--accent); }
a[aria-current="page"] { font-weight: 700; text-decoration: none; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.25rem; margin-top: 2rem; } h3 { font-size: 1.05rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
caption { text-align: left; }
th, td { text-align: left; padding: 0.3rem 0.7rem; border-bottom: 1px solid var(--line); vertical-align: top; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font-family: ui-monospace, monospace; font-size: 0.9rem; overflow-wrap: anywhere; }
pre { white-space: pre-wrap; border: 1px solid var(--line); padding: 0.5rem; max-width: 100%; }
form.inline { display: inline; margin: 0; }
button { font: inherit; padding: 0.3rem 0.9rem; border: 1px solid var(--accent); border-radius: 0.3rem; background: var(--bg); color: var(--accent); cursor: pointer; }
button.danger { border-color: var(--warn); color: var(--warn); }
button:hover { text-decoration: underline; }
:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
label { display: block; font-weight: 600; margin-bottom: 0.25rem; }
input { font: inherit; padding: 0.35rem; width: min(30rem, 100%); border: 1px solid var(--muted); border-radius: 0.3rem; background: var(--bg); color: var(--fg); }
.muted { color: var(--muted); }
.warn { color: var(--warn); font-weight: 600; }
.ok { color: var(--ok); font-weight: 600; }
.error { border-left: 4px solid var(--warn); padding: 0.5rem 0.75rem; }
.notice { border-left: 4px solid var(--accent); padding: 0.5rem 0.75rem; }
"#;

/// `text` for an HTML text node or a quoted attribute: terminal and
/// bidirectional controls escaped first (as the command line shows them),
/// then `& < > " '` as entities.
pub(crate) fn esc(text: &str) -> String {
    let text = escape_controls(text);
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The first `max` bytes of `bytes` as text (invalid UTF-8 as `\xNN`,
/// a cut marked with `…`), escaped for HTML.
pub(crate) fn esc_bytes(bytes: &[u8], max: usize) -> String {
    let mut end = bytes.len().min(max);
    // Not in the middle of a character: back off over continuation bytes
    // (at most three).
    let mut back = 0;
    while end < bytes.len() && end > 0 && back < 3 && bytes[end] & 0xC0 == 0x80 {
        end -= 1;
        back += 1;
    }
    let mut out = String::with_capacity(end + 8);
    for chunk in bytes[..end].utf8_chunks() {
        out.push_str(&esc(chunk.valid()));
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    if end < bytes.len() {
        out.push('…');
    }
    out
}

/// `segment` percent-encoded for one path segment of a link (everything
/// but the unreserved characters).
pub(crate) fn path_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Which part of the console a page belongs to, for the navigation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    /// No navigation: the login page, the page that says the console is off.
    None,
    /// The queues.
    Queues,
    /// The dead letters.
    DeadLetters,
}

/// A whole page: `title`, the navigation (with a log-out button) unless
/// `nav` is [`Nav::None`], then `body`.
pub(crate) fn page(title: &str, nav: Nav, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 1024);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"referrer\" content=\"same-origin\">\
         <title>{} · acemq console</title>\
         <link rel=\"stylesheet\" href=\"/console/style.css\"></head><body>\
         <header><strong>acemq console</strong>",
        esc(title)
    );
    if nav != Nav::None {
        let current = |n: Nav| {
            if n == nav {
                " aria-current=\"page\""
            } else {
                ""
            }
        };
        let _ = write!(
            out,
            "<nav aria-label=\"Console\"><a href=\"/console/\"{}>Queues</a>\
             <a href=\"/console/dead-letters\"{}>Dead letters</a>\
             <form class=\"inline\" method=\"post\" action=\"/console/logout\">\
             <button type=\"submit\">Log out</button></form></nav>",
            current(Nav::Queues),
            current(Nav::DeadLetters)
        );
    }
    let _ = writeln!(
        out,
        "</header><main id=\"main\"><h1>{}</h1>{body}</main></body></html>",
        esc(title)
    );
    out
}

/// `html` as an answer with `status` and the console's headers: the
/// [`CSP`], no caching, no sniffing, no framing, the referrer kept to this
/// origin.
pub(crate) fn respond(status: StatusCode, html: String) -> Response {
    let mut resp = (status, html).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secure(h);
    resp
}

/// The headers every console answer carries.
pub(crate) fn secure(h: &mut axum::http::HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
}

/// A `303 See Other` to `to` (after a form's POST), with the console's
/// headers.
pub(crate) fn see_other(to: &str) -> Response {
    let mut resp = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    secure(resp.headers_mut());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_controls_are_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(esc("a\u{202e}b\n"), "a\\u{202e}b\\n");
        assert_eq!(esc_bytes(b"<b>\xff", 10), "&lt;b&gt;\\xff");
        assert_eq!(esc_bytes("héllo".as_bytes(), 2), "h…");
        assert_eq!(path_segment("shop.orders/x y"), "shop.orders%2Fx%20y");
    }
}

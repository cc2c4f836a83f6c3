//! The console's pages, rendered on the server. Everything that comes from
//! a message or a queue name goes through [`esc`].

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use super::html::{esc, esc_bytes, page, path_segment, Nav};
use super::read::{Message, Read, ReadError};
use crate::app::health::QueueSnapshot;

/// The most messages listed on the dead-letters page for each queue.
pub(crate) const LISTED: usize = 100;

/// The longest error text shown in a list, in characters.
const ERROR_SHOWN: usize = 160;

/// The login page: one password field.
pub(crate) fn login(error: Option<&str>) -> String {
    let mut body = String::new();
    if let Some(e) = error {
        let _ = write!(body, "<p class=\"error\" role=\"alert\">{}</p>", esc(e));
    }
    body.push_str(
        "<form method=\"post\" action=\"/console/login\">\
         <label for=\"token\">Admin token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" \
         required autofocus>\
         <p class=\"muted\">The token in the service's <code>ACEMQ_ADMIN_TOKEN</code>. \
         Press Enter to log in.</p>\
         <button type=\"submit\">Log in</button></form>",
    );
    page("Log in", Nav::None, &body)
}

/// The page when no admin token is configured.
pub(crate) fn off() -> String {
    page(
        "The console is off",
        Nav::None,
        "<p>No admin token is configured, so the console (and every admin route that changes \
         state) is off.</p><p>Start the service with <code>ACEMQ_ADMIN_TOKEN</code> set to a \
         long random token (for example <code>openssl rand -hex 32</code>) where it reads it \
         through <code>acemq::admin::AdminToken::from_env</code>, or give one to \
         <code>acemq::admin::AdminRouter::token</code>; then log in here with it.</p>",
    )
}

fn state(q: &QueueSnapshot, draining: bool) -> &'static str {
    if draining {
        "draining"
    } else if q.paused {
        "paused"
    } else if q.consuming {
        "consuming"
    } else {
        "not consuming"
    }
}

/// The queues page.
pub(crate) fn queues(
    queues: &[QueueSnapshot],
    draining: bool,
    timeouts: &std::collections::BTreeMap<String, String>,
) -> String {
    let mut b = String::new();
    if draining {
        b.push_str(
            "<p class=\"notice\" role=\"status\">The drain has begun: the queues take nothing \
             new, and pause and resume no longer apply.</p>",
        );
    }
    if queues.is_empty() {
        b.push_str("<p>No queue is consumed yet (they appear once the service has started).</p>");
        return page("Queues", Nav::Queues, &b);
    }
    b.push_str(
        "<div class=\"scroll\"><table><caption class=\"muted\">Counts since the process \
         started</caption><thead><tr><th scope=\"col\">Queue</th><th scope=\"col\">State</th>\
         <th scope=\"col\">Circuit</th><th scope=\"col\" class=\"n\">In flight</th>\
         <th scope=\"col\" class=\"n\">Held</th><th scope=\"col\" class=\"n\">Handled</th>\
         <th scope=\"col\" class=\"n\">Retried</th><th scope=\"col\" class=\"n\">Dead-lettered</th>\
         <th scope=\"col\">Consumer timeout</th><th scope=\"col\">Action</th></tr></thead><tbody>",
    );
    for q in queues {
        let name = esc(&q.name);
        let seg = path_segment(&q.name);
        let st = state(q, draining);
        let circuit = match q.circuit {
            "closed" => "closed".to_owned(),
            c => format!("<span class=\"warn\">{}</span>", esc(&c.replace('_', "-"))),
        };
        let (verb, label) = if q.paused || q.circuit != "closed" {
            ("resume", "Resume")
        } else {
            ("pause", "Pause")
        };
        let action = if draining {
            "<span class=\"muted\">—</span>".to_owned()
        } else {
            format!(
                "<form class=\"inline\" method=\"post\" action=\"/console/queues/{seg}/{verb}\">\
                 <button type=\"submit\" aria-label=\"{label} {name}\">{label}</button></form>"
            )
        };
        let _ = write!(
            b,
            "<tr data-queue=\"{name}\" data-state=\"{st}\"><th scope=\"row\">{name}</th>\
             <td>{st}</td><td>{circuit}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td>\
             <td>{action}</td></tr>",
            q.in_flight,
            q.held,
            q.handled,
            q.retried,
            q.dead_lettered,
            timeouts
                .get(&q.name)
                .map_or_else(|| "the broker's".to_owned(), |t| esc(t)),
        );
    }
    b.push_str("</tbody></table></div>");
    page("Queues", Nav::Queues, &b)
}

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` and how long ago.
fn when(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let ago = (now - secs).max(0);
    let ago = match ago {
        s if s < 120 => format!("{s} s ago"),
        s if s < 7200 => format!("{} min ago", s / 60),
        s if s < 172_800 => format!("{} h ago", s / 3600),
        s => format!("{} days ago", s / 86_400),
    };
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC ({ago})",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// One dead-letter queue's section of the dead-letters page.
pub(crate) fn dead_letter_section(
    b: &mut String,
    queue: &str,
    dlq: &str,
    read: &Result<Read, ReadError>,
    limit: usize,
) {
    let seg = path_segment(queue);
    let name = esc(dlq);
    let read = match read {
        Ok(r) => r,
        Err(e) => {
            let _ = write!(
                b,
                "<section data-dlq=\"{name}\"><h2>{name}</h2><p class=\"error\">{}</p></section>",
                esc(&e.0)
            );
            return;
        }
    };
    let _ = write!(
        b,
        "<section data-dlq=\"{name}\" data-held=\"{}\" aria-labelledby=\"h-{seg}\">\
         <h2 id=\"h-{seg}\">{name}</h2>",
        read.held
    );
    if read.held == 0 {
        let _ = write!(
            b,
            "<p class=\"ok\">Empty: no dead letter of {}.</p></section>",
            esc(queue)
        );
        return;
    }
    let n = read.messages.len();
    let _ = write!(
        b,
        "<p>{} message{} ready. Counted from the {n} read{} (each given back to the queue, in \
         order).</p>",
        read.held,
        if read.held == 1 { "" } else { "s" },
        if n < read.held as usize {
            format!(" first: at most {limit} are read")
        } else {
            String::new()
        }
    );
    if let Some((oldest, newest)) = read.span_ms() {
        let _ = write!(
            b,
            "<p>Oldest dead-lettered {}; newest {}.</p>",
            when(oldest),
            when(newest)
        );
    }
    b.push_str(
        "<h3>By reason</h3><table><thead><tr><th scope=\"col\">Reason</th>\
         <th scope=\"col\" class=\"n\">Messages</th><th scope=\"col\">Action</th></tr></thead><tbody>",
    );
    for (reason, count) in read.by_reason() {
        let r = esc(&reason);
        let replay = if acemq_layers::Reason::from_header(&reason).is_some() {
            format!(
                "<form class=\"inline\" method=\"get\" action=\"/console/dead-letters/{seg}/replay\">\
                 <input type=\"hidden\" name=\"reason\" value=\"{r}\">\
                 <button type=\"submit\" aria-label=\"Replay the {r} messages of {name}\">Replay</button></form>"
            )
        } else {
            "<span class=\"muted\">replay all below</span>".to_owned()
        };
        let _ = write!(
            b,
            "<tr data-reason=\"{r}\"><th scope=\"row\">{r}</th><td class=\"n\">{count}</td><td>{replay}</td></tr>"
        );
    }
    b.push_str("</tbody></table><h3>By error</h3><div class=\"scroll\"><table><thead><tr>\
                <th scope=\"col\">Error (digits as #)</th><th scope=\"col\" class=\"n\">Messages</th>\
                </tr></thead><tbody>");
    for (error, count) in read.by_error() {
        let _ = write!(
            b,
            "<tr><td><code>{}</code></td><td class=\"n\">{count}</td></tr>",
            esc(&cut(&error, ERROR_SHOWN))
        );
    }
    b.push_str("</tbody></table></div>");
    let repeated = read.repeated_ids();
    if !repeated.is_empty() {
        let _ = write!(
            b,
            "<p class=\"warn\">{} message id{} occur more than once (marked ⚠ below).</p>",
            repeated.len(),
            if repeated.len() == 1 { "" } else { "s" }
        );
    }
    let _ = write!(
        b,
        "<h3>Messages</h3><p class=\"muted\">The first {} of those read. Select messages by their \
         id to replay only those.</p><form method=\"get\" action=\"/console/dead-letters/{seg}/replay\">\
         <div class=\"scroll\">\
         <table><thead><tr><th scope=\"col\">Select</th><th scope=\"col\" class=\"n\">#</th><th scope=\"col\">Message id</th>\
         <th scope=\"col\">Reason</th><th scope=\"col\" class=\"n\">Attempts</th>\
         <th scope=\"col\">Error</th></tr></thead><tbody>",
        n.min(LISTED)
    );
    for m in read.messages.iter().take(LISTED) {
        let id = m.message_id.as_deref().unwrap_or("");
        let mark = if repeated.contains_key(id) {
            " <span class=\"warn\" title=\"repeated message id\">⚠ repeated</span>"
        } else {
            ""
        };
        let shown = if id.is_empty() {
            "(none)".to_owned()
        } else {
            esc(&cut(id, 80))
        };
        let select = if id.is_empty() {
            String::new()
        } else {
            format!(
                "<input type=\"checkbox\" name=\"id\" value=\"{}\" aria-label=\"Select message {}\">",
                esc(id),
                m.position
            )
        };
        let _ = write!(
            b,
            "<tr><td>{select}</td><td class=\"n\">{pos}</td><td><a href=\"/console/dead-letters/{seg}/messages/{pos}\">{shown}</a>{mark}</td>\
             <td>{}</td><td class=\"n\">{}</td><td><code>{}</code></td></tr>",
            esc(m.reason.as_deref().unwrap_or("none")),
            m.attempts.map(|a| a.to_string()).unwrap_or_default(),
            esc(&cut(m.error.as_deref().unwrap_or(""), ERROR_SHOWN)),
            pos = m.position,
        );
    }
    let _ = write!(
        b,
        "</tbody></table></div><p><button type=\"submit\">Replay selected</button></p></form><p>\
         <a href=\"/console/dead-letters/{seg}/replay\">Replay all of {name}</a> · \
         <a href=\"/console/dead-letters/{seg}/purge\">Purge {name}</a></p></section>"
    );
}

/// The message page.
pub(crate) fn message(queue: &str, dlq: &str, m: &Message) -> String {
    let seg = path_segment(queue);
    let opt = |v: &Option<String>| v.as_deref().map_or_else(|| "—".to_owned(), esc);
    let mut b = format!(
        "<p><a href=\"/console/dead-letters#h-{seg}\">Back to {}</a></p><dl>",
        esc(dlq)
    );
    let rows = [
        ("Position", m.position.to_string()),
        ("Message id", opt(&m.message_id)),
        ("Reason", opt(&m.reason)),
        (
            "Attempts",
            m.attempts.map_or_else(|| "—".to_owned(), |a| a.to_string()),
        ),
        ("First seen in queue", opt(&m.queue)),
        ("Original exchange", opt(&m.exchange)),
        ("Original routing key", opt(&m.routing_key)),
        (
            "Dead-lettered",
            m.dead_lettered_at_ms.map_or_else(|| "—".to_owned(), when),
        ),
        ("Redelivered", m.redelivered.to_string()),
        ("Content type", opt(&m.content_type)),
    ];
    for (k, v) in rows {
        let _ = write!(b, "<dt>{k}</dt><dd>{v}</dd>");
    }
    let _ = write!(
        b,
        "</dl><h2>Error</h2><pre>{}</pre><h2>Headers</h2><div class=\"scroll\"><table><thead><tr>\
         <th scope=\"col\">Header</th><th scope=\"col\">Value</th></tr></thead><tbody>",
        esc(m.error.as_deref().unwrap_or("(none)"))
    );
    for (k, v) in &m.headers {
        let _ = write!(
            b,
            "<tr><th scope=\"row\"><code>{}</code></th><td><code>{}</code></td></tr>",
            esc(k),
            esc(v)
        );
    }
    let _ = write!(
        b,
        "</tbody></table></div><h2>Body</h2><p class=\"muted\">{} bytes{}</p><pre>{}</pre>",
        m.body_len,
        if m.body_len > m.body.len() {
            format!("; the first {} shown", m.body.len())
        } else {
            String::new()
        },
        esc_bytes(&m.body, m.body.len())
    );
    if let Some(id) = &m.message_id {
        let _ = write!(
            b,
            "<form method=\"get\" action=\"/console/dead-letters/{seg}/replay\">\
             <input type=\"hidden\" name=\"id\" value=\"{}\">\
             <button type=\"submit\">Replay this message</button></form>",
            esc(id)
        );
    }
    let title = format!("Message {} of {dlq}", m.position);
    page(&title, Nav::DeadLetters, &b)
}

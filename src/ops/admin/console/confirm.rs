//! The confirmations before a replay or a purge (each says how many
//! messages), and the page after an action.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::html::{esc, page, path_segment, Nav};
use super::read::Read;

/// The confirmation before a replay: how many messages it moves, with
/// `reason`, of the `ids` selected (every message when neither).
pub(crate) fn confirm_replay(
    queue: &str,
    dlq: &str,
    reason: Option<&str>,
    ids: Option<&BTreeSet<String>>,
    read: &Read,
) -> String {
    let seg = path_segment(queue);
    let count = if reason.is_none() && ids.is_none() {
        read.held as usize
    } else {
        read.messages
            .iter()
            .filter(|m| reason.is_none_or(|r| m.reason.as_deref() == Some(r)))
            .filter(|m| {
                ids.is_none_or(|ids| m.message_id.as_ref().is_some_and(|id| ids.contains(id)))
            })
            .count()
    };
    let partial = reason.is_some() && ids.is_none() && read.messages.len() < read.held as usize;
    let mut what = String::new();
    let mut hidden = String::new();
    if let Some(r) = reason {
        let _ = write!(what, "with reason <strong>{}</strong> ", esc(r));
        let _ = write!(
            hidden,
            "<input type=\"hidden\" name=\"reason\" value=\"{}\">",
            esc(r)
        );
    }
    if let Some(ids) = ids {
        let _ = write!(what, "selected by message id ");
        for id in ids {
            let _ = write!(
                hidden,
                "<input type=\"hidden\" name=\"id\" value=\"{}\">",
                esc(id)
            );
        }
    }
    let body = format!(
        "<p data-count=\"{count}\">Replay {}{count} message{} {what}from <code>{}</code> to \
         <code>{}</code>? Each is published back with its attempt count reset, confirmed by the \
         broker, and only then removed from the dead-letter queue.</p>\
         <form method=\"post\" action=\"/console/dead-letters/{seg}/replay\">{hidden}\
         <button type=\"submit\">Confirm replay of {count} message{}</button> \
         <a href=\"/console/dead-letters#h-{seg}\">Cancel</a></form>",
        if partial { "at least " } else { "" },
        if count == 1 { "" } else { "s" },
        esc(dlq),
        esc(queue),
        if count == 1 { "" } else { "s" },
    );
    page("Confirm replay", Nav::DeadLetters, &body)
}

/// The confirmation before a purge: how many messages it deletes.
pub(crate) fn confirm_purge(queue: &str, dlq: &str, held: u32) -> String {
    let seg = path_segment(queue);
    let body = format!(
        "<p data-count=\"{held}\">Purge <code>{}</code>? Its {held} message{} (and any that \
         arrive before you confirm) are deleted for good.</p>\
         <form method=\"post\" action=\"/console/dead-letters/{seg}/purge\">\
         <button type=\"submit\" class=\"danger\">Confirm purge of {held} message{}</button> \
         <a href=\"/console/dead-letters#h-{seg}\">Cancel</a></form>",
        esc(dlq),
        if held == 1 { "" } else { "s" },
        if held == 1 { "" } else { "s" },
    );
    page("Confirm purge", Nav::DeadLetters, &body)
}

/// The page after an action, or an error: `text` and a link back.
pub(crate) fn outcome(title: &str, text: &str, ok: bool) -> String {
    let class = if ok { "notice" } else { "error" };
    let body = format!(
        "<p class=\"{class}\" role=\"status\">{}</p><p><a href=\"/console/dead-letters\">Back to \
         the dead letters</a> · <a href=\"/console/\">Queues</a></p>",
        esc(text)
    );
    page(title, Nav::DeadLetters, &body)
}

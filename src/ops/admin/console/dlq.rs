//! The dead-letter pages: every `.dlq` of the config, a message, and the
//! replay and purge with their confirmations.

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tracing::{info, warn};

use super::html::{self, respond};
use super::state::{bad_request, field, form, peer, Console, Denied};
use super::{confirm, pages, read};
use crate::replay::{replay_dead_letters, ReplayOptions};

pub(crate) async fn dead_letters(State(c): State<Console>, headers: HeaderMap) -> Response {
    if let Err(page) = c.access(&headers) {
        return *page;
    }
    let mut body = String::new();
    if c.config.queues.is_empty() {
        body.push_str("<p>No queue of the config has <code>dead_letter: true</code>.</p>");
    }
    for queue in &c.config.queues {
        let dlq = acemq_layers::dead_letter::dlq_name(queue);
        let read = read::read(
            &c.config.broker,
            &c.connection_name(),
            &dlq,
            c.config.read_limit,
        )
        .await;
        pages::dead_letter_section(&mut body, queue, &dlq, &read, c.config.read_limit);
    }
    respond(
        StatusCode::OK,
        html::page("Dead letters", html::Nav::DeadLetters, &body),
    )
}

fn no_such_dlq(queue: &str) -> Response {
    respond(
        StatusCode::NOT_FOUND,
        confirm::outcome(
            "No such dead-letter queue",
            &format!("{queue:?} is not a queue of this service's config with dead_letter: true."),
            false,
        ),
    )
}

pub(crate) async fn message(
    State(c): State<Console>,
    Path((queue, n)): Path<(String, usize)>,
    headers: HeaderMap,
) -> Response {
    if let Err(page) = c.access(&headers) {
        return *page;
    }
    if !c.is_dead_lettered(&queue) {
        return no_such_dlq(&queue);
    }
    let dlq = acemq_layers::dead_letter::dlq_name(&queue);
    if n == 0 || n > c.config.read_limit {
        return bad_request(&format!(
            "messages are numbered from 1 to the read limit, {}",
            c.config.read_limit
        ));
    }
    match read::read(&c.config.broker, &c.connection_name(), &dlq, n).await {
        Ok(r) => match r.messages.get(n - 1) {
            Some(m) => respond(StatusCode::OK, pages::message(&queue, &dlq, m)),
            None => respond(
                StatusCode::NOT_FOUND,
                confirm::outcome(
                    "No such message",
                    &format!("{dlq} holds {} messages now, not {n}.", r.held),
                    false,
                ),
            ),
        },
        Err(e) => respond(
            StatusCode::BAD_GATEWAY,
            confirm::outcome("Could not read", &e.0, false),
        ),
    }
}

/// The message ids a replay is limited to (each `id` field), if any.
fn ids_of(fields: &[(String, String)]) -> Option<std::collections::BTreeSet<String>> {
    let ids: std::collections::BTreeSet<String> = fields
        .iter()
        .filter(|(k, v)| k == "id" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect();
    (!ids.is_empty()).then_some(ids)
}

/// The reason a replay is limited to, from a form or query: `Ok(None)`
/// for all, an error page for a reason acemq does not write.
fn reason_of(fields: &[(String, String)]) -> Result<Option<acemq_layers::Reason>, Denied> {
    match field(fields, "reason") {
        None => Ok(None),
        Some(r) => acemq_layers::Reason::from_header(r)
            .map(Some)
            .ok_or_else(|| {
                Box::new(bad_request(&format!(
                "{r:?} is not a reason acemq writes (rejected, max-attempts, panic, timeout, …)"
            )))
            }),
    }
}

pub(crate) async fn confirm(
    State(c): State<Console>,
    Path((queue, action)): Path<(String, String)>,
    req: Request,
) -> Response {
    if let Err(page) = c.access(req.headers()) {
        return *page;
    }
    if !c.is_dead_lettered(&queue) {
        return no_such_dlq(&queue);
    }
    let dlq = acemq_layers::dead_letter::dlq_name(&queue);
    let fields: Vec<(String, String)> =
        url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
    let limit = match action.as_str() {
        "replay" => c.config.read_limit,
        "purge" => 0,
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let reason = match reason_of(&fields) {
        Ok(r) => r,
        Err(page) => return *page,
    };
    match read::read(&c.config.broker, &c.connection_name(), &dlq, limit).await {
        Ok(r) if action == "purge" => {
            respond(StatusCode::OK, confirm::confirm_purge(&queue, &dlq, r.held))
        }
        Ok(r) => respond(
            StatusCode::OK,
            confirm::confirm_replay(
                &queue,
                &dlq,
                reason.map(|r| r.as_str()),
                ids_of(&fields).as_ref(),
                &r,
            ),
        ),
        Err(e) => respond(
            StatusCode::BAD_GATEWAY,
            confirm::outcome("Could not read", &e.0, false),
        ),
    }
}

pub(crate) async fn act(
    State(c): State<Console>,
    Path((queue, action)): Path<(String, String)>,
    req: Request,
) -> Response {
    let peer = peer(&req);
    if let Err(page) = c.control(req.headers(), &peer, &action) {
        return *page;
    }
    if !c.is_dead_lettered(&queue) {
        return no_such_dlq(&queue);
    }
    let dlq = acemq_layers::dead_letter::dlq_name(&queue);
    let Some(fields) = form(req).await else {
        return bad_request("send the form's fields as application/x-www-form-urlencoded");
    };
    match action.as_str() {
        "replay" => {
            let reason = match reason_of(&fields) {
                Ok(r) => r,
                Err(page) => return *page,
            };
            let mut options = ReplayOptions::new();
            if let Some(r) = reason {
                options = options.only_reason(r);
            }
            let ids = ids_of(&fields);
            let selected = ids.as_ref().map_or(0, |ids| ids.len());
            if let Some(ids) = ids {
                options = options.only_message_ids(ids);
            }
            let wanted = reason.map_or("all", |r| r.as_str());
            info!(queue = ?queue, reason = wanted, selected, %peer, "console: replay of {dlq} asked by an operator");
            match replay_dead_letters(&c.config.broker, &queue, options).await {
                Ok(report) => {
                    info!(queue = ?queue, moved = report.moved, skipped = report.skipped, not_selected = report.not_selected, %peer, "console: replay done");
                    respond(
                        StatusCode::OK,
                        confirm::outcome("Replayed", &report.to_string(), true),
                    )
                }
                Err(e) => {
                    warn!(queue = ?queue, %peer, error = e.to_string().as_str(), "console: replay failed");
                    respond(
                        StatusCode::BAD_GATEWAY,
                        confirm::outcome("Replay failed", &e.to_string(), false),
                    )
                }
            }
        }
        "purge" => match read::purge(&c.config.broker, &c.connection_name(), &dlq).await {
            Ok(n) => {
                info!(queue = ?queue, purged = n, %peer, "console: {dlq} purged by an operator");
                respond(
                    StatusCode::OK,
                    confirm::outcome("Purged", &format!("purged {n} messages from {dlq}"), true),
                )
            }
            Err(e) => respond(
                StatusCode::BAD_GATEWAY,
                confirm::outcome("Purge failed", &e.0, false),
            ),
        },
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

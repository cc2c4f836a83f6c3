//! The operator's console: pages of the admin router under `/console/`
//! (feature `console`), behind the admin token.
//!
//! [`AdminRouter::console`](super::AdminRouter::console) adds them, given a
//! [`ConsoleConfig`] (the queues and their dead-letter queues, from the
//! [`Config`], and the broker's address to read those from):
//!
//! | page | what |
//! |---|---|
//! | `GET /console/` | each queue's state (consuming, paused, draining), circuit, in flight, held, handled, retried, dead-lettered; pause and resume |
//! | `GET /console/dead-letters` | each `.dlq` of the config: counts by reason and by error (digits grouped), the oldest and newest, repeated message ids, the first messages |
//! | `GET /console/dead-letters/{queue}/messages/{n}` | the `n`th message: headers, reason, error, attempts, first-seen queue and exchange, body preview |
//! | `GET /console/dead-letters/{queue}/replay[?reason=R]` | the confirmation: how many messages a replay moves |
//! | `POST /console/dead-letters/{queue}/replay` | the replay ([`replay_dead_letters`]: confirmed publishes, acknowledged after) |
//! | `GET`, `POST /console/dead-letters/{queue}/purge` | the confirmation, then the purge |
//!
//! Counting means reading: each dead-letter queue's first
//! [`read_limit`](ConsoleConfig::read_limit) messages (1,000 by default)
//! are taken with `basic.get`, never acknowledged, and given back in order
//! as their channel closes (as `acemq dlq peek` does); the page says how
//! many it read. On a quorum queue each read raises the messages'
//! `x-delivery-count` by one.
//!
//! # Access
//!
//! With no admin token configured every page says how to turn the console
//! on (`403`). Without a session a page is the login form alone (`401`):
//! one password field, whose token a `POST /console/login` exchanges for a
//! random session id (256 bits, kept in memory for 8 hours; never the token)
//! in an `HttpOnly`, `SameSite=Strict`, `Path=/console` cookie. Every form
//! that changes state is a `POST`; with the cookie it must also come from
//! this origin (`Origin`, else `Referer`, when the browser sends one).
//! Each control action also takes the token as `Authorization: Bearer`,
//! and each is logged (target `acemq::ops::admin::console`) with the queue
//! and the peer.
//!
//! The pages are rendered on the server, with no script and no asset from
//! outside the binary, under `Content-Security-Policy: default-src 'none';
//! style-src 'self'; form-action 'self'; frame-ancestors 'none'`. Text
//! from a message is escaped.
mod confirm;
mod dlq;
mod html;
mod pages;
mod read;
mod session;
mod state;

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tracing::{info, warn};

use super::auth::AdminToken;
use crate::app::health::Health;
use html::{respond, see_other};
use state::{field, form, peer, Console};

pub use state::ConsoleConfig;

/// The console's routes over `health`, `token` and `config`.
pub(super) fn routes(health: Health, token: Option<AdminToken>, config: ConsoleConfig) -> Router {
    let console = Console {
        health,
        token,
        config: Arc::new(config),
        sessions: session::Sessions::default(),
    };
    Router::new()
        .route("/console", get(|| async { see_other("/console/") }))
        .route("/console/", get(queues))
        .route("/console/style.css", get(style))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", axum::routing::post(logout))
        .route(
            "/console/queues/{name}/{verb}",
            axum::routing::post(control),
        )
        .route("/console/dead-letters", get(dlq::dead_letters))
        .route(
            "/console/dead-letters/{queue}/messages/{n}",
            get(dlq::message),
        )
        .route(
            "/console/dead-letters/{queue}/{action}",
            get(dlq::confirm).post(dlq::act),
        )
        .with_state(console)
}

async fn style() -> Response {
    let mut resp = html::STYLE.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/css; charset=utf-8"),
    );
    html::secure(h);
    resp
}

async fn login_page(State(c): State<Console>, headers: HeaderMap) -> Response {
    match c.access(&headers) {
        Ok(_) => see_other("/console/"),
        Err(page) => *page,
    }
}

async fn login(State(c): State<Console>, req: Request) -> Response {
    let Some(token) = c.token.clone() else {
        return respond(StatusCode::FORBIDDEN, pages::off());
    };
    let peer = peer(&req);
    if !session::same_origin(req.headers()) {
        warn!(%peer, "console: a login form from another origin refused");
        return respond(
            StatusCode::FORBIDDEN,
            pages::login(Some("Log in from this console's own page.")),
        );
    }
    let fields = form(req).await.unwrap_or_default();
    let presented = field(&fields, "token").unwrap_or("");
    if !token.matches(presented.as_bytes()) {
        warn!(%peer, "console: a login with a wrong token refused");
        return respond(
            StatusCode::UNAUTHORIZED,
            pages::login(Some("That is not the admin token.")),
        );
    }
    match c.sessions.open() {
        Ok(id) => {
            info!(%peer, "console: logged in");
            let mut resp = see_other("/console/");
            resp.headers_mut().insert(
                header::SET_COOKIE,
                session::set_cookie(&id, c.config.secure_cookie),
            );
            resp
        }
        Err(e) => respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            pages::login(Some(&format!("No session could be made: {}", e.0))),
        ),
    }
}

async fn logout(State(c): State<Console>, headers: HeaderMap) -> Response {
    if session::same_origin(&headers) {
        c.sessions.close(&headers);
    }
    let mut resp = see_other("/console/");
    resp.headers_mut()
        .insert(header::SET_COOKIE, session::clear_cookie());
    resp
}

async fn queues(State(c): State<Console>, headers: HeaderMap) -> Response {
    if let Err(page) = c.access(&headers) {
        return *page;
    }
    let snap = c.health.snapshot();
    respond(
        StatusCode::OK,
        pages::queues(&snap.queues, c.health.is_draining(), &c.config.timeouts),
    )
}

async fn control(
    State(c): State<Console>,
    Path((name, verb)): Path<(String, String)>,
    req: Request,
) -> Response {
    let peer = peer(&req);
    if let Err(page) = c.control(req.headers(), &peer, &verb) {
        return *page;
    }
    if c.health.is_draining() {
        return respond(
            StatusCode::CONFLICT,
            confirm::outcome(
                "Refused",
                "The drain has begun: pause and resume no longer apply.",
                false,
            ),
        );
    }
    let done = match verb.as_str() {
        "pause" => c.health.pause(&name),
        "resume" => c.health.resume(&name),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    match done {
        Ok(()) => {
            info!(route = %verb, queue = ?name, %peer, "console: queue {verb}d by an operator");
            see_other("/console/")
        }
        Err(e) => respond(
            StatusCode::NOT_FOUND,
            confirm::outcome("No such queue", &e.to_string(), false),
        ),
    }
}

#[cfg(test)]
mod tests {
    //! Access to the pages, in memory (the dead-letter pages against the
    //! broker are in `tests/broker/console.rs`).

    use std::sync::Arc;

    use acemq_layers::PauseHandle;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;
    use crate::config::Config;
    use crate::consumer::QueueStats;

    const TOKEN: &str = "console-test-token-0123456789";

    fn console(token: Option<&str>) -> (Router, PauseHandle) {
        let health = Health::new();
        let gate = PauseHandle::new();
        health.add_queue("shop.orders", gate.clone(), Arc::new(QueueStats::default()));
        let mut q = crate::config::QueueConfig::new("shop.orders");
        q.dead_letter = true;
        q.kind = crate::config::QueueType::Quorum;
        q.consumer_timeout = Some(std::time::Duration::from_secs(20));
        let config = ConsoleConfig::new(&Config::new([q]), "amqp://127.0.0.1:1/%2f");
        let token = token.map(|t| AdminToken::new(t).unwrap());
        (routes(health, token, config), gate)
    }

    async fn send(router: &Router, req: Request<Body>) -> (StatusCode, HeaderMap, String) {
        let resp = router.clone().oneshot(req).await.expect("infallible");
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    }

    fn get(uri: &str, cookie: Option<&str>) -> Request<Body> {
        let mut r = Request::get(uri).header(header::HOST, "admin:8080");
        if let Some(c) = cookie {
            r = r.header(header::COOKIE, c);
        }
        r.body(Body::empty()).unwrap()
    }

    fn post(uri: &str, cookie: Option<&str>, origin: Option<&str>, body: &str) -> Request<Body> {
        let mut r = Request::post(uri)
            .header(header::HOST, "admin:8080")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(c) = cookie {
            r = r.header(header::COOKIE, c);
        }
        if let Some(o) = origin {
            r = r.header(header::ORIGIN, o);
        }
        r.body(Body::from(body.to_owned())).unwrap()
    }

    /// Logs in and returns the `Cookie` header to send.
    async fn log_in(router: &Router) -> String {
        let (status, headers, _) = send(
            router,
            post(
                "/console/login",
                None,
                Some("http://admin:8080"),
                &format!("token={TOKEN}"),
            ),
        )
        .await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        let set = headers[header::SET_COOKIE].to_str().unwrap().to_owned();
        set.split(';').next().unwrap().to_owned()
    }

    #[tokio::test]
    async fn without_a_token_configured_every_page_says_how_to_turn_it_on() {
        let (router, _) = console(None);
        for uri in ["/console/", "/console/dead-letters"] {
            let (status, headers, body) = send(&router, get(uri, None)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{uri}");
            assert!(body.contains("ACEMQ_ADMIN_TOKEN"), "{body}");
            assert_eq!(headers[header::CONTENT_SECURITY_POLICY], html::CSP);
        }
    }

    #[tokio::test]
    async fn without_the_cookie_a_page_is_only_the_login_form() {
        let (router, _) = console(Some(TOKEN));
        for uri in [
            "/console/",
            "/console/dead-letters",
            "/console/dead-letters/shop.orders/purge",
        ] {
            let (status, headers, body) = send(&router, get(uri, None)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri}");
            assert_eq!(body.matches("<input").count(), 1, "{body}");
            assert!(body.contains("type=\"password\""), "{body}");
            assert!(
                !body.contains("shop.orders") && !body.contains("<nav"),
                "{body}"
            );
            assert!(headers[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap()
                .starts_with("default-src 'none'"));
            assert_eq!(headers[header::CACHE_CONTROL], "no-store");
        }
    }

    #[tokio::test]
    async fn a_wrong_token_is_the_form_again_and_the_right_one_a_strict_cookie_not_the_token() {
        let (router, _) = console(Some(TOKEN));
        let wrong = post(
            "/console/login",
            None,
            None,
            "token=console-test-token-012345678X",
        );
        let (status, headers, body) = send(&router, wrong).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(body.contains("not the admin token") && body.contains("type=\"password\""));
        assert!(headers.get(header::SET_COOKIE).is_none());

        let right = post("/console/login", None, None, &format!("token={TOKEN}"));
        let (status, headers, _) = send(&router, right).await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        assert_eq!(headers[header::LOCATION], "/console/");
        let set = headers[header::SET_COOKIE].to_str().unwrap();
        for part in [
            "acemq_console=",
            "HttpOnly",
            "SameSite=Strict",
            "Path=/console",
        ] {
            assert!(set.contains(part), "{set}");
        }
        assert!(!set.contains(TOKEN), "the cookie is not the token: {set}");

        let cookie = log_in(&router).await;
        let (status, _, body) = send(&router, get("/console/", Some(&cookie))).await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains("data-queue=\"shop.orders\" data-state=\"consuming\""),
            "{body}"
        );

        let (status, headers, _) =
            send(&router, post("/console/logout", Some(&cookie), None, "")).await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        assert!(headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0"));
        let (status, _, _) = send(&router, get("/console/", Some(&cookie))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "the session ended");
    }

    #[tokio::test]
    async fn a_pause_form_needs_the_cookie_and_this_origin_or_the_bearer_token() {
        let (router, gate) = console(Some(TOKEN));
        let cookie = log_in(&router).await;
        let uri = "/console/queues/shop.orders/pause";
        let (status, _, _) = send(&router, post(uri, None, None, "")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let evil = post(uri, Some(&cookie), Some("https://evil.example"), "");
        let (status, _, body) = send(&router, evil).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(!gate.is_paused());

        let ours = post(uri, Some(&cookie), Some("http://admin:8080"), "");
        let (status, headers, _) = send(&router, ours).await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        assert_eq!(headers[header::LOCATION], "/console/");
        assert!(gate.is_paused());
        let (_, _, body) = send(&router, get("/console/", Some(&cookie))).await;
        assert!(body.contains("data-state=\"paused\""), "{body}");
        assert!(body.contains("aria-label=\"Resume shop.orders\""), "{body}");

        let bearer = Request::post("/console/queues/shop.orders/resume")
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(header::ORIGIN, "https://evil.example")
            .body(Body::empty())
            .unwrap();
        let (status, _, _) = send(&router, bearer).await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        assert!(!gate.is_paused());
    }

    #[tokio::test]
    async fn a_queue_without_a_dead_letter_queue_is_a_404_and_a_bad_reason_a_400() {
        let (router, _) = console(Some(TOKEN));
        let cookie = log_in(&router).await;
        let (status, _, body) = send(
            &router,
            get("/console/dead-letters/other/replay", Some(&cookie)),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("&quot;other&quot;"), "{body}");
        let uri = "/console/dead-letters/shop.orders/replay?reason=%3Cscript%3E";
        let (status, _, body) = send(&router, get(uri, Some(&cookie))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            body.contains("&lt;script&gt;") && !body.contains("<script>"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn the_style_sheet_is_served_from_the_binary() {
        let (router, _) = console(Some(TOKEN));
        let (status, headers, body) = send(&router, get("/console/style.css", None)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], "text/css; charset=utf-8");
        assert!(body.contains(":focus-visible"));
    }

    #[tokio::test]
    async fn the_queues_page_shows_each_queues_consumer_timeout() {
        let (router, _) = console(Some(TOKEN));
        let cookie = log_in(&router).await;
        let (status, _, page) = send(&router, get("/console/", Some(&cookie))).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(
            page.contains("<th scope=\"col\">Consumer timeout</th>"),
            "{page}"
        );
        assert!(page.contains("<td>20s (consumer_timeout)</td>"), "{page}");
    }
}

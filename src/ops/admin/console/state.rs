//! The console's state and what every page asks of a request: access
//! (a session or the bearer token), a form's fields, the peer.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Request};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use tracing::warn;

use super::html::respond;
use super::session::{self, Sessions};
use super::{confirm, pages};
use crate::app::health::Health;
use crate::config::Config;
use crate::connection::redact;
use crate::ops::admin::auth::{self, AdminToken};

/// What the operator's console needs beyond the admin router's
/// [`Health`]: the queues whose dead letters it shows and the broker to
/// read them from. [`AdminRouter::console`](crate::admin::AdminRouter::console)
/// adds its pages (feature `console`):
///
/// | page | what |
/// |---|---|
/// | `GET /console/` | each queue's state, circuit, in flight, held, handled, retried, dead-lettered; pause and resume |
/// | `GET /console/dead-letters` | each `.dlq` of the config: counts by reason and by error (digits grouped), the oldest and newest, repeated message ids, the first messages |
/// | `GET /console/dead-letters/{queue}/messages/{n}` | the `n`th message: headers, reason, error, attempts, first-seen queue and exchange, body preview |
/// | `GET`, `POST /console/dead-letters/{queue}/replay` | the confirmation (`?reason=R`, `?id=ID&id=ID…` for a selection, or all), then the replay ([`replay_dead_letters`](crate::replay::replay_dead_letters)) |
/// | `GET`, `POST /console/dead-letters/{queue}/purge` | the confirmation, then the purge |
///
/// Counting reads: the first [`read_limit`](Self::read_limit) messages of
/// each dead-letter queue are taken with `basic.get` and given back in
/// order as their channel closes, never acknowledged.
///
/// With no admin token configured every page says how to turn the console
/// on (`403`); without a session a page is the login form alone (`401`),
/// whose token `POST /console/login` exchanges for a random session id in
/// an `HttpOnly`, `SameSite=Strict`, `Path=/console` cookie. Every action
/// is a `POST`, refused when its `Origin` (else `Referer`) names another
/// host, also accepted with `Authorization: Bearer`, and logged. No
/// script, no asset from outside the binary, a strict
/// `Content-Security-Policy`; everything from a message is escaped.
///
/// ```
/// use acemq::admin::{AdminRouter, AdminToken, ConsoleConfig};
///
/// let config = acemq::Config::from_path("examples/shop.yaml").unwrap();
/// let console = ConsoleConfig::new(&config, "amqp://guest:guest@127.0.0.1:5672/%2f")
///     .read_limit(500);
/// let admin: axum::Router = AdminRouter::new(acemq::Health::new())
///     .token(AdminToken::new("3f9c2a7e5b1d4c8a9e6f0b2d").unwrap())
///     .console(console)
///     .build();
/// # let _ = admin;
/// ```
#[derive(Clone)]
pub struct ConsoleConfig {
    pub(crate) broker: String,
    /// The queues with a dead-letter queue, in config order.
    pub(crate) queues: Vec<String>,
    /// Each consumed queue's consumer timeout as the config gives it, and
    /// where from; absent: the broker's own.
    pub(crate) timeouts: std::collections::BTreeMap<String, String>,
    pub(crate) read_limit: usize,
    pub(crate) secure_cookie: bool,
}

impl std::fmt::Debug for ConsoleConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleConfig")
            .field("broker", &redact(&self.broker))
            .field("queues", &self.queues)
            .field("read_limit", &self.read_limit)
            .field("secure_cookie", &self.secure_cookie)
            .finish()
    }
}

impl ConsoleConfig {
    /// The default [`read_limit`](Self::read_limit).
    pub const DEFAULT_READ_LIMIT: usize = 1000;

    /// The console over `config`'s queues with `dead_letter: true`, reading
    /// their dead-letter queues from `broker` (an AMQP URI, or several
    /// separated by commas, as `AMQP_ADDR` takes).
    pub fn new(config: &Config, broker: impl Into<String>) -> Self {
        ConsoleConfig {
            broker: broker.into(),
            queues: config
                .queues
                .iter()
                .filter(|q| q.dead_letter)
                .map(|q| q.name.clone())
                .collect(),
            timeouts: config
                .queues
                .iter()
                .filter_map(|q| {
                    let (t, from) = q.effective_consumer_timeout()?;
                    Some((q.name.clone(), format!("{t:?} ({from})")))
                })
                .collect(),
            read_limit: Self::DEFAULT_READ_LIMIT,
            secure_cookie: false,
        }
    }

    /// How many messages of each dead-letter queue a page reads at most
    /// (at least 1).
    pub fn read_limit(mut self, n: usize) -> Self {
        self.read_limit = n.max(1);
        self
    }

    /// Marks the session cookie `Secure` (sent over HTTPS only): set it
    /// when the console is reached through TLS.
    pub fn secure_cookie(mut self, secure: bool) -> Self {
        self.secure_cookie = secure;
        self
    }
}

/// The console's state.
#[derive(Clone)]
pub(crate) struct Console {
    pub(crate) health: Health,
    pub(crate) token: Option<AdminToken>,
    pub(crate) config: Arc<ConsoleConfig>,
    pub(crate) sessions: Sessions,
}

/// A refusal: the page to answer (boxed: a `Response` is large).
pub(crate) type Denied = Box<Response>;

/// How a request was let in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// The session cookie.
    Session,
    /// The bearer token.
    Bearer,
}

impl Console {
    /// Whether `headers` may see the pages: a session, or the bearer token;
    /// else the answer (the login form, or the page that says the console
    /// is off).
    pub(crate) fn access(&self, headers: &HeaderMap) -> Result<Access, Denied> {
        if self.token.is_none() {
            return Err(Box::new(respond(StatusCode::FORBIDDEN, pages::off())));
        }
        if auth::check(self.token.as_ref(), headers).is_ok() {
            return Ok(Access::Bearer);
        }
        if self.sessions.valid(headers) {
            return Ok(Access::Session);
        }
        Err(Box::new(respond(
            StatusCode::UNAUTHORIZED,
            pages::login(None),
        )))
    }

    /// [`access`](Self::access) for a request that changes state: with the
    /// cookie, it must also come from this origin.
    pub(crate) fn control(
        &self,
        headers: &HeaderMap,
        peer: &str,
        what: &str,
    ) -> Result<Access, Denied> {
        let access = self.access(headers)?;
        if access == Access::Session && !session::same_origin(headers) {
            warn!(%peer, action = what, "console: a form from another origin refused");
            return Err(Box::new(respond(
                StatusCode::FORBIDDEN,
                confirm::outcome(
                    "Refused",
                    "This form was not sent from this console's own page (its Origin or Referer \
                     names another site): nothing was done.",
                    false,
                ),
            )));
        }
        Ok(access)
    }

    pub(crate) fn is_dead_lettered(&self, queue: &str) -> bool {
        self.config.queues.iter().any(|q| q == queue)
    }

    /// The connection name of the console's reads.
    pub(crate) fn connection_name(&self) -> String {
        format!("acemq-console:{}", std::process::id())
    }
}

/// The peer's address, when the server put it in the request.
pub(crate) fn peer(req: &Request) -> String {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_owned(), |c| c.0.to_string())
}

/// The fields of a form (`application/x-www-form-urlencoded`, or an empty
/// body without a content type); `None` for any other body.
pub(crate) async fn form(req: Request) -> Option<Vec<(String, String)>> {
    let urlencoded = match req.headers().get(header::CONTENT_TYPE) {
        None => true,
        Some(ct) => ct
            .to_str()
            .is_ok_and(|ct| ct.starts_with("application/x-www-form-urlencoded")),
    };
    let body: Bytes = axum::body::to_bytes(req.into_body(), 64 * 1024)
        .await
        .ok()?;
    if !urlencoded {
        return None;
    }
    Some(
        url::form_urlencoded::parse(&body)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect(),
    )
}

pub(crate) fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

pub(crate) fn bad_request(text: &str) -> Response {
    respond(
        StatusCode::BAD_REQUEST,
        confirm::outcome("Bad request", text, false),
    )
}

//! The bearer token the control routes need, and the check in front of
//! them: constant-time, before anything else looks at the request.

use std::fmt;
use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use subtle::ConstantTimeEq;

/// The environment variable [`AdminToken::from_env`] reads (and the shop,
/// through it): `ACEMQ_ADMIN_TOKEN`.
pub const TOKEN_ENV: &str = "ACEMQ_ADMIN_TOKEN";

/// The fewest characters a token may have: a shorter one can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;

/// The bearer token that opens the admin control routes (pause, resume and
/// every route that changes state), sent as `Authorization: Bearer <token>`.
///
/// Its `Debug` never shows it.
///
/// ```
/// use acemq::admin::AdminToken;
///
/// let token = AdminToken::new("3f9c2a7e5b1d4c8a9e6f0b2d").unwrap();
/// assert_eq!(format!("{token:?}"), "AdminToken(***)");
/// assert!(AdminToken::new("short").is_err()); // under 16 characters
/// assert!(AdminToken::new("with a space in it, too").is_err());
/// ```
#[derive(Clone)]
pub struct AdminToken(Arc<str>);

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(***)")
    }
}

/// A token that cannot serve: what was wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadToken {
    /// Fewer than [`MIN_TOKEN_LEN`] characters.
    #[error(
        "the admin token has {0} characters, fewer than {MIN_TOKEN_LEN}: use a long random one \
         (for example `openssl rand -hex 32`)"
    )]
    TooShort(usize),
    /// A character a bearer token cannot carry in a header.
    #[error(
        "the admin token holds a space, a control character or a non-ASCII character: use \
         visible ASCII only (for example `openssl rand -hex 32`)"
    )]
    Unsendable,
}

impl AdminToken {
    /// The token, when it has at least [`MIN_TOKEN_LEN`] characters, all
    /// visible ASCII (what an `Authorization` header carries).
    pub fn new(token: impl Into<String>) -> Result<Self, BadToken> {
        let token = token.into();
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(BadToken::Unsendable);
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(BadToken::TooShort(token.len()));
        }
        Ok(Self(token.into()))
    }

    /// The token in [`TOKEN_ENV`] (`ACEMQ_ADMIN_TOKEN`): `None` when it is
    /// unset or empty, an error naming the variable when it is set to a
    /// token that cannot serve. For a program's `main`; the router itself
    /// never reads the environment.
    pub fn from_env() -> Result<Option<Self>, FromEnvError> {
        match std::env::var(TOKEN_ENV) {
            Ok(t) if t.is_empty() => Ok(None),
            Ok(t) => Self::new(t).map(Some).map_err(FromEnvError::Bad),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(FromEnvError::Bad(BadToken::Unsendable)),
        }
    }

    /// Whether `presented` is this token, compared in constant time (only
    /// the length can be learnt from the time it takes).
    pub(crate) fn matches(&self, presented: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(presented).into()
    }
}

/// `ACEMQ_ADMIN_TOKEN` is set to a token that cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FromEnvError {
    /// The token's fault.
    #[error("{TOKEN_ENV}: {0}")]
    Bad(BadToken),
}

/// Why a control route refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No token configured: the control routes are off (403).
    Off,
    /// No `Authorization: Bearer` header (401).
    Missing,
    /// A bearer token that is not the one configured (401).
    Wrong,
}

impl Refusal {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refusal::Off => "control routes off: no admin token configured",
            Refusal::Missing => "no bearer token",
            Refusal::Wrong => "wrong bearer token",
        }
    }
}

/// Checks `headers`' `Authorization: Bearer <token>` against `token`.
pub(crate) fn check(token: Option<&AdminToken>, headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(token) = token else {
        return Err(Refusal::Off);
    };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(Refusal::Missing);
    };
    let value = value.as_bytes();
    let (scheme, rest) = value.split_at(value.len().min(7));
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return Err(Refusal::Missing);
    }
    if token.matches(rest.trim_ascii()) {
        Ok(())
    } else {
        Err(Refusal::Wrong)
    }
}

#[derive(Serialize)]
struct RefusalBody {
    error: &'static str,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let error = match self {
            Refusal::Off => {
                "control routes are off: no admin token is configured. Set ACEMQ_ADMIN_TOKEN \
                 (a program that reads it through acemq::admin::AdminToken::from_env) or give \
                 one to acemq::admin::AdminRouter::token, then send it as \
                 `Authorization: Bearer <token>`"
            }
            Refusal::Missing => {
                "this route changes state: send the admin token as `Authorization: Bearer <token>`"
            }
            Refusal::Wrong => "the bearer token is not the admin token",
        };
        let body = Json(RefusalBody { error });
        match self {
            Refusal::Off => (StatusCode::FORBIDDEN, body).into_response(),
            Refusal::Missing => (
                StatusCode::UNAUTHORIZED,
                [(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"acemq-admin\""),
                )],
                body,
            )
                .into_response(),
            Refusal::Wrong => (
                StatusCode::UNAUTHORIZED,
                [(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(
                        "Bearer realm=\"acemq-admin\", error=\"invalid_token\"",
                    ),
                )],
                body,
            )
                .into_response(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn the_header_is_checked_scheme_case_insensitively_and_the_token_exactly() {
        let t = AdminToken::new("0123456789abcdef").unwrap();
        assert_eq!(check(Some(&t), &with("Bearer 0123456789abcdef")), Ok(()));
        assert_eq!(check(Some(&t), &with("bearer 0123456789abcdef")), Ok(()));
        assert_eq!(
            check(Some(&t), &with("Bearer 0123456789abcdeF")),
            Err(Refusal::Wrong)
        );
        assert_eq!(
            check(Some(&t), &with("Bearer 0123456789abcde")),
            Err(Refusal::Wrong)
        );
        assert_eq!(check(Some(&t), &with("Bearer ")), Err(Refusal::Wrong));
        assert_eq!(
            check(Some(&t), &with("Basic 0123456789abcdef")),
            Err(Refusal::Missing)
        );
        assert_eq!(check(Some(&t), &HeaderMap::new()), Err(Refusal::Missing));
        assert_eq!(
            check(None, &with("Bearer 0123456789abcdef")),
            Err(Refusal::Off)
        );
    }

    #[test]
    fn a_token_that_cannot_serve_says_why() {
        assert_eq!(AdminToken::new("").unwrap_err(), BadToken::TooShort(0));
        assert_eq!(
            AdminToken::new("0123456789abcdé").unwrap_err(),
            BadToken::Unsendable
        );
        assert!(AdminToken::new("x".repeat(15))
            .unwrap_err()
            .to_string()
            .contains("openssl rand"));
    }
}

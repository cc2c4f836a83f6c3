//! The console's sessions: a login exchanges the admin token for a random
//! session id, kept here and in an `HttpOnly`, `SameSite=Strict` cookie
//! (never the token itself); and the same-origin check of a form's POST.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, HeaderValue};

/// The cookie's name.
pub(crate) const COOKIE: &str = "acemq_console";

/// How long a session lasts from its login.
pub(crate) const LIFETIME: Duration = Duration::from_secs(8 * 3600);

/// The most sessions kept at once: past it a login ends the oldest.
pub(crate) const MAX_SESSIONS: usize = 256;

/// The sessions open now: id (64 hex digits, 256 random bits) to when it
/// ends.
#[derive(Clone, Default)]
pub(crate) struct Sessions {
    open: Arc<Mutex<HashMap<String, Instant>>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

/// The operating system's random generator failed: no session can be made.
#[derive(Debug)]
pub(crate) struct NoRandom(pub(crate) String);

impl Sessions {
    /// A new session: its id, to be set as the cookie.
    pub(crate) fn open(&self) -> Result<String, NoRandom> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| NoRandom(e.to_string()))?;
        let mut id = String::with_capacity(64);
        for b in bytes {
            let _ = write!(id, "{b:02x}");
        }
        let now = Instant::now();
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|_, ends| *ends > now);
        if open.len() >= MAX_SESSIONS {
            if let Some(oldest) = open
                .iter()
                .min_by_key(|(_, ends)| **ends)
                .map(|(k, _)| k.clone())
            {
                open.remove(&oldest);
            }
        }
        open.insert(id.clone(), now + LIFETIME);
        Ok(id)
    }

    /// Whether `headers` carry the cookie of a session open now.
    pub(crate) fn valid(&self, headers: &HeaderMap) -> bool {
        let Some(id) = cookie(headers) else {
            return false;
        };
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(id).is_some_and(|ends| *ends > Instant::now())
    }

    /// Ends the session whose cookie `headers` carry, if any.
    pub(crate) fn close(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers) {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            open.remove(id);
        }
    }
}

/// The session id in the request's `Cookie` headers, if any.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The `Set-Cookie` value for session `id` (`Secure` when `secure`).
pub(crate) fn set_cookie(id: &str, secure: bool) -> HeaderValue {
    let mut v = format!(
        "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}",
        LIFETIME.as_secs()
    );
    if secure {
        v.push_str("; Secure");
    }
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The `Set-Cookie` value that removes the cookie.
pub(crate) fn clear_cookie() -> HeaderValue {
    HeaderValue::from_static("acemq_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// Whether a form's POST comes from this console's own pages: its
/// `Origin` (else its `Referer`), when present, names the host of the
/// request's `Host` header. With neither, the `SameSite=Strict` cookie is
/// what keeps another site's form out (a browser does not send it
/// cross-site).
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let from = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .map(|v| v.to_str().ok());
    match from {
        None => true,
        Some(None) => false,
        Some(Some(from)) => {
            let Ok(url) = url::Url::parse(from) else {
                return false;
            };
            let Some(from_host) = url.host_str() else {
                return false;
            };
            let from = match url.port() {
                Some(p) => format!("{from_host}:{p}"),
                None => from_host.to_owned(),
            };
            host.is_some_and(|h| h.eq_ignore_ascii_case(&from))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_session_is_valid_until_closed_and_ids_differ() {
        let s = Sessions::default();
        let a = s.open().unwrap();
        let b = s.open().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        let with = headers(&[(header::COOKIE, &format!("x=1; {COOKIE}={a}"))]);
        assert!(s.valid(&with));
        assert!(!s.valid(&headers(&[(
            header::COOKIE,
            &format!("{COOKIE}={}", "0".repeat(64))
        )])));
        assert!(!s.valid(&HeaderMap::new()));
        s.close(&with);
        assert!(!s.valid(&with));
    }

    #[test]
    fn past_the_cap_the_oldest_session_ends() {
        let s = Sessions::default();
        let first = s.open().unwrap();
        for _ in 0..MAX_SESSIONS {
            s.open().unwrap();
        }
        let with = headers(&[(header::COOKIE, &format!("{COOKIE}={first}"))]);
        assert!(!s.valid(&with));
        assert_eq!(s.open.lock().unwrap().len(), MAX_SESSIONS);
    }

    #[test]
    fn origin_or_referer_must_name_the_host() {
        let host = (header::HOST, "127.0.0.1:8080");
        assert!(same_origin(&headers(std::slice::from_ref(&host))));
        assert!(same_origin(&headers(&[
            host.clone(),
            (header::ORIGIN, "http://127.0.0.1:8080")
        ])));
        assert!(!same_origin(&headers(&[
            host.clone(),
            (header::ORIGIN, "https://evil.example")
        ])));
        assert!(!same_origin(&headers(&[
            host.clone(),
            (header::ORIGIN, "null")
        ])));
        assert!(same_origin(&headers(&[
            host.clone(),
            (header::REFERER, "http://127.0.0.1:8080/console/")
        ])));
        assert!(!same_origin(&headers(&[
            host,
            (header::REFERER, "http://127.0.0.1:9090/console/")
        ])));
    }
}

//! [`split`]: libpq's `sslmode` and `sslrootcert`, taken out of a
//! connection string before tokio-postgres parses the rest (it knows
//! `disable`, `prefer` and `require` only, and no `sslrootcert`).

use super::error::OutboxError;

/// How the pool's connections use TLS (libpq's `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS if the server offers it, else plain; the certificate is not
    /// checked (libpq's default).
    Prefer,
    /// TLS or no connection; the certificate is not checked.
    Require,
    /// TLS or no connection; the certificate chains to a trusted root and
    /// names the host.
    VerifyFull,
}

/// The TLS part of a connection string, and the rest of it.
#[derive(Debug)]
pub(crate) struct Split {
    /// The string without `sslmode` and `sslrootcert`.
    pub(crate) rest: String,
    pub(crate) mode: SslMode,
    /// `sslrootcert`'s file (for `verify-full`); `None` or `system`: the
    /// operating system's roots.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) root_cert: Option<String>,
}

fn bad(message: String) -> OutboxError {
    OutboxError::Config { message }
}

/// Takes `sslmode` and `sslrootcert` out of `settings`, in either form
/// (`key=value …` or a `postgresql://` URL). Nothing of the other values (a
/// password) appears in an error.
pub(crate) fn split(settings: &str) -> Result<Split, OutboxError> {
    let trimmed = settings.trim_start();
    let (rest, pairs) =
        if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
            split_url(trimmed)
        } else {
            split_key_values(settings)
        };
    let mut mode = None;
    let mut root_cert = None;
    for (key, value) in pairs {
        if key == "sslmode" {
            mode = Some(match value.as_str() {
                "disable" => SslMode::Disable,
                "prefer" => SslMode::Prefer,
                "require" => SslMode::Require,
                "verify-full" => SslMode::VerifyFull,
                "allow" | "verify-ca" => {
                    return Err(bad(format!(
                    "sslmode={value} is not supported: use disable, prefer, require or verify-full"
                )))
                }
                _ => {
                    return Err(bad(
                        "sslmode must be disable, prefer, require or verify-full".into(),
                    ))
                }
            });
        } else {
            root_cert = Some(value);
        }
    }
    let mode = mode.unwrap_or(SslMode::Prefer);
    if root_cert.is_some() && mode != SslMode::VerifyFull {
        return Err(bad(
            "sslrootcert is read with sslmode=verify-full only: add it, or drop sslrootcert".into(),
        ));
    }
    Ok(Split {
        rest,
        mode,
        root_cert: root_cert.filter(|path| path != "system"),
    })
}

fn is_tls_key(key: &str) -> bool {
    key == "sslmode" || key == "sslrootcert"
}

/// `postgresql://…?a=b&sslmode=require`: the query's TLS pairs out.
fn split_url(url: &str) -> (String, Vec<(String, String)>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), Vec::new());
    };
    let mut kept = Vec::new();
    let mut pairs = Vec::new();
    for part in query.split('&') {
        match url::form_urlencoded::parse(part.as_bytes()).next() {
            Some((key, value)) if is_tls_key(&key) => pairs.push((key.into(), value.into())),
            _ => kept.push(part),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (rest, pairs)
}

/// `host=… sslmode=require password='a b\'c'`: the TLS pairs out, the
/// others kept as written (tokio-postgres's and libpq's grammar: a value is
/// single-quoted with backslash escapes, or runs to the next space).
fn split_key_values(settings: &str) -> (String, Vec<(String, String)>) {
    let mut rest = String::with_capacity(settings.len());
    let mut pairs = Vec::new();
    let mut chars = settings.char_indices().peekable();
    loop {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = chars.peek() else {
            break;
        };
        let mut key = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if(|(_, c)| *c == '=').is_some() {
            while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
            let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '\'' if quoted => break,
                    c if !quoted && c.is_whitespace() => break,
                    c => value.push(c),
                }
            }
        }
        let end = chars.peek().map_or(settings.len(), |&(i, _)| i);
        if is_tls_key(&key) {
            pairs.push((key, value));
        } else {
            rest.push_str(settings[start..end].trim_end());
            rest.push(' ');
        }
    }
    (rest.trim_end().to_owned(), pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values_lose_only_the_tls_pairs() {
        let s =
            split(r"host=db sslmode = verify-full password='a b\'c' sslrootcert=/ca.pem user=u")
                .unwrap();
        assert_eq!(s.rest, r"host=db password='a b\'c' user=u");
        assert_eq!(s.mode, SslMode::VerifyFull);
        assert_eq!(s.root_cert.as_deref(), Some("/ca.pem"));
        let parsed: tokio_postgres::Config = s.rest.parse().unwrap();
        assert_eq!(parsed.get_password(), Some(&b"a b'c"[..]));
    }

    #[test]
    fn a_url_loses_only_the_tls_pairs() {
        let s = split("postgresql://u:p@db/app?sslmode=require&application_name=x").unwrap();
        assert_eq!(s.rest, "postgresql://u:p@db/app?application_name=x");
        assert_eq!(s.mode, SslMode::Require);
        let s = split("postgresql://u@db/app?sslrootcert=%2Fca.pem&sslmode=verify-full").unwrap();
        assert_eq!(s.rest, "postgresql://u@db/app");
        assert_eq!(s.root_cert.as_deref(), Some("/ca.pem"));
        assert_eq!(split("postgresql://u@db").unwrap().mode, SslMode::Prefer);
    }

    #[test]
    fn unsupported_modes_say_what_is() {
        for (settings, says) in [
            (
                "host=db sslmode=verify-ca",
                "sslmode=verify-ca is not supported",
            ),
            (
                "host=db sslmode=bogus password=secret",
                "disable, prefer, require or verify-full",
            ),
            (
                "host=db sslrootcert=/ca.pem sslmode=require",
                "verify-full only",
            ),
        ] {
            let error = split(settings).unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
            assert!(!error.contains("secret"), "{error}");
        }
        let s = split("host=db sslmode=verify-full sslrootcert=system").unwrap();
        assert_eq!(s.root_cert, None);
    }
}

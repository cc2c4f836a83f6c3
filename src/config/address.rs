//! Broker addresses as data: where they come from (code, `AMQP_ADDR`, the
//! config, the default), what makes one valid, the order they are tried
//! in, and how one is shown without its password. Nothing here connects:
//! [`connection`](crate::connection) does, with these.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// The address used when neither code, `AMQP_ADDR` nor the config gives one.
pub const DEFAULT_AMQP_ADDR: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The broker address: `AMQP_ADDR`, or [`DEFAULT_AMQP_ADDR`]. With a
/// comma-separated `AMQP_ADDR` this is the whole list as written; use
/// [`resolve_addresses`] to get it split.
pub fn amqp_addr_from_env() -> String {
    std::env::var("AMQP_ADDR").unwrap_or_else(|_| DEFAULT_AMQP_ADDR.to_owned())
}

/// The broker addresses to use, in precedence order:
///
/// 1. `from_code` (e.g. `App::amqp_addr`), when given and not empty;
/// 2. the `AMQP_ADDR` environment variable, when set and not blank: one
///    address, or several separated by commas;
/// 3. the config's `addresses`, when not empty;
/// 4. [`DEFAULT_AMQP_ADDR`].
///
/// Each entry of `from_code` and of the config may itself be a
/// comma-separated list. Blank entries are dropped; the order is kept
/// ([`connect_any`](crate::connection::connect_any) shuffles).
pub fn resolve_addresses(from_code: Option<&[String]>, config: &[String]) -> Vec<String> {
    resolve_addresses_with(
        from_code,
        std::env::var("AMQP_ADDR").ok().as_deref(),
        config,
    )
}

/// [`resolve_addresses`] with the value of `AMQP_ADDR` given (for tests and
/// callers that read their environment elsewhere).
pub fn resolve_addresses_with(
    from_code: Option<&[String]>,
    amqp_addr: Option<&str>,
    config: &[String],
) -> Vec<String> {
    let split = |items: &mut dyn Iterator<Item = &str>| -> Vec<String> {
        items
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    if let Some(code) = from_code {
        let v = split(&mut code.iter().map(String::as_str));
        if !v.is_empty() {
            return v;
        }
    }
    if let Some(env) = amqp_addr {
        let v = split(&mut std::iter::once(env));
        if !v.is_empty() {
            return v;
        }
    }
    let v = split(&mut config.iter().map(String::as_str));
    if !v.is_empty() {
        return v;
    }
    vec![DEFAULT_AMQP_ADDR.to_owned()]
}

/// Checks that `addr` is an `amqp://` or `amqps://` URL with a host; the
/// error says what is wrong (password hidden).
pub fn check_address(addr: &str) -> Result<(), String> {
    let u = url::Url::parse(addr).map_err(|e| format!("{} is not a URL: {e}", redact(addr)))?;
    if u.scheme() != "amqp" && u.scheme() != "amqps" {
        return Err(format!(
            "{} has the scheme {:?}, not amqp or amqps",
            redact(addr),
            u.scheme()
        ));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(format!("{} has no host", redact(addr)));
    }
    Ok(())
}

/// `addresses` in a random order (a fleet of processes spreads over a
/// cluster's nodes).
pub fn shuffled(addresses: &[String]) -> Vec<String> {
    let mut v = addresses.to_vec();
    let state = RandomState::new();
    for i in (1..v.len()).rev() {
        let mut h = state.build_hasher();
        h.write_usize(i);
        let j = (h.finish() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// The address with its password replaced by `***`, safe to log. A
/// comma-separated list is redacted address by address.
pub fn redact(addr: &str) -> String {
    if addr.contains(',') {
        return addr
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(redact)
            .collect::<Vec<_>>()
            .join(",");
    }
    match url::Url::parse(addr) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "<unparseable AMQP address>".to_owned(),
    }
}

/// `addr` with `heartbeat=<secs>` added to its query, unless it has one.
pub(crate) fn with_heartbeat(addr: &str, heartbeat: Option<Duration>) -> String {
    let (Some(h), Ok(mut u)) = (heartbeat, url::Url::parse(addr)) else {
        return addr.to_owned();
    };
    if u.query_pairs().any(|(k, _)| k == "heartbeat") {
        return addr.to_owned();
    }
    u.query_pairs_mut()
        .append_pair("heartbeat", &h.as_secs().to_string());
    u.to_string()
}

/// The virtual host an address names (`/` when its path is empty), decoded.
pub(crate) fn vhost_of(addr: &str) -> String {
    let Ok(u) = url::Url::parse(addr) else {
        return "/".to_owned();
    };
    let path = u.path().strip_prefix('/').unwrap_or(u.path());
    if path.is_empty() {
        return "/".to_owned();
    }
    url::form_urlencoded::parse(format!("v={path}").as_bytes())
        .next()
        .map_or_else(|| path.to_owned(), |(_, v)| v.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_replaced_in_a_redacted_address() {
        let r = redact("amqp://user:s3cret@host:5672/%2f");
        assert!(!r.contains("s3cret"), "{r}");
        assert!(r.contains("user:***@host"), "{r}");
        let list = redact("amqp://u:s3cret@a:1/%2f, amqp://u:s3cret@b:2/%2f");
        assert_eq!(list, "amqp://u:***@a:1/%2f,amqp://u:***@b:2/%2f");
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn addresses_come_from_code_then_amqp_addr_then_config_then_the_default() {
        let code = strings(&["amqp://code"]);
        let config = strings(&["amqp://c1", "amqp://c2"]);
        assert_eq!(
            resolve_addresses_with(Some(&code), Some("amqp://env"), &config),
            code
        );
        assert_eq!(
            resolve_addresses_with(None, Some("amqp://e1, amqp://e2,"), &config),
            strings(&["amqp://e1", "amqp://e2"])
        );
        assert_eq!(resolve_addresses_with(None, Some("  "), &config), config);
        assert_eq!(resolve_addresses_with(Some(&[]), None, &config), config);
        assert_eq!(
            resolve_addresses_with(None, None, &[]),
            strings(&[DEFAULT_AMQP_ADDR])
        );
    }

    #[test]
    fn shuffling_keeps_every_address_once() {
        let a = strings(&["amqp://a", "amqp://b", "amqp://c", "amqp://d"]);
        let mut seen_first = std::collections::HashSet::new();
        for _ in 0..200 {
            let mut s = shuffled(&a);
            seen_first.insert(s[0].clone());
            s.sort();
            assert_eq!(s, a);
        }
        assert!(seen_first.len() > 1, "the order varies: {seen_first:?}");
    }

    #[test]
    fn a_heartbeat_is_added_to_the_query_unless_the_address_has_one() {
        let h = Some(Duration::from_secs(15));
        assert_eq!(
            with_heartbeat("amqp://u:p@h:5672/%2f", h),
            "amqp://u:p@h:5672/%2f?heartbeat=15"
        );
        assert_eq!(
            with_heartbeat("amqp://h/%2f?heartbeat=5", h),
            "amqp://h/%2f?heartbeat=5"
        );
        assert_eq!(with_heartbeat("amqp://h/%2f", None), "amqp://h/%2f");
    }

    #[test]
    fn bad_addresses_are_named_without_their_password() {
        let e = check_address("http://u:s3cret@h/").unwrap_err();
        assert!(e.contains("scheme") && !e.contains("s3cret"), "{e}");
        assert!(check_address("not a url").is_err());
        assert!(check_address("amqp://h:5672/%2f").is_ok());
    }
}

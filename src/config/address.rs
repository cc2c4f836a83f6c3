//! Broker addresses as data: where they come from (code, `AMQP_ADDR`, the
//! config, the default), what makes one valid, the order they are tried
//! in, and how one is shown without its password. Nothing here connects:
//! [`connection`](crate::connection) does, with these.

use std::time::Duration;

use super::error::ConfigError;

/// The address used when neither code, `AMQP_ADDR` nor the config gives one.
///
/// ```
/// use acemq::connection::{resolve_addresses, DEFAULT_AMQP_ADDR};
///
/// if std::env::var_os("AMQP_ADDR").is_none() {
///     assert_eq!(resolve_addresses(None, &[]), [DEFAULT_AMQP_ADDR]);
/// }
/// ```
pub const DEFAULT_AMQP_ADDR: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The broker address: `AMQP_ADDR`, or [`DEFAULT_AMQP_ADDR`]. With a
/// comma-separated `AMQP_ADDR` this is the whole list as written; use
/// [`resolve_addresses`] to get it split.
///
/// ```
/// let addr = acemq::connection::amqp_addr_from_env();
/// assert!(addr.starts_with("amqp"), "{}", acemq::connection::redact(&addr));
/// ```
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
///
/// ```
/// use acemq::connection::resolve_addresses;
///
/// // An address given in code wins over AMQP_ADDR and the config; a list
/// // may be written as one comma-separated entry.
/// let code = ["amqp://a:5672/%2f, amqp://b:5672/%2f".to_owned()];
/// let config = ["amqp://c:5672/%2f".to_owned()];
/// assert_eq!(resolve_addresses(Some(&code), &config), ["amqp://a:5672/%2f", "amqp://b:5672/%2f"]);
/// ```
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

/// The query parameters an address may carry (what lapin reads), and the
/// values each takes.
const QUERY_PARAMETERS: &str = "heartbeat (seconds, 0 to 65535), channel_max (0 to 65535), \
                                frame_max (bytes, 0 to 4294967295), connection_timeout \
                                (milliseconds) and auth_mechanism (plain, amqplain, external, \
                                anonymous or rabbit-cr-demo)";

/// Checks that `addr` is one `amqp://` or `amqps://` URL with a host, a
/// port above 0, query parameters lapin reads with values it accepts, and —
/// for `amqps://` — a build with the `tls` feature (without it the
/// connection would be opened in plain text). The error says what is wrong
/// and what to do (password hidden).
///
/// ```
/// use acemq::connection::check_address;
///
/// assert!(check_address("amqp://guest:guest@rabbit:5672/%2f?heartbeat=30").is_ok());
/// let why = check_address("http://guest:s3cret@rabbit/").unwrap_err();
/// assert!(!why.contains("s3cret"), "the password is hidden: {why}");
/// ```
pub fn check_address(addr: &str) -> Result<(), String> {
    let shown = redact(addr);
    if one_url_with_a_comma(addr) {
        return Err(format!(
            "{shown} has a comma in its user name or password, and a comma separates the \
             addresses of a list: write it as %2C"
        ));
    }
    if addr.contains(',') {
        return Err(format!(
            "{shown} is a list of addresses, not one: give them one by one (or as AMQP_ADDR, \
             which splits at the commas)"
        ));
    }
    let u = url::Url::parse(addr).map_err(|e| {
        format!("{shown} is not a URL ({e}): write amqp://USER:PASSWORD@HOST:PORT/VHOST")
    })?;
    if u.scheme() != "amqp" && u.scheme() != "amqps" {
        return Err(format!(
            "{shown} is not a valid amqp:// URL (its scheme is {:?}): write \
             amqp://USER:PASSWORD@HOST:PORT/VHOST, or amqps://… with the tls feature",
            u.scheme()
        ));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(format!("{shown} has no host"));
    }
    if u.port() == Some(0) {
        return Err(format!(
            "{shown} has the port 0: give RabbitMQ's AMQP port (5672, or 5671 for amqps://)"
        ));
    }
    if u.scheme() == "amqps" && !cfg!(feature = "tls") {
        return Err(format!(
            "{shown} asks for TLS, and acemq was built without its `tls` feature (the \
             connection would be opened in plain text, the password included): enable it \
             (acemq = {{ features = [\"tls\"] }}), or use an amqp:// address"
        ));
    }
    for (key, value) in u.query_pairs() {
        check_query_parameter(&key, &value).map_err(|why| format!("{shown}: {why}"))?;
    }
    // What lapin reads at connect time: the user name, password and vhost
    // percent-decoded to UTF-8.
    addr.parse::<lapin::uri::AMQPUri>().map_err(|_| {
        format!(
            "{shown} cannot be read as an AMQP URI: its user name, password or vhost is not \
             valid UTF-8 once percent-decoded"
        )
    })?;
    Ok(())
}

/// One query parameter of an address: a name lapin reads, with a value it
/// accepts.
fn check_query_parameter(key: &str, value: &str) -> Result<(), String> {
    let whole = |max: u64| -> Result<(), String> {
        match value.parse::<u64>() {
            Ok(n) if n <= max => Ok(()),
            _ => Err(format!(
                "{key}={value} is not a whole number from 0 to {max}"
            )),
        }
    };
    match key {
        "heartbeat" | "channel_max" => whole(u64::from(u16::MAX)),
        "frame_max" => whole(u64::from(u32::MAX)),
        "connection_timeout" => whole(u64::MAX),
        "auth_mechanism" => {
            let known = [
                "plain",
                "amqplain",
                "external",
                "anonymous",
                "rabbit-cr-demo",
            ];
            if known.contains(&value.to_ascii_lowercase().as_str()) {
                Ok(())
            } else {
                Err(format!(
                    "auth_mechanism={value} is not one of {}",
                    known.join(", ")
                ))
            }
        }
        _ => Err(format!(
            "the query parameter {key:?} is not one acemq passes on (it would be ignored): \
             remove it; the parameters read are {QUERY_PARAMETERS}; TLS files go in the \
             config's tls:"
        )),
    }
}

/// Checks every address of a list (each entry may itself be
/// comma-separated, as `AMQP_ADDR` and the config's `addresses` may be):
/// for each address that is not usable, its entry's index, its number in
/// the whole list (from 1) and why. Empty when all are usable.
pub(crate) fn check_address_list(list: &[String]) -> Vec<(usize, usize, String)> {
    let mut problems = Vec::new();
    let mut n = 0;
    for (i, entry) in list.iter().enumerate() {
        let addresses: Vec<&str> = if one_url_with_a_comma(entry) {
            vec![entry.as_str()]
        } else {
            entry
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .collect()
        };
        for addr in addresses {
            n += 1;
            if let Err(why) = check_address(addr) {
                problems.push((i, n, why));
            }
        }
    }
    problems
}

/// [`resolve_addresses`], every address of the list it picks checked
/// first ([`check_address`]): an error naming where the list came from
/// (code, `AMQP_ADDR`, the config's `addresses`) and every address that is
/// not usable, even when another one would answer.
pub(crate) fn resolve_checked_addresses(
    from_code: Option<&[String]>,
    config: &[String],
) -> Result<Vec<String>, ConfigError> {
    let env = std::env::var("AMQP_ADDR").ok();
    let (source, given): (&str, Vec<String>) = match (from_code, env.as_deref()) {
        (Some(code), _) if has_entries(code) => ("the address given in code", code.to_vec()),
        (_, Some(env)) if has_entries(&[env.to_owned()]) => ("AMQP_ADDR", vec![env.to_owned()]),
        _ => ("addresses", config.to_vec()),
    };
    let problems = check_address_list(&given);
    if !problems.is_empty() {
        let total = resolve_addresses_with(Some(&given), None, &[]).len();
        let what = problems
            .iter()
            .map(|(_, n, why)| format!("address {n} of {total}: {why}"))
            .collect::<Vec<_>>()
            .join("; ");
        return Err(ConfigError::invalid(
            source,
            format!("has {} unusable address(es)", problems.len()),
            what,
        ));
    }
    Ok(resolve_addresses_with(from_code, env.as_deref(), config))
}

/// Whether a source of addresses names any (not only blanks and commas).
fn has_entries(entries: &[String]) -> bool {
    entries
        .iter()
        .flat_map(|e| e.split(','))
        .any(|a| !a.trim().is_empty())
}

/// Whether `text` reads as one URL with a host whose user name or password
/// holds a comma: one address that a list would split. Not when anything
/// after its host holds an `@` (a list whose later addresses carry
/// credentials, read as one URL, would keep them in its path: shown
/// unredacted).
fn one_url_with_a_comma(text: &str) -> bool {
    url::Url::parse(text).is_ok_and(|u| {
        let after_host_has_at = u.path().contains('@')
            || u.query().is_some_and(|q| q.contains('@'))
            || u.fragment().is_some_and(|f| f.contains('@'));
        u.has_host()
            && !after_host_has_at
            && (u.username().contains(',') || u.password().is_some_and(|p| p.contains(',')))
    })
}

/// `addresses` in a random order (a fleet of processes spreads over a
/// cluster's nodes).
pub fn shuffled(addresses: &[String]) -> Vec<String> {
    let mut v = addresses.to_vec();
    fastrand::shuffle(&mut v);
    v
}

/// The address with its password replaced by `***`, safe to log. A
/// comma-separated list is redacted address by address; a part of it that
/// is not a URL with a host (a piece of a password cut at a comma, say) is
/// not shown. One URL whose user name or password holds a comma is
/// redacted as one address.
///
/// ```
/// use acemq::connection::redact;
///
/// assert_eq!(redact("amqp://shop:s3cret@rabbit:5672/%2f"), "amqp://shop:***@rabbit:5672/%2f");
/// ```
pub fn redact(addr: &str) -> String {
    if addr.contains(',') && !one_url_with_a_comma(addr) {
        return addr
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(redact_one)
            .collect::<Vec<_>>()
            .join(",");
    }
    redact_one(addr)
}

fn redact_one(addr: &str) -> String {
    // `scheme:user@host` without `//` is no AMQP address, and its user
    // name may be another reading's password: not shown.
    let authority_written = addr
        .split_once(':')
        .is_some_and(|(_, rest)| rest.starts_with("//"));
    match url::Url::parse(addr) {
        Ok(mut u) if u.has_host() && authority_written => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        _ => "<unparseable AMQP address>".to_owned(),
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
    fn a_list_whose_first_address_has_a_comma_in_its_user_name_hides_every_later_password() {
        // Read as one URL (user "u,x"), the second address would sit in its
        // path, password and all.
        let r = redact("amqp://u,x:p@h/,amqp://v:s3cret@h2/%2f");
        assert!(!r.contains("s3cret"), "{r}");
        assert!(r.contains("v:***@h2"), "{r}");
    }

    #[test]
    fn an_address_without_slashes_after_its_scheme_is_not_shown() {
        // Read with the list before it as one URL, `s3cretpw` is a password.
        let r = redact("amqp://u,v:w@h/,amqp:s3cretpw@h2/x@y");
        assert!(!r.contains("s3cretpw"), "{r}");
        assert_eq!(redact("amqp:s3cretpw@h2"), "<unparseable AMQP address>");
    }

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
    fn query_parameters_are_read_as_lapin_reads_them_and_bad_values_refused() {
        for ok in [
            "amqp://u:p@h:5672/%2f?heartbeat=0",
            "amqp://h/%2f?heartbeat=65535&channel_max=10&frame_max=131072",
            "amqp://h/%2f?connection_timeout=3000&auth_mechanism=EXTERNAL",
        ] {
            check_address(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let e = check_address("amqp://u:s3cret@h:5672/%2f?heartbeat=notanumber").unwrap_err();
        assert!(
            e.contains("heartbeat=notanumber is not a whole number from 0 to 65535"),
            "{e}"
        );
        assert!(!e.contains("s3cret") && !e.contains('\n'), "{e}");
        let e = check_address("amqp://h/%2f?heartbeat=70000").unwrap_err();
        assert!(e.contains("heartbeat=70000"), "{e}");
        let e = check_address("amqp://h/%2f?auth_mechanism=kerberos").unwrap_err();
        assert!(e.contains("auth_mechanism=kerberos is not one of"), "{e}");
        let e = check_address("amqp://h/%2f?verify=verify_none").unwrap_err();
        assert!(e.contains("\"verify\" is not one acemq passes on"), "{e}");
        let e = check_address("amqp://h:0/%2f").unwrap_err();
        assert!(e.contains("port 0"), "{e}");
        assert!(check_address("amqp://h:70000/%2f").is_err());
        assert!(check_address("amqp://%FF:p@h/%2f").is_err(), "not UTF-8");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn an_amqps_address_is_refused_without_the_tls_feature() {
        let e = check_address("amqps://u:s3cret@h:5671/%2f").unwrap_err();
        assert!(
            e.contains("built without its `tls` feature") && e.contains("plain text"),
            "{e}"
        );
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn an_amqps_address_is_accepted_with_the_tls_feature() {
        check_address("amqps://u:s3cret@h:5671/%2f").unwrap();
    }

    #[test]
    fn every_address_of_a_list_is_checked_and_each_bad_one_named() {
        let list = strings(&[
            "amqp://u:p@good:5672/%2f, http://u:s3cret@web/",
            "amqp://h/%2f?heartbeat=x",
        ]);
        let problems = check_address_list(&list);
        let at: Vec<(usize, usize)> = problems.iter().map(|(i, n, _)| (*i, *n)).collect();
        assert_eq!(at, [(0, 2), (1, 3)], "{problems:?}");
        assert!(problems[0].2.contains("scheme is \"http\""), "{problems:?}");
        assert!(!problems[0].2.contains("s3cret"), "{problems:?}");
        assert!(check_address_list(&strings(&["amqp://a, amqp://b"])).is_empty());
        // One address whose user name holds a comma is named as one.
        let problems = check_address_list(&strings(&["amqp://ops,team:s3cret@h/%2f"]));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].2.contains("%2C"), "{problems:?}");
        assert!(!problems[0].2.contains("s3cret"), "{problems:?}");
    }

    #[test]
    fn a_comma_in_the_user_name_or_password_never_shows_the_password() {
        for addr in [
            "amqp://ops,team:s3cret@broker:5672/%2f",
            "amqp://ops:s3cr,et@broker:5672/%2f",
            "amqp://ops:1234,5678@broker:5672/%2f",
        ] {
            let r = redact(addr);
            assert!(
                !r.contains("s3cr") && !r.contains("1234") && !r.contains("5678"),
                "{addr} -> {r}"
            );
            assert!(r.contains("***@broker"), "{addr} -> {r}");
        }
        // A piece of a list that is not a URL with a host is not shown.
        assert_eq!(
            redact("amqp://u:p@a/%2f,team:s3cret@b"),
            "amqp://u:***@a/%2f,<unparseable AMQP address>"
        );
    }

    #[test]
    fn bad_addresses_are_named_without_their_password() {
        let e = check_address("http://u:s3cret@h/").unwrap_err();
        assert!(e.contains("scheme") && !e.contains("s3cret"), "{e}");
        assert!(check_address("not a url").is_err());
        assert!(check_address("amqp://h:5672/%2f").is_ok());
    }
}

//! The `addresses` target's property: arbitrary strings through the
//! connection module's address functions (`check_address`, `redact`,
//! `resolve_addresses_with`, `shuffled`), none of which connects.
//!
//! Shared by `fuzz/fuzz_targets/addresses.rs` and the replay test
//! (`tests/fuzz_corpus.rs`): both decode the bytes with [`decode`].

use acemq::connection::{
    check_address, redact, resolve_addresses_with, shuffled, DEFAULT_AMQP_ADDR,
};
use arbitrary::{Arbitrary, Unstructured};

/// The fuzzer's input: one address, and the three sources of a list.
#[derive(Arbitrary, Debug)]
pub(crate) struct Input {
    addr: String,
    from_code: Option<Vec<String>>,
    amqp_addr: Option<String>,
    config: Vec<String>,
}

/// Decodes `data` as the fuzz target does, or `None` where it would skip
/// them.
pub(crate) fn decode(data: &[u8]) -> Option<Input> {
    Input::arbitrary_take_rest(Unstructured::new(data)).ok()
}

/// The property, on raw bytes (the replay's entry point).
pub(crate) fn check(data: &[u8]) {
    if let Some(input) = decode(data) {
        check_input(input);
    }
}

/// The property.
pub(crate) fn check_input(input: Input) {
    check_one(&input.addr);
    for a in input.from_code.iter().flatten().chain(&input.config) {
        check_one(a);
    }
    if let Some(a) = &input.amqp_addr {
        check_one(a);
    }
    check_resolve(&input);
}

/// The entries of a comma-separated list, trimmed, blanks dropped: the
/// model `resolve_addresses_with`'s docs describe.
fn entries<'a>(items: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    items
        .into_iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn check_resolve(input: &Input) {
    let got = resolve_addresses_with(
        input.from_code.as_deref(),
        input.amqp_addr.as_deref(),
        &input.config,
    );
    let from_code = entries(input.from_code.iter().flatten());
    let env = entries(input.amqp_addr.iter());
    let config = entries(&input.config);
    let want = [from_code, env, config]
        .into_iter()
        .find(|v| !v.is_empty())
        .unwrap_or_else(|| vec![DEFAULT_AMQP_ADDR.to_owned()]);
    assert_eq!(got, want);
    for a in &got {
        assert!(!a.is_empty() && !a.contains(',') && a.trim() == a, "{a:?}");
    }
    let mut s = shuffled(&got);
    let mut sorted = got.clone();
    s.sort();
    sorted.sort();
    assert_eq!(s, sorted, "a shuffle keeps every address once");
    // A list is redacted address by address (unless, joined, it reads as
    // one URL whose user name or password holds a comma: then as that one).
    let joined = got.join(",");
    let r = redact(&joined);
    if got.len() > 1 && !userinfo_has_comma(&joined) {
        assert_eq!(
            r,
            got.iter().map(|a| redact(a)).collect::<Vec<_>>().join(",")
        );
    }
}

/// The password of `addr` as written in it, when it parses as a URL with
/// one, else `None`.
fn password(addr: &str) -> Option<String> {
    url::Url::parse(addr).ok()?.password().map(str::to_owned)
}

/// Whether `text` shows `secret`, a password of `addr` (or, with a comma in
/// it, a part of one), where `addr` does not show it anyway outside the
/// password. Parts shorter than four bytes are not counted: `amqp://u:1@1`
/// has no secret to keep.
fn leaks(text: &str, addr: &str, secret: &str) -> Option<String> {
    if secret == "***" {
        return None;
    }
    // What is public: the address with the password taken out once, as
    // written and as the URL serialises it (which percent-encodes the rest
    // the way it encodes the password). A URL whose password cannot be
    // removed has nothing public in that second form.
    let public = addr.replacen(secret, "", 1);
    let serialised = url::Url::parse(addr)
        .ok()
        .and_then(|mut u| u.set_password(None).ok().map(|()| u.to_string()))
        .unwrap_or_default();
    std::iter::once(secret)
        .chain(secret.split(','))
        .filter(|part| {
            part.len() >= 4
                && !public.contains(part)
                && !serialised.contains(part)
                && part != &"***"
        })
        .find(|part| text.contains(part))
        .map(str::to_owned)
}

/// Whether the user name or password of `addr` (as a URL with a host)
/// holds a comma.
fn userinfo_has_comma(addr: &str) -> bool {
    url::Url::parse(addr).is_ok_and(|u| {
        u.has_host()
            && (u.username().contains(',') || u.password().is_some_and(|p| p.contains(',')))
    })
}

fn check_one(addr: &str) {
    // Never panics; an accepted address is an amqp(s) URL with a host.
    let checked = check_address(addr);
    let parsed = url::Url::parse(addr);
    match &checked {
        Ok(()) => {
            let u = parsed
                .as_ref()
                .expect("an accepted address parses as a URL");
            assert!(u.scheme() == "amqp" || u.scheme() == "amqps", "{addr:?}");
            assert!(u.host_str().is_some_and(|h| !h.is_empty()), "{addr:?}");
            assert!(!addr.contains(','), "one address, not a list: {addr:?}");
            assert!(u.port() != Some(0), "{addr:?}");
        }
        Err(message) => assert!(!message.is_empty()),
    }

    let r = redact(addr);
    // Every URL in the redacted text shows no password but `***`.
    for part in r.split(',') {
        if let Ok(u) = url::Url::parse(part) {
            assert!(
                u.password().is_none_or(|p| p == "***"),
                "redact({addr:?}) = {r:?} shows the password {:?}",
                u.password()
            );
        }
    }
    if let Some(secret) = password(addr) {
        if let Some(part) = leaks(&r, addr, &secret) {
            panic!("redact({addr:?}) = {r:?} shows {part:?} of the password {secret:?}");
        }
        if let Err(message) = &checked {
            if let Some(part) = leaks(message, addr, &secret) {
                panic!("check_address({addr:?}) = {message:?} shows {part:?} of the password");
            }
        }
    }
    // Redacting is idempotent on one AMQP address. (Not on any URL: the
    // url crate reads `file://e/a:` back as `file:///a:`, a drive letter.)
    if checked.is_ok() && !addr.contains(',') && !r.contains(',') {
        assert_eq!(redact(&r), r, "redact(redact({addr:?}))");
    }
}

//! The config, the broker addresses and the connection, all through the
//! library's own code: `Config::from_path` (its validation and error
//! texts), `resolve_addresses` (`--amqp-addr` > `AMQP_ADDR` > the config's
//! `addresses` > the default), `connect_any` (its timeout, TLS and error
//! texts, the password hidden).

use std::path::Path;
use std::time::Duration;

use acemq::config::Config;
use acemq::connection::{
    check_address, connect_any, resolve_addresses, ConnectError, ConnectOptions,
};
use acemq::lapin::Connection;

use crate::exit::Failure;

/// Loads and validates a config as the service does; a failure is exit 78
/// with the library's text (it names the field and the fix).
pub(crate) fn load_config(path: &Path) -> Result<Config, Failure> {
    Config::from_path(path).map_err(|e| Failure::config(e.to_string()))
}

/// Where to connect and how.
#[derive(Debug)]
pub(crate) struct Target {
    addresses: Vec<String>,
    options: ConnectOptions,
    timeout: Duration,
}

impl Target {
    /// The addresses from `--amqp-addr`, `AMQP_ADDR`, the config or the
    /// default, and the config's heartbeat, TLS files and connect timeout.
    /// A malformed `--amqp-addr` is a usage error (exit 64), named without
    /// its password.
    pub(crate) fn new(flag: Option<&str>, config: Option<&Config>) -> Result<Target, Failure> {
        let from_flag: Option<Vec<String>> = flag.map(|f| vec![f.to_owned()]);
        if let Some(flag) = flag {
            let given: Vec<String> = flag
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect();
            // A build without TLS is the config's matter (78), not a usage error.
            refuse_tls_without_tls(&given)?;
            for addr in &given {
                check_address(addr).map_err(|why| Failure::usage(format!("--amqp-addr: {why}")))?;
            }
        }
        let config_addresses = config.map_or(&[][..], |c| c.addresses.as_slice());
        let addresses = resolve_addresses(from_flag.as_deref(), config_addresses);
        refuse_tls_without_tls(&addresses)?;
        // Every address of AMQP_ADDR or the config, not only the one that
        // answers (the flag's were checked above).
        for addr in &addresses {
            check_address(addr).map_err(Failure::config)?;
        }
        Ok(Target {
            addresses,
            options: config.map(ConnectOptions::from_config).unwrap_or_default(),
            timeout: config.map_or(Config::DEFAULT_CONNECT_TIMEOUT, |c| c.connect_timeout),
        })
    }

    /// The resolved addresses, in order (with their passwords: never print
    /// them unredacted).
    pub(crate) fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// Connects to the first address that answers; returns the connection
    /// and the address that answered, password hidden.
    pub(crate) async fn connect(&self, verb: &str) -> Result<(Connection, String), Failure> {
        let name = connection_name(verb);
        match connect_any(&self.addresses, &name, self.timeout, &self.options).await {
            Ok(connected) => Ok((connected.connection, connected.address)),
            Err(e) => Err(connect_failure(e)),
        }
    }
}

/// Without the `tls` feature lapin has no TLS backend, and its TCP layer
/// then opens an `amqps://` address in plain text (the password included)
/// rather than failing: refuse such an address before connecting (exit 78).
fn refuse_tls_without_tls(addresses: &[String]) -> Result<(), Failure> {
    if cfg!(feature = "tls") {
        return Ok(());
    }
    match addresses
        .iter()
        .find(|a| a.trim_start().to_ascii_lowercase().starts_with("amqps:"))
    {
        Some(addr) => Err(Failure::config(format!(
            "{} asks for TLS, and this acemq was built without its `tls` feature (it would \
             connect in plain text): install it with `cargo install acemq-cli --features tls`, \
             or use an amqp:// address",
            acemq::connection::redact(addr)
        ))),
        None => Ok(()),
    }
}

/// A connect error's exit code: 78 for what the config or the environment
/// got wrong (an address that is not an AMQP URL, a TLS file), 69 for the
/// rest. The library's text names the address with its password hidden.
fn connect_failure(e: ConnectError) -> Failure {
    let message = e.to_string();
    if e.is_config() {
        Failure::config(message)
    } else {
        Failure::unavailable(message)
    }
}

/// The name a connection of `verb` shows in the management UI:
/// `acemq VERB (host:pid)`.
pub(crate) fn connection_name(verb: &str) -> String {
    format!("acemq {verb} ({}:{})", hostname(), std::process::id())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_flag_address_is_a_usage_error_without_its_password() {
        let e = Target::new(Some("http://u:s3cret@h/"), None).unwrap_err();
        assert_eq!(e.exit, crate::exit::Exit::Usage);
        assert!(!e.message.contains("s3cret"), "{e}");
    }
}

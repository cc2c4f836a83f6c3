//! The TLS settings lapin takes, read from the files the config names.

use std::path::Path;

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};

use super::error::ConnectError;
use crate::config::TlsConfig;

fn read_tls_file(field: &'static str, path: &Path) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|e| ConnectError::Tls {
        field,
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// The TLS settings lapin takes, read from the files `tls` names.
pub(crate) fn tls_config(tls: Option<&TlsConfig>) -> Result<OwnedTLSConfig, ConnectError> {
    let Some(tls) = tls else {
        return Ok(OwnedTLSConfig::default());
    };
    if !cfg!(feature = "tls") && (tls.ca_file.is_some() || tls.cert_file.is_some()) {
        return Err(ConnectError::Tls {
            field: "tls",
            path: tls
                .ca_file
                .as_ref()
                .or(tls.cert_file.as_ref())
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            reason:
                "acemq was built without its `tls` feature; enable it to use amqps:// and TLS files"
                    .to_owned(),
        });
    }
    let cert_chain = match &tls.ca_file {
        Some(p) => Some(
            String::from_utf8(read_tls_file("tls.ca_file", p)?).map_err(|_| ConnectError::Tls {
                field: "tls.ca_file",
                path: p.display().to_string(),
                reason: "not a PEM (text) file".to_owned(),
            })?,
        ),
        None => None,
    };
    let identity = match (&tls.cert_file, &tls.key_file) {
        (Some(c), Some(k)) => Some(OwnedIdentity::PKCS8 {
            pem: read_tls_file("tls.cert_file", c)?,
            key: read_tls_file("tls.key_file", k)?,
        }),
        _ => None,
    };
    Ok(OwnedTLSConfig {
        identity,
        cert_chain,
    })
}

//! [`connector`]: the outbox pool's TLS (feature `tls`): rustls with the
//! ring provider, as lapin's `amqps://`, for libpq's `sslmode`.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::error::OutboxError;
use super::sslmode::{Split, SslMode};

fn bad(message: String) -> OutboxError {
    OutboxError::Config { message }
}

/// The connector for `split`'s mode: for `prefer` and `require` the
/// connection is encrypted and the certificate not checked (libpq's
/// meaning: a passive listener learns nothing, an active one in the middle
/// can pose as the server); for `verify-full` it must chain to
/// `sslrootcert`'s certificates, else the operating system's roots, and
/// name the host.
pub(crate) fn connector(split: &Split) -> Result<MakeRustlsConnect, OutboxError> {
    let provider = Arc::new(ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e}")))?;
    let config = if split.mode == SslMode::VerifyFull {
        builder.with_root_certificates(roots(split.root_cert.as_deref())?)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(algorithms)))
    };
    Ok(MakeRustlsConnect::new(config.with_no_client_auth()))
}

fn roots(file: Option<&str>) -> Result<RootCertStore, OutboxError> {
    let mut roots = RootCertStore::empty();
    match file {
        Some(path) => {
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|e| bad(format!("sslrootcert {path}: {e}")))?
            {
                let cert = cert.map_err(|e| bad(format!("sslrootcert {path}: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| bad(format!("sslrootcert {path}: {e}")))?;
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    if roots.is_empty() {
        return Err(bad(format!(
            "sslmode=verify-full found no root certificate in {}: name the server's CA's file with sslrootcert",
            file.unwrap_or("the operating system's store")
        )));
    }
    Ok(roots)
}

/// `prefer` and `require`: any certificate, with the handshake's
/// signatures still checked against it.
#[derive(Debug)]
struct EncryptOnly(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

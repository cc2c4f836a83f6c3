//! `outbox::pool` over TLS (feature `tls`) against the local PostgreSQL:
//! libpq's `sslmode` as the pool's connections live it, read back from the
//! server's `pg_stat_ssl`. With the server's `ssl` off, `require` must fail
//! naming TLS and `prefer` connect in plain.

use acemq::outbox;

use crate::support::{admin, pg_base};

/// Whether the pool's connection is encrypted, as the server sees it; or
/// the pool's error.
async fn encrypted(settings: &str) -> Result<bool, String> {
    let pool = outbox::pool(settings, 1).map_err(|e| e.to_string())?;
    let client = pool.get().await.map_err(|e| {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(e) = source {
            text = format!("{text}: {e}");
            source = e.source();
        }
        text
    })?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(row.get(0))
}

async fn show(setting: &str) -> String {
    admin()
        .await
        .query_one(&format!("SHOW {setting}"), &[])
        .await
        .expect("SHOW")
        .get(0)
}

#[tokio::test]
async fn sslmode_decides_the_pools_tls() {
    let base = pg_base();
    assert!(!encrypted(&format!("{base} sslmode=disable")).await.unwrap());
    if show("ssl").await != "on" {
        assert!(!encrypted(&format!("{base} sslmode=prefer")).await.unwrap());
        let error = encrypted(&format!("{base} sslmode=require"))
            .await
            .unwrap_err();
        assert!(error.contains("TLS"), "{error}");
        return;
    }
    // `prefer` (the default) and `require` encrypt, without checking the
    // server's certificate (Debian's is self-signed).
    assert!(encrypted(&base).await.unwrap());
    assert!(encrypted(&format!("{base} sslmode=require")).await.unwrap());

    // `verify-full` with the operating system's roots: refused, and the
    // error says why (the self-signed certificate is not trusted, or where
    // the system trusts it, it does not name 127.0.0.1).
    let error = encrypted(&format!("{base} sslmode=verify-full"))
        .await
        .unwrap_err();
    assert!(
        error.contains("TLS") && error.contains("certificate"),
        "{error}"
    );

    // With the server's own certificate as the root: the name is checked —
    // not an address the certificate does not name, but its host name.
    let cert = show("ssl_cert_file").await;
    let verify = |host: &str| {
        format!(
            "host={host} hostaddr=127.0.0.1 user=postgres sslmode=verify-full sslrootcert={cert}"
        )
    };
    let error = encrypted(&verify("127.0.0.1")).await.unwrap_err();
    assert!(error.contains("certificate not valid for name"), "{error}");
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let mut named = false;
    for host in ["localhost", hostname.trim()] {
        named |= encrypted(&verify(host)).await == Ok(true);
    }
    assert!(
        named,
        "verify-full with {cert} named neither localhost nor {hostname}"
    );
}

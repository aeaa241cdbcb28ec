//! What the Postgres and Redis connections share about TLS: the one crypto
//! provider (ring), and recognising a failed certificate check inside a
//! client library's error, so it can be reported naming the setting to fix
//! instead of as a generic I/O failure.

use std::error::Error;
use std::sync::Arc;

/// Makes ring the process-wide rustls provider, for the clients that take
/// the default (redis-rs; `pg` names ring itself). Needed because a
/// dependency (pgwire-replication, through tokio-rustls' default features)
/// also enables rustls' aws-lc-rs provider, and with two compiled in rustls
/// picks neither. Idempotent; call before building any TLS client.
pub(crate) fn use_ring() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The rustls error in `e` or its source chain (the libraries wrap it in an
/// `io::Error`; redis-rs's source is that error behind an `Arc`), as text.
pub(crate) fn rustls_failure(e: &(dyn Error + 'static)) -> Option<String> {
    let mut next = Some(e);
    while let Some(mut err) = next {
        if let Some(shared) = err.downcast_ref::<Arc<dyn Error + Send + Sync>>() {
            err = &**shared;
        }
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        let wrapped = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        if let Some(tls) = wrapped {
            return Some(tls.to_string());
        }
        next = err.source();
    }
    None
}

//! Building redis-rs clients from `store.redis`: the one place that applies
//! `store.redis.tls` (CA bundle, client certificate and key) to the store's
//! connections, the near cache's tracked connection and the stream
//! consumer's, and that names the setting when a TLS handshake fails.
//!
//! A `rediss://` URL without `tls` verifies against the system's roots. The
//! certificate must name the URL's host (a DNS name or an IP address SAN);
//! there is no plain-text fallback.

use crate::config::RedisTls;
use redis::{Client, IntoConnectionInfo, RedisError, RedisResult, TlsCertificates};

/// A client for `info`, with the certificates of `tls` if given.
pub fn client(info: impl IntoConnectionInfo, tls: Option<&RedisTls>) -> RedisResult<Client> {
    match tls {
        Some(tls) => Client::build_with_tls(info, certificates(tls)),
        None => Client::open(info),
    }
}

/// `store.redis.tls` in redis-rs's form.
pub fn certificates(tls: &RedisTls) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca.clone(),
    }
}

/// For a failed TLS handshake, the error rephrased to name what to check.
pub fn tls_failure(e: &RedisError) -> Option<String> {
    let detail = crate::tls::rustls_failure(e)?;
    Some(format!(
        "TLS handshake with redis failed: {detail} (check store.redis.tls.ca_file against \
         the server's CA, the certificate's names against the URL's host, and \
         store.redis.tls.cert_file/key_file if the server requires client certificates)"
    ))
}

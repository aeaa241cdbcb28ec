//! Building redis-rs clients from `store.redis`: the one place that applies
//! `store.redis.tls` (CA bundle, client certificate and key) to the store's
//! connections, the near cache's tracked connection and the stream
//! consumer's, and that names the setting when a TLS handshake fails.
//!
//! A `rediss://` URL without `tls` verifies against the system's roots. The
//! certificate must name the URL's host (a DNS name or an IP address SAN;
//! with Sentinel, the address the sentinels announce), or
//! `store.redis.tls.server_name` when given ([`pin`]); there is no
//! plain-text fallback.

use crate::config::RedisTls;
use redis::io::AsyncDNSResolver;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError,
    RedisFuture, RedisResult, TlsCertificates,
};
use std::net::SocketAddr;

/// A client for `info`, with the certificates of `tls` if given.
pub(crate) fn client(info: impl IntoConnectionInfo, tls: Option<&RedisTls>) -> RedisResult<Client> {
    crate::tls::use_ring();
    match tls {
        Some(tls) => Client::build_with_tls(info, certificates(tls)),
        None => Client::open(info),
    }
}

/// `store.redis.tls` in redis-rs's form.
pub(crate) fn certificates(tls: &RedisTls) -> TlsCertificates {
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
pub(crate) fn tls_failure(e: &RedisError) -> Option<String> {
    let detail = crate::tls::rustls_failure(e)?;
    Some(format!(
        "TLS handshake with redis failed: {detail} (check store.redis.tls.ca_file against \
         the server's CA, the certificate's names against store.redis.tls.server_name or the \
         URL's host (with Sentinel: the address the sentinels announce), and \
         store.redis.tls.cert_file/key_file if the server requires client certificates)"
    ))
}

/// `store.redis.tls.server_name`: redis-rs verifies the certificate against
/// the host of the connection's address, so the address gets the server
/// name as its host, and this resolver sends that name to the real host.
/// Any other name resolves as usual.
#[derive(Clone)]
pub(crate) struct Pinned {
    name: String,
    host: String,
}

impl Pinned {
    /// The host the server name stands for.
    pub(crate) fn host(&self) -> &str {
        &self.host
    }
}

impl AsyncDNSResolver for Pinned {
    fn resolve<'a, 'b: 'a>(
        &'a self,
        host: &'b str,
        port: u16,
    ) -> RedisFuture<'a, Box<dyn Iterator<Item = SocketAddr> + Send + 'a>> {
        let host = if host == self.name { &self.host } else { host };
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host, port)).await?;
            Ok(Box::new(addrs) as Box<dyn Iterator<Item = SocketAddr> + Send>)
        })
    }
}

/// `info` as it must be given to redis-rs with `tls`'s server name: the
/// TLS address's host replaced by the name, and the resolver that finds the
/// real host (`None`: no server name, or no TLS; `info` unchanged).
pub(crate) fn pin(
    info: ConnectionInfo,
    tls: Option<&RedisTls>,
) -> (ConnectionInfo, Option<Pinned>) {
    let Some(name) = tls.and_then(|t| t.server_name.clone()) else {
        return (info, None);
    };
    let ConnectionAddr::TcpTls {
        host,
        port,
        insecure,
        tls_params,
    } = info.addr().clone()
    else {
        return (info, None);
    };
    let addr = ConnectionAddr::TcpTls {
        host: name.clone(),
        port,
        insecure,
        tls_params,
    };
    (info.set_addr(addr), Some(Pinned { name, host }))
}

/// `config` with `pinned`'s resolver, if any.
pub(crate) fn resolve_with(
    config: AsyncConnectionConfig,
    pinned: Option<&Pinned>,
) -> AsyncConnectionConfig {
    match pinned {
        Some(pinned) => config.set_dns_resolver(pinned.clone()),
        None => config,
    }
}

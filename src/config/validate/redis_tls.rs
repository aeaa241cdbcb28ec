//! `store.redis.tls`: the certificates of `rediss://` connections, read and
//! parsed at validation.

use super::{err, Result};
use crate::config::file::FileRedisTls;
use crate::config::{RedisTarget, RedisTls};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// `store.redis.tls`: only with `rediss://` URLs; every file is read and
/// its PEM parsed now, so a config that could not connect fails `check`.
pub(super) fn redis_tls(
    raw: Option<&FileRedisTls>,
    target: &RedisTarget,
) -> Result<Option<RedisTls>> {
    let at = "store.redis.tls";
    let Some(t) = raw else {
        // Sentinels over TLS but the primary in plain text is surely not
        // what was meant: say so rather than guess.
        if let RedisTarget::Sentinel(s) = target {
            if s.nodes.iter().any(|n| n.starts_with("rediss://")) {
                return err(
                    at,
                    "needed with rediss:// sentinels: the primary and replicas use TLS only \
                     with it (`tls: {}` for the system's roots)",
                );
            }
        }
        return Ok(None);
    };
    let urls = match target {
        RedisTarget::Single(url) => std::slice::from_ref(url),
        RedisTarget::Cluster(urls) => urls.as_slice(),
        // The primary and replicas (addresses from the sentinels) use TLS
        // because `tls` is given; the sentinels themselves as their URLs say.
        RedisTarget::Sentinel(_) => &[],
    };
    if let Some(plain) = urls.iter().find(|u| !u.starts_with("rediss://")) {
        return err(
            at,
            format!("needs rediss:// URLs; {plain:?} would connect in plain text"),
        );
    }
    let read = |field: &str, path: &str| {
        std::fs::read(path).or_else(|e| {
            err(
                format!("{at}.{field}"),
                format!("cannot read {path:?}: {e}"),
            )
        })
    };
    let certs = |field: &str, path: &str| {
        let pem = read(field, path)?;
        let count = CertificateDer::pem_slice_iter(&pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .or_else(|e| err(format!("{at}.{field}"), format!("{path:?}: bad PEM: {e}")))?
            .len();
        if count == 0 {
            return err(
                format!("{at}.{field}"),
                format!("{path:?} holds no certificate"),
            );
        }
        Ok(pem)
    };
    let ca = t
        .ca_file
        .as_deref()
        .map(|p| certs("ca_file", p))
        .transpose()?;
    let client = match (&t.cert_file, &t.key_file) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            let cert = certs("cert_file", cert)?;
            let key_path = key;
            let key = read("key_file", key_path)?;
            if let Err(e) = PrivateKeyDer::from_pem_slice(&key) {
                return err(
                    format!("{at}.key_file"),
                    format!("{key_path:?} holds no usable private key: {e}"),
                );
            }
            Some((cert, key))
        }
        (Some(_), None) => return err(format!("{at}.key_file"), "needed with cert_file"),
        (None, Some(_)) => return err(format!("{at}.cert_file"), "needed with key_file"),
    };
    let server_name = match &t.server_name {
        None => None,
        Some(name) => {
            let at = format!("{at}.server_name");
            if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
                return err(at, format!("{name:?} is not a DNS name or IP address"));
            }
            // redis-rs verifies each cluster node against the host that
            // `CLUSTER SLOTS` names, and takes no per-node resolver.
            if matches!(target, RedisTarget::Cluster(_)) {
                return err(
                    at,
                    "not supported with store.redis.cluster (the nodes are verified against \
                     the names the cluster announces: set cluster-announce-hostname)",
                );
            }
            Some(name.clone())
        }
    };
    Ok(Some(RedisTls {
        ca,
        client,
        server_name,
    }))
}

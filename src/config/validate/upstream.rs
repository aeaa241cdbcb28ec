//! `upstream`: the service next to sidecache, reached over plain HTTP.

use super::{err, Result};
use crate::config::file::FileConfig;
use crate::config::UpstreamConfig;

pub(super) fn upstream(raw: &FileConfig) -> Result<UpstreamConfig> {
    let u = &raw.upstream;
    let uri: http::Uri = u
        .url
        .parse()
        .or_else(|e| err("upstream.url", format!("{:?}: {e}", u.url)))?;
    let scheme = uri.scheme().cloned();
    if scheme.as_ref() != Some(&http::uri::Scheme::HTTP) {
        return err(
            "upstream.url",
            "must be an http:// URL (sidecache talks plain HTTP to the service next to it)",
        );
    }
    let Some(authority) = uri.authority().cloned() else {
        return err("upstream.url", "needs a host and port");
    };
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return err("upstream.url", "must not have a path or query");
    }
    if u.timeout.0.is_zero() || u.connect_timeout.0.is_zero() {
        return err("upstream.timeout", "timeouts must be greater than zero");
    }
    Ok(UpstreamConfig {
        scheme: http::uri::Scheme::HTTP,
        authority,
        connect_timeout: u.connect_timeout.0,
        timeout: u.timeout.0,
        max_idle_per_host: u.max_idle_per_host,
    })
}

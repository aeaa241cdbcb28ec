//! Turns the file model ([`FileConfig`]) into the typed [`Config`], one file
//! per section of `file.rs`, run in this order: `listen` and `admin`,
//! `upstream`, `store` (its `tls` apart), `fill`, `invalidation`, `limits`
//! and `h2`, `access_log`, `server`, then `routes` (each route, then the
//! cross-route checks: unique names, no two routes that could match one
//! request, relations), then `invalidation.capture` (its mappings name
//! routes). The first error found is returned; it names the YAML path.

mod access_log;
mod admin;
mod capture;
mod fill;
mod invalidation;
mod limits;
mod redis_tls;
mod routes;
mod server;
mod store;
mod upstream;

pub(crate) use invalidation::check_identifier;

use super::file::FileConfig;
use super::{Config, ConfigError};
use std::net::SocketAddr;
use std::time::Duration;

type Result<T> = std::result::Result<T, ConfigError>;

fn err<T>(path: impl Into<String>, message: impl Into<String>) -> Result<T> {
    Err(ConfigError::invalid(path, message))
}

pub(crate) fn validate(raw: FileConfig, digest: [u8; 32]) -> Result<Config> {
    if raw.version != 1 {
        return err(
            "version",
            format!("unsupported version {}; expected 1", raw.version),
        );
    }
    let listen = addr("listen", &raw.listen)?;
    if !crate::pipeline::cache_status::valid_name(&raw.cache_name) {
        return err(
            "cache_name",
            format!(
                "{:?} is not a token (a letter or `*`, then letters, digits or !#$%&'*+-.^_`|~:/)",
                raw.cache_name
            ),
        );
    }
    let admin = admin::admin(&raw, listen)?;
    let upstream = upstream::upstream(&raw)?;
    let store = store::store(&raw)?;
    let fill = fill::fill(&raw)?;
    let mut invalidation = invalidation::invalidation(&raw, &store)?;
    let limits = limits::limits(&raw)?;
    let uploads = limits::uploads(&raw)?;
    let access_log = access_log::access_log(&raw)?;
    let server = server::server(&raw)?;
    let (routes, warnings) = routes::routes(raw.routes, &fill, &upstream)?;
    capture::capture(
        raw.invalidation.capture.as_ref(),
        &mut invalidation,
        &routes,
    )?;

    let max_fresh = routes
        .routes
        .iter()
        .map(|r| r.max_fresh() + r.stale_keep())
        .max()
        .unwrap_or_default();
    let max_lease = routes
        .routes
        .iter()
        .map(|r| r.lease)
        .max()
        .unwrap_or_default();
    let gen_ttl = max_fresh + max_lease + upstream.timeout + Duration::from_secs(60);

    Ok(Config {
        listen,
        log_format: raw.log_format,
        cache_name: raw.cache_name,
        admin,
        upstream,
        store,
        fill,
        routes,
        invalidation,
        limits,
        uploads,
        access_log,
        server,
        gen_ttl,
        warnings,
        digest,
    })
}

fn addr(path: &str, s: &str) -> Result<SocketAddr> {
    s.parse()
        .or_else(|_| err(path, format!("{s:?} is not an address like 0.0.0.0:8080")))
}

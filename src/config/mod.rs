//! Configuration: the file model (`file`), units (`units`), `${VAR}`
//! interpolation (`interpolate`), validation into the typed [`Config`]
//! (`validate`, one file per section), route templates and matching
//! (`route`) on the normal form of request paths (`path`), a route's Bloom
//! filter (`bloom`) and relations (`relations`), and the hot-reload watcher
//! (`watch`).
//!
//! Flow: YAML text -> generic value -> `${VAR}` replaced in string values ->
//! [`file::FileConfig`] (serde, unknown keys rejected, path-aware errors) ->
//! [`validate::validate`] -> [`Config`]. Every error names the YAML path.

pub(crate) mod bloom;
pub(crate) mod bloom_sizing;
pub(crate) mod capture;
pub(crate) mod file;
pub(crate) mod interpolate;
pub(crate) mod path;
pub(crate) mod pattern;
pub(crate) mod query_ignore;
pub(crate) mod relations;
pub(crate) mod route;
pub(crate) mod units;
pub(crate) mod validate;
pub(crate) mod watch;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

pub use bloom_sizing::Sizing;
pub use capture::CaptureMode;
pub use file::FileLogFormat;
pub(crate) use route::RouteMatch;
pub use route::{
    ClientCacheControl, EtagMode, OriginCacheControl, OriginVary, QueryMode, Route, RouteTable, Ttl,
};

/// The JSON Schema of the config file, derived from the file model
/// ([`file::FileConfig`]) so it cannot drift from what `load` accepts
/// (`sidecache schema`). Doc comments become descriptions.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(file::FileConfig);
    serde_json::to_string_pretty(&schema).unwrap_or_default()
}

/// A validated, typed configuration. Immutable once built; a reload builds a
/// new one and swaps it in whole.
#[derive(Debug)]
pub struct Config {
    pub listen: SocketAddr,
    pub log_format: file::FileLogFormat,
    /// The cache's name in `Cache-Status` (docs/caching.md#cache-status).
    pub cache_name: String,
    pub admin: AdminConfig,
    pub upstream: UpstreamConfig,
    pub store: StoreConfig,
    pub fill: FillConfig,
    pub routes: RouteTable,
    pub invalidation: InvalidationConfig,
    pub limits: LimitsConfig,
    /// Request bodies on their way to the service (also `limits` in the
    /// file); read per request.
    pub uploads: UploadConfig,
    /// Reloadable at run time: read per request.
    pub access_log: AccessLogConfig,
    /// The runtime layout (restart to change).
    pub server: ServerConfig,
    /// TTL of generation keys: max(ttl + jitter (or max_ttl) + max(grace,
    /// stale_if_error)) + max(lease) + upstream.timeout (a renewed lease
    /// lasts that long) + 60 s (docs/architecture.md#generation-protocol). The
    /// stale window is included so that a kept entry's generation outlives it:
    /// a lost generation would make the entry unprovable, and so never served
    /// stale.
    pub gen_ttl: Duration,
    /// Valid but doubtful settings, logged at start, on `check` and on
    /// reload (never an error).
    pub warnings: Vec<ConfigWarning>,
    /// SHA-256 of the file text, to skip reloads that change nothing.
    pub digest: [u8; 32],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    pub token: Option<String>,
}

#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `http://host:port`, no path.
    pub scheme: http::uri::Scheme,
    pub authority: http::uri::Authority,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub max_idle_per_host: usize,
}

/// `server.runtime`: see `crate::server::layout`.
pub use file::FileRuntime as RuntimeLayout;

/// `server`: the runtime layout of the client listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    pub runtime: RuntimeLayout,
    /// Worker threads (`multi_thread`) or per-core runtimes (`per_core`);
    /// `None`: one per CPU this process may run on.
    pub workers: Option<usize>,
}

/// `access_log`: what the access log writes (see `crate::access_log`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AccessLogConfig {
    pub enabled: bool,
    pub format: file::FileLogFormat,
    /// Share of requests logged, in (0, 1].
    pub sample: f64,
    /// Log the query string too.
    pub query: bool,
    pub request_id: file::FileRequestId,
    /// Lines waiting for the writer (restart to change).
    pub buffer: usize,
}

/// What one client connection may cost (`limits` and `h2` in the file).
/// All of it applies on reload without a restart: `max_connections` at the
/// accept loop's next check, the rest to connections accepted after the
/// reload (a connection keeps the limits it was accepted with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitsConfig {
    /// Open client connections; at the cap the listener stops accepting.
    pub max_connections: usize,
    /// The whole request head, from accept (or from the first byte of a
    /// keep-alive connection's next request), HTTP/2 preface sniff included.
    pub header_timeout: Duration,
    /// HTTP/1 request head (request line + headers); HTTP/2 header list.
    pub max_header_bytes: usize,
    /// A connection with no request in flight is closed after this long.
    pub idle_timeout: Duration,
    /// A connection whose client takes nothing of a pending response for
    /// this long is closed.
    pub send_timeout: Duration,
    pub h2_max_concurrent_streams: u32,
    /// Request target (path and query, or the absolute URI); longer is 414.
    pub max_target_bytes: usize,
}

/// How forwarded request bodies are held before the upstream request
/// starts (docs/configuration.md#request-bodies). All apply on reload, to
/// requests that start after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadConfig {
    /// Bytes of one body held before the upstream request starts; the rest
    /// of a larger body streams.
    pub buffer: usize,
    /// Bytes all held bodies may reserve together; past it, 503.
    pub budget: usize,
    /// The held part must arrive within this; otherwise 408.
    pub body_timeout: Duration,
    /// Path prefixes (normal form, segment-aligned) whose bodies stream.
    pub stream: Vec<String>,
}

impl UploadConfig {
    /// Whether the body of a request to `raw_path` streams unbuffered: its
    /// normal form starts with a `stream_uploads` prefix at a segment
    /// boundary. A path with no normal form never does, so `..` or an
    /// encoded `/` cannot reach an unlisted path through a listed prefix.
    pub(crate) fn streams(&self, raw_path: &str) -> bool {
        if self.stream.is_empty() {
            return false;
        }
        let Ok(path) = path::normalize(raw_path) else {
            return false;
        };
        self.stream.iter().any(|prefix| {
            path.strip_prefix(prefix.as_str()).is_some_and(|rest| {
                prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/')
            })
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Single(String),
    Cluster(Vec<String>),
    /// The primary that Redis Sentinel names, followed across failovers.
    Sentinel(SentinelTarget),
}

/// `store.redis.sentinel`.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    /// The monitored master's name (`sentinel monitor <name> ...`).
    pub master: String,
    /// `redis://` URLs of the sentinels (their own credentials in the URL).
    pub nodes: Vec<String>,
    /// Credentials and database of the primary and replicas.
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
}

impl std::fmt::Debug for SentinelTarget {
    // The password is a secret: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelTarget")
            .field("master", &self.master)
            .field("nodes", &self.nodes.len())
            .field("db", &self.db)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub target: RedisTarget,
    pub command_timeout: Duration,
    /// `None`: every read goes to Redis.
    pub near_cache: Option<NearCacheConfig>,
    /// Certificates for `rediss://` URLs; `None`: the system's roots and
    /// no client certificate.
    pub tls: Option<RedisTls>,
    /// `None`: invalidations are acknowledged once the primary applied them.
    pub replicas_ack: Option<ReplicasAck>,
}

/// `store.redis.replicas_ack` and `replicas_timeout`: an invalidation counts
/// as applied (outbox row deleted, stream entry acked) only once `replicas`
/// replicas hold it (`WAIT replicas timeout`); fewer is a failure, retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicasAck {
    pub replicas: u32,
    pub timeout: Duration,
}

/// `store.redis.tls`, read and parsed at validation (so `check` refuses a
/// file that could not be used); a changed file needs a restart.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM of the CA bundle; `None`: the system's roots.
    pub ca: Option<Vec<u8>>,
    /// PEM of the client certificate chain and of its key (mTLS).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
    /// Verify the server's certificate against this name instead of the
    /// host connected to (`store.redis.tls.server_name`).
    pub server_name: Option<String>,
}

impl std::fmt::Debug for RedisTls {
    // The key is a secret: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// The in-process copy of hot entries in front of Redis (single node,
/// Sentinel or Cluster), kept coherent by Redis invalidation pushes (see
/// `store::redis::near`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NearCacheConfig {
    pub max_bytes: u64,
    /// Longest time an entry is served from memory without asking Redis;
    /// bounds staleness if invalidation pushes stop arriving unnoticed.
    pub max_age: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// `None`: the embedded in-process store.
    pub redis: Option<RedisConfig>,
    pub namespace: String,
    pub breaker_cooldown: Duration,
    /// `store.memory.max_bytes`: the embedded store's budget (unused with
    /// `redis`).
    pub memory_max_bytes: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct FillConfig {
    pub max_concurrency: usize,
    pub max_body: u64,
    /// How long a fill may wait for a permit (0 = not at all).
    pub queue_timeout: Duration,
    /// Fills waiting for a permit at once; more answer 503 at once.
    pub max_queued: usize,
}

/// Change feeds that invalidate cached objects (docs/invalidation.md#sources).
/// Both optional, both may run at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidationConfig {
    pub outbox: Option<OutboxConfig>,
    pub stream: Option<StreamConfig>,
    /// Instances per feed that run its fan-out: every event is applied by its
    /// consumer plus at most this many witnesses, whatever the number of
    /// instances (`crate::invalidation::witness`,
    /// docs/invalidation.md#witnesses-k-instances-fan-out-not-all-of-them).
    pub witnesses: u32,
    /// Change capture from the service's own tables.
    pub capture: Option<capture::CaptureConfig>,
}

/// `invalidation.outbox`: the Postgres outbox worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxConfig {
    /// A `postgres://` URL or key=value connection string (may hold a
    /// password: never logged).
    pub url: String,
    /// A plain SQL identifier (validated), used unquoted in queries.
    pub table: String,
    /// Poll period while rows are pending (in backoff, locked by another
    /// worker, not applied yet).
    pub poll_interval: Duration,
    /// Poll period while nothing is pending and LISTEN is up: a safety net
    /// for a lost NOTIFY (docs/invalidation.md#what-the-worker-does).
    pub idle_poll_interval: Duration,
    /// Rows claimed per transaction.
    pub batch: u32,
    /// A plain SQL identifier (validated); the `outbox-ddl` trigger notifies it.
    pub notify_channel: String,
    /// Workers LISTEN for the trigger's NOTIFY. Off: no trigger, and the
    /// witnesses poll at `poll_interval` even when idle (a NOTIFY serializes
    /// the commits of every notifying transaction in the cluster).
    pub notify: bool,
}

/// Where a new consumer group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamStart {
    /// `$`: only entries added after the group was created.
    Latest,
    /// `0`: every entry still in the stream.
    Earliest,
}

/// `invalidation.redis_stream`: the Redis Stream consumer. It reads from the
/// store's Redis (`store.redis`), on a connection of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    pub stream: String,
    pub group: String,
    pub start: StreamStart,
    /// Entries pending longer than this on any consumer are claimed.
    pub claim_idle: Duration,
}

/// A setting that is valid but likely not what the operator wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// YAML path, like `routes[0].lease`.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: YAML syntax error: {message}")]
    Syntax { file: String, message: String },
    #[error("{file}: {path}: {message}")]
    Invalid {
        file: String,
        path: String,
        message: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            file: "config".to_owned(),
            path: path.into(),
            message: message.into(),
        }
    }

    fn in_file(self, name: &str) -> Self {
        match self {
            ConfigError::Invalid { path, message, .. } => ConfigError::Invalid {
                file: name.to_owned(),
                path,
                message,
            },
            ConfigError::Syntax { message, .. } => ConfigError::Syntax {
                file: name.to_owned(),
                message,
            },
            other => other,
        }
    }
}

impl Config {
    /// Reads and validates the file at `path`, interpolating from the process
    /// environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::from_file_text(path, &Config::read(path)?)
    }

    /// The file's text, for a caller that looks at it before parsing.
    pub(crate) fn read(path: &Path) -> Result<String, ConfigError> {
        std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.display().to_string(),
            source,
        })
    }

    /// Parses `text` read from `path` (errors name the file), with
    /// `${VAR}` taken from the process environment.
    pub(crate) fn from_file_text(path: &Path, text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, &|k| std::env::var(k).ok())
            .map_err(|e| e.in_file(&path.display().to_string()))
    }

    /// The digest a config parsed from `text` carries.
    pub(crate) fn digest_of(text: &str) -> [u8; 32] {
        use sha2::Digest;
        sha2::Sha256::digest(text.as_bytes()).into()
    }

    /// Parses and validates config text; `env` looks up `${VAR}` values.
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax {
                file: "config".to_owned(),
                message: e.to_string(),
            })?;
        interpolate::interpolate(&mut value, env)?;
        let raw: file::FileConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::invalid(
                if path == "." {
                    "(top level)".into()
                } else {
                    path
                },
                e.into_inner().to_string(),
            )
        })?;
        validate::validate(raw, Config::digest_of(text))
    }

    /// Names of settings that differ and cannot change without a restart.
    pub(crate) fn restart_only_changes(&self, next: &Config) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.listen != next.listen {
            changed.push("listen");
        }
        if self.admin.listen != next.admin.listen {
            changed.push("admin.listen");
        }
        if self.store != next.store {
            changed.push("store");
        }
        if self.upstream.authority != next.upstream.authority
            || self.upstream.scheme != next.upstream.scheme
        {
            changed.push("upstream.url");
        }
        if self.upstream.connect_timeout != next.upstream.connect_timeout {
            changed.push("upstream.connect_timeout");
        }
        if self.upstream.max_idle_per_host != next.upstream.max_idle_per_host {
            changed.push("upstream.max_idle_per_host");
        }
        // The worker and the consumer hold connections and a consumer group
        // made from these settings; they are started once.
        if self.invalidation.capture != next.invalidation.capture {
            changed.push("invalidation.capture");
        }
        if self.invalidation.outbox != next.invalidation.outbox {
            changed.push("invalidation.outbox");
        }
        if self.invalidation.stream != next.invalidation.stream {
            changed.push("invalidation.redis_stream");
        }
        if self.log_format != next.log_format {
            changed.push("log_format");
        }
        // Threads and listeners are made once, at start.
        if self.server != next.server {
            changed.push("server");
        }
        // The buffer is made once, with the writer.
        if self.access_log.buffer != next.access_log.buffer {
            changed.push("access_log.buffer");
        }
        changed
    }
}

#[cfg(test)]
mod tests;

/// Helpers for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Config, ConfigError, Route};
    use std::sync::Arc;

    /// The top of a minimal valid file, without routes.
    pub(crate) const BASE: &str = r#"
version: 1
listen: 127.0.0.1:8080
admin: { listen: 127.0.0.1:9090 }
upstream: { url: "http://127.0.0.1:8000" }
"#;

    /// A `routes:` list of one route with two params.
    pub(crate) const APP: &str = r#"
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params: { tenant: "[a-z]+", id: "[1-9][0-9]*" }
    ttl: 60s
"#;

    /// Parses [`BASE`] followed by `rest`, with `${HOST}` set to 127.0.0.1.
    pub(crate) fn parse(rest: &str) -> Result<Config, ConfigError> {
        Config::parse(&format!("{BASE}{rest}"), &|k| {
            (k == "HOST").then(|| "127.0.0.1".to_owned())
        })
    }

    /// The message of the error that [`parse`] must return for `rest`.
    pub(crate) fn err(rest: &str) -> String {
        match parse(rest) {
            Ok(_) => panic!("config should be rejected:\n{rest}"),
            Err(e) => e.to_string(),
        }
    }

    /// The first route of a minimal config whose `routes:` list is `routes`.
    pub(crate) fn route(routes: &str) -> Arc<Route> {
        let text = format!(
            "version: 1\nlisten: 127.0.0.1:1\nadmin: {{ listen: 127.0.0.1:2 }}\n\
             upstream: {{ url: \"http://127.0.0.1:3\" }}\nroutes:\n{routes}"
        );
        match Config::parse(&text, &|_| None) {
            Ok(cfg) => cfg.routes.routes[0].clone(),
            Err(e) => panic!("test config is invalid: {e}"),
        }
    }
}

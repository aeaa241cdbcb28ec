//! The config file as written: serde structs with `deny_unknown_fields` and
//! defaults. Nothing here is validated beyond its YAML type; `validate`
//! (one file per section) turns a [`FileConfig`] into the typed
//! [`super::Config`].
//!
//! One file on purpose, though long: it is the whole YAML shape with its
//! defaults, read top to bottom like the file itself, and the JSON Schema
//! (`sidecache schema`) is derived from it in one place.

use serde::Deserialize;
use std::collections::BTreeMap;

use super::units::{HumanDuration, HumanSize};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(
    title = "sidecache configuration",
    description = "The YAML config of sidecache (version 1). Every key: docs/configuration.md."
)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    pub version: u32,
    pub listen: String,
    #[serde(default)]
    pub log_format: FileLogFormat,
    /// The cache's name in `Cache-Status` (RFC 9211): an sf-token.
    #[serde(default = "defaults::cache_name")]
    pub cache_name: String,
    pub admin: FileAdmin,
    pub upstream: FileUpstream,
    #[serde(default)]
    pub store: FileStore,
    #[serde(default)]
    pub fill: FileFill,
    #[serde(default)]
    pub invalidation: FileInvalidation,
    #[serde(default)]
    pub limits: FileLimits,
    #[serde(default)]
    pub h2: FileH2,
    #[serde(default)]
    pub access_log: FileAccessLog,
    #[serde(default)]
    pub server: FileServer,
    #[serde(default)]
    pub routes: Vec<FileRoute>,
}

/// `server`: how the client listener is run
/// (docs/configuration.md#runtime-layout).
#[derive(Debug, Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileServer {
    #[serde(default)]
    pub runtime: FileRuntime,
    /// Absent: one per CPU this process may run on.
    #[serde(default)]
    pub workers: Option<usize>,
}

/// `server.runtime: multi_thread | per_core`.
#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileRuntime {
    /// One work-stealing tokio runtime for everything.
    #[default]
    MultiThread,
    /// One current-thread runtime per worker, each with its own
    /// `SO_REUSEPORT` listener and upstream pool.
    PerCore,
}

/// `access_log`: one line per client request on stdout
/// (docs/configuration.md#access-log).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileAccessLog {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub format: FileLogFormat,
    /// Share of requests logged, in (0, 1].
    #[serde(default = "defaults::sample")]
    pub sample: f64,
    /// Log the query string (off: it may carry secrets).
    #[serde(default)]
    pub query: bool,
    #[serde(default)]
    pub request_id: FileRequestId,
    /// Room for about this many lines (of `access_log::LINE_ROOM` bytes)
    /// waiting for the writer; lines that find no room are dropped.
    #[serde(default = "defaults::access_log_buffer")]
    pub buffer: usize,
}

impl Default for FileAccessLog {
    fn default() -> Self {
        FileAccessLog {
            enabled: false,
            format: FileLogFormat::Text,
            sample: defaults::sample(),
            query: false,
            request_id: FileRequestId::Pass,
            buffer: defaults::access_log_buffer(),
        }
    }
}

/// `access_log.request_id: pass | generate`.
#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileRequestId {
    /// The client's `X-Request-Id` (if any) is passed through and logged.
    #[default]
    Pass,
    /// As `pass`, and a request without one gets a fresh id, sent upstream
    /// and returned to the client.
    Generate,
}

/// `limits`: what one client connection may cost
/// (docs/configuration.md#limits).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileLimits {
    /// Absent: derived from `RLIMIT_NOFILE` (see `validate`).
    #[serde(default)]
    pub max_connections: Option<usize>,
    #[serde(default = "defaults::header_timeout")]
    pub header_timeout: HumanDuration,
    #[serde(default = "defaults::max_header_bytes")]
    pub max_header_bytes: HumanSize,
    #[serde(default = "defaults::idle_timeout")]
    pub idle_timeout: HumanDuration,
    #[serde(default = "defaults::send_timeout")]
    pub send_timeout: HumanDuration,
    /// The request target (path and query); longer -> 414.
    #[serde(default = "defaults::max_target_bytes")]
    pub max_target_bytes: HumanSize,
    /// A forwarded request body is held up to this size before the
    /// upstream request starts (docs/configuration.md#request-bodies).
    #[serde(default = "defaults::request_buffer")]
    pub request_buffer: HumanSize,
    /// What all buffered request bodies together may hold; past it new
    /// uploads get 503.
    #[serde(default = "defaults::request_buffer_budget")]
    pub request_buffer_budget: HumanSize,
    /// The buffered part of a request body must arrive within this, or
    /// 408 and the connection is closed.
    #[serde(default = "defaults::body_timeout")]
    pub body_timeout: HumanDuration,
    /// Path prefixes whose request bodies stream to the service unbuffered.
    #[serde(default)]
    pub stream_uploads: Vec<String>,
}

impl Default for FileLimits {
    fn default() -> Self {
        FileLimits {
            max_connections: None,
            header_timeout: defaults::header_timeout(),
            max_header_bytes: defaults::max_header_bytes(),
            idle_timeout: defaults::idle_timeout(),
            send_timeout: defaults::send_timeout(),
            max_target_bytes: defaults::max_target_bytes(),
            request_buffer: defaults::request_buffer(),
            request_buffer_budget: defaults::request_buffer_budget(),
            body_timeout: defaults::body_timeout(),
            stream_uploads: Vec::new(),
        }
    }
}

/// `h2`: HTTP/2 (h2c) settings for client connections.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileH2 {
    #[serde(default = "defaults::max_concurrent_streams")]
    pub max_concurrent_streams: u32,
}

impl Default for FileH2 {
    fn default() -> Self {
        FileH2 {
            max_concurrent_streams: defaults::max_concurrent_streams(),
        }
    }
}

#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileLogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileAdmin {
    pub listen: String,
    #[serde(default)]
    pub token: Option<String>,
    /// Lets a non-loopback `listen` run without a token (the operator's
    /// explicit choice, e.g. a port only reachable inside the pod).
    #[serde(default)]
    pub allow_unauthenticated: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileUpstream {
    pub url: String,
    #[serde(default = "defaults::connect_timeout")]
    pub connect_timeout: HumanDuration,
    #[serde(default = "defaults::upstream_timeout")]
    pub timeout: HumanDuration,
    #[serde(default = "defaults::max_idle_per_host")]
    pub max_idle_per_host: usize,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileStore {
    #[serde(default)]
    pub redis: Option<FileRedis>,
    #[serde(default = "defaults::namespace")]
    pub namespace: String,
    #[serde(default)]
    pub breaker: FileBreaker,
    /// The embedded store (no `redis`): its byte budget.
    #[serde(default)]
    pub memory: FileMemoryStore,
}

impl Default for FileStore {
    fn default() -> Self {
        FileStore {
            redis: None,
            namespace: defaults::namespace(),
            breaker: FileBreaker::default(),
            memory: FileMemoryStore::default(),
        }
    }
}

/// `store.memory`: the embedded store's limits (docs/architecture.md#embedded-store).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileMemoryStore {
    /// Bytes of keys, values and per-key overhead the store may hold
    /// before it evicts.
    #[serde(default = "defaults::memory_max_bytes")]
    pub max_bytes: HumanSize,
}

impl Default for FileMemoryStore {
    fn default() -> Self {
        FileMemoryStore {
            max_bytes: defaults::memory_max_bytes(),
        }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileRedis {
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub cluster: Option<Vec<String>>,
    #[serde(default)]
    pub sentinel: Option<FileSentinel>,
    #[serde(default = "defaults::command_timeout")]
    pub command_timeout: HumanDuration,
    #[serde(default)]
    pub near_cache: Option<FileNearCache>,
    #[serde(default)]
    pub tls: Option<FileRedisTls>,
    /// Replicas that must hold an invalidation before its event is
    /// acknowledged (`WAIT`); 0: do not wait.
    #[serde(default)]
    pub replicas_ack: u32,
    #[serde(default = "defaults::replicas_timeout")]
    pub replicas_timeout: HumanDuration,
}

/// `store.redis.sentinel`: follow the primary Redis Sentinel names.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileSentinel {
    pub master: String,
    /// Sentinel URLs (`redis://host:26379`).
    pub nodes: Vec<String>,
    /// For the primary (not the sentinels: those go in their URLs).
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub db: i64,
}

/// `store.redis.tls`: certificates for `rediss://` (files in PEM).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileRedisTls {
    /// CA bundle that signs the server's certificate; absent: system roots.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// Client certificate (chain) and key, for servers that require mTLS.
    #[serde(default)]
    pub cert_file: Option<String>,
    #[serde(default)]
    pub key_file: Option<String>,
    /// The name the server's certificate is verified against, instead of
    /// the host connected to.
    #[serde(default)]
    pub server_name: Option<String>,
}

/// `store.redis.near_cache`; absent = defaults (on for `url`, off for
/// `cluster` and `sentinel`, where it is opt-in).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileNearCache {
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    #[serde(default = "defaults::near_max_bytes")]
    pub max_bytes: HumanSize,
    #[serde(default = "defaults::near_max_age")]
    pub max_age: HumanDuration,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileBreaker {
    #[serde(default = "defaults::cooldown")]
    pub cooldown: HumanDuration,
}

impl Default for FileBreaker {
    fn default() -> Self {
        FileBreaker {
            cooldown: defaults::cooldown(),
        }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileFill {
    #[serde(default = "defaults::max_concurrency")]
    pub max_concurrency: usize,
    #[serde(default = "defaults::max_body")]
    pub max_body: HumanSize,
    #[serde(default = "defaults::queue_timeout")]
    pub queue_timeout: HumanDuration,
    #[serde(default = "defaults::max_queued")]
    pub max_queued: usize,
}

impl Default for FileFill {
    fn default() -> Self {
        FileFill {
            max_concurrency: defaults::max_concurrency(),
            max_body: defaults::max_body(),
            queue_timeout: defaults::queue_timeout(),
            max_queued: defaults::max_queued(),
        }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileInvalidation {
    #[serde(default)]
    pub outbox: Option<FileOutbox>,
    #[serde(default)]
    pub redis_stream: Option<FileRedisStream>,
    #[serde(default = "defaults::witnesses")]
    pub witnesses: u32,
    #[serde(default)]
    pub capture: Option<FileCapture>,
}

impl Default for FileInvalidation {
    fn default() -> Self {
        FileInvalidation {
            outbox: None,
            redis_stream: None,
            witnesses: defaults::witnesses(),
            capture: None,
        }
    }
}

/// `invalidation.capture`: change capture from the service's own tables.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileCapture {
    pub mode: FileCaptureMode,
    /// Default: `invalidation.outbox.url`.
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default = "defaults::capture_name")]
    pub slot: String,
    #[serde(default = "defaults::capture_name")]
    pub publication: String,
    pub tables: Vec<FileCaptureTable>,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FileCaptureMode {
    Triggers,
    Logical,
}

/// One entry of `invalidation.capture.tables`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileCaptureTable {
    pub table: String,
    pub route: String,
    /// Route param -> template over the row's columns (`"{id}"`).
    #[serde(default)]
    pub params: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub revision: Option<String>,
    #[serde(default)]
    pub on_insert: FileOnInsert,
}

/// What an `INSERT` of a mapped row does besides invalidating.
#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FileOnInsert {
    #[default]
    Invalidate,
    /// Also grows the route's Bloom filter (an `create` event).
    Create,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileOutbox {
    pub url: String,
    #[serde(default = "defaults::outbox_table")]
    pub table: String,
    #[serde(default = "defaults::poll_interval")]
    pub poll_interval: HumanDuration,
    #[serde(default = "defaults::idle_poll_interval")]
    pub idle_poll_interval: HumanDuration,
    #[serde(default = "defaults::batch")]
    pub batch: u32,
    #[serde(default = "defaults::outbox_table")]
    pub notify_channel: String,
    /// `false`: no NOTIFY trigger; witnesses poll at `poll_interval`.
    #[serde(default = "defaults::yes")]
    pub notify: bool,
    /// Besides `url`: libpq's `sslmode` / `sslrootcert` (also for the
    /// Bloom source, which uses the same database).
    #[serde(default)]
    pub sslmode: Option<String>,
    #[serde(default)]
    pub sslrootcert: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileRedisStream {
    #[serde(default = "defaults::stream")]
    pub stream: String,
    #[serde(default = "defaults::group")]
    pub group: String,
    #[serde(default)]
    pub start: FileStreamStart,
    #[serde(default = "defaults::claim_idle")]
    pub claim_idle: HumanDuration,
}

#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FileStreamStart {
    #[default]
    Latest,
    Earliest,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileRoute {
    pub name: String,
    pub path: String,
    #[serde(default = "defaults::methods")]
    pub methods: Vec<String>,
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    #[serde(default)]
    pub query: FileQuery,
    /// Query parameter names (`*` matches any run of characters) dropped
    /// from the key and the fill request, never a reason to bypass:
    /// tracking parameters such as `utm_*`, `fbclid`, `gclid`.
    #[serde(default)]
    pub query_ignore: Vec<String>,
    #[serde(default)]
    pub vary: Vec<String>,
    /// A duration, or `origin` (then `max_ttl` is required).
    pub ttl: FileTtl,
    /// With `ttl: origin`: the cap of the origin's lifetime.
    #[serde(default)]
    pub max_ttl: Option<HumanDuration>,
    /// With `ttl: origin`: the lifetime of answers that give none.
    #[serde(default)]
    pub default_ttl: Option<HumanDuration>,
    #[serde(default = "defaults::zero")]
    pub jitter: HumanDuration,
    #[serde(default = "defaults::negative_ttl")]
    pub negative_ttl: HumanDuration,
    /// Stale-while-revalidate window after expiry.
    #[serde(default = "defaults::zero")]
    pub grace: HumanDuration,
    /// With `ttl: origin`: the widest stale window an answer's own
    /// `stale-while-revalidate` may open (beyond `grace`); absent: 1m.
    #[serde(default)]
    pub max_grace: Option<HumanDuration>,
    /// Window after expiry in which an entry answers instead of a failed refill.
    #[serde(default = "defaults::zero")]
    pub stale_if_error: HumanDuration,
    /// How long an expired entry with validators is kept to be revalidated.
    #[serde(default = "defaults::keep")]
    pub keep: HumanDuration,
    /// Hit-for-pass: how long an object variant whose answer could not be
    /// stored for a reason of its own is forwarded without a fill; `0s` off.
    #[serde(default = "defaults::hit_for_pass")]
    pub hit_for_pass: HumanDuration,
    /// With the store unreachable: how young a running degraded fetch of
    /// the object must be for a miss to join it instead of fetching its
    /// own; `0s` never joins.
    #[serde(default = "defaults::degraded_join_window")]
    pub degraded_join_window: HumanDuration,
    /// Statuses stored as positive answers. Absent: `[200]`; with `ttl:
    /// origin`, the statuses RFC 9110 §15.1 marks heuristically cacheable
    /// (200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501; those not in
    /// `negative_status`), and any other status whose answer gives explicit
    /// freshness.
    #[serde(default)]
    pub cache_status: Option<Vec<u16>>,
    #[serde(default = "defaults::negative_status")]
    pub negative_status: Vec<u16>,
    #[serde(default = "defaults::lease")]
    pub lease: HumanDuration,
    #[serde(default = "defaults::wait")]
    pub wait: HumanDuration,
    #[serde(default = "defaults::yes")]
    pub invalidate_on_write: bool,
    #[serde(default)]
    pub bloom: Option<FileBloom>,
    /// `Host` sent on fills; absent = the upstream's authority.
    #[serde(default)]
    pub host: Option<String>,
    /// Client headers copied onto fills besides `vary`; absent = the
    /// tracing defaults.
    #[serde(default)]
    pub fill_headers: Option<Vec<String>>,
    #[serde(default)]
    pub origin_cache_control: FileOriginCacheControl,
    /// Read RFC 9213 `CDN-Cache-Control` in place of `Cache-Control`.
    #[serde(default)]
    pub cdn_cache_control: bool,
    /// Key each object's variants on the request headers its answers name
    /// in `Vary` (learned per object), besides `vary`. Absent: on with
    /// `ttl: origin`, off otherwise.
    #[serde(default)]
    pub vary_from_origin: Option<bool>,
    /// With `vary_from_origin`: most header names learned from one answer.
    #[serde(default)]
    pub max_vary_headers: Option<usize>,
    /// With `vary_from_origin`: longest value (bytes) of a learned header a
    /// request may carry and still be cached.
    #[serde(default)]
    pub max_vary_value: Option<usize>,
    /// This route's share of `fill.max_concurrency`; absent = the default share.
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    #[serde(default)]
    pub client_cache_control: FileClientCacheControl,
    #[serde(default)]
    pub etag: FileEtag,
    /// Other routes' objects an event for this route invalidates too.
    #[serde(default)]
    pub also_invalidates: Vec<FileRelation>,
    /// Response header whose space- or comma-separated values tag the entry.
    #[serde(default)]
    pub tags_from: Option<String>,
    /// Response header carrying the answer's integer version (revision).
    #[serde(default)]
    pub version_from: Option<String>,
}

/// One `also_invalidates` item: a route and its params as templates over
/// this route's params (`{ tenant: "{tenant}" }`).
#[derive(Debug, Deserialize, Clone, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileRelation {
    pub route: String,
    #[serde(default)]
    pub params: BTreeMap<String, String>,
}

/// `ttl: 60s | origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileTtl {
    Fixed(HumanDuration),
    Origin,
}

impl<'de> Deserialize<'de> for FileTtl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "origin" {
            return Ok(FileTtl::Origin);
        }
        super::units::parse_duration(&s)
            .map(|d| FileTtl::Fixed(HumanDuration(d)))
            .map_err(|e| serde::de::Error::custom(format!("{e}, or `origin`")))
    }
}

impl schemars::JsonSchema for FileTtl {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Ttl".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A fixed lifetime (`60s`) or `origin`: the origin's Cache-Control/Expires.",
            "type": "string",
            "pattern": "^(origin|[0-9]+(ms|s|m|h))$"
        })
    }
}

/// `client_cache_control: pass | remaining | "<literal header value>"`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum FileClientCacheControl {
    #[default]
    Pass,
    Remaining,
    Literal(String),
}

impl<'de> Deserialize<'de> for FileClientCacheControl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.as_str() {
            "pass" => FileClientCacheControl::Pass,
            "remaining" => FileClientCacheControl::Remaining,
            _ => FileClientCacheControl::Literal(s),
        })
    }
}

impl schemars::JsonSchema for FileClientCacheControl {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ClientCacheControl".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "`pass`, `remaining`, or a literal Cache-Control value for clients.",
            "type": "string"
        })
    }
}

/// `etag: origin | auto`.
#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FileEtag {
    #[default]
    Origin,
    Auto,
}

/// `origin_cache_control: honor | ignore`.
#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FileOriginCacheControl {
    #[default]
    Honor,
    Ignore,
}

/// `query: include | ignore | [names]`.
#[derive(Debug, Deserialize, Clone, PartialEq, Eq, schemars::JsonSchema)]
#[serde(untagged)]
pub(crate) enum FileQuery {
    Mode(FileQueryMode),
    Allow(Vec<String>),
}

impl Default for FileQuery {
    fn default() -> Self {
        FileQuery::Mode(FileQueryMode::Include)
    }
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FileQueryMode {
    Include,
    Ignore,
}

#[derive(Debug, Deserialize, Clone, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileBloom {
    pub scope: String,
    pub source: String,
    pub capacity: u64,
    pub fp_rate: f64,
    #[serde(default = "defaults::rebuild_every")]
    pub rebuild_every: HumanDuration,
}

pub(super) mod defaults {
    use super::super::units::{HumanDuration, HumanSize};
    use std::time::Duration;

    pub(crate) fn connect_timeout() -> HumanDuration {
        HumanDuration(Duration::from_secs(1))
    }
    pub(crate) fn upstream_timeout() -> HumanDuration {
        HumanDuration(Duration::from_secs(10))
    }
    pub(crate) fn max_idle_per_host() -> usize {
        64
    }
    pub(crate) fn namespace() -> String {
        "sc:".to_owned()
    }
    pub(crate) fn cache_name() -> String {
        "sidecache".to_owned()
    }
    pub(crate) fn command_timeout() -> HumanDuration {
        HumanDuration(Duration::from_millis(300))
    }
    pub(crate) fn memory_max_bytes() -> HumanSize {
        HumanSize(crate::store::memory::DEFAULT_MAX_BYTES)
    }
    pub(crate) fn near_max_bytes() -> HumanSize {
        HumanSize(64 << 20)
    }
    pub(crate) fn near_max_age() -> HumanDuration {
        HumanDuration(Duration::from_secs(1))
    }
    pub(crate) fn replicas_timeout() -> HumanDuration {
        HumanDuration(Duration::from_millis(500))
    }
    pub(crate) fn cooldown() -> HumanDuration {
        HumanDuration(Duration::from_secs(2))
    }
    pub(crate) fn queue_timeout() -> HumanDuration {
        HumanDuration(Duration::from_millis(250))
    }
    pub(crate) fn max_queued() -> usize {
        256
    }
    pub(crate) fn max_concurrency() -> usize {
        8
    }
    pub(crate) fn max_body() -> HumanSize {
        HumanSize(1024 * 1024)
    }
    pub(crate) fn outbox_table() -> String {
        "sidecache_outbox".to_owned()
    }
    pub(crate) fn poll_interval() -> HumanDuration {
        HumanDuration(Duration::from_secs(1))
    }
    pub(crate) fn idle_poll_interval() -> HumanDuration {
        HumanDuration(Duration::from_secs(30))
    }
    pub(crate) fn batch() -> u32 {
        100
    }
    pub(crate) fn stream() -> String {
        "sidecache:invalidations".to_owned()
    }
    pub(crate) fn group() -> String {
        "sidecache".to_owned()
    }
    pub(crate) fn witnesses() -> u32 {
        2
    }
    pub(crate) fn capture_name() -> String {
        "sidecache".to_owned()
    }
    pub(crate) fn claim_idle() -> HumanDuration {
        HumanDuration(Duration::from_secs(30))
    }
    pub(crate) fn methods() -> Vec<String> {
        vec!["GET".to_owned(), "HEAD".to_owned()]
    }
    pub(crate) fn zero() -> HumanDuration {
        HumanDuration(Duration::ZERO)
    }
    pub(crate) fn keep() -> HumanDuration {
        HumanDuration(Duration::from_secs(60))
    }
    pub(crate) fn negative_ttl() -> HumanDuration {
        HumanDuration(Duration::from_secs(5))
    }
    pub(crate) fn cache_status() -> Vec<u16> {
        vec![200]
    }
    /// With `ttl: origin`: RFC 9110 §15.1's heuristically cacheable
    /// statuses, 206 aside (fills ask for whole objects).
    pub(crate) fn origin_cache_status() -> Vec<u16> {
        vec![200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501]
    }
    pub(crate) fn negative_status() -> Vec<u16> {
        vec![404]
    }
    pub(crate) fn hit_for_pass() -> HumanDuration {
        HumanDuration(Duration::from_secs(60))
    }
    /// Well inside the 50 ms staleness bound (docs/architecture.md#degraded-answers-are-never-older-than-the-window),
    /// and still long enough to gather a burst of misses into one fetch.
    pub(crate) fn degraded_join_window() -> HumanDuration {
        HumanDuration(Duration::from_millis(20))
    }
    pub(crate) fn lease() -> HumanDuration {
        HumanDuration(Duration::from_secs(3))
    }
    pub(crate) fn wait() -> HumanDuration {
        HumanDuration(Duration::from_millis(600))
    }
    pub(crate) fn yes() -> bool {
        true
    }
    pub(crate) fn fill_headers() -> Vec<String> {
        ["traceparent", "tracestate", "x-request-id"]
            .map(str::to_owned)
            .to_vec()
    }
    pub(crate) fn header_timeout() -> HumanDuration {
        HumanDuration(Duration::from_secs(10))
    }
    pub(crate) fn max_header_bytes() -> HumanSize {
        HumanSize(64 * 1024)
    }
    pub(crate) fn idle_timeout() -> HumanDuration {
        HumanDuration(Duration::from_secs(60))
    }
    pub(crate) fn send_timeout() -> HumanDuration {
        HumanDuration(Duration::from_secs(30))
    }
    /// nginx's and Apache's request-line limit.
    pub(crate) fn max_target_bytes() -> HumanSize {
        HumanSize(8 * 1024)
    }
    /// nginx's `client_max_body_size` default: most form posts and JSON
    /// bodies fit whole.
    pub(crate) fn request_buffer() -> HumanSize {
        HumanSize(1024 * 1024)
    }
    pub(crate) fn request_buffer_budget() -> HumanSize {
        HumanSize(64 * 1024 * 1024)
    }
    /// Like `send_timeout`: a full 1 MiB buffer needs 35 KB/s.
    pub(crate) fn body_timeout() -> HumanDuration {
        HumanDuration(Duration::from_secs(30))
    }
    pub(crate) fn max_concurrent_streams() -> u32 {
        100
    }
    /// 1 MiB of lines (256 bytes each), split into one shard per CPU;
    /// at 100 000 req/s, 40 ms of lines.
    pub(crate) fn access_log_buffer() -> usize {
        4096
    }
    pub(crate) fn sample() -> f64 {
        1.0
    }
    pub(crate) fn rebuild_every() -> HumanDuration {
        HumanDuration(Duration::from_secs(600))
    }
}

//! Turns the file model into the typed [`Config`]: addresses, URLs, route
//! templates and anchored param patterns, and the cross-route checks
//! (unique names, no two routes that could match one request).

use super::file::FileStreamStart;
use super::file::{
    defaults, FileClientCacheControl, FileConfig, FileEtag, FileNearCache, FileOriginCacheControl,
    FileQuery, FileQueryMode, FileRedis, FileRedisTls, FileRoute, FileSentinel, FileTtl,
};
use super::pattern::ParamPattern;
use super::route::{
    overlaps, parse_template, ClientCacheControl, EtagMode, OriginCacheControl, OriginVary, Param,
    QueryMode, Route, RouteTable, Ttl,
};
use super::units::HumanDuration;
use super::{
    AccessLogConfig, AdminConfig, Config, ConfigError, ConfigWarning, FillConfig,
    InvalidationConfig, LimitsConfig, NearCacheConfig, OutboxConfig, RedisConfig, RedisTarget,
    RedisTls, ReplicasAck, SentinelTarget, ServerConfig, StoreConfig, StreamConfig, StreamStart,
    UpstreamConfig,
};
use http::{HeaderName, Method};
use redis::IntoConnectionInfo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

type Result<T> = std::result::Result<T, ConfigError>;

fn err<T>(path: impl Into<String>, message: impl Into<String>) -> Result<T> {
    Err(ConfigError::invalid(path, message))
}

pub fn validate(raw: FileConfig, digest: [u8; 32]) -> Result<Config> {
    if raw.version != 1 {
        return err(
            "version",
            format!("unsupported version {}; expected 1", raw.version),
        );
    }
    let listen = addr("listen", &raw.listen)?;
    let admin = AdminConfig {
        listen: addr("admin.listen", &raw.admin.listen)?,
        token: raw.admin.token.clone().filter(|t| !t.is_empty()),
    };
    if admin.listen == listen {
        return err("admin.listen", "must differ from listen");
    }
    // Whoever reaches /admin/* can invalidate everything and start builds.
    if !admin.listen.ip().is_loopback() && admin.token.is_none() && !raw.admin.allow_unauthenticated
    {
        return err(
            "admin.token",
            format!(
                "admin.listen {} is not a loopback address and no token is set: anyone who reaches it \
                 could invalidate the cache; set admin.token, or admin.allow_unauthenticated: true \
                 if only trusted peers can reach that port",
                admin.listen
            ),
        );
    }
    let upstream = upstream(&raw)?;
    let store = store(&raw)?;
    if raw.fill.max_concurrency == 0 {
        return err("fill.max_concurrency", "must be at least 1");
    }
    if raw.fill.queue_timeout.0 > Duration::from_secs(10) {
        return err(
            "fill.queue_timeout",
            "must be at most 10s: a queued fill holds its client, and a long queue hides an overload",
        );
    }
    let fill = FillConfig {
        max_concurrency: raw.fill.max_concurrency,
        max_body: raw.fill.max_body.0,
        queue_timeout: raw.fill.queue_timeout.0,
        max_queued: raw.fill.max_queued,
    };
    let invalidation = invalidation(&raw, &store)?;
    let limits = limits(&raw)?;
    let access_log = access_log(&raw)?;
    let server = server(&raw)?;

    // A route may take at most half the fill permits (rounded up), so a
    // flood of misses on one route (cache-busting) leaves the other half to
    // the rest; a lone route has no one to share with and takes them all.
    let default_budget = if raw.routes.len() <= 1 {
        fill.max_concurrency
    } else {
        fill.max_concurrency.div_ceil(2)
    };
    let mut warnings = Vec::new();
    let mut routes: Vec<Route> = Vec::with_capacity(raw.routes.len());
    let mut relations = Vec::with_capacity(raw.routes.len());
    for (i, mut r) in raw.routes.into_iter().enumerate() {
        let at = format!("routes[{i}]");
        relations.push(std::mem::take(&mut r.also_invalidates));
        let route = route(&at, r, &fill, default_budget)?;
        if route.lease < upstream.timeout {
            warnings.push(ConfigWarning {
                path: format!("{at}.lease"),
                message: format!(
                    "{:?} is shorter than upstream.timeout ({:?}): a slower fill keeps its \
                     lease only by renewing it every {:?}; if a renewal fails, that fill \
                     is not cached (publish outcome lease_lost)",
                    route.lease,
                    upstream.timeout,
                    route.lease / 3
                ),
            });
        }
        if let Some(j) = routes.iter().position(|o| o.name == route.name) {
            return err(
                format!("{at}.name"),
                format!("duplicate route name {:?} (also routes[{j}])", route.name),
            );
        }
        if let Some(j) = routes.iter().position(|o| overlaps(o, &route)) {
            return err(
                format!("{at}.path"),
                format!(
                    "{:?} conflicts with routes[{j}] ({:?}): one request could match both",
                    route.template, routes[j].template
                ),
            );
        }
        routes.push(route);
    }
    let relations = super::relations::resolve(&routes, &relations)?;
    let routes: Vec<Arc<Route>> = routes
        .into_iter()
        .zip(relations)
        .map(|(mut route, relations)| {
            route.also_invalidates = relations;
            Arc::new(route)
        })
        .collect();

    let max_fresh = routes
        .iter()
        .map(|r| r.max_fresh() + r.stale_keep())
        .max()
        .unwrap_or_default();
    let max_lease = routes.iter().map(|r| r.lease).max().unwrap_or_default();
    let gen_ttl = max_fresh + max_lease + upstream.timeout + Duration::from_secs(60);

    Ok(Config {
        listen,
        log_format: raw.log_format,
        admin,
        upstream,
        store,
        fill,
        routes: RouteTable { routes },
        invalidation,
        limits,
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

fn upstream(raw: &FileConfig) -> Result<UpstreamConfig> {
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

fn store(raw: &FileConfig) -> Result<StoreConfig> {
    let s = &raw.store;
    let redis = match &s.redis {
        None => None,
        Some(r) => {
            let target = match (&r.url, &r.cluster, &r.sentinel) {
                (Some(url), None, None) => {
                    redis_url("store.redis.url", url)?;
                    RedisTarget::Single(url.clone())
                }
                (None, Some(nodes), None) if !nodes.is_empty() => {
                    for (i, n) in nodes.iter().enumerate() {
                        redis_url(&format!("store.redis.cluster[{i}]"), n)?;
                    }
                    RedisTarget::Cluster(nodes.clone())
                }
                (None, None, Some(s)) => RedisTarget::Sentinel(sentinel(s)?),
                (None, None, None) | (None, Some(_), None) => {
                    return err(
                        "store.redis",
                        "needs `url`, a non-empty `cluster` list or `sentinel`",
                    )
                }
                _ => {
                    return err(
                        "store.redis",
                        "give one of `url`, `cluster` and `sentinel`, not several",
                    )
                }
            };
            if r.command_timeout.0.is_zero() {
                return err("store.redis.command_timeout", "must be greater than zero");
            }
            let near_cache = near_cache(r.near_cache.as_ref(), &target)?;
            let tls = redis_tls(r.tls.as_ref(), &target)?;
            let replicas_ack = replicas_ack(r)?;
            Some(RedisConfig {
                target,
                command_timeout: r.command_timeout.0,
                near_cache,
                tls,
                replicas_ack,
            })
        }
    };
    if s.namespace.contains(['{', '}']) || s.namespace.chars().any(char::is_whitespace) {
        return err("store.namespace", "must not contain '{', '}' or whitespace");
    }
    Ok(StoreConfig {
        redis,
        namespace: s.namespace.clone(),
        breaker_cooldown: s.breaker.cooldown.0,
    })
}

fn near_cache(
    raw: Option<&FileNearCache>,
    target: &RedisTarget,
) -> Result<Option<NearCacheConfig>> {
    let at = "store.redis.near_cache";
    let Some(n) = raw else {
        // On by default for a single node; opt-in with Cluster and
        // Sentinel (one tracked connection per master, a flush on every
        // slot map change or primary switch), until measured in production.
        return Ok(
            matches!(target, RedisTarget::Single(_)).then_some(NearCacheConfig {
                max_bytes: defaults::near_max_bytes().0,
                max_age: defaults::near_max_age().0,
            }),
        );
    };
    if !n.enabled {
        return Ok(None);
    }
    if n.max_bytes.0 < 1 << 20 {
        return err(format!("{at}.max_bytes"), "must be at least 1MiB");
    }
    if n.max_age.0.is_zero() || n.max_age.0 > Duration::from_secs(60) {
        return err(format!("{at}.max_age"), "must be between 1ms and 60s");
    }
    Ok(Some(NearCacheConfig {
        max_bytes: n.max_bytes.0,
        max_age: n.max_age.0,
    }))
}

/// Witness slots per feed: each is one more covered check per event.
const MAX_WITNESSES: u32 = 16;

fn invalidation(raw: &FileConfig, store: &StoreConfig) -> Result<InvalidationConfig> {
    let outbox = match &raw.invalidation.outbox {
        None => None,
        Some(o) => {
            let at = "invalidation.outbox";
            if o.url.trim().is_empty() {
                return err(
                    format!("{at}.url"),
                    "must not be empty (is the variable set?)",
                );
            }
            // The config's TLS keys join the connection string, so the
            // outbox worker and the Bloom source both connect with them.
            let url = crate::pg::with_ssl(&o.url, o.sslmode.as_deref(), o.sslrootcert.as_deref())
                .or_else(|e| err(format!("{at}.{}", e.key()), e.to_string()))?;
            // Parses sslmode and loads sslrootcert, so `check` refuses what
            // could not connect. The URL may hold a password: the error
            // names the problem, not the text.
            if let Err(e) = crate::pg::PgConnector::parse(&url) {
                let key = match (&o.sslrootcert, &e) {
                    (Some(_), crate::pg::PgError::Config(m)) if m.contains("sslrootcert") => {
                        "sslrootcert"
                    }
                    _ => "url",
                };
                return err(format!("{at}.{key}"), e.to_string());
            }
            check_identifier(&o.table).or_else(|m| err(format!("{at}.table"), m))?;
            check_identifier(&o.notify_channel)
                .or_else(|m| err(format!("{at}.notify_channel"), m))?;
            if o.poll_interval.0 < Duration::from_millis(10) {
                return err(format!("{at}.poll_interval"), "must be at least 10ms");
            }
            if o.idle_poll_interval.0 < o.poll_interval.0 {
                return err(
                    format!("{at}.idle_poll_interval"),
                    "must be at least poll_interval",
                );
            }
            if !(1..=10_000).contains(&o.batch) {
                return err(format!("{at}.batch"), "must be between 1 and 10000");
            }
            Some(OutboxConfig {
                url,
                table: o.table.clone(),
                poll_interval: o.poll_interval.0,
                idle_poll_interval: o.idle_poll_interval.0,
                batch: o.batch,
                notify_channel: o.notify_channel.clone(),
            })
        }
    };
    let stream = match &raw.invalidation.redis_stream {
        None => None,
        Some(r) => {
            let at = "invalidation.redis_stream";
            match &store.redis {
                Some(RedisConfig {
                    target: RedisTarget::Single(_) | RedisTarget::Sentinel(_),
                    ..
                }) => {}
                // The dead-letter stream `<stream>:dead` must live on the
                // stream's node: one hash slot.
                Some(RedisConfig {
                    target: RedisTarget::Cluster(_),
                    ..
                }) if !has_hash_tag(&r.stream) => {
                    return err(
                        format!("{at}.stream"),
                        "needs a hash tag with store.redis.cluster (e.g. \"{sidecache}:invalidations\"), \
                         so that its dead-letter stream `<stream>:dead` shares its slot",
                    )
                }
                Some(RedisConfig {
                    target: RedisTarget::Cluster(_),
                    ..
                }) => {}
                None => return err(at, "needs store.redis: the stream lives in that Redis"),
            }
            if r.stream.is_empty() || r.stream.chars().any(|c| c.is_whitespace()) {
                return err(
                    format!("{at}.stream"),
                    "must be a non-empty key without whitespace",
                );
            }
            if r.group.is_empty() || r.group.chars().any(|c| c.is_whitespace()) {
                return err(
                    format!("{at}.group"),
                    "must be a non-empty name without whitespace",
                );
            }
            if r.claim_idle.0 < Duration::from_secs(1) {
                return err(format!("{at}.claim_idle"), "must be at least 1s");
            }
            Some(StreamConfig {
                stream: r.stream.clone(),
                group: r.group.clone(),
                start: match r.start {
                    FileStreamStart::Latest => StreamStart::Latest,
                    FileStreamStart::Earliest => StreamStart::Earliest,
                },
                claim_idle: r.claim_idle.0,
            })
        }
    };
    let witnesses = raw.invalidation.witnesses;
    if !(1..=MAX_WITNESSES).contains(&witnesses) {
        return err(
            "invalidation.witnesses",
            format!("must be between 1 and {MAX_WITNESSES}"),
        );
    }
    Ok(InvalidationConfig {
        outbox,
        stream,
        witnesses,
    })
}

fn access_log(raw: &FileConfig) -> Result<AccessLogConfig> {
    let a = &raw.access_log;
    // NaN fails this too.
    if !(a.sample > 0.0 && a.sample <= 1.0) {
        return err(
            "access_log.sample",
            format!("{} must be greater than 0 and at most 1", a.sample),
        );
    }
    if !(1..=1 << 20).contains(&a.buffer) {
        return err("access_log.buffer", "must be between 1 and 1048576 lines");
    }
    Ok(AccessLogConfig {
        buffer: a.buffer,
        enabled: a.enabled,
        format: a.format,
        sample: a.sample,
        query: a.query,
        request_id: a.request_id,
    })
}

/// Most threads `server.workers` may ask for: far more than any machine a
/// sidecar gets, few enough that a typo cannot start thousands of threads.
const MAX_WORKERS: usize = 256;

fn server(raw: &FileConfig) -> Result<ServerConfig> {
    let workers = match raw.server.workers {
        Some(n) if !(1..=MAX_WORKERS).contains(&n) => {
            return err(
                "server.workers",
                format!("must be between 1 and {MAX_WORKERS}"),
            )
        }
        n => n,
    };
    Ok(ServerConfig {
        runtime: raw.server.runtime,
        workers,
    })
}

fn limits(raw: &FileConfig) -> Result<LimitsConfig> {
    let l = &raw.limits;
    let max_connections = match l.max_connections {
        Some(0) => return err("limits.max_connections", "must be at least 1"),
        Some(n) => n,
        None => default_max_connections(open_files_limit()),
    };
    for (field, d) in [
        ("header_timeout", l.header_timeout.0),
        ("idle_timeout", l.idle_timeout.0),
        ("send_timeout", l.send_timeout.0),
    ] {
        if d < Duration::from_millis(100) {
            return err(format!("limits.{field}"), "must be at least 100ms");
        }
    }
    // hyper's HTTP/1 read buffer cannot be smaller than 8 KiB; a head
    // larger than 1 MiB is no longer a request head but an attack.
    let max_header_bytes = l.max_header_bytes.0;
    if !(8 * 1024..=1024 * 1024).contains(&max_header_bytes) {
        return err("limits.max_header_bytes", "must be between 8KiB and 1MiB");
    }
    if raw.h2.max_concurrent_streams == 0 {
        return err("h2.max_concurrent_streams", "must be at least 1");
    }
    Ok(LimitsConfig {
        max_connections,
        header_timeout: l.header_timeout.0,
        max_header_bytes: max_header_bytes as usize,
        idle_timeout: l.idle_timeout.0,
        send_timeout: l.send_timeout.0,
        h2_max_concurrent_streams: raw.h2.max_concurrent_streams,
    })
}

/// The default `limits.max_connections` for a process allowed `nofile`
/// open files: a forwarded request holds two descriptors (the client's and
/// an upstream connection), and 64 are kept for the listeners, Redis,
/// Postgres, the config watcher and the pool's idle connections. So the cap
/// is reached before `accept` fails with EMFILE, and an accepted client can
/// still reach the upstream. At most 10 000; at least 1.
pub fn default_max_connections(nofile: u64) -> usize {
    let usable = nofile.saturating_sub(64) / 2;
    usable.clamp(1, 10_000) as usize
}

/// The soft `RLIMIT_NOFILE` of this process (what `accept` runs into);
/// unknown counts as unlimited.
fn open_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass, which outlives the call.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    if ok && limit.rlim_cur != libc::RLIM_INFINITY {
        limit.rlim_cur
    } else {
        u64::MAX
    }
}

fn redis_url(path: &str, url: &str) -> Result<()> {
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return err(path, format!("{url:?} is not a redis:// URL"));
    }
    // redis-rs would refuse it at the first connect, after `check` passed.
    if url.ends_with("#insecure") {
        return err(
            path,
            "`#insecure` (no certificate check) is not supported: give store.redis.tls.ca_file",
        );
    }
    Ok(())
}

fn sentinel(s: &FileSentinel) -> Result<SentinelTarget> {
    let at = "store.redis.sentinel";
    if s.master.is_empty() || s.master.chars().any(char::is_whitespace) {
        return err(format!("{at}.master"), "must be a name without whitespace");
    }
    if s.nodes.is_empty() {
        return err(format!("{at}.nodes"), "needs at least one sentinel URL");
    }
    // redis-rs gives all sentinels one scheme's certificates and one set
    // of credentials: the URLs must agree on both.
    let first = &s.nodes[0];
    let credentials = |url: &str| {
        url.into_connection_info()
            .map(|i| {
                let r = i.redis_settings();
                (
                    r.username().map(str::to_owned),
                    r.password().map(str::to_owned),
                )
            })
            .ok()
    };
    for (i, n) in s.nodes.iter().enumerate() {
        let at = format!("{at}.nodes[{i}]");
        redis_url(&at, n)?;
        if n.starts_with("rediss://") != first.starts_with("rediss://") {
            return err(
                at,
                "all sentinel URLs must use the same scheme (redis:// or rediss://)",
            );
        }
        match credentials(n) {
            None => return err(at, format!("{n:?} is not a valid redis URL")),
            Some(c) if Some(&c) != credentials(first).as_ref() => {
                return err(
                    at,
                    "all sentinel URLs must carry the same username and password",
                )
            }
            Some(_) => {}
        }
    }
    if !(0..=15).contains(&s.db) {
        return err(format!("{at}.db"), "must be between 0 and 15");
    }
    Ok(SentinelTarget {
        master: s.master.clone(),
        nodes: s.nodes.clone(),
        username: s.username.clone(),
        password: s.password.clone(),
        db: s.db,
    })
}

/// Whether `key` has a non-empty `{hash tag}` (Redis Cluster slot rule).
fn has_hash_tag(key: &str) -> bool {
    key.split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .is_some_and(|(tag, _)| !tag.is_empty())
}

fn replicas_ack(r: &FileRedis) -> Result<Option<ReplicasAck>> {
    if r.replicas_ack == 0 {
        return Ok(None);
    }
    let timeout = r.replicas_timeout.0;
    if timeout.is_zero() || timeout > Duration::from_secs(60) {
        return err(
            "store.redis.replicas_timeout",
            "must be between 1ms and 60s",
        );
    }
    Ok(Some(ReplicasAck {
        replicas: r.replicas_ack,
        timeout,
    }))
}

/// `store.redis.tls`: only with `rediss://` URLs; every file is read and
/// its PEM parsed now, so a config that could not connect fails `check`.
fn redis_tls(raw: Option<&FileRedisTls>, target: &RedisTarget) -> Result<Option<RedisTls>> {
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

fn route(at: &str, r: FileRoute, fill: &FillConfig, default_budget: usize) -> Result<Route> {
    let name_ok = !r.name.is_empty()
        && r.name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !name_ok {
        return err(
            format!("{at}.name"),
            format!("{:?} must match [a-z0-9_-]+", r.name),
        );
    }
    let (segments, names) = parse_template(&r.path).or_else(|m| err(format!("{at}.path"), m))?;
    let mut params = Vec::with_capacity(names.len());
    for name in names {
        let Some(pattern) = r.params.get(&name) else {
            return err(
                format!("{at}.params.{name}"),
                format!("path param {{{name}}} has no pattern; every param needs one"),
            );
        };
        let re = ParamPattern::new(pattern)
            .or_else(|e| err(format!("{at}.params.{name}"), format!("bad regex: {e}")))?;
        params.push(Param { name, pattern: re });
    }
    if let Some(extra) = r
        .params
        .keys()
        .find(|k| !params.iter().any(|p| &p.name == *k))
    {
        return err(
            format!("{at}.params.{extra}"),
            format!("{extra:?} is not a param of path {:?}", r.path),
        );
    }
    let mut methods = Vec::new();
    for (i, m) in r.methods.iter().enumerate() {
        let method = match m.to_ascii_uppercase().as_str() {
            "GET" => Method::GET,
            "HEAD" => Method::HEAD,
            other => {
                return err(
                    format!("{at}.methods[{i}]"),
                    format!("{other:?}: only GET and HEAD can be cached"),
                )
            }
        };
        methods.push(method);
    }
    if !methods.contains(&Method::GET) {
        return err(
            format!("{at}.methods"),
            "must include GET (HEAD is answered from the GET entry)",
        );
    }
    let query = match r.query {
        FileQuery::Mode(FileQueryMode::Include) => QueryMode::Include,
        FileQuery::Mode(FileQueryMode::Ignore) => QueryMode::Ignore,
        FileQuery::Allow(mut names) => {
            names.sort();
            names.dedup();
            QueryMode::Allow(names)
        }
    };
    let mut vary = Vec::with_capacity(r.vary.len());
    for (i, h) in r.vary.iter().enumerate() {
        let name = HeaderName::from_bytes(h.as_bytes()).or_else(|_| {
            err(
                format!("{at}.vary[{i}]"),
                format!("{h:?} is not a header name"),
            )
        })?;
        vary.push(name);
    }
    for (field, list) in [
        ("cache_status", &r.cache_status),
        ("negative_status", &r.negative_status),
    ] {
        if let Some((i, s)) = list
            .iter()
            .enumerate()
            .find(|(_, s)| !(100..=599).contains(*s))
        {
            return err(
                format!("{at}.{field}[{i}]"),
                format!("{s} is not an HTTP status"),
            );
        }
        // Fills ask for the whole object without conditions: a 206 or 304
        // from the origin is a partial or empty answer, never one to store
        // and replay to everyone (ranges and 304s are answered from the 200).
        if let Some((i, s)) = list
            .iter()
            .enumerate()
            .find(|(_, s)| [206, 304].contains(*s))
        {
            return err(
                format!("{at}.{field}[{i}]"),
                format!("{s} cannot be cached: ranges and 304s are answered from the cached 200"),
            );
        }
    }
    if let Some(s) = r
        .cache_status
        .iter()
        .find(|s| r.negative_status.contains(s))
    {
        return err(
            format!("{at}.negative_status"),
            format!("{s} is in both cache_status and negative_status"),
        );
    }
    let origin_cache_control = match r.origin_cache_control {
        FileOriginCacheControl::Honor => OriginCacheControl::Honor,
        FileOriginCacheControl::Ignore => OriginCacheControl::Ignore,
    };
    let ttl = ttl(at, r.ttl, r.max_ttl, r.default_ttl, origin_cache_control)?;
    let fresh = match ttl {
        Ttl::Fixed(t) => t + r.jitter.0,
        Ttl::Origin { max, .. } => max,
    }
    .max(r.negative_ttl.0);
    let max_grace = match (r.max_grace, ttl) {
        (None, _) => Duration::ZERO,
        (Some(m), Ttl::Origin { .. }) => m.0,
        (Some(_), Ttl::Fixed(_)) => {
            return err(
                format!("{at}.max_grace"),
                "only with ttl: origin (the origin's stale-while-revalidate is read there)",
            )
        }
    };
    // The wider of the two names the field an error points at.
    let grace = if max_grace > r.grace.0 {
        ("max_grace", max_grace)
    } else {
        ("grace", r.grace.0)
    };
    stale_windows(at, fresh, grace, r.stale_if_error.0, r.keep.0)?;
    if r.lease.0 < Duration::from_millis(10) {
        return err(format!("{at}.lease"), "must be at least 10ms");
    }
    let bloom = match r.bloom {
        Some(b) => Some(super::bloom::validate(at, b, &params)?),
        None => None,
    };
    let host = match &r.host {
        None => None,
        Some(h) => {
            let valid = h
                .parse::<http::uri::Authority>()
                .is_ok_and(|a| a.as_str() == h);
            match http::HeaderValue::from_str(h) {
                Ok(v) if valid => Some(v),
                _ => return err(format!("{at}.host"), format!("{h:?} is not a host[:port]")),
            }
        }
    };
    if host.is_some() && vary.contains(&http::header::HOST) {
        return err(
            format!("{at}.host"),
            "the route keys on the client's Host (vary); a fixed fill Host contradicts it",
        );
    }
    let fill_headers = fill_headers(at, r.fill_headers.unwrap_or_else(defaults::fill_headers))?;
    let origin_vary = origin_vary(
        at,
        r.vary_from_origin,
        r.max_vary_headers,
        r.max_vary_value,
        origin_cache_control,
    )?;
    let fill_budget = match r.max_concurrency {
        None => default_budget,
        Some(n) if (1..=fill.max_concurrency).contains(&n) => n,
        Some(n) => {
            return err(
                format!("{at}.max_concurrency"),
                format!(
                    "{n}: must be between 1 and fill.max_concurrency ({})",
                    fill.max_concurrency
                ),
            )
        }
    };
    Ok(Route {
        name: r.name,
        template: r.path,
        segments,
        params,
        methods,
        query,
        vary,
        ttl,
        jitter: r.jitter.0,
        negative_ttl: r.negative_ttl.0,
        grace: r.grace.0,
        max_grace,
        stale_if_error: r.stale_if_error.0,
        keep: r.keep.0,
        cache_status: r.cache_status,
        negative_status: r.negative_status,
        lease: r.lease.0,
        wait: r.wait.0,
        invalidate_on_write: r.invalidate_on_write,
        bloom,
        host,
        fill_headers,
        origin_cache_control,
        cdn_cache_control: r.cdn_cache_control,
        origin_vary,
        fill_budget,
        client_cache_control: client_cache_control(at, r.client_cache_control)?,
        etag: match r.etag {
            FileEtag::Origin => EtagMode::Origin,
            FileEtag::Auto => EtagMode::Auto,
        },
        also_invalidates: Vec::new(),
        tags_from: optional_header(&format!("{at}.tags_from"), r.tags_from.as_deref())?,
        version_from: optional_header(&format!("{at}.version_from"), r.version_from.as_deref())?,
        counters: Default::default(),
    })
}

/// `vary_from_origin` and its bounds (`max_vary_headers`, 1..=16, default
/// 4; `max_vary_value`, 1..=8192 bytes, default 256). The bounds belong to
/// it, and it needs `origin_cache_control: honor` (`ignore` drops `Vary`).
fn origin_vary(
    at: &str,
    on: bool,
    max_headers: Option<usize>,
    max_value: Option<usize>,
    origin_cache_control: OriginCacheControl,
) -> Result<Option<OriginVary>> {
    if !on {
        for (key, set) in [
            ("max_vary_headers", max_headers.is_some()),
            ("max_vary_value", max_value.is_some()),
        ] {
            if set {
                return err(format!("{at}.{key}"), "only with vary_from_origin: true");
            }
        }
        return Ok(None);
    }
    if origin_cache_control == OriginCacheControl::Ignore {
        return err(
            format!("{at}.vary_from_origin"),
            "needs origin_cache_control: honor (ignore drops the answer's Vary)",
        );
    }
    let max_headers = max_headers.unwrap_or(4);
    if !(1..=16).contains(&max_headers) {
        return err(
            format!("{at}.max_vary_headers"),
            format!("{max_headers}: must be between 1 and 16"),
        );
    }
    let max_value = max_value.unwrap_or(256);
    if !(1..=8192).contains(&max_value) {
        return err(
            format!("{at}.max_vary_value"),
            format!("{max_value}: must be between 1 and 8192"),
        );
    }
    Ok(Some(OriginVary {
        max_headers,
        max_value,
    }))
}

/// A header name setting (`tags_from`, `version_from`), if given.
fn optional_header(path: &str, name: Option<&str>) -> Result<Option<HeaderName>> {
    name.map(|n| {
        HeaderName::from_bytes(n.as_bytes())
            .or_else(|_| err(path, format!("{n:?} is not a header name")))
    })
    .transpose()
}

/// `ttl`, and `max_ttl` / `default_ttl`, which belong to `ttl: origin`.
fn ttl(
    at: &str,
    ttl: FileTtl,
    max_ttl: Option<HumanDuration>,
    default_ttl: Option<HumanDuration>,
    occ: OriginCacheControl,
) -> Result<Ttl> {
    match ttl {
        FileTtl::Fixed(t) => {
            if t.0.is_zero() {
                return err(format!("{at}.ttl"), "must be greater than zero");
            }
            for (field, given) in [("max_ttl", max_ttl), ("default_ttl", default_ttl)] {
                if given.is_some() {
                    return err(
                        format!("{at}.{field}"),
                        "only applies with `ttl: origin` (this route's ttl is fixed)",
                    );
                }
            }
            Ok(Ttl::Fixed(t.0))
        }
        FileTtl::Origin => {
            let Some(max) = max_ttl else {
                return err(
                    format!("{at}.max_ttl"),
                    "is required with `ttl: origin` (the longest the origin may make an entry fresh)",
                );
            };
            if max.0.is_zero() {
                return err(format!("{at}.max_ttl"), "must be greater than zero");
            }
            let default = default_ttl.map_or(Duration::ZERO, |d| d.0);
            if default > max.0 {
                return err(
                    format!("{at}.default_ttl"),
                    format!("{default:?} exceeds max_ttl ({:?})", max.0),
                );
            }
            if occ == OriginCacheControl::Ignore {
                return err(
                    format!("{at}.origin_cache_control"),
                    "`ignore` contradicts `ttl: origin`, which takes the lifetime from the \
                     origin's Cache-Control; use `honor`",
                );
            }
            Ok(Ttl::Origin {
                max: max.0,
                default,
            })
        }
    }
}

/// Response directives of RFC 9111 §5.2.2 (and RFC 5861, RFC 8246) that a
/// literal `client_cache_control` may use; anything else is a typo.
const CLIENT_DIRECTIVES: &[&str] = &[
    "max-age",
    "s-maxage",
    "no-cache",
    "no-store",
    "no-transform",
    "must-revalidate",
    "proxy-revalidate",
    "must-understand",
    "private",
    "public",
    "immutable",
    "stale-while-revalidate",
    "stale-if-error",
];

/// `client_cache_control`: `pass`, `remaining`, or a literal header value
/// made of known directives.
fn client_cache_control(at: &str, raw: FileClientCacheControl) -> Result<ClientCacheControl> {
    let path = format!("{at}.client_cache_control");
    let literal = match raw {
        FileClientCacheControl::Pass => return Ok(ClientCacheControl::Pass),
        FileClientCacheControl::Remaining => return Ok(ClientCacheControl::Remaining),
        FileClientCacheControl::Literal(l) => l,
    };
    let trimmed = literal.trim();
    if trimmed.eq_ignore_ascii_case("pass") || trimmed.eq_ignore_ascii_case("remaining") {
        return err(
            path,
            format!("{literal:?}: the modes are spelled `pass` and `remaining`"),
        );
    }
    let Ok(value) = http::HeaderValue::from_str(trimmed) else {
        return err(
            path,
            format!("{literal:?} is not a header value (visible ASCII only)"),
        );
    };
    let mut names = 0;
    for element in split_list(trimmed) {
        let name = element.split('=').next().unwrap_or_default().trim();
        if name.is_empty() {
            continue;
        }
        names += 1;
        if !CLIENT_DIRECTIVES
            .iter()
            .any(|d| d.eq_ignore_ascii_case(name))
        {
            return err(
                path,
                format!(
                    "{name:?} is not a Cache-Control response directive; use `pass`, \
                     `remaining` or a list of: {}",
                    CLIENT_DIRECTIVES.join(", ")
                ),
            );
        }
    }
    if names == 0 {
        return err(
            path,
            "is empty; use `pass`, `remaining` or directives such as \"private, max-age=0\"",
        );
    }
    Ok(ClientCacheControl::Literal(value))
}

/// Splits a header list at commas outside quoted strings.
fn split_list(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// `fill_headers`: client headers a fill may carry besides `vary`. Refused
/// here: headers the fill sets itself or that describe one connection,
/// credentials (they make a request BYPASS unless keyed, so they belong in
/// `vary`), `accept-encoding` (the encoding must be keyed, or the fill asks
/// for identity) and conditional or range headers (a fill must fetch the
/// whole object, never a 304 or 206).
fn fill_headers(at: &str, names: Vec<String>) -> Result<Vec<HeaderName>> {
    const REFUSED: &[(&str, &str)] = &[
        ("host", "set the route's `host` instead"),
        ("content-length", "a fill has no body"),
        ("transfer-encoding", "a fill has no body"),
        ("connection", "hop-by-hop"),
        ("keep-alive", "hop-by-hop"),
        ("proxy-connection", "hop-by-hop"),
        ("te", "hop-by-hop"),
        ("upgrade", "hop-by-hop"),
        ("proxy-authorization", "hop-by-hop"),
        (
            "authorization",
            "credentials: list it in `vary` to cache per credential",
        ),
        (
            "cookie",
            "credentials: list it in `vary` to cache per cookie",
        ),
        (
            "accept-encoding",
            "list it in `vary`: the encoding must be part of the key",
        ),
        ("if-match", "a fill fetches the whole object"),
        ("if-none-match", "a fill fetches the whole object"),
        ("if-modified-since", "a fill fetches the whole object"),
        ("if-unmodified-since", "a fill fetches the whole object"),
        ("if-range", "a fill fetches the whole object"),
        ("range", "a fill fetches the whole object"),
    ];
    let mut out: Vec<HeaderName> = Vec::with_capacity(names.len());
    for (i, h) in names.iter().enumerate() {
        let path = format!("{at}.fill_headers[{i}]");
        let Ok(name) = HeaderName::from_bytes(h.as_bytes()) else {
            return err(path, format!("{h:?} is not a header name"));
        };
        if let Some((_, why)) = REFUSED.iter().find(|(n, _)| *n == name.as_str()) {
            return err(path, format!("{h:?} cannot be sent on fills: {why}"));
        }
        if !out.contains(&name) {
            out.push(name);
        }
    }
    Ok(out)
}

/// SQL identifiers spliced into the outbox SQL (table, NOTIFY channel).
/// Accepts `name` or `schema.name`, each part `[a-z_][a-z0-9_]*` and at most
/// 63 bytes (Postgres' limit). Lower case only: unquoted identifiers fold to
/// lower case, so `Outbox` would silently name `outbox`.
pub fn check_identifier(name: &str) -> std::result::Result<(), String> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 {
        return Err(format!("{name:?}: at most one '.' (schema.name)"));
    }
    for part in parts {
        let mut chars = part.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !first_ok || !rest_ok || part.len() > 63 {
            return Err(format!(
                "{name:?} is not a plain SQL identifier ([a-z_][a-z0-9_]*, at most 63 bytes)"
            ));
        }
    }
    Ok(())
}

/// The longest an entry may stay in the store (fresh life plus its stale
/// window). Entries carry their stale windows as u32 milliseconds, and a
/// keep window of months would pin dead objects in memory for no reader.
const MAX_ENTRY_LIFE: Duration = Duration::from_secs(30 * 24 * 3600);

/// `grace`, `stale_if_error` and `keep`: the store keeps an entry for
/// `ttl + jitter + max(grace, stale_if_error, keep)`, which must stay bounded.
fn stale_windows(
    at: &str,
    fresh: Duration,
    grace: (&str, Duration),
    stale_if_error: Duration,
    keep: Duration,
) -> Result<()> {
    // The widest names the field (the first listed on a tie).
    let (field, widest) = [grace, ("stale_if_error", stale_if_error), ("keep", keep)]
        .into_iter()
        .rev()
        .max_by_key(|&(_, window)| window)
        .unwrap_or(grace);
    let life = fresh + widest;
    if life > MAX_ENTRY_LIFE {
        return err(
            format!("{at}.{field}"),
            format!(
                "keeps entries for {}s (ttl + jitter + max(grace, stale_if_error, keep)); at most {}s",
                life.as_secs(),
                MAX_ENTRY_LIFE.as_secs()
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_connections_from_nofile() {
        assert_eq!(default_max_connections(1024), 480);
        assert_eq!(default_max_connections(65_536), 10_000);
        assert_eq!(default_max_connections(10), 1);
        assert_eq!(default_max_connections(u64::MAX), 10_000);
    }

    #[test]
    fn identifiers() {
        for ok in ["sidecache_outbox", "_x", "app.outbox", "a1"] {
            assert!(check_identifier(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "Outbox",
            "a-b",
            "a;drop table x",
            "a.b.c",
            "a.",
            "x y",
            &"a".repeat(64),
        ] {
            assert!(check_identifier(bad).is_err(), "{bad}");
        }
    }
}

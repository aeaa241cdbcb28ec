//! `store`: the embedded store or Redis (one node, a Cluster or the primary
//! Sentinel names), the near cache in front of it, replica acknowledgement,
//! the key namespace and the breaker. `store.redis.tls` is in `redis_tls`.

use super::redis_tls::redis_tls;
use super::{err, Result};
use crate::config::file::{defaults, FileConfig, FileNearCache, FileRedis, FileSentinel};
use crate::config::{
    NearCacheConfig, RedisConfig, RedisTarget, ReplicasAck, SentinelTarget, StoreConfig,
};
use redis::IntoConnectionInfo;
use std::time::Duration;

/// The smallest `store.memory.max_bytes`: one default `fill.max_body` per
/// shard.
const MIN_MEMORY_BYTES: u64 = 16 << 20;

pub(super) fn store(raw: &FileConfig) -> Result<StoreConfig> {
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
    let memory_max_bytes = s.memory.max_bytes.0;
    // Below this a shard's share would hold few answers of the default
    // `fill.max_body`; answers larger than a share are not stored.
    if memory_max_bytes < MIN_MEMORY_BYTES {
        return err("store.memory.max_bytes", "must be at least 16MiB");
    }
    Ok(StoreConfig {
        redis,
        namespace: s.namespace.clone(),
        breaker_cooldown: s.breaker.cooldown.0,
        memory_max_bytes,
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

#[cfg(test)]
mod tests {
    use crate::config::testing::{err, parse, APP};
    use crate::config::NearCacheConfig;
    use std::time::Duration;

    #[test]
    fn memory_budget_defaults_and_lower_bound() {
        assert_eq!(parse(APP).expect("valid").store.memory_max_bytes, 256 << 20);
        let set = parse(&format!(
            "store: {{ memory: {{ max_bytes: 64MiB }} }}\n{APP}"
        ));
        assert_eq!(set.expect("valid").store.memory_max_bytes, 64 << 20);
        let small = err(&format!(
            "store: {{ memory: {{ max_bytes: 8MiB }} }}\n{APP}"
        ));
        assert!(small.contains("store.memory.max_bytes"), "{small}");
    }

    #[test]
    fn near_cache_defaults_and_limits() {
        let single =
            |near: &str| format!("store:\n  redis:\n    url: redis://127.0.0.1:6379\n{near}{APP}");
        let cfg = parse(&single("")).expect("valid");
        let redis = cfg.store.redis.as_ref().expect("redis");
        assert_eq!(
            redis.near_cache,
            Some(NearCacheConfig {
                max_bytes: 64 << 20,
                max_age: Duration::from_secs(1),
            }),
            "on by default for a single node"
        );
        let cfg = parse(&single(
            "    near_cache: { max_bytes: 8MiB, max_age: 250ms }\n",
        ))
        .expect("valid");
        assert_eq!(
            cfg.store.redis.as_ref().and_then(|r| r.near_cache),
            Some(NearCacheConfig {
                max_bytes: 8 << 20,
                max_age: Duration::from_millis(250),
            })
        );
        let off = parse(&single("    near_cache: { enabled: false }\n")).expect("valid");
        assert_eq!(off.store.redis.as_ref().and_then(|r| r.near_cache), None);
        assert!(err(&single("    near_cache: { max_bytes: 1KiB }\n"))
            .contains("store.redis.near_cache.max_bytes"));
        assert!(err(&single("    near_cache: { max_age: 0s }\n"))
            .contains("store.redis.near_cache.max_age"));

        let cluster = "store:\n  redis:\n    cluster: [redis://127.0.0.1:7000]\n";
        let cfg = parse(&format!("{cluster}{APP}")).expect("valid");
        assert_eq!(
            cfg.store.redis.as_ref().and_then(|r| r.near_cache),
            None,
            "off by default for a cluster"
        );
        let on = parse(&format!(
            "{cluster}    near_cache: {{ enabled: true }}\n{APP}"
        ))
        .expect("opt-in on a cluster");
        assert_eq!(
            on.store.redis.as_ref().and_then(|r| r.near_cache),
            Some(NearCacheConfig {
                max_bytes: 64 << 20,
                max_age: Duration::from_secs(1),
            })
        );
        assert!(err(&format!(
            "{cluster}    near_cache: {{ enabled: true, max_age: 0s }}\n{APP}"
        ))
        .contains("store.redis.near_cache.max_age"));
    }
}

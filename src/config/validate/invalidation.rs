//! `invalidation`: the change feeds (the Postgres outbox, the Redis
//! Stream) and how many instances apply each event.

use super::{err, Result};
use crate::config::file::{FileConfig, FileStreamStart};
use crate::config::{
    InvalidationConfig, OutboxConfig, RedisConfig, RedisTarget, StoreConfig, StreamConfig,
    StreamStart,
};
use std::time::Duration;

/// Witness slots per feed: each is one more covered check per event.
const MAX_WITNESSES: u32 = 16;

pub(super) fn invalidation(raw: &FileConfig, store: &StoreConfig) -> Result<InvalidationConfig> {
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
                notify: o.notify,
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
        // After the routes (its mappings name them): `capture.rs`.
        capture: None,
    })
}

/// Whether `key` has a non-empty `{hash tag}` (Redis Cluster slot rule).
fn has_hash_tag(key: &str) -> bool {
    key.split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .is_some_and(|(tag, _)| !tag.is_empty())
}

/// SQL identifiers spliced into the outbox SQL (table, NOTIFY channel).
/// Accepts `name` or `schema.name`, each part `[a-z_][a-z0-9_]*` and at most
/// 63 bytes (Postgres' limit). Lower case only: unquoted identifiers fold to
/// lower case, so `Outbox` would silently name `outbox`.
pub(crate) fn check_identifier(name: &str) -> std::result::Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{err, parse, APP};

    #[test]
    fn invalidation_sources_are_typed_and_validated() {
        let cfg = parse(&format!(
            r#"
store: {{ redis: {{ url: "redis://127.0.0.1:6379/0" }} }}
invalidation:
  outbox: {{ url: "postgres://u@127.0.0.1/db", batch: 50, poll_interval: 250ms }}
  redis_stream: {{ start: earliest, claim_idle: 10s }}
{APP}"#
        ))
        .expect("valid");
        let outbox = cfg.invalidation.outbox.as_ref().expect("outbox");
        assert_eq!(outbox.table, "sidecache_outbox");
        assert_eq!(outbox.notify_channel, "sidecache_outbox");
        assert_eq!(outbox.batch, 50);
        assert_eq!(outbox.poll_interval, std::time::Duration::from_millis(250));
        assert_eq!(
            outbox.idle_poll_interval,
            std::time::Duration::from_secs(30)
        );
        let stream = cfg.invalidation.stream.as_ref().expect("stream");
        assert_eq!(stream.stream, "sidecache:invalidations");
        assert_eq!(stream.group, "sidecache");
        assert_eq!(stream.start, StreamStart::Earliest);
        assert_eq!(stream.claim_idle, std::time::Duration::from_secs(10));
        assert_eq!(cfg.invalidation.witnesses, 2, "the default");

        let cases = [
            (
                "invalidation: { witnesses: 0 }",
                "invalidation.witnesses",
            ),
            (
                "invalidation: { witnesses: 17 }",
                "invalidation.witnesses",
            ),
            (
                "invalidation: { outbox: { url: 'postgres://h/d', table: 'x; drop' } }",
                "invalidation.outbox.table",
            ),
            (
                "invalidation: { outbox: { url: 'postgres://h/d', notify_channel: 'A' } }",
                "invalidation.outbox.notify_channel",
            ),
            (
                "invalidation: { outbox: { url: 'postgres://h/d', poll_interval: 5s, idle_poll_interval: 2s } }",
                "invalidation.outbox.idle_poll_interval",
            ),
            (
                "invalidation: { outbox: { url: 'postgres://h/d', batch: 0 } }",
                "invalidation.outbox.batch",
            ),
            (
                "invalidation: { outbox: { url: '' } }",
                "invalidation.outbox.url",
            ),
            (
                "invalidation: { outbox: { url: 'postgres://h/d', tabel: x } }",
                "invalidation.outbox",
            ),
            (
                "invalidation: { redis_stream: {} }",
                "invalidation.redis_stream",
            ),
        ];
        for (yaml, path) in cases {
            let e = err(&format!("{yaml}\n{APP}"));
            assert!(e.contains(path), "{yaml}: {e}");
        }
    }

    #[test]
    fn invalidation_changes_need_a_restart() {
        let a = parse(&format!(
            "invalidation: {{ outbox: {{ url: 'postgres://h/d' }} }}\n{APP}"
        ))
        .unwrap();
        let b = parse(&format!(
            "invalidation: {{ outbox: {{ url: 'postgres://h/d', batch: 7 }} }}\n{APP}"
        ))
        .unwrap();
        assert_eq!(a.restart_only_changes(&b), vec!["invalidation.outbox"]);
    }

    #[test]
    fn outbox_tls_keys_join_the_url_and_conflicts_name_the_key() {
        let outbox = |body: &str| format!("invalidation: {{ outbox: {{ {body} }} }}\n{APP}");
        let cfg = parse(&outbox("url: 'postgres://h/d', sslmode: require")).expect("valid");
        let url = &cfg.invalidation.outbox.as_ref().expect("outbox").url;
        assert_eq!(url, "postgres://h/d?sslmode=require");
        let e = err(&outbox(
            "url: 'postgres://h/d?sslmode=disable', sslmode: require",
        ));
        assert!(e.contains("invalidation.outbox.sslmode"), "{e}");
        assert!(e.contains("conflicts"), "{e}");
        let e = err(&outbox(
            "url: 'host=h sslrootcert=/a.pem', sslrootcert: /b.pem",
        ));
        assert!(e.contains("invalidation.outbox.sslrootcert"), "{e}");
        let e = err(&outbox("url: 'host=h', sslmode: allow"));
        assert!(e.contains("invalidation.outbox.sslmode"), "{e}");
        let e = err(&outbox(
            "url: 'host=h', sslmode: verify-ca, sslrootcert: /nonexistent/ca.pem",
        ));
        assert!(e.contains("invalidation.outbox.sslrootcert"), "{e}");
    }

    #[test]
    fn a_stream_on_a_cluster_needs_a_hash_tag() {
        let cluster = "store:\n  redis:\n    cluster: [redis://127.0.0.1:7000]\n";
        let stream = |name: &str| {
            format!("{cluster}invalidation: {{ redis_stream: {{ stream: \"{name}\" }} }}\n{APP}")
        };
        let e = err(&stream("sidecache:invalidations"));
        assert!(e.contains("invalidation.redis_stream.stream"), "{e}");
        assert!(e.contains("hash tag"), "{e}");
        assert!(err(&stream("{}:inv")).contains("hash tag"), "empty tag");
        let cfg = parse(&stream("{sidecache}:invalidations")).expect("valid");
        assert!(cfg.invalidation.stream.is_some());
        let sentinel =
            "store:\n  redis:\n    sentinel: { master: m, nodes: [redis://127.0.0.1:26379] }\n";
        // No slots with Sentinel: no hash tag needed.
        let cfg = parse(&format!(
            "{sentinel}invalidation: {{ redis_stream: {{ stream: \"s:i\" }} }}\n{APP}"
        ))
        .expect("a stream on Sentinel");
        assert!(cfg.invalidation.stream.is_some());
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

//! The status page of the admin listener: `GET /` serves one
//! self-contained HTML page (`page.html`: inline CSS and script, no
//! external assets) that polls `GET /admin/status` every second and draws
//! per-route request rates and hit ratios (with a rolling chart), the
//! breaker, the near cache, the config reload state, outbox and stream lag
//! and the recent dead letters. The page itself holds no data, so it is
//! open; the JSON is under `/admin/` and follows the admin token rules
//! (the page asks for the token when it gets a 401).
//!
//! The JSON carries cumulative counters; the page turns two successive
//! snapshots into rates, so the server keeps no history.

use crate::config::Config;
use crate::invalidation::Invalidator;
use crate::metrics::{names, Metrics};
use prometheus::proto::MetricFamily;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// The page, served as is.
pub(crate) const PAGE: &str = include_str!("page.html");

/// What the JSON is built from.
pub(crate) struct Sources<'a> {
    pub cfg: &'a Config,
    pub metrics: &'a Metrics,
    pub invalidator: &'a Invalidator,
    pub started: Instant,
    pub instance: &'a str,
}

/// Samples of one family: label values by name, and the value.
type Samples = Vec<(HashMap<String, String>, f64)>;

fn samples(families: &[MetricFamily]) -> HashMap<&str, Samples> {
    families
        .iter()
        .map(|f| {
            let counter = f.get_field_type() == prometheus::proto::MetricType::COUNTER;
            let list = f
                .get_metric()
                .iter()
                .map(|m| {
                    let labels = m
                        .get_label()
                        .iter()
                        .map(|l| (l.name().to_owned(), l.value().to_owned()))
                        .collect();
                    // Histograms are not read here.
                    let value = if counter {
                        m.get_counter().get_value()
                    } else {
                        m.get_gauge().get_value()
                    };
                    (labels, value)
                })
                .collect();
            (f.name(), list)
        })
        .collect()
}

/// The status snapshot as JSON.
pub(crate) fn snapshot(src: &Sources<'_>) -> Value {
    let families = src.metrics.registry.gather();
    let s = samples(&families);
    let get = |name: &str| s.get(name).map(Vec::as_slice).unwrap_or_default();
    let one = |name: &str| get(name).first().map_or(0.0, |(_, v)| *v);
    let by = |name: &str, label: &str| -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (labels, v) in get(name) {
            *out.entry(labels.get(label).cloned().unwrap_or_default())
                .or_default() += v;
        }
        out
    };

    // Every configured route appears, with or without traffic; "-" is
    // forwarded traffic.
    let mut routes: BTreeMap<String, Map<String, Value>> = src
        .cfg
        .routes
        .routes
        .iter()
        .map(|r| (r.name.clone(), Map::new()))
        .collect();
    routes.entry("-".to_owned()).or_default();
    for (labels, v) in get(names::REQUESTS) {
        let (Some(route), Some(result)) = (labels.get("route"), labels.get("result")) else {
            continue;
        };
        let counts = routes.entry(route.clone()).or_default();
        counts.insert(result.clone(), json!(*v as u64));
    }
    let inflight = by(names::FILL_INFLIGHT, "route");
    let overloaded = by(names::OVERLOADED, "route");
    let routes: Vec<Value> = routes
        .into_iter()
        .map(|(name, counts)| {
            let total: u64 = counts.values().filter_map(Value::as_u64).sum();
            json!({
                "route": name,
                "requests": counts,
                "total": total,
                "fill_inflight": inflight.get(&name).copied().unwrap_or(0.0) as u64,
                "overloaded": overloaded.get(&name).copied().unwrap_or(0.0) as u64,
            })
        })
        .collect();

    let near = by(names::NEAR_CACHE, "outcome");
    let near_enabled = src
        .cfg
        .store
        .redis
        .as_ref()
        .is_some_and(|r| r.near_cache.is_some());
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    json!({
        "instance": src.instance,
        "version": env!("CARGO_PKG_VERSION"),
        "time_ms": now,
        "uptime_s": src.started.elapsed().as_secs(),
        "routes": routes,
        "store": {
            "kind": if src.cfg.store.redis.is_some() { "redis" } else { "embedded" },
            "breaker_open": one(names::BREAKER_OPEN) > 0.0,
            "writes_refused": one(names::STORE_WRITES_REFUSED) > 0.0,
            "errors": by(names::STORE_ERRORS, "op").values().sum::<f64>() as u64,
        },
        "near_cache": {
            "enabled": near_enabled,
            "tracking": one(names::NEAR_CACHE_TRACKING) > 0.0,
            "hits": near.get("hit").copied().unwrap_or(0.0) as u64,
            "misses": near.get("miss").copied().unwrap_or(0.0) as u64,
        },
        "config": {
            "routes": src.cfg.routes.routes.len(),
            "last_reload_successful": one(names::CONFIG_LAST_RELOAD_SUCCESSFUL) > 0.0,
            "last_reload_time_ms": (one(names::CONFIG_LAST_RELOAD_TIMESTAMP) * 1000.0) as u64,
            "reloads": by(names::CONFIG_RELOADS, "outcome"),
        },
        "outbox": {
            "configured": src.cfg.invalidation.outbox.is_some(),
            "pending": one(names::OUTBOX_PENDING) as u64,
            "oldest_s": one(names::OUTBOX_OLDEST),
            "dead": one(names::OUTBOX_DEAD) as u64,
        },
        "stream": {
            "configured": src.cfg.invalidation.stream.is_some(),
            "pending": one(names::STREAM_PENDING) as u64,
        },
        "invalidations": by(names::INVALIDATIONS, "source"),
        "dead_letters": {
            "total": by(names::DEAD_LETTERS, "source"),
            "recent": src.invalidator.recent_dead_letters(),
        },
        "upstream_errors": by(names::UPSTREAM_ERRORS, "kind"),
        "access_log": {
            "enabled": src.cfg.access_log.enabled,
            "dropped": by(names::ACCESS_LOG_DROPPED, "reason").values().sum::<f64>() as u64,
        },
        "client_connections": one(names::CLIENT_CONNECTIONS) as u64,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_is_self_contained() {
        // The SVG namespace is a name, not something fetched.
        let page = super::PAGE.replace("http://www.w3.org/2000/svg", "");
        assert!(page.starts_with("<!doctype html>"));
        // No external assets: nothing fetched but our own JSON.
        for outside in ["http://", "https://", "//cdn", "<link", "src=\""] {
            assert!(!page.contains(outside), "the page references {outside:?}");
        }
        assert!(page.contains("/admin/status"));
        assert!(
            !page.contains("innerHTML"),
            "data goes in with textContent only"
        );
    }
}

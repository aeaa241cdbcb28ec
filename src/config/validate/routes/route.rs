//! One route (`routes[i]`): its name, path template and param patterns,
//! methods, `vary` keys, cached statuses, lease, Bloom filter and share of
//! the fill permits; query keys (`query`), freshness (`freshness`) and
//! headers (`headers`) are checked in their own files. Checks across
//! routes are in `routes`.

use super::freshness::freshness;
use super::headers::{client_cache_control, fill_headers, fill_host, optional_header, origin_vary};
use crate::config::file::{defaults, FileEtag, FileOriginCacheControl, FileRoute, FileTtl};
use crate::config::pattern::ParamPattern;
use crate::config::route::{parse_template, EtagMode, OriginCacheControl, Param, Route};
use crate::config::validate::{err, Result};
use crate::config::FillConfig;
use http::{HeaderName, Method};
use std::time::Duration;

/// The longest `hit_for_pass`: a marker only spares fills that would not be
/// stored anyway, but an object that became cacheable again should not
/// wait longer than this to be cached.
const MAX_HIT_FOR_PASS: Duration = Duration::from_secs(3600);

/// The longest `degraded_join_window`: a longer one hands DEGRADED answers
/// further past the staleness bound than any gain in coalescing is worth
/// (the fill permits bound the upstream load anyway).
const MAX_DEGRADED_JOIN_WINDOW: Duration = Duration::from_secs(1);

/// A `degraded_join_window` longer than this is accepted with a warning:
/// a joined DEGRADED answer may then be older than the staleness bound
/// (docs/architecture.md#degraded-answers-are-never-older-than-the-window).
pub(super) const STALENESS_BOUND: Duration = Duration::from_millis(50);

/// Validates route `at` (`routes[i]`); `default_budget` is its share of
/// `fill.max_concurrency` unless it sets its own. `also_invalidates` is
/// left empty: relations are resolved against the whole table.
pub(super) fn route(
    at: &str,
    mut r: FileRoute,
    fill: &FillConfig,
    default_budget: usize,
) -> Result<Route> {
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
    // Taken, not moved: `freshness` reads the rest of `r` by reference.
    let (query, query_ignore) =
        super::query::query(at, std::mem::take(&mut r.query), &r.query_ignore)?;
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
    // `ttl: origin` means origin semantics (docs/caching.md#ttl-from-origin):
    // what RFC 9110 lets a shared cache store, unless the route lists its own.
    let origin_ttl = matches!(r.ttl, FileTtl::Origin);
    let (cache_status, fresh_any_status) = match r.cache_status.take() {
        Some(list) => (list, false),
        None if origin_ttl => {
            let mut list = defaults::origin_cache_status();
            list.retain(|s| !r.negative_status.contains(s));
            (list, true)
        }
        None => (defaults::cache_status(), false),
    };
    for (field, list) in [
        ("cache_status", &cache_status),
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
    if let Some(s) = cache_status.iter().find(|s| r.negative_status.contains(s)) {
        return err(
            format!("{at}.negative_status"),
            format!("{s} is in both cache_status and negative_status"),
        );
    }
    let origin_cache_control = match r.origin_cache_control {
        FileOriginCacheControl::Honor => OriginCacheControl::Honor,
        FileOriginCacheControl::Ignore => OriginCacheControl::Ignore,
    };
    let (ttl, max_grace) = freshness(at, &r, origin_cache_control)?;
    if r.lease.0 < Duration::from_millis(10) {
        return err(format!("{at}.lease"), "must be at least 10ms");
    }
    if r.hit_for_pass.0 > MAX_HIT_FOR_PASS {
        return err(format!("{at}.hit_for_pass"), "must be at most 1h");
    }
    if r.degraded_join_window.0 > MAX_DEGRADED_JOIN_WINDOW {
        return err(format!("{at}.degraded_join_window"), "must be at most 1s");
    }
    let bloom = match r.bloom {
        Some(b) => Some(super::bloom::validate(at, b, &params)?),
        None => None,
    };
    let host = fill_host(at, r.host.as_deref(), &vary)?;
    let fill_headers = fill_headers(at, r.fill_headers.unwrap_or_else(defaults::fill_headers))?;
    let origin_vary = origin_vary(
        at,
        r.vary_from_origin.unwrap_or(origin_ttl),
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
        query_ignore,
        vary,
        ttl,
        jitter: r.jitter.0,
        negative_ttl: r.negative_ttl.0,
        grace: r.grace.0,
        max_grace,
        stale_if_error: r.stale_if_error.0,
        keep: r.keep.0,
        hit_for_pass: r.hit_for_pass.0,
        degraded_join_window: r.degraded_join_window.0,
        cache_status,
        fresh_any_status,
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

#[cfg(test)]
mod tests {
    use crate::config::testing::{err, parse};

    #[test]
    fn ttl_origin_means_origin_semantics_unless_turned_off() {
        let route = |keys: &str| {
            let yaml = format!(
                "routes:\n  - {{ name: r, path: \"/r/{{id}}\", params: {{ id: \"[0-9]+\" }}{keys} }}\n"
            );
            let cfg = parse(&yaml).expect("valid");
            std::sync::Arc::clone(&cfg.routes.routes[0])
        };
        let origin = route(", ttl: origin, max_ttl: 1h");
        assert!(origin.origin_vary.is_some(), "learned Vary on by default");
        assert_eq!(origin.max_grace, std::time::Duration::from_secs(60));
        assert!(origin.fresh_any_status);
        assert_eq!(
            origin.cache_status,
            [200, 203, 204, 300, 301, 308, 405, 410, 414, 501],
            "heuristically cacheable, 404 left to negative_status"
        );
        let off = route(
            ", ttl: origin, max_ttl: 1h, vary_from_origin: false, max_grace: 0s, cache_status: [200]",
        );
        assert!(off.origin_vary.is_none());
        assert!(off.max_grace.is_zero());
        assert!(!off.fresh_any_status);
        assert_eq!(off.cache_status, [200]);
        let fixed = route(", ttl: 60s");
        assert!(fixed.origin_vary.is_none() && fixed.max_grace.is_zero());
        assert!(!fixed.fresh_any_status);
        assert_eq!(fixed.cache_status, [200]);
    }

    #[test]
    fn prefix_templates_are_validated() {
        for (path, words) in [
            ("/a/{rest...}/b", "last segment"),
            ("/a/{x...}/{y...}", "two prefix params"),
            ("/a/{...}", "param name"),
            ("/a//{id}", "normal form"),
            ("/a/./{id}", "normal form"),
            ("/%7euser/{id}", "normal form"),
            ("/a/%2f/{id}", "normal form"),
        ] {
            let yaml = format!(
                "routes:\n  - name: r\n    path: \"{path}\"\n    params: {{ id: \"x\", rest: \"x\", x: \"x\", y: \"x\" }}\n    ttl: 1s\n"
            );
            let e = err(&yaml);
            assert!(e.contains("routes[0].path"), "{path}: {e}");
            assert!(e.contains(words), "{path}: {e}");
        }
        // The trailing slash and the root stay valid templates.
        parse(
            "routes:\n  - { name: r, path: /docs/, ttl: 1s }\n  - { name: root, path: /, ttl: 1s }\n",
        )
        .expect("valid");
    }
}

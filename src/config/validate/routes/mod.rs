//! `routes`: each route (`route`, with its `query`, `freshness`,
//! `headers`, `bloom` and `relations`), then what only the whole table can check: unique
//! names, no two routes that could match one request, each route's default
//! share of the fill permits, and the relations between routes.

mod bloom;
mod freshness;
mod headers;
mod query;
mod relations;
mod route;

use super::{err, Result};
use crate::config::file::FileRoute;
use crate::config::route::{overlaps, Route, RouteTable};
use crate::config::{ConfigWarning, FillConfig, UpstreamConfig};
use std::sync::Arc;

/// The route table, and the warnings about its routes.
pub(super) fn routes(
    raw: Vec<FileRoute>,
    fill: &FillConfig,
    upstream: &UpstreamConfig,
) -> Result<(RouteTable, Vec<ConfigWarning>)> {
    // A route may take at most half the fill permits (rounded up), so a
    // flood of misses on one route (cache-busting) leaves the other half to
    // the rest; a lone route has no one to share with and takes them all.
    let default_budget = if raw.len() <= 1 {
        fill.max_concurrency
    } else {
        fill.max_concurrency.div_ceil(2)
    };
    let mut warnings = Vec::new();
    let mut routes: Vec<Route> = Vec::with_capacity(raw.len());
    let mut relations = Vec::with_capacity(raw.len());
    for (i, mut r) in raw.into_iter().enumerate() {
        let at = format!("routes[{i}]");
        relations.push(std::mem::take(&mut r.also_invalidates));
        let route = route::route(&at, r, fill, default_budget)?;
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
        if route.degraded_join_window > route::STALENESS_BOUND {
            warnings.push(ConfigWarning {
                path: format!("{at}.degraded_join_window"),
                message: format!(
                    "{:?} is longer than {:?}: with the store unreachable, a request may \
                     get an answer the service read that long before it arrived, beyond \
                     the staleness bound",
                    route.degraded_join_window,
                    route::STALENESS_BOUND
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
    let relations = relations::resolve(&routes, &relations)?;
    let routes: Vec<Arc<Route>> = routes
        .into_iter()
        .zip(relations)
        .map(|(mut route, relations)| {
            route.also_invalidates = relations;
            Arc::new(route)
        })
        .collect();
    Ok((RouteTable { routes }, warnings))
}

#[cfg(test)]
mod tests {
    use crate::config::route::{EtagMode, OriginCacheControl};
    use crate::config::testing::{err, parse, APP};

    #[test]
    fn fill_settings_defaults_limits_and_warnings() {
        let cfg = parse(APP).expect("valid");
        let r = &cfg.routes.routes[0];
        let names: Vec<&str> = r.fill_headers.iter().map(|h| h.as_str()).collect();
        assert_eq!(names, ["traceparent", "tracestate", "x-request-id"]);
        assert_eq!(r.host, None);
        assert_eq!(r.origin_cache_control, OriginCacheControl::Honor);
        assert_eq!(r.etag, EtagMode::Origin);
        assert_eq!(r.fill_budget, 8, "a lone route may use every permit");
        assert_eq!(r.degraded_join_window, std::time::Duration::from_millis(20));
        // Default lease 3 s < upstream.timeout 10 s: a warning, not an error.
        assert_eq!(cfg.warnings.len(), 1);
        assert_eq!(cfg.warnings[0].path, "routes[0].lease");

        let two = r#"
fill: { max_concurrency: 5 }
routes:
  - { name: a, path: "/a/{id}", params: { id: "[0-9]+" }, ttl: 1s, lease: 20s,
      host: "svc.internal:8080", fill_headers: [], origin_cache_control: ignore, etag: auto }
  - { name: b, path: "/b/{id}", params: { id: "[0-9]+" }, ttl: 1s, max_concurrency: 5 }
"#;
        let cfg = parse(two).expect("valid");
        let (a, b) = (&cfg.routes.routes[0], &cfg.routes.routes[1]);
        assert_eq!(a.fill_budget, 3, "half of 5, rounded up");
        assert_eq!(b.fill_budget, 5);
        assert_eq!(
            a.host.as_ref().map(|h| h.as_bytes()),
            Some(&b"svc.internal:8080"[..])
        );
        assert!(a.fill_headers.is_empty());
        assert_eq!(a.origin_cache_control, OriginCacheControl::Ignore);
        assert_eq!(a.etag, EtagMode::Auto);
        let paths: Vec<&str> = cfg.warnings.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(paths, ["routes[1].lease"]);

        let route = |extra: &str| {
            format!("routes:\n  - {{ name: a, path: \"/a/{{id}}\", params: {{ id: \"[0-9]+\" }}, ttl: 1s, {extra} }}\n")
        };
        for (extra, path, words) in [
            ("fill_headers: [Host]", "routes[0].fill_headers[0]", "host"),
            (
                "fill_headers: [x-a, cookie]",
                "routes[0].fill_headers[1]",
                "vary",
            ),
            (
                "fill_headers: [accept-encoding]",
                "routes[0].fill_headers[0]",
                "vary",
            ),
            (
                "fill_headers: [range]",
                "routes[0].fill_headers[0]",
                "whole object",
            ),
            (
                "fill_headers: [connection]",
                "routes[0].fill_headers[0]",
                "hop-by-hop",
            ),
            (
                "fill_headers: [\"bad name\"]",
                "routes[0].fill_headers[0]",
                "header name",
            ),
            ("host: \"a b\"", "routes[0].host", "host"),
            ("host: \"http://x/\"", "routes[0].host", "host"),
            ("host: x, vary: [host]", "routes[0].host", "vary"),
            (
                "max_concurrency: 0",
                "routes[0].max_concurrency",
                "between 1",
            ),
            (
                "max_concurrency: 9",
                "routes[0].max_concurrency",
                "between 1",
            ),
            (
                "origin_cache_control: maybe",
                "routes[0].origin_cache_control",
                "variant",
            ),
            ("etag: strong", "routes[0].etag", "variant"),
            (
                "cache_status: [200, 206]",
                "routes[0].cache_status[1]",
                "206 cannot be cached",
            ),
            (
                "negative_status: [304]",
                "routes[0].negative_status[0]",
                "304 cannot be cached",
            ),
            ("max_grace: 5s", "routes[0].max_grace", "ttl: origin"),
            (
                "max_vary_headers: 2",
                "routes[0].max_vary_headers",
                "vary_from_origin",
            ),
            (
                "vary_from_origin: true, max_vary_headers: 17",
                "routes[0].max_vary_headers",
                "between 1 and 16",
            ),
            (
                "vary_from_origin: true, max_vary_value: 0",
                "routes[0].max_vary_value",
                "between 1 and 8192",
            ),
            (
                "vary_from_origin: true, origin_cache_control: ignore",
                "routes[0].vary_from_origin",
                "honor",
            ),
            (
                "degraded_join_window: 1001ms",
                "routes[0].degraded_join_window",
                "at most 1s",
            ),
        ] {
            let e = err(&route(extra));
            assert!(e.contains(path), "{extra}: {e}");
            assert!(e.to_lowercase().contains(words), "{extra}: {e}");
        }
    }

    #[test]
    fn a_degraded_join_window_past_the_staleness_bound_is_warned_about() {
        let route = |window: &str| {
            format!("routes:\n  - {{ name: a, path: \"/a/{{id}}\", params: {{ id: \"[0-9]+\" }}, ttl: 1s, lease: 20s, degraded_join_window: {window} }}\n")
        };
        for (window, ms, warned) in [
            ("0s", 0, false),
            ("50ms", 50, false),
            ("51ms", 51, true),
            ("1s", 1000, true),
        ] {
            let cfg = parse(&route(window)).expect("valid");
            let r = &cfg.routes.routes[0];
            assert_eq!(r.degraded_join_window, std::time::Duration::from_millis(ms));
            let paths: Vec<&str> = cfg.warnings.iter().map(|w| w.path.as_str()).collect();
            let want: &[&str] = if warned {
                &["routes[0].degraded_join_window"]
            } else {
                &[]
            };
            assert_eq!(paths, want, "{window}");
        }
    }

    #[test]
    fn prefix_routes_conflict_only_when_a_path_could_match_both() {
        // Route a is `/s/{p...}`; route b is `b` with the params it names.
        let two = |b: &str| {
            let mut params = Vec::new();
            if b.contains("{q...}") {
                params.push("q: \"[a-z]+\"");
            }
            if b.contains("{w}") {
                params.push("w: \"[0-9]+\"");
            }
            format!(
                "routes:\n  - name: a\n    path: \"/s/{{p...}}\"\n    params: {{ p: \"[a-z]+(/[a-z]+)*\" }}\n    ttl: 1s\n  - name: b\n    path: \"{b}\"\n    params: {{ {} }}\n    ttl: 1s\n",
                params.join(", ")
            )
        };
        // A literal tail the prefix pattern refuses: no conflict.
        parse(&two("/s/x1")).expect("digits are outside [a-z]");
        parse(&two("/s")).expect("the prefix needs a segment");
        parse(&two("/s/")).expect("nor an empty one");
        parse(&two("/t/{q...}")).expect("another literal");
        for b in ["/s/x", "/s/x/y", "/s/{q...}", "/s/x/{q...}", "/s/{w}"] {
            let e = err(&two(b));
            assert!(
                e.contains("routes[1].path") && e.contains("conflicts"),
                "{b}: {e}"
            );
        }
    }
}

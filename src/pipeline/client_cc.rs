//! The `Cache-Control` a client receives with an answer from the cache
//! (`client_cache_control` per route): the origin's as stored (`pass`), a
//! literal, or `remaining`, a lifetime that ends when the entry stops
//! being fresh here. Only answers built from an entry whose status the
//! route stores (`cache_status`, `negative_status`) are touched: HIT,
//! NEGATIVE, STALE, and MISS or DEGRADED answers of such a status. What the
//! origin refused to let us store (one-client answers), errors, BYPASS and
//! forwarded answers keep the origin's header.
//!
//! `remaining` writes `max-age = Age + remaining whole seconds`: a client
//! subtracts the `Age` it receives from `max-age` (RFC 9111 §4.2.3), so
//! this leaves it exactly the entry's remaining freshness, rounded down.
//! Less than a second left, or an expired entry (STALE), gets `max-age=0`. The origin's other
//! directives stay; `s-maxage` goes too (a downstream shared cache would
//! prefer it to `max-age`). Both rewriting modes drop `Expires`, which a
//! `max-age` overrides anyway and an HTTP/1.0 cache would follow instead.

use crate::body::Body;
use crate::config::{ClientCacheControl, Route};
use http::header::{self, HeaderMap, HeaderValue};
use http::Response;

/// Marks a response built from an entry (set by the pipeline's `respond`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FromEntry {
    /// Unix ms until which the entry is fresh.
    pub fresh_until_ms: u64,
}

/// Applies the route's `client_cache_control` to `resp` at `now_ms`.
pub fn apply(route: &Route, resp: &mut Response<Body>, now_ms: u64) {
    if route.client_cache_control == ClientCacheControl::Pass {
        return;
    }
    let Some(from) = resp.extensions().get::<FromEntry>().copied() else {
        return;
    };
    let code = resp.status().as_u16();
    if !route.cache_status.contains(&code) && !route.negative_status.contains(&code) {
        return;
    }
    let headers = resp.headers_mut();
    let value = match &route.client_cache_control {
        ClientCacheControl::Pass => return,
        ClientCacheControl::Literal(v) => v.clone(),
        ClientCacheControl::Remaining => remaining(headers, from, now_ms),
    };
    headers.remove(header::EXPIRES);
    headers.insert(header::CACHE_CONTROL, value);
}

/// The `remaining` header: the stored directives without `max-age` and
/// `s-maxage`, then `max-age` (see the module doc).
fn remaining(headers: &HeaderMap, from: FromEntry, now_ms: u64) -> HeaderValue {
    let left_secs = from.fresh_until_ms.saturating_sub(now_ms) / 1000;
    let max_age = if left_secs == 0 {
        0
    } else {
        let age = headers
            .get(header::AGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        age.saturating_add(left_secs)
    };
    let mut out = String::new();
    for line in headers.get_all(header::CACHE_CONTROL) {
        // An unreadable line is dropped rather than passed on half-parsed.
        let Ok(line) = line.to_str() else { continue };
        for element in super::cache_control::elements(line) {
            let name = element.split('=').next().unwrap_or_default().trim();
            if name.eq_ignore_ascii_case("max-age") || name.eq_ignore_ascii_case("s-maxage") {
                continue;
            }
            out.push_str(element);
            out.push_str(", ");
        }
    }
    out.push_str("max-age=");
    out.push_str(&max_age.to_string());
    // Built from visible ASCII of valid header values and digits.
    HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from(max_age))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body;

    fn route(mode: &str) -> std::sync::Arc<Route> {
        crate::config::testing::route(&format!(
            "  - {{ name: app, path: \"/a/{{id}}\", params: {{ id: \"[0-9]+\" }}, ttl: 60s, client_cache_control: \"{mode}\" }}\n"
        ))
    }

    fn resp(
        code: u16,
        headers: &[(&'static str, &'static str)],
        fresh_until_ms: u64,
    ) -> Response<Body> {
        let mut r = Response::new(body::empty());
        *r.status_mut() = http::StatusCode::from_u16(code).expect("status");
        for (k, v) in headers {
            r.headers_mut().append(*k, HeaderValue::from_static(v));
        }
        r.extensions_mut().insert(FromEntry { fresh_until_ms });
        r
    }

    fn cc(r: &Response<Body>) -> Option<&str> {
        r.headers()
            .get(header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
    }

    #[test]
    fn pass_keeps_the_origin_header() {
        let mut r = resp(200, &[("cache-control", "public, max-age=600")], 0);
        apply(&route("pass"), &mut r, 1_000);
        assert_eq!(cc(&r), Some("public, max-age=600"));
    }

    #[test]
    fn literal_replaces_it_and_drops_expires() {
        let mut r = resp(
            200,
            &[
                ("cache-control", "public, max-age=600"),
                ("cache-control", "immutable"),
                ("expires", "Thu, 01 Jan 2099 00:00:00 GMT"),
            ],
            0,
        );
        apply(&route("private, max-age=0"), &mut r, 1_000);
        assert_eq!(cc(&r), Some("private, max-age=0"));
        assert_eq!(r.headers().get_all(header::CACHE_CONTROL).iter().count(), 1);
        assert!(r.headers().get(header::EXPIRES).is_none());
    }

    #[test]
    fn remaining_counts_the_age_the_client_subtracts() {
        let r60 = route("remaining");
        // Fresh for 42.9 s more, 18 s old: max-age 18 + 42.
        let mut r = resp(
            200,
            &[
                (
                    "cache-control",
                    "public, s-maxage=600, max-age=600, stale-if-error=\"1,2\"",
                ),
                ("age", "18"),
            ],
            100_000,
        );
        apply(&r60, &mut r, 57_100);
        assert_eq!(cc(&r), Some("public, stale-if-error=\"1,2\", max-age=60"));
        // A MISS has no Age: the whole remaining lifetime.
        let mut r = resp(200, &[], 60_000);
        apply(&r60, &mut r, 0);
        assert_eq!(cc(&r), Some("max-age=60"));
        // Negative entries too.
        let mut r = resp(404, &[("age", "1")], 5_000);
        apply(&r60, &mut r, 1_000);
        assert_eq!(cc(&r), Some("max-age=5"));
        // Never negative; stale answers are stale for the client too.
        let mut r = resp(200, &[("age", "70")], 60_000);
        apply(&r60, &mut r, 70_000);
        assert_eq!(cc(&r), Some("max-age=0"));
        let mut r = resp(200, &[("age", "59")], 60_000);
        apply(&r60, &mut r, 59_500);
        assert_eq!(cc(&r), Some("max-age=0"));
    }

    #[test]
    fn only_answers_from_stored_entries_are_touched() {
        let r = route("private");
        // Not built from an entry (one-client answer, forwarded).
        let mut plain = Response::new(body::empty());
        plain
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
        apply(&r, &mut plain, 0);
        assert_eq!(cc(&plain), Some("public"));
        // A status the route does not store (a shared 500).
        let mut err = resp(500, &[("cache-control", "public")], 0);
        apply(&r, &mut err, 0);
        assert_eq!(cc(&err), Some("public"));
    }
}

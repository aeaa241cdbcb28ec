//! The `Cache-Control` a client receives with an answer from the cache
//! (`client_cache_control` per route): the origin's as stored (`pass`), a
//! literal, or `remaining`, a lifetime that ends when the entry stops
//! being fresh here. Applied where an answer is built from an entry (the
//! pipeline's `respond`), and only for a status the route stores
//! (`cache_status`, `negative_status`): HIT, NEGATIVE, STALE, and MISS or
//! DEGRADED answers of such a status. What the origin refused to let us
//! store (one-client answers), errors, BYPASS and forwarded answers keep
//! the origin's header.
//!
//! `remaining` writes `max-age = Age + remaining whole seconds`: a client
//! subtracts the `Age` it receives from `max-age` (RFC 9111 §4.2.3), so
//! this leaves it exactly the entry's remaining freshness, rounded down.
//! Less than a second left, or an expired entry (STALE), gets `max-age=0`.
//! The origin's other directives stay; `s-maxage` goes too (a downstream
//! shared cache would prefer it to `max-age`). Both rewriting modes drop
//! `Expires`, which a `max-age` overrides anyway and an HTTP/1.0 cache
//! would follow instead.

use super::entry::Entry;
use crate::config::{ClientCacheControl, Route};
use http::header::{self, HeaderMap, HeaderValue};

/// Applies the route's `client_cache_control` to `headers`, those of an
/// answer built from `entry` (with its `Age` already set).
pub(crate) fn apply(route: &Route, entry: &Entry, headers: &mut HeaderMap) {
    // The default costs one comparison on the hit path.
    if route.client_cache_control == ClientCacheControl::Pass {
        return;
    }
    apply_at(route, entry, headers, super::publish::now_ms());
}

fn apply_at(route: &Route, entry: &Entry, headers: &mut HeaderMap, now_ms: u64) {
    if !route.cache_status.contains(&entry.status) && !route.negative_status.contains(&entry.status)
    {
        return;
    }
    let value = match &route.client_cache_control {
        ClientCacheControl::Pass => return,
        ClientCacheControl::Literal(v) => v.clone(),
        ClientCacheControl::Remaining => remaining(headers, entry.fresh_until_ms, now_ms),
    };
    headers.remove(header::EXPIRES);
    headers.insert(header::CACHE_CONTROL, value);
}

/// The `remaining` header: the stored directives without `max-age` and
/// `s-maxage`, then `max-age` (see the module doc).
fn remaining(headers: &HeaderMap, fresh_until_ms: u64, now_ms: u64) -> HeaderValue {
    let left_secs = fresh_until_ms.saturating_sub(now_ms) / 1000;
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

    fn route(mode: &str) -> std::sync::Arc<Route> {
        crate::config::testing::route(&format!(
            "  - {{ name: app, path: \"/a/{{id}}\", params: {{ id: \"[0-9]+\" }}, ttl: 60s, client_cache_control: \"{mode}\" }}\n"
        ))
    }

    fn entry(status: u16, fresh_until_ms: u64) -> Entry {
        Entry {
            status,
            negative: status == 404,
            stored_at_ms: 0,
            fresh_until_ms,
            grace_ms: 0,
            stale_if_error_ms: 0,
            generation: bytes::Bytes::from_static(b"g"),
            identity: "app:1".into(),
            variant: "v".into(),
            headers: vec![],
            body: bytes::Bytes::new(),
            tags: vec![],
        }
    }

    /// The answer's headers after `apply_at` on an entry of `status`.
    fn answer(
        mode: &str,
        status: u16,
        headers: &[(&'static str, &'static str)],
        fresh_until_ms: u64,
        now_ms: u64,
    ) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(*k, HeaderValue::from_static(v));
        }
        apply_at(&route(mode), &entry(status, fresh_until_ms), &mut h, now_ms);
        h
    }

    fn cc(h: &HeaderMap) -> Option<&str> {
        h.get(header::CACHE_CONTROL).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn pass_keeps_the_origin_header() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("public, max-age=600"),
        );
        apply(&route("pass"), &entry(200, 0), &mut h);
        assert_eq!(cc(&h), Some("public, max-age=600"));
    }

    #[test]
    fn literal_replaces_it_and_drops_expires() {
        let h = answer(
            "private, max-age=0",
            200,
            &[
                ("cache-control", "public, max-age=600"),
                ("cache-control", "immutable"),
                ("expires", "Thu, 01 Jan 2099 00:00:00 GMT"),
            ],
            0,
            1_000,
        );
        assert_eq!(cc(&h), Some("private, max-age=0"));
        assert_eq!(h.get_all(header::CACHE_CONTROL).iter().count(), 1);
        assert!(h.get(header::EXPIRES).is_none());
    }

    #[test]
    fn remaining_counts_the_age_the_client_subtracts() {
        // Fresh for 42.9 s more, 18 s old: max-age 18 + 42.
        let h = answer(
            "remaining",
            200,
            &[
                (
                    "cache-control",
                    "public, s-maxage=600, max-age=600, stale-if-error=\"1,2\"",
                ),
                ("age", "18"),
            ],
            100_000,
            57_100,
        );
        assert_eq!(cc(&h), Some("public, stale-if-error=\"1,2\", max-age=60"));
        // A MISS has no Age: the whole remaining lifetime.
        assert_eq!(
            cc(&answer("remaining", 200, &[], 60_000, 0)),
            Some("max-age=60")
        );
        // Negative entries too.
        let h = answer("remaining", 404, &[("age", "1")], 5_000, 1_000);
        assert_eq!(cc(&h), Some("max-age=5"));
        // Never negative: expired (STALE) or under a second left.
        let h = answer("remaining", 200, &[("age", "70")], 60_000, 70_000);
        assert_eq!(cc(&h), Some("max-age=0"));
        let h = answer("remaining", 200, &[("age", "59")], 60_000, 59_500);
        assert_eq!(cc(&h), Some("max-age=0"));
    }

    #[test]
    fn statuses_the_route_does_not_store_keep_the_origin_header() {
        // A shared 500 (an unlisted status) is built from an entry too.
        let h = answer("private", 500, &[("cache-control", "public")], 0, 0);
        assert_eq!(cc(&h), Some("public"));
    }
}

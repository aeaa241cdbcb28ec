//! Conditional fills (RFC 9111 §4.3): a fill that finds the object's entry
//! expired asks the origin whether it changed instead of fetching the body
//! again. The validators come from the stored entry (its `ETag`, its
//! `Last-Modified`), never from the client that missed: the fill request
//! stays the one built from the key, plus `If-None-Match` /
//! `If-Modified-Since`. A `304` refreshes the stored entry (its headers
//! updated from the `304` per §4.3.4, its body kept) and goes through stage
//! 8 like any answer, so it is published only under the fill's lease and
//! generation ticket; any other answer replaces the entry as a plain fill
//! would.
//!
//! Only an entry of the fill's own generation is revalidated
//! (docs/architecture.md#the-serving-rule): after an invalidation the old body
//! must not come back with fresh headers, so the fill is a full `GET`.

use super::entry::Entry;
use super::fill::{Fetched, FillRequest};
use crate::config::{EtagMode, Route};
use http::header::{self, HeaderMap, HeaderValue};
use http::StatusCode;

/// What a conditional fill found: the `outcome` label of
/// `sidecache_revalidations_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Revalidation {
    /// `304`: the stored body is still current.
    NotModified,
    /// Any other answer below 500: it replaces the entry.
    Modified,
    /// The upstream call failed or answered 5xx.
    Error,
}

impl Revalidation {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Revalidation::NotModified => "not_modified",
            Revalidation::Modified => "modified",
            Revalidation::Error => "error",
        }
    }
}

/// Whether an origin answer carries a validator a later fill can send back.
pub(crate) fn has_validators(headers: &HeaderMap) -> bool {
    headers.contains_key(header::ETAG) || headers.contains_key(header::LAST_MODIFIED)
}

/// The validators of a stored entry that a conditional fill sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Validators {
    etag: Option<HeaderValue>,
    last_modified: Option<HeaderValue>,
}

impl Validators {
    /// The validators of `entry` if a fill holding `ticket` may revalidate
    /// it: of the same generation, and with an origin `ETag` (not one
    /// `etag: auto` derived, which the origin never issued) or a
    /// `Last-Modified`.
    pub(crate) fn of(entry: &Entry, ticket: &[u8], route: &Route) -> Option<Validators> {
        if entry.generation != ticket {
            return None;
        }
        let stored = |name: header::HeaderName| {
            entry
                .headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        };
        let etag = stored(header::ETAG)
            .filter(|tag| route.etag != EtagMode::Auto || *tag != super::etag::derive(&entry.body));
        let last_modified = stored(header::LAST_MODIFIED);
        (etag.is_some() || last_modified.is_some()).then_some(Validators {
            etag,
            last_modified,
        })
    }

    /// The fill request made conditional.
    pub(crate) fn apply(&self, request: &FillRequest) -> FillRequest {
        let mut conditional = request.clone();
        let h = &mut conditional.headers;
        if let Some(tag) = &self.etag {
            h.insert(header::IF_NONE_MATCH, tag.clone());
        }
        if let Some(date) = &self.last_modified {
            h.insert(header::IF_MODIFIED_SINCE, date.clone());
        }
        conditional
    }
}

/// Judges a conditional fill's answer against the entry it revalidated: a
/// `304` becomes that entry's status and body with its headers updated
/// from the `304`, anything else stays as it came.
pub(crate) fn resolve(stored: &Entry, fetched: Fetched) -> (Fetched, Revalidation) {
    let (status, headers) = match &fetched {
        Fetched::Buffered {
            status, headers, ..
        } => (*status, headers),
        // A 304 may declare the full representation's length, which can
        // exceed `max_body` (then it arrives as streamed): still a 304.
        Fetched::Streamed(resp) => (resp.status(), resp.headers()),
    };
    if status == StatusCode::NOT_MODIFIED {
        let refreshed = Fetched::Buffered {
            status: StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK),
            headers: updated_headers(stored, headers),
            body: stored.body.clone(),
        };
        return (refreshed, Revalidation::NotModified);
    }
    let outcome = if status.is_server_error() {
        Revalidation::Error
    } else {
        Revalidation::Modified
    };
    (fetched, outcome)
}

/// RFC 9111 §3.2 (applied by §4.3.4): every field of the `304` replaces
/// the stored field of that name; stored fields it does not name are kept.
/// `Content-Length` is never taken from a `304` (the stored body decides
/// it). Hop-by-hop fields were dropped when the `304` was read.
fn updated_headers(stored: &Entry, not_modified: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(stored.headers.len() + not_modified.len());
    for (name, value) in &stored.headers {
        if !not_modified.contains_key(name) {
            out.append(name.clone(), value.clone());
        }
    }
    for (name, value) in not_modified {
        if name != header::CONTENT_LENGTH {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::HeaderName;

    fn entry(headers: &[(&'static str, &'static str)]) -> Entry {
        Entry {
            status: 200,
            negative: false,
            stored_at_ms: 1,
            fresh_until_ms: 2,
            grace_ms: 0,
            stale_if_error_ms: 0,
            generation: Bytes::from_static(b"g1"),
            identity: "app:1".into(),
            variant: "v".into(),
            headers: headers
                .iter()
                .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
                .collect(),
            body: Bytes::from_static(b"body"),
            tags: vec![],
        }
    }

    fn route(etag: &str) -> std::sync::Arc<Route> {
        crate::config::testing::route(&format!(
            "  - {{ name: app, path: \"/a/{{id}}\", params: {{ id: \"[0-9]+\" }}, ttl: 10s, etag: {etag} }}\n"
        ))
    }

    #[test]
    fn validators_come_from_an_entry_of_the_same_generation() {
        let r = route("origin");
        let e = entry(&[
            ("etag", "\"v1\""),
            ("last-modified", "Wed, 01 Jan 2020 00:00:00 GMT"),
        ]);
        let v = Validators::of(&e, b"g1", &r).expect("validators");
        let req = v.apply(&FillRequest {
            path_and_query: "/a/1".into(),
            headers: HeaderMap::new(),
        });
        assert_eq!(req.headers[header::IF_NONE_MATCH], "\"v1\"");
        assert_eq!(
            req.headers[header::IF_MODIFIED_SINCE],
            "Wed, 01 Jan 2020 00:00:00 GMT"
        );
        // Another generation (invalidated since): never revalidated.
        assert_eq!(Validators::of(&e, b"g2", &r), None);
        assert_eq!(Validators::of(&entry(&[]), b"g1", &r), None);
    }

    #[test]
    fn a_derived_etag_is_not_sent_to_the_origin() {
        let auto = route("auto");
        let mut e = entry(&[]);
        e.headers
            .push((header::ETAG, super::super::etag::derive(&e.body)));
        assert_eq!(Validators::of(&e, b"g1", &auto), None);
        e.headers.push((
            header::LAST_MODIFIED,
            HeaderValue::from_static("Wed, 01 Jan 2020 00:00:00 GMT"),
        ));
        let v = Validators::of(&e, b"g1", &auto).expect("last-modified");
        assert_eq!(v.etag, None);
    }

    #[test]
    fn a_304_updates_headers_and_keeps_status_and_body() {
        let stored = entry(&[
            ("etag", "\"v1\""),
            ("cache-control", "max-age=1"),
            ("x-kept", "a"),
            ("x-multi", "1"),
            ("x-multi", "2"),
        ]);
        let mut h = HeaderMap::new();
        h.insert("cache-control", HeaderValue::from_static("max-age=3600"));
        h.insert("x-multi", HeaderValue::from_static("3"));
        h.insert("content-length", HeaderValue::from_static("10"));
        let fetched = Fetched::Buffered {
            status: StatusCode::NOT_MODIFIED,
            headers: h,
            body: Bytes::new(),
        };
        let (refreshed, outcome) = resolve(&stored, fetched);
        assert_eq!(outcome, Revalidation::NotModified);
        let Fetched::Buffered {
            status,
            headers,
            body,
        } = refreshed
        else {
            panic!("buffered");
        };
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"body"[..]));
        assert_eq!(headers["cache-control"], "max-age=3600");
        assert_eq!(headers["x-kept"], "a");
        assert_eq!(headers["etag"], "\"v1\"");
        let multi: Vec<_> = headers.get_all("x-multi").iter().collect();
        assert_eq!(multi, ["3"]);
        assert!(!headers.contains_key("content-length"));

        let changed = Fetched::Buffered {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from_static(b"new"),
        };
        assert_eq!(resolve(&stored, changed).1, Revalidation::Modified);
        let failed = Fetched::Buffered {
            status: StatusCode::BAD_GATEWAY,
            headers: HeaderMap::new(),
            body: Bytes::new(),
        };
        assert_eq!(resolve(&stored, failed).1, Revalidation::Error);
        let mut streamed = http::Response::new(crate::body::empty());
        *streamed.status_mut() = StatusCode::NOT_MODIFIED;
        let (refreshed, outcome) = resolve(&stored, Fetched::Streamed(streamed));
        assert_eq!(outcome, Revalidation::NotModified);
        assert!(matches!(
            refreshed,
            Fetched::Buffered {
                status: StatusCode::OK,
                ..
            }
        ));
    }
}

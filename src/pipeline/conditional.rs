//! Conditional requests answered from an entry (RFC 9110 §13): the client's
//! preconditions, evaluated in the order of §13.2.2 against the validators
//! the entry stores (`ETag`, `Last-Modified`), and the 304 built from the
//! 200 that would have been sent (§15.4.5).
//!
//! Only the client's answer changes: fills never carry these headers (see
//! `fill`), so what is stored, and served to everyone else, never depends
//! on them.

use headers::{Header, HeaderMapExt};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use std::time::SystemTime;

/// The client's preconditions, kept from its request (the request itself is
/// gone by the time a fill answers). Absent headers are `None`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Conditions {
    if_match: Option<headers::IfMatch>,
    if_none_match: Option<headers::IfNoneMatch>,
    if_modified_since: Option<headers::IfModifiedSince>,
    if_unmodified_since: Option<headers::IfUnmodifiedSince>,
}

impl Conditions {
    /// Reads the four precondition headers. An unreadable one is ignored,
    /// as §13.1 asks of each (an invalid date, an unparseable list).
    pub(crate) fn from_headers(headers: &HeaderMap) -> Conditions {
        Conditions {
            if_match: headers.typed_get(),
            if_none_match: headers.typed_get(),
            if_modified_since: headers.typed_get(),
            if_unmodified_since: headers.typed_get(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.if_match.is_none()
            && self.if_none_match.is_none()
            && self.if_modified_since.is_none()
            && self.if_unmodified_since.is_none()
    }
}

/// The validators of a stored response, parsed only when a condition
/// needs them (a date parse costs more than the rest of a 304).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Validators<'a> {
    etag: Option<&'a HeaderValue>,
    last_modified: Option<&'a HeaderValue>,
}

impl<'a> Validators<'a> {
    pub(crate) fn of(headers: &'a [(HeaderName, HeaderValue)]) -> Validators<'a> {
        let mut v = Validators::default();
        for (name, value) in headers {
            if name == header::ETAG {
                v.etag.get_or_insert(value);
            } else if name == header::LAST_MODIFIED {
                v.last_modified.get_or_insert(value);
            }
        }
        v
    }

    /// The stored `ETag`; one that does not parse counts as absent.
    pub(crate) fn etag(&self) -> Option<headers::ETag> {
        headers::ETag::decode(&mut self.etag.into_iter()).ok()
    }

    /// The stored `Last-Modified`; one that does not parse counts as absent.
    pub(crate) fn last_modified(&self) -> Option<SystemTime> {
        headers::LastModified::decode(&mut self.last_modified.into_iter())
            .ok()
            .map(SystemTime::from)
    }
}

/// What the preconditions say about answering with the stored 2xx.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Precondition {
    /// Answer as if there were none.
    Proceed,
    /// 304: the client's copy is current.
    NotModified,
    /// 412.
    Failed,
}

/// RFC 9110 §13.2.2 for a GET or HEAD whose answer would be the stored 2xx.
pub(crate) fn evaluate(c: &Conditions, v: &Validators) -> Precondition {
    // Step 1-2: If-Match (strong comparison; `*` holds: the entry exists),
    // else If-Unmodified-Since (only with a Last-Modified to compare).
    if let Some(if_match) = &c.if_match {
        let holds = if_match.is_any()
            || v.etag()
                .is_some_and(|tag| if_match.precondition_passes(&tag));
        if !holds {
            return Precondition::Failed;
        }
    } else if let Some(ius) = &c.if_unmodified_since {
        if v.last_modified()
            .is_some_and(|lm| !ius.precondition_passes(lm))
        {
            return Precondition::Failed;
        }
    }
    // Step 3-4: If-None-Match (weak comparison; `*` matches any entry),
    // else If-Modified-Since (only with a Last-Modified to compare).
    if let Some(inm) = &c.if_none_match {
        let matches = *inm == headers::IfNoneMatch::any()
            || v.etag().is_some_and(|tag| !inm.precondition_passes(&tag));
        if matches {
            return Precondition::NotModified;
        }
    } else if let Some(ims) = &c.if_modified_since {
        if v.last_modified().is_some_and(|lm| !ims.is_modified(lm)) {
            return Precondition::NotModified;
        }
    }
    Precondition::Proceed
}

/// The fields a 304 carries (§15.4.5): those a 200 would have carried of
/// `Cache-Control`, `Content-Location`, `Date`, `ETag`, `Expires`, `Vary`,
/// and `Last-Modified` (which guides the client's cache when there is no
/// `ETag`). Sidecache's own `Age` stays; `X-Cache` is added by the caller.
const NOT_MODIFIED_KEEPS: [HeaderName; 8] = [
    header::CACHE_CONTROL,
    header::CONTENT_LOCATION,
    header::DATE,
    header::ETAG,
    header::EXPIRES,
    header::VARY,
    header::LAST_MODIFIED,
    header::AGE,
];

/// Reduces the headers of the 200 that would have been sent to those of
/// its 304, in one pass.
pub(crate) fn not_modified_headers(full: &mut HeaderMap) {
    let mut kept = HeaderMap::with_capacity(NOT_MODIFIED_KEEPS.len());
    let mut current: Option<(HeaderName, bool)> = None;
    // The owned iterator names a header only at its first value.
    for (name, value) in std::mem::take(full) {
        if let Some(name) = name {
            let keep = NOT_MODIFIED_KEEPS.contains(&name);
            current = Some((name, keep));
        }
        if let Some((name, true)) = &current {
            kept.append(name.clone(), value);
        }
    }
    *full = kept;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn request(pairs: &[(&'static str, &'static str)]) -> Conditions {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        Conditions::from_headers(&h)
    }

    const LM: &str = "Tue, 15 Nov 1994 12:45:26 GMT";
    const BEFORE: &str = "Tue, 15 Nov 1994 12:45:25 GMT";
    const AFTER: &str = "Tue, 15 Nov 1994 12:45:27 GMT";

    fn stored(
        etag: Option<&'static str>,
        last_modified: Option<&'static str>,
    ) -> Vec<(HeaderName, HeaderValue)> {
        let mut h = vec![(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"))];
        if let Some(t) = etag {
            h.push((header::ETAG, HeaderValue::from_static(t)));
        }
        if let Some(d) = last_modified {
            h.push((header::LAST_MODIFIED, HeaderValue::from_static(d)));
        }
        h
    }

    fn evaluate(c: &Conditions, stored: &[(HeaderName, HeaderValue)]) -> Precondition {
        super::evaluate(c, &Validators::of(stored))
    }

    use Precondition::*;

    #[test]
    fn if_none_match_lists_weak_comparison_and_star() {
        let v = stored(Some("\"v2\""), None);
        let e = |inm| evaluate(&request(&[("if-none-match", inm)]), &v);
        assert_eq!(e("\"v2\""), NotModified);
        assert_eq!(e("\"v1\", \"v2\", \"v3\""), NotModified, "a list");
        assert_eq!(e("W/\"v2\""), NotModified, "weak comparison");
        assert_eq!(e("*"), NotModified);
        assert_eq!(e("\"v1\""), Proceed, "an old tag");
        assert_eq!(e("\"v1\", W/\"v3\""), Proceed);
        assert_eq!(e("v2"), Proceed, "unquoted is not an entity-tag");
        // Several lines are one list.
        let mut h = HeaderMap::new();
        h.append("if-none-match", HeaderValue::from_static("\"a\""));
        h.append("if-none-match", HeaderValue::from_static("\"v2\""));
        assert_eq!(evaluate(&Conditions::from_headers(&h), &v), NotModified);
        // A weak stored tag matches weakly too.
        let weak = stored(Some("W/\"v2\""), None);
        assert_eq!(
            evaluate(&request(&[("if-none-match", "\"v2\"")]), &weak),
            NotModified
        );
        // No stored ETag: only `*` matches.
        let none = stored(None, Some(LM));
        assert_eq!(
            evaluate(&request(&[("if-none-match", "\"v2\"")]), &none),
            Proceed
        );
        assert_eq!(
            evaluate(&request(&[("if-none-match", "*")]), &none),
            NotModified
        );
    }

    #[test]
    fn if_modified_since_only_without_if_none_match() {
        let v = stored(Some("\"v2\""), Some(LM));
        let ims = |d| evaluate(&request(&[("if-modified-since", d)]), &v);
        assert_eq!(ims(LM), NotModified);
        assert_eq!(ims(AFTER), NotModified);
        assert_eq!(ims(BEFORE), Proceed);
        assert_eq!(ims("yesterday"), Proceed, "an invalid date is ignored");
        // If-None-Match wins, even when the date alone would say 304.
        assert_eq!(
            evaluate(
                &request(&[("if-none-match", "\"v1\""), ("if-modified-since", AFTER)]),
                &v
            ),
            Proceed
        );
        // Without Last-Modified there is nothing to compare.
        assert_eq!(
            evaluate(
                &request(&[("if-modified-since", AFTER)]),
                &stored(Some("\"v2\""), None)
            ),
            Proceed
        );
    }

    #[test]
    fn if_match_and_if_unmodified_since_fail_with_412_first() {
        let v = stored(Some("\"v2\""), Some(LM));
        let e = |pairs: &[(&'static str, &'static str)]| evaluate(&request(pairs), &v);
        assert_eq!(e(&[("if-match", "\"v2\"")]), Proceed);
        assert_eq!(e(&[("if-match", "\"v1\", \"v2\"")]), Proceed);
        assert_eq!(e(&[("if-match", "*")]), Proceed);
        assert_eq!(e(&[("if-match", "\"v1\"")]), Failed);
        assert_eq!(e(&[("if-match", "W/\"v2\"")]), Failed, "strong comparison");
        assert_eq!(
            evaluate(
                &request(&[("if-match", "\"v2\"")]),
                &stored(Some("W/\"v2\""), None)
            ),
            Failed,
            "a weak stored tag never matches strongly"
        );
        assert_eq!(e(&[("if-unmodified-since", LM)]), Proceed);
        assert_eq!(e(&[("if-unmodified-since", BEFORE)]), Failed);
        // If-Match present: If-Unmodified-Since is not evaluated.
        assert_eq!(
            e(&[("if-match", "\"v2\""), ("if-unmodified-since", BEFORE)]),
            Proceed
        );
        // 412 is decided before 304.
        assert_eq!(
            e(&[("if-match", "\"v1\""), ("if-none-match", "\"v2\"")]),
            Failed
        );
        assert_eq!(
            e(&[("if-match", "\"v2\""), ("if-none-match", "\"v2\"")]),
            NotModified
        );
    }

    #[test]
    fn no_conditions_proceed() {
        let c = request(&[("accept", "*/*")]);
        assert!(c.is_empty());
        assert_eq!(evaluate(&c, &stored(Some("\"v\""), Some(LM))), Proceed);
    }

    #[test]
    fn validators_tolerate_garbage() {
        let garbage = stored(Some("not-quoted"), Some("last tuesday"));
        let v = Validators::of(&garbage);
        assert_eq!((v.etag(), v.last_modified()), (None, None));
        let good = stored(Some("\"x\""), Some(LM));
        let v = Validators::of(&good);
        assert_eq!(
            v.last_modified(),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(784_903_526))
        );
        assert_eq!(v.etag().map(|t| t.is_weak()), Some(false));
    }

    #[test]
    fn not_modified_keeps_the_listed_fields_only() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("content-type", "application/json"),
            ("content-length", "120"),
            ("etag", "\"v2\""),
            ("cache-control", "max-age=60"),
            ("vary", "accept"),
            ("vary", "accept-encoding"),
            ("last-modified", LM),
            ("age", "3"),
            ("x-origin-thing", "1"),
            ("accept-ranges", "bytes"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        not_modified_headers(&mut h);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["age", "cache-control", "etag", "last-modified", "vary"]
        );
        assert_eq!(h.get_all("vary").iter().count(), 2);
    }
}

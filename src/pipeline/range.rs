//! Range requests answered from a cached 200 (RFC 9110 §14): one byte
//! range → 206 with `Content-Range`; none satisfiable, or an invalid
//! ranges-set (e.g. `bytes=5-2`) → 416 with `Content-Range: bytes */len`;
//! several ranges → the full 200 (§14.2 lets a server ignore `Range`; a
//! multipart/byteranges answer would cost more than the whole object
//! usually does); a unit other than `bytes` → ignored. `If-Range`
//! (§13.1.5) decides whether the range applies: a strong `ETag` equal to the
//! stored one, or a date equal to the stored `Last-Modified`; anything else
//! gets the full 200. The ranges-set grammar and its limits (at most 100
//! ranges, 30 digits a position) are `http_range_header`'s.
//!
//! Fills never carry `Range` or `If-Range` (see `fill`): the whole object is
//! fetched and stored, and a 206 from the origin is never stored (its status
//! cannot be listed in `cache_status`/`negative_status`).

use super::conditional::Validators;
use http::header::{self, HeaderMap, HeaderValue};
use std::ops::RangeInclusive;
use std::time::SystemTime;

/// The client's `Range` and `If-Range`, kept from its request.
#[derive(Debug, Default, Clone)]
pub(crate) struct RangeAsk {
    range: Option<HeaderValue>,
    if_range: Option<HeaderValue>,
}

impl RangeAsk {
    pub(crate) fn from_headers(headers: &HeaderMap) -> RangeAsk {
        let range = headers.get(header::RANGE).cloned();
        // If-Range means nothing without a Range (§13.1.5).
        let if_range = range
            .as_ref()
            .and_then(|_| headers.get(header::IF_RANGE).cloned());
        RangeAsk { range, if_range }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.range.is_none()
    }
}

/// What to answer for a representation of `len` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RangeAnswer {
    /// The full 200.
    Full,
    /// 206 with these bytes (inclusive, within the representation).
    Partial(RangeInclusive<u64>),
    /// 416.
    Unsatisfiable,
}

/// Judges the client's range against a stored 200 of `len` bytes.
pub(crate) fn evaluate(ask: &RangeAsk, v: &Validators, len: u64) -> RangeAnswer {
    let Some(range) = &ask.range else {
        return RangeAnswer::Full;
    };
    if let Some(if_range) = &ask.if_range {
        if !if_range_holds(if_range, v) {
            return RangeAnswer::Full;
        }
    }
    let Ok(text) = range.to_str() else {
        return RangeAnswer::Unsatisfiable;
    };
    let bytes_unit = text
        .get(..6)
        .is_some_and(|unit| unit.eq_ignore_ascii_case("bytes="));
    if !bytes_unit {
        return RangeAnswer::Full;
    }
    let parsed = match http_range_header::parse_range_header(text) {
        Ok(p) => p,
        // An invalid ranges-set is rejected rather than ignored (§14.2
        // allows either; nginx rejects too).
        Err(_) => return RangeAnswer::Unsatisfiable,
    };
    if parsed.len() > 1 {
        return RangeAnswer::Full;
    }
    match parsed.validate(len) {
        Ok(mut ranges) => match ranges.pop() {
            Some(r) if ranges.is_empty() => RangeAnswer::Partial(r),
            // A suffix range of an empty representation: nothing to cut.
            _ => RangeAnswer::Full,
        },
        Err(_) => RangeAnswer::Unsatisfiable,
    }
}

/// §13.1.5: an entity-tag must equal the stored one by strong comparison;
/// a date must equal the stored `Last-Modified` exactly.
fn if_range_holds(if_range: &HeaderValue, v: &Validators) -> bool {
    let Ok(text) = if_range.to_str() else {
        return false;
    };
    if text.starts_with('"') || text.starts_with("W/") {
        let Ok(tag) = text.parse::<headers::ETag>() else {
            return false;
        };
        return !tag.is_weak() && v.etag().is_some_and(|stored| strong_eq(&stored, &tag));
    }
    match (httpdate::parse_http_date(text), v.last_modified()) {
        (Ok(date), Some(lm)) => same_second(date, lm),
        _ => false,
    }
}

/// Strong comparison (§8.8.3.2): neither weak, opaque tags equal. `headers`
/// exposes it only through `IfMatch`.
fn strong_eq(a: &headers::ETag, b: &headers::ETag) -> bool {
    headers::IfMatch::from(b.clone()).precondition_passes(a)
}

fn same_second(a: SystemTime, b: SystemTime) -> bool {
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .ok()
    };
    secs(a).is_some() && secs(a) == secs(b)
}

/// `Content-Range` of a 206: `bytes first-last/len`.
pub(crate) fn content_range(r: &RangeInclusive<u64>, len: u64) -> HeaderValue {
    let text = format!("bytes {}-{}/{len}", r.start(), r.end());
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("bytes */0"))
}

/// `Content-Range` of a 416: `bytes */len`.
pub(crate) fn unsatisfied_range(len: u64) -> HeaderValue {
    let text = format!("bytes */{len}");
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("bytes */0"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use RangeAnswer::*;

    const LM: &str = "Tue, 15 Nov 1994 12:45:26 GMT";

    static STORED: [(header::HeaderName, HeaderValue); 2] = [
        (header::ETAG, HeaderValue::from_static("\"v2\"")),
        (header::LAST_MODIFIED, HeaderValue::from_static(LM)),
    ];

    fn stored() -> Validators<'static> {
        Validators::of(&STORED)
    }

    fn ask(range: &'static str, if_range: Option<&'static str>) -> RangeAsk {
        let mut h = HeaderMap::new();
        h.insert(header::RANGE, HeaderValue::from_static(range));
        if let Some(ir) = if_range {
            h.insert(header::IF_RANGE, HeaderValue::from_static(ir));
        }
        RangeAsk::from_headers(&h)
    }

    fn e(range: &'static str, len: u64) -> RangeAnswer {
        evaluate(&ask(range, None), &stored(), len)
    }

    #[test]
    fn single_ranges() {
        assert_eq!(e("bytes=0-99", 1000), Partial(0..=99));
        assert_eq!(e("bytes=990-", 1000), Partial(990..=999));
        assert_eq!(e("bytes=-10", 1_048_576), Partial(1_048_566..=1_048_575));
        assert_eq!(
            e("bytes=-5000", 1000),
            Partial(0..=999),
            "suffix longer than all"
        );
        assert_eq!(e("bytes=900-5000", 1000), Partial(900..=999), "end clipped");
        assert_eq!(
            e("BYTES=1-1", 10),
            Partial(1..=1),
            "unit is case-insensitive"
        );
    }

    #[test]
    fn unsatisfiable_and_invalid_sets_are_416() {
        assert_eq!(e("bytes=1000-", 1000), Unsatisfiable);
        assert_eq!(e("bytes=1000-2000", 1000), Unsatisfiable);
        assert_eq!(e("bytes=-0", 1000), Unsatisfiable);
        assert_eq!(e("bytes=5-2", 1000), Unsatisfiable, "last before first");
        assert_eq!(e("bytes=abc", 1000), Unsatisfiable);
        assert_eq!(e("bytes=", 1000), Unsatisfiable);
        assert_eq!(e("bytes=0-1, 5-2", 1000), Unsatisfiable);
        assert_eq!(e("bytes=0-99", 0), Unsatisfiable, "empty representation");
    }

    #[test]
    fn several_ranges_other_units_and_none_get_the_full_200() {
        assert_eq!(e("bytes=0-1, 5-9", 1000), Full);
        assert_eq!(e("items=0-1", 1000), Full);
        assert_eq!(e("bytes", 1000), Full);
        assert_eq!(e("bytes=-10", 0), Full, "no bytes to cut");
        assert_eq!(
            evaluate(&RangeAsk::default(), &stored(), 1000),
            Full,
            "no Range"
        );
        // If-Range alone means nothing.
        let mut h = HeaderMap::new();
        h.insert(header::IF_RANGE, HeaderValue::from_static("\"v2\""));
        assert!(RangeAsk::from_headers(&h).is_empty());
    }

    #[test]
    fn if_range_needs_the_current_strong_tag_or_the_exact_date() {
        let ir = |v| evaluate(&ask("bytes=0-9", Some(v)), &stored(), 100);
        assert_eq!(ir("\"v2\""), Partial(0..=9));
        assert_eq!(ir("\"v1\""), Full, "an old tag");
        assert_eq!(ir("W/\"v2\""), Full, "a weak tag never holds");
        assert_eq!(ir(LM), Partial(0..=9));
        assert_eq!(ir("Tue, 15 Nov 1994 12:45:27 GMT"), Full, "a later date");
        assert_eq!(ir("Tue, 15 Nov 1994 12:45:25 GMT"), Full, "an earlier date");
        assert_eq!(ir("garbage"), Full);
        // The stored tag is weak: no If-Range tag can hold.
        let weak_tag = [(header::ETAG, HeaderValue::from_static("W/\"v2\""))];
        let weak = Validators::of(&weak_tag);
        assert_eq!(
            evaluate(&ask("bytes=0-9", Some("\"v2\"")), &weak, 100),
            Full
        );
        // Nothing stored to compare with.
        assert_eq!(
            evaluate(&ask("bytes=0-9", Some(LM)), &Validators::default(), 100),
            Full
        );
    }

    #[test]
    fn content_range_values() {
        assert_eq!(content_range(&(0..=9), 100), "bytes 0-9/100");
        assert_eq!(unsatisfied_range(1_048_576), "bytes */1048576");
    }
}

//! The `Cache-Status` response header (RFC 9211) on every answer of a cache
//! route, beside `X-Cache`: what the outcome says by itself ([`base`], one
//! table row per [`CacheOutcome`]) plus the facts only the stage that
//! answered knows ([`Facts`]: why a request went forward, the status the
//! service answered, the remaining freshness, whether the answer was
//! stored, whether the request joined another's fill). The mapping is the
//! table in docs/caching.md#cache-status.

use super::entry::Entry;
use super::publish;
use crate::outcome::CacheOutcome;
use http::HeaderValue;

/// The response header's name.
pub(crate) static CACHE_STATUS: http::HeaderName = http::HeaderName::from_static("cache-status");

/// Why the request went forward (RFC 9211 §2.2), for the values sidecache
/// can tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fwd {
    /// The route does not take this request from the cache.
    Bypass,
    /// No entry for this URI (the key has no other variant dimension).
    UriMiss,
    /// An entry of the URI exists, but not for this request's variant.
    VaryMiss,
    /// No usable entry; uri-miss or vary-miss, which one is not known.
    Miss,
    /// The entry was stale: a refill or a revalidation.
    Stale,
}

impl Fwd {
    fn as_str(self) -> &'static str {
        match self {
            Fwd::Bypass => "bypass",
            Fwd::UriMiss => "uri-miss",
            Fwd::VaryMiss => "vary-miss",
            Fwd::Miss => "miss",
            Fwd::Stale => "stale",
        }
    }
}

/// What an outcome says by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Base {
    /// Answered from the cache without going forward.
    pub hit: bool,
    pub fwd: Option<Fwd>,
    /// `detail`, a token.
    pub detail: Option<&'static str>,
}

/// The mapping table (docs/caching.md#cache-status): one row per outcome.
pub(crate) const fn base(outcome: CacheOutcome) -> Base {
    const fn row(hit: bool, fwd: Option<Fwd>, detail: Option<&'static str>) -> Base {
        Base { hit, fwd, detail }
    }
    match outcome {
        CacheOutcome::Hit => row(true, None, None),
        CacheOutcome::Negative => row(true, None, Some("negative")),
        // Within grace: served at once, the refresh runs in the background.
        CacheOutcome::Stale => row(true, None, Some("stale")),
        CacheOutcome::Miss => row(false, Some(Fwd::UriMiss), None),
        CacheOutcome::Bloom => row(false, None, Some("bloom-absent")),
        CacheOutcome::Bypass => row(false, Some(Fwd::Bypass), None),
        CacheOutcome::Degraded => row(false, Some(Fwd::Miss), Some("store-unavailable")),
        // The cache chose not to handle it: its answers cannot be stored.
        CacheOutcome::Pass => row(false, Some(Fwd::Bypass), Some("hit-for-pass")),
    }
}

/// What the answering stage knows beyond the outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Replaces the outcome's `hit` and `fwd`: this request went forward
    /// for this reason (a refill of a stale entry, a vary miss), even when
    /// the outcome is STALE (stale-if-error after a failed refill).
    pub fwd: Option<Fwd>,
    /// The status the service answered the fill or the forwarded request.
    pub fwd_status: Option<u16>,
    /// Remaining freshness of the entry served or stored, in seconds;
    /// negative when stale.
    pub ttl: Option<i64>,
    /// The fill's answer was written to the store.
    pub stored: bool,
    /// This request joined a fill another request started.
    pub collapsed: bool,
    /// Replaces the outcome's `detail`.
    pub detail: Option<&'static str>,
}

impl Facts {
    /// An answer from `entry` without going forward: its freshness now.
    pub(crate) fn from_entry(entry: &Entry) -> Facts {
        Facts {
            ttl: Some(ttl_seconds(entry, publish::now_ms())),
            ..Facts::default()
        }
    }
}

/// `entry`'s remaining freshness at `now_ms` in whole seconds, rounded
/// towards zero; negative once expired.
pub(crate) fn ttl_seconds(entry: &Entry, now_ms: u64) -> i64 {
    let (until, now) = (entry.fresh_until_ms as i128, now_ms as i128);
    ((until - now) / 1000).clamp(i64::MIN.into(), i64::MAX.into()) as i64
}

/// The header for one answer of the cache named `name` (an sf-token,
/// checked at load), in the canonical serialization (RFC 8941 §4.1: no
/// space after `;`).
pub(crate) fn value(name: &str, outcome: CacheOutcome, facts: &Facts) -> HeaderValue {
    // Hits of one object within one second carry the same value: each
    // thread keeps the last one, so such a hit costs a compare and a
    // reference count instead of building the value (bench/README.md,
    // "Figures that were in code comments").
    thread_local! {
        static LAST: std::cell::RefCell<Option<(String, CacheOutcome, Facts, HeaderValue)>> =
            const { std::cell::RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((n, o, f, v)) if *o == outcome && f == facts && n == name => v.clone(),
        _ => {
            let v = build(name, outcome, facts);
            *last = Some((name.to_owned(), outcome, *facts, v.clone()));
            v
        }
    })
}

fn build(name: &str, outcome: CacheOutcome, facts: &Facts) -> HeaderValue {
    // Bytes with `itoa`: `fmt::Write` into a `String` and a second copy
    // cost a few hundred instructions more.
    let base = base(outcome);
    let mut v = Vec::with_capacity(name.len() + 64);
    let mut int = itoa::Buffer::new();
    v.extend_from_slice(name.as_bytes());
    match facts.fwd.or(base.fwd) {
        Some(fwd) => {
            v.extend_from_slice(b";fwd=");
            v.extend_from_slice(fwd.as_str().as_bytes());
            if let Some(status) = facts.fwd_status {
                v.extend_from_slice(b";fwd-status=");
                v.extend_from_slice(int.format(status).as_bytes());
            }
        }
        None if base.hit => v.extend_from_slice(b";hit"),
        None => {}
    }
    if let Some(ttl) = facts.ttl {
        v.extend_from_slice(b";ttl=");
        v.extend_from_slice(int.format(ttl).as_bytes());
    }
    if facts.stored {
        v.extend_from_slice(b";stored");
    }
    if facts.collapsed {
        v.extend_from_slice(b";collapsed");
    }
    if let Some(detail) = facts.detail.or(base.detail) {
        v.extend_from_slice(b";detail=");
        v.extend_from_slice(detail.as_bytes());
    }
    // Made only of the name (a token), tokens and integers.
    HeaderValue::from_maybe_shared(bytes::Bytes::from(v))
        .unwrap_or_else(|_| HeaderValue::from_static("sidecache"))
}

/// Whether `name` can be the cache's name: an sf-token (RFC 8941 §3.3.4).
pub(crate) fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '*');
    first_ok && chars.all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~:/".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every outcome's row. A new outcome is one line here and one in
    /// [`base`] (the match there is exhaustive).
    #[test]
    fn every_outcome_maps_to_its_row() {
        let table = [
            (CacheOutcome::Hit, "sidecache;hit"),
            (CacheOutcome::Negative, "sidecache;hit;detail=negative"),
            (CacheOutcome::Stale, "sidecache;hit;detail=stale"),
            (CacheOutcome::Miss, "sidecache;fwd=uri-miss"),
            (CacheOutcome::Bloom, "sidecache;detail=bloom-absent"),
            (CacheOutcome::Bypass, "sidecache;fwd=bypass"),
            (
                CacheOutcome::Degraded,
                "sidecache;fwd=miss;detail=store-unavailable",
            ),
            (
                CacheOutcome::Pass,
                "sidecache;fwd=bypass;detail=hit-for-pass",
            ),
        ];
        assert_eq!(table.len(), CacheOutcome::COUNT, "a row per outcome");
        for (outcome, expected) in table {
            let v = value("sidecache", outcome, &Facts::default());
            assert_eq!(v.to_str().expect("ascii"), expected, "{outcome:?}");
        }
    }

    #[test]
    fn facts_add_parameters_in_rfc_order() {
        let facts = Facts {
            fwd: Some(Fwd::Stale),
            fwd_status: Some(304),
            ttl: Some(60),
            stored: true,
            collapsed: true,
            detail: None,
        };
        let v = value("edge-1", CacheOutcome::Miss, &facts);
        assert_eq!(
            v.to_str().expect("ascii"),
            "edge-1;fwd=stale;fwd-status=304;ttl=60;stored;collapsed"
        );
        // A stale hit has a negative ttl; a failed refill answered stale
        // went forward.
        let stale = Facts {
            ttl: Some(-3),
            ..Facts::default()
        };
        let v = value("sidecache", CacheOutcome::Stale, &stale);
        assert_eq!(
            v.to_str().expect("ascii"),
            "sidecache;hit;ttl=-3;detail=stale"
        );
        let after_error = Facts {
            fwd: Some(Fwd::Stale),
            fwd_status: Some(503),
            ttl: Some(-3),
            detail: Some("stale-if-error"),
            ..Facts::default()
        };
        let v = value("sidecache", CacheOutcome::Stale, &after_error);
        assert_eq!(
            v.to_str().expect("ascii"),
            "sidecache;fwd=stale;fwd-status=503;ttl=-3;detail=stale-if-error"
        );
    }

    #[test]
    fn values_are_structured_field_lists() {
        use sfv::{FieldType, List, Parser as SfParser};
        let facts = Facts {
            fwd: Some(Fwd::VaryMiss),
            fwd_status: Some(200),
            ttl: Some(-1),
            stored: true,
            collapsed: true,
            detail: Some("stale-if-error"),
        };
        let v = value("cdn/edge:1", CacheOutcome::Miss, &facts);
        let list: List = SfParser::new(v.to_str().expect("ascii"))
            .parse()
            .expect("an sf-list");
        assert_eq!(list.len(), 1);
        assert_eq!(
            list.serialize().expect("serializes"),
            v.to_str().expect("ascii")
        );
    }

    #[test]
    fn names_must_be_tokens() {
        for ok in ["sidecache", "edge-1", "cdn/edge:1", "*x", "A.b_c"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "1cache", "two words", "a;b", "a,b", "\"q\"", "ünï"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}

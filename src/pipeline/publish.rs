//! Stage 8: decide whether an upstream answer may be cached, build the
//! entry stamped with the generation ticket, and publish it with the
//! publish script (which re-checks lease owner and generation atomically).

use super::cache_control::{
    judge_vary, learned_vary_of, CacheControl, OriginFreshness, VaryVerdict, ZeroLifetime,
};
use super::entry::Entry;
use crate::config::{OriginCacheControl, Route, Ttl};
use crate::keys::CacheKey;
use crate::proxy::headers::strip_hop_by_hop;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use rand::Rng;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why an answer is or is not cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cacheability {
    Positive,
    Negative,
    /// Not stored, for this reason.
    Uncacheable(Uncacheable),
}

/// Why an answer is not stored: the `reason` label of
/// `sidecache_uncacheable_total` (a handful of values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Uncacheable {
    /// Status not listed in `cache_status` / `negative_status`.
    Status,
    /// `Set-Cookie`: the answer carries one client's session.
    SetCookie,
    /// `Cache-Control: private`.
    Private,
    /// `Cache-Control: no-store`.
    NoStore,
    /// `Cache-Control: no-cache` without validators to revalidate it with.
    NoCache,
    /// `max-age=0` without `s-maxage` (and no validators).
    MaxAgeZero,
    /// `s-maxage=0` (wins over any `max-age` in a shared cache; and no
    /// validators).
    SMaxAgeZero,
    /// `Vary: *`.
    VaryStar,
    /// `Vary` names a header the route's key does not include.
    VaryUnkeyed,
    /// `ttl: origin`: the lifetime the answer gives itself is already used
    /// up (`Expires` not after `Date`, `Age` at least the lifetime).
    Expired,
    /// `ttl: origin` without `default_ttl`: the answer gives no lifetime.
    NoLifetime,
    /// `tags_from`: more tags than allowed, or a malformed one.
    Tags,
}

impl Uncacheable {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Uncacheable::Status => "status",
            Uncacheable::SetCookie => "set_cookie",
            Uncacheable::Private => "private",
            Uncacheable::NoStore => "no_store",
            Uncacheable::NoCache => "no_cache",
            Uncacheable::MaxAgeZero => "max_age_0",
            Uncacheable::SMaxAgeZero => "s_maxage_0",
            Uncacheable::VaryStar => "vary_star",
            Uncacheable::VaryUnkeyed => "vary_unkeyed",
            Uncacheable::Expired => "expired",
            Uncacheable::NoLifetime => "no_lifetime",
            Uncacheable::Tags => "tags",
        }
    }
}

impl Cacheability {
    /// May coalesced requests for the same key receive this answer? Only
    /// if it is cacheable, merely has an unlisted status (an upstream
    /// error is the same for all of them) or gives no lifetime to store it
    /// for (`ttl: origin`). An answer the origin refused to let us share is
    /// for the request whose fill fetched it; the others fetch their own.
    pub(crate) fn is_shareable(self) -> bool {
        matches!(
            self,
            Cacheability::Positive
                | Cacheability::Negative
                | Cacheability::Uncacheable(
                    Uncacheable::Status
                        | Uncacheable::Expired
                        | Uncacheable::NoLifetime
                        | Uncacheable::Tags
                )
        )
    }
}

/// What became of one fill's answer: the `outcome` label of
/// `sidecache_publish_total`, one string per value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FillOutcome {
    /// Written under our lease and ticket.
    Published,
    /// The generation moved since the ticket (an invalidation won the race).
    Rejected,
    /// The lease expired or was taken over before the publish (a fill
    /// slower than its lease whose renewal failed).
    LeaseLost,
    /// The store failed the publish; the answer was still returned.
    WriteFailure,
    /// Not storable (see [`Uncacheable`]).
    Uncacheable,
    /// Larger than `fill.max_body`: streamed through to one client.
    TooLarge,
    /// `version_from`: the answer is older than the object's floor (a
    /// lagging replica behind the service); served, not stored.
    BelowFloor,
    /// `tags_from`: the answer carries a tag the fill took no ticket for
    /// before its upstream call; served, not stored, the tags remembered
    /// for the next fill.
    TagsUnticketed,
}

impl FillOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FillOutcome::Published => "published",
            FillOutcome::Rejected => "publish_rejected",
            FillOutcome::LeaseLost => "lease_lost",
            FillOutcome::WriteFailure => "write_failure",
            FillOutcome::Uncacheable => "uncacheable",
            FillOutcome::TooLarge => "too_large",
            FillOutcome::BelowFloor => "below_floor",
            FillOutcome::TagsUnticketed => "tags_unticketed",
        }
    }
}

/// Stage 8's verdict on an upstream answer. `Set-Cookie`, `private` and
/// `no-store` always keep it out (docs/caching.md#origin-refusals); with
/// `origin_cache_control: honor` so do `no-cache`, a zero shared freshness
/// lifetime and a `Vary` beyond the route's key; with `ttl: origin` also a
/// lifetime already spent, or none without a `default_ttl`.
/// `cc` is `headers`' `Cache-Control`, parsed once per answer.
pub(crate) fn cacheability(
    route: &Route,
    status: StatusCode,
    headers: &HeaderMap,
    cc: &CacheControl,
) -> Cacheability {
    use Cacheability::Uncacheable as No;
    if headers.contains_key(header::SET_COOKIE) {
        return No(Uncacheable::SetCookie);
    }
    if cc.private {
        return No(Uncacheable::Private);
    }
    if cc.no_store {
        return No(Uncacheable::NoStore);
    }
    let code = status.as_u16();
    let kind = if route.cache_status.contains(&code) {
        Cacheability::Positive
    } else if route.negative_status.contains(&code) {
        Cacheability::Negative
    } else if route.fresh_any_status
        && !matches!(code, 206 | 304)
        && matches!(
            cc.freshness(headers, SystemTime::now()),
            OriginFreshness::Fresh(_)
        )
    {
        // RFC 9111 §3: explicit freshness makes any final status storable.
        Cacheability::Positive
    } else {
        return No(Uncacheable::Status);
    };
    if route.origin_cache_control == OriginCacheControl::Ignore {
        return kind;
    }
    let origin = match route.ttl {
        Ttl::Origin { default, .. } => Some((cc.freshness(headers, SystemTime::now()), default)),
        Ttl::Fixed(_) => None,
    };
    let refusal = match (cc.no_cache, cc.zero_lifetime(), origin) {
        (true, ..) => Some(Uncacheable::NoCache),
        (_, Some(ZeroLifetime::SMaxAge), _) => Some(Uncacheable::SMaxAgeZero),
        (_, Some(ZeroLifetime::MaxAge), _) => Some(Uncacheable::MaxAgeZero),
        (_, _, Some((OriginFreshness::Spent, _))) => Some(Uncacheable::Expired),
        (_, _, Some((OriginFreshness::Unspecified, default)))
            if kind == Cacheability::Positive && default.is_zero() =>
        {
            Some(Uncacheable::NoLifetime)
        }
        _ => None,
    };
    // Each of these leaves nothing to reuse without asking the origin: the
    // answer is worth storing only if it can be asked about (validators,
    // and the route keeps expired entries). It is then stored expired
    // ([`lifetime`]) and every use revalidates it.
    let revalidatable = !route.keep.is_zero() && super::revalidate::has_validators(headers);
    if let Some(reason) = refusal.filter(|_| !revalidatable) {
        return No(reason);
    }
    // `vary_from_origin`: the names beyond `vary` become the object's key
    // (the fill stage stores it under them), within the route's bound.
    let verdict = match route.origin_vary {
        None => judge_vary(headers, &route.vary),
        Some(bounds) => match learned_vary_of(headers, &route.vary, bounds.max_headers) {
            Ok(_) => VaryVerdict::Keyed,
            Err(refused) => refused,
        },
    };
    match verdict {
        VaryVerdict::Keyed => kind,
        VaryVerdict::Star => No(Uncacheable::VaryStar),
        VaryVerdict::Unkeyed => No(Uncacheable::VaryUnkeyed),
    }
}

/// The directives stage 8 decides by: the answer's `CDN-Cache-Control`
/// where the route reads it (`cdn_cache_control: true`) and it is valid,
/// else its `Cache-Control`. Parsed once per answer.
pub(crate) fn directives(route: &Route, headers: &HeaderMap) -> CacheControl {
    route
        .cdn_cache_control
        .then(|| super::cache_control::targeted(headers))
        .flatten()
        .unwrap_or_else(|| CacheControl::parse(headers))
}

/// How long one entry is fresh and how long it may be served stale or
/// revalidated after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lifetime {
    pub fresh: Duration,
    pub grace: Duration,
    pub stale_if_error: Duration,
    /// The route's `keep` if the answer has validators, else zero.
    pub keep: Duration,
}

impl Lifetime {
    /// What the store keeps it for: its fresh life plus the widest of the
    /// stale windows and `keep`.
    pub(crate) fn store_ttl(&self) -> Duration {
        self.fresh + self.grace.max(self.stale_if_error).max(self.keep)
    }
}

/// The entry's lifetime: [`entry_ttl`] fresh (zero for an answer that must
/// be revalidated before each use: `no-cache`, a zero shared lifetime),
/// then the route's stale windows as narrowed (never widened) by the
/// origin's `Cache-Control`, and `keep` for an answer with validators.
/// The store keeps the entry for [`Lifetime::store_ttl`], so a short
/// per-answer freshness (`ttl: origin`) also shortens its stay.
pub(crate) fn lifetime(
    route: &Route,
    kind: Cacheability,
    headers: &HeaderMap,
    cc: &CacheControl,
) -> Lifetime {
    let origin = match route.ttl {
        Ttl::Fixed(_) => OriginFreshness::Unspecified,
        Ttl::Origin { .. } => cc.freshness(headers, SystemTime::now()),
    };
    let honor = route.origin_cache_control == OriginCacheControl::Honor;
    let revalidate_always = honor && (cc.no_cache || cc.zero_lifetime().is_some());
    let has_validators = super::revalidate::has_validators(headers);
    Lifetime {
        fresh: if revalidate_always {
            Duration::ZERO
        } else {
            entry_ttl(route, kind, origin)
        },
        grace: grace(route, cc),
        stale_if_error: cc.narrow(route.stale_if_error, cc.stale_if_error),
        keep: if has_validators {
            route.keep
        } else {
            Duration::ZERO
        },
    }
}

/// The grace window: the route's `grace`, narrowed by the origin's
/// `stale-while-revalidate`; with `ttl: origin` that directive may also
/// open a window up to the route's `max_grace` (RFC 5861). `no-cache`,
/// `must-revalidate` and `proxy-revalidate` close both. Either way it is
/// a window for entries of the current generation only (stage 3).
fn grace(route: &Route, cc: &CacheControl) -> Duration {
    let narrowed = cc.narrow(route.grace, cc.stale_while_revalidate);
    match (route.ttl, cc.stale_while_revalidate) {
        (Ttl::Origin { .. }, Some(secs)) => narrowed.max(cc.narrow(route.max_grace, Some(secs))),
        _ => narrowed,
    }
}

/// How long an entry is fresh.
///
/// `ttl: 60s`: positive TTL = ttl + uniform[0, jitter], so entries filled
/// together do not expire together (avalanche); negative answers use
/// `negative_ttl`.
///
/// `ttl: origin` (`origin` is what the answer says, see
/// [`CacheControl::freshness`]): positive = the origin's lifetime, else
/// `default_ttl`, at most `max_ttl`; negative = the origin's lifetime, else
/// `negative_ttl`, at most `negative_ttl`. Jitter is taken off, never
/// added (the origin's lifetime is a limit), and at most a tenth of the
/// lifetime, so a short lifetime keeps its meaning.
pub(crate) fn entry_ttl(route: &Route, kind: Cacheability, origin: OriginFreshness) -> Duration {
    let given = match origin {
        OriginFreshness::Fresh(d) => Some(d),
        OriginFreshness::Spent => Some(Duration::ZERO),
        OriginFreshness::Unspecified => None,
    };
    match (route.ttl, kind) {
        (Ttl::Fixed(_), Cacheability::Negative) => route.negative_ttl,
        (Ttl::Fixed(ttl), _) => ttl + jitter(route.jitter),
        (Ttl::Origin { .. }, Cacheability::Negative) => {
            given.unwrap_or(route.negative_ttl).min(route.negative_ttl)
        }
        (Ttl::Origin { max, default }, _) => {
            let fresh = given.unwrap_or(default).min(max);
            fresh.saturating_sub(jitter(route.jitter.min(fresh / 10)))
        }
    }
}

/// uniform[0, max], in milliseconds.
fn jitter(max: Duration) -> Duration {
    let max_ms = max.as_millis() as u64;
    if max_ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(rand::rng().random_range(0..=max_ms))
}

/// Response headers worth replaying from the cache: no hop-by-hop headers,
/// no `Set-Cookie`, no framing (recomputed), no `Age` or `X-Cache` (ours).
pub(crate) fn replayable_headers(mut headers: HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    strip_hop_by_hop(&mut headers);
    for h in [header::SET_COOKIE, header::CONTENT_LENGTH, header::AGE] {
        headers.remove(h);
    }
    headers.remove(&crate::outcome::X_CACHE);
    let mut out = Vec::with_capacity(headers.len());
    let mut last: Option<HeaderName> = None;
    for (name, value) in headers {
        // `HeaderMap`'s owned iterator yields the name only for its first value.
        if let Some(n) = name {
            last = Some(n);
        }
        if let Some(n) = &last {
            out.push((n.clone(), value));
        }
    }
    out
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The entry for an upstream answer, stamped with `generation`. Its
/// `stored_at_ms` is back-dated by the origin's `Age`, so the `Age` a cached
/// answer carries counts the time upstream caches held it too (RFC 9111
/// §4.2.3); freshness counts from now (`life`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn build_entry(
    key: &CacheKey,
    generation: Bytes,
    kind: Cacheability,
    life: Lifetime,
    origin_age: Duration,
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
) -> Entry {
    let now = now_ms();
    let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
    Entry {
        status: status.as_u16(),
        negative: kind == Cacheability::Negative,
        stored_at_ms: now.saturating_sub(origin_age.as_millis() as u64),
        fresh_until_ms: now.saturating_add(life.fresh.as_millis() as u64),
        grace_ms: ms(life.grace),
        stale_if_error_ms: ms(life.stale_if_error),
        generation,
        identity: Bytes::copy_from_slice(key.identity.as_bytes()),
        variant: Bytes::copy_from_slice(key.variant.as_bytes()),
        headers,
        body,
        tags: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> std::sync::Arc<Route> {
        crate::config::testing::route(
            r#"  - { name: app, path: "/a/{id}", params: { id: "[0-9]+" }, ttl: 10s, jitter: 2s, negative_ttl: 3s }
"#,
        )
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    /// [`cacheability`] of an answer with `status` and `pairs`.
    fn judged(r: &Route, status: u16, pairs: &[(&'static str, &'static str)]) -> Cacheability {
        let h = headers(pairs);
        let status = StatusCode::from_u16(status).expect("status");
        cacheability(r, status, &h, &CacheControl::parse(&h))
    }

    #[test]
    fn what_is_cached() {
        use Cacheability::Uncacheable as No;
        let r = route();
        let c = |s: u16, h: &[(&'static str, &'static str)]| judged(&r, s, h);
        assert_eq!(c(200, &[]), Cacheability::Positive);
        assert_eq!(c(404, &[]), Cacheability::Negative);
        assert_eq!(c(500, &[]), No(Uncacheable::Status));
        assert_eq!(c(200, &[("set-cookie", "s=1")]), No(Uncacheable::SetCookie));
        assert_eq!(
            c(200, &[("cache-control", "max-age=5, Private")]),
            No(Uncacheable::Private)
        );
        assert_eq!(
            c(200, &[("cache-control", "no-store")]),
            No(Uncacheable::NoStore)
        );
        assert_eq!(
            c(404, &[("cache-control", "public, no-store")]),
            No(Uncacheable::NoStore)
        );
        assert_eq!(
            c(200, &[("cache-control", "max-age=60")]),
            Cacheability::Positive
        );
        assert_eq!(
            c(200, &[("cache-control", "no-cache")]),
            No(Uncacheable::NoCache)
        );
        assert_eq!(
            c(200, &[("cache-control", "max-age=0")]),
            No(Uncacheable::MaxAgeZero)
        );
        assert_eq!(
            c(200, &[("cache-control", "max-age=60, s-maxage=0")]),
            No(Uncacheable::SMaxAgeZero)
        );
        assert_eq!(
            c(200, &[("cache-control", "max-age=0, s-maxage=30")]),
            Cacheability::Positive
        );
        assert_eq!(c(200, &[("vary", "*")]), No(Uncacheable::VaryStar));
        assert_eq!(c(404, &[("vary", "X-User")]), No(Uncacheable::VaryUnkeyed));
        // Only an unlisted status may be shared with coalesced requests.
        assert!(No(Uncacheable::Status).is_shareable());
        for refused in [
            Uncacheable::SetCookie,
            Uncacheable::Private,
            Uncacheable::NoStore,
            Uncacheable::NoCache,
            Uncacheable::VaryUnkeyed,
        ] {
            assert!(!No(refused).is_shareable(), "{refused:?}");
        }
    }

    #[test]
    fn answers_to_revalidate_on_every_use_are_stored_expired_with_validators() {
        use Cacheability::Uncacheable as No;
        let s = Duration::from_secs;
        let r = route();
        let origin = origin_route("");
        let no_keep = origin_route(", keep: 0s");
        let etag = ("etag", "\"v1\"");
        let lm = ("last-modified", "Wed, 01 Jan 2020 00:00:00 GMT");
        for (route, pairs, without) in [
            (
                &r,
                [("cache-control", "no-cache"), etag],
                Uncacheable::NoCache,
            ),
            (
                &r,
                [("cache-control", "max-age=0"), lm],
                Uncacheable::MaxAgeZero,
            ),
            (
                &origin,
                [("cache-control", "s-maxage=0"), etag],
                Uncacheable::SMaxAgeZero,
            ),
            (&origin, [("expires", "0"), etag], Uncacheable::Expired),
            (&origin, [("x-other", "1"), lm], Uncacheable::NoLifetime),
        ] {
            assert_eq!(
                judged(route, 200, &pairs),
                Cacheability::Positive,
                "{pairs:?}"
            );
            let h = headers(&pairs);
            let cc = CacheControl::parse(&h);
            let life = lifetime(route, Cacheability::Positive, &h, &cc);
            assert_eq!(
                (life.fresh, life.store_ttl()),
                (Duration::ZERO, s(60)),
                "{pairs:?}"
            );
            // Without validators, or without `keep`, nothing to revalidate.
            assert_eq!(judged(route, 200, &pairs[..1]), No(without), "{pairs:?}");
            assert_eq!(judged(&no_keep, 200, &pairs), No(without), "{pairs:?}");
        }
        // A fresh answer with validators is kept `keep` past its freshness.
        let h = headers(&[("cache-control", "max-age=5"), etag]);
        let life = lifetime(
            &origin,
            Cacheability::Positive,
            &h,
            &CacheControl::parse(&h),
        );
        assert_eq!(life.store_ttl(), life.fresh + s(60));
        let h = headers(&[("cache-control", "max-age=5")]);
        let life = lifetime(
            &origin,
            Cacheability::Positive,
            &h,
            &CacheControl::parse(&h),
        );
        assert_eq!(life.store_ttl(), life.fresh);
    }

    #[test]
    fn ignore_keeps_only_the_privacy_refusals() {
        use Cacheability::Uncacheable as No;
        let r = crate::config::testing::route(
            r#"  - { name: app, path: "/a/{id}", params: { id: "[0-9]+" }, ttl: 10s, origin_cache_control: ignore }
"#,
        );
        let c = |h: &[(&'static str, &'static str)]| judged(&r, 200, h);
        assert_eq!(
            c(&[
                ("cache-control", "no-cache, max-age=0, s-maxage=0"),
                ("vary", "*")
            ]),
            Cacheability::Positive
        );
        assert_eq!(
            c(&[("cache-control", "no-store")]),
            No(Uncacheable::NoStore)
        );
        assert_eq!(c(&[("cache-control", "private")]), No(Uncacheable::Private));
        assert_eq!(c(&[("set-cookie", "a=1")]), No(Uncacheable::SetCookie));
    }

    #[test]
    fn ttl_jitter_stays_in_range() {
        let r = route();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let t = entry_ttl(&r, Cacheability::Positive, OriginFreshness::Unspecified);
            assert!(
                t >= Duration::from_secs(10) && t <= Duration::from_secs(12),
                "{t:?}"
            );
            seen.insert(t);
        }
        assert!(seen.len() > 10, "jitter should spread TTLs");
        assert_eq!(
            entry_ttl(&r, Cacheability::Negative, OriginFreshness::Unspecified),
            Duration::from_secs(3)
        );
        // A fixed ttl ignores what the origin says.
        let long = OriginFreshness::Fresh(Duration::from_secs(3600));
        assert!(entry_ttl(&r, Cacheability::Positive, long) <= Duration::from_secs(12));
    }

    fn origin_route(keys: &str) -> std::sync::Arc<Route> {
        crate::config::testing::route(&format!(
            "  - {{ name: app, path: \"/a/{{id}}\", params: {{ id: \"[0-9]+\" }}, ttl: origin, max_ttl: 60s, negative_ttl: 3s{keys} }}\n"
        ))
    }

    #[test]
    fn origin_ttl_is_capped_defaulted_and_only_shortened_by_jitter() {
        use OriginFreshness::*;
        let s = Duration::from_secs;
        let r = origin_route(", default_ttl: 10s");
        let pos = |o| entry_ttl(&r, Cacheability::Positive, o);
        let neg = |o| entry_ttl(&r, Cacheability::Negative, o);
        assert_eq!(pos(Fresh(s(2))), s(2));
        assert_eq!(pos(Fresh(s(3600))), s(60), "capped by max_ttl");
        assert_eq!(pos(Unspecified), s(10), "default_ttl");
        assert_eq!(neg(Fresh(s(3600))), s(3), "capped by negative_ttl");
        assert_eq!(neg(Fresh(s(1))), s(1));
        assert_eq!(neg(Unspecified), s(3));
        let jittered = origin_route(", jitter: 30s");
        for _ in 0..200 {
            let t = entry_ttl(&jittered, Cacheability::Positive, Fresh(s(20)));
            assert!(t >= s(18) && t <= s(20), "{t:?}");
        }
    }

    #[test]
    fn stale_while_revalidate_opens_grace_up_to_max_grace_with_origin_ttl() {
        let s = Duration::from_secs;
        let grace_of = |r: &Route, cc: &'static str| {
            let h = headers(&[("cache-control", cc)]);
            lifetime(r, Cacheability::Positive, &h, &CacheControl::parse(&h)).grace
        };
        let capped = origin_route(", max_grace: 10s");
        assert_eq!(
            grace_of(&capped, "max-age=1, stale-while-revalidate=4"),
            s(4)
        );
        assert_eq!(
            grace_of(&capped, "max-age=1, stale-while-revalidate=99"),
            s(10)
        );
        assert_eq!(
            grace_of(&capped, "max-age=1"),
            s(0),
            "no directive, no window"
        );
        assert_eq!(
            grace_of(
                &capped,
                "max-age=1, stale-while-revalidate=4, must-revalidate"
            ),
            s(0)
        );
        // By default the directive opens a window of up to a minute;
        // `max_grace: 0s` turns that off, and it only narrows `grace`.
        assert_eq!(
            grace_of(&origin_route(""), "max-age=1, stale-while-revalidate=4"),
            s(4)
        );
        assert_eq!(
            grace_of(&origin_route(""), "max-age=1, stale-while-revalidate=99"),
            s(60)
        );
        assert_eq!(
            grace_of(
                &origin_route(", max_grace: 0s"),
                "max-age=1, stale-while-revalidate=4"
            ),
            s(0)
        );
        let both = origin_route(", grace: 3s, max_grace: 2s");
        assert_eq!(grace_of(&both, "max-age=1, stale-while-revalidate=9"), s(3));
        assert_eq!(grace_of(&both, "max-age=1, stale-while-revalidate=1"), s(1));
    }

    #[test]
    fn origin_ttl_stores_the_statuses_a_shared_cache_may() {
        use Cacheability::Uncacheable as No;
        let c = judged;
        let fresh = [("cache-control", "max-age=5")];
        let r = origin_route("");
        // RFC 9110 §15.1's heuristically cacheable statuses, with explicit
        // freshness; 404 stays negative (`negative_status`).
        for code in [200, 203, 204, 300, 301, 308, 405, 410, 414, 501] {
            assert_eq!(c(&r, code, &fresh), Cacheability::Positive, "{code}");
            assert_eq!(c(&r, code, &[]), No(Uncacheable::NoLifetime), "{code}");
        }
        assert_eq!(c(&r, 404, &fresh), Cacheability::Negative);
        // Any other final status only with explicit freshness.
        for code in [302, 307, 400, 403, 500, 503] {
            assert_eq!(c(&r, code, &fresh), Cacheability::Positive, "{code}");
            assert_eq!(c(&r, code, &[]), No(Uncacheable::Status), "{code}");
        }
        let expires = [("expires", "Thu, 01 Jan 2099 00:00:00 GMT")];
        assert_eq!(c(&r, 302, &expires), Cacheability::Positive);
        // Partial and not-modified answers are never entries.
        assert_eq!(c(&r, 206, &fresh), No(Uncacheable::Status));
        assert_eq!(c(&r, 304, &fresh), No(Uncacheable::Status));
        // A route that lists its statuses keeps to them.
        let listed = origin_route(", cache_status: [200]");
        assert_eq!(c(&listed, 301, &fresh), No(Uncacheable::Status));
        assert_eq!(c(&listed, 500, &fresh), No(Uncacheable::Status));
        // Fixed TTLs keep the old default, `[200]`.
        assert_eq!(c(&route(), 301, &fresh), No(Uncacheable::Status));
    }

    #[test]
    fn origin_ttl_refuses_spent_and_missing_lifetimes() {
        use Cacheability::Uncacheable as No;
        let c = judged;
        let r = origin_route("");
        assert_eq!(c(&r, 200, &[]), No(Uncacheable::NoLifetime));
        assert_eq!(
            c(&r, 404, &[]),
            Cacheability::Negative,
            "negative_ttl applies"
        );
        assert_eq!(
            c(&r, 200, &[("cache-control", "max-age=5")]),
            Cacheability::Positive
        );
        assert_eq!(
            c(&r, 200, &[("cache-control", "max-age=0")]),
            No(Uncacheable::MaxAgeZero)
        );
        assert_eq!(
            c(&r, 200, &[("cache-control", "max-age=5"), ("age", "9")]),
            No(Uncacheable::Expired)
        );
        assert_eq!(c(&r, 200, &[("expires", "0")]), No(Uncacheable::Expired));
        assert_eq!(
            c(&r, 200, &[("cache-control", "max-age=5, private")]),
            No(Uncacheable::Private)
        );
        assert_eq!(
            c(&r, 200, &[("cache-control", "max-age=5, no-store")]),
            No(Uncacheable::NoStore)
        );
        let with_default = origin_route(", default_ttl: 5s");
        assert_eq!(c(&with_default, 200, &[]), Cacheability::Positive);
        assert!(No(Uncacheable::NoLifetime).is_shareable());
        assert!(No(Uncacheable::Expired).is_shareable());
    }

    #[test]
    fn replayed_headers_drop_cookies_and_framing() {
        let h = headers(&[
            ("content-type", "application/json"),
            ("set-cookie", "a=1"),
            ("connection", "x-private"),
            ("x-private", "1"),
            ("content-length", "9"),
            ("vary", "accept"),
        ]);
        let mut h = h;
        h.append("vary", HeaderValue::from_static("accept-language"));
        let kept = replayable_headers(h);
        let names: Vec<&str> = kept.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type", "vary", "vary"]);
    }
}

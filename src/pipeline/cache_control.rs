//! The origin's own say on caching (RFC 9111 §5.2.2, §4.1, §4.2.1): the
//! `Cache-Control` directives a shared cache must honour, the freshness
//! lifetime an answer gives itself (for `ttl: origin`), and `Vary`.
//!
//! Parsing follows RFC 9110 §5.6: a header may come as several lines, each a
//! comma-separated list; directive names are case-insensitive; a value is a
//! token or a quoted-string (which may itself contain commas and escaped
//! quotes). Anything this parser cannot read is resolved towards not
//! caching: an unparseable `max-age` counts as 0 (RFC 9111 §4.2.1 calls such
//! a response stale), a repeated `max-age` takes its smallest value.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use std::time::{Duration, SystemTime};

/// The directives of a response that decide whether a shared cache may
/// store it. Absent directives are `false` / `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CacheControl {
    pub no_store: bool,
    /// `no-cache`, qualified (`no-cache="field"`) or not: both mean
    /// "revalidate before every reuse" here (the field list is not kept).
    pub no_cache: bool,
    /// `private`, qualified or not (same reasoning).
    pub private: bool,
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    /// `must-revalidate` or `proxy-revalidate`: never serve it expired.
    pub must_revalidate: bool,
    /// RFC 5861 `stale-while-revalidate=N` (seconds; smallest if repeated).
    pub stale_while_revalidate: Option<u64>,
    /// RFC 5861 `stale-if-error=N` (seconds; smallest if repeated).
    pub stale_if_error: Option<u64>,
}

impl CacheControl {
    /// Parses every `Cache-Control` line of `headers`.
    pub(crate) fn parse(headers: &HeaderMap) -> CacheControl {
        let mut cc = CacheControl::default();
        for line in headers.get_all(header::CACHE_CONTROL) {
            // Not visible ASCII (obs-text): unreadable, so the safe reading.
            let Ok(line) = line.to_str() else {
                cc.no_store = true;
                continue;
            };
            for (name, value) in directives(line) {
                cc.apply(name, value);
            }
        }
        cc
    }

    fn apply(&mut self, name: &str, value: Option<String>) {
        let seconds = || {
            value
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let min = |old: Option<u64>, new: u64| Some(old.map_or(new, |o| o.min(new)));
        if name.eq_ignore_ascii_case("no-store") {
            self.no_store = true;
        } else if name.eq_ignore_ascii_case("no-cache") {
            self.no_cache = true;
        } else if name.eq_ignore_ascii_case("private") {
            self.private = true;
        } else if name.eq_ignore_ascii_case("max-age") {
            self.max_age = min(self.max_age, seconds());
        } else if name.eq_ignore_ascii_case("s-maxage") {
            self.s_maxage = min(self.s_maxage, seconds());
        } else if name.eq_ignore_ascii_case("must-revalidate")
            || name.eq_ignore_ascii_case("proxy-revalidate")
        {
            self.must_revalidate = true;
        } else if name.eq_ignore_ascii_case("stale-while-revalidate") {
            self.stale_while_revalidate = min(self.stale_while_revalidate, seconds());
        } else if name.eq_ignore_ascii_case("stale-if-error") {
            self.stale_if_error = min(self.stale_if_error, seconds());
        }
    }

    /// Narrows a route's stale window by what the origin allows: the
    /// origin may shorten it (`limit`), never widen it; `no-cache`,
    /// `must-revalidate` and `proxy-revalidate` close it.
    pub(crate) fn narrow(&self, route_window: Duration, limit: Option<u64>) -> Duration {
        if self.no_cache || self.must_revalidate {
            return Duration::ZERO;
        }
        match limit {
            Some(secs) => route_window.min(Duration::from_secs(secs)),
            None => route_window,
        }
    }

    /// Which directive makes the freshness lifetime of a shared cache zero,
    /// if one does: `s-maxage` decides when present (RFC 9111 §5.2.2.10),
    /// else `max-age`.
    pub(crate) fn zero_lifetime(&self) -> Option<ZeroLifetime> {
        match (self.s_maxage, self.max_age) {
            (Some(0), _) => Some(ZeroLifetime::SMaxAge),
            (Some(_), _) => None,
            (None, Some(0)) => Some(ZeroLifetime::MaxAge),
            _ => None,
        }
    }

    /// The freshness the answer's own headers give it in a shared cache
    /// (RFC 9111 §4.2.1): `s-maxage`, else `max-age`, else `Expires` minus
    /// `Date` (minus `now` without a readable `Date`), less the `Age` it
    /// arrived with (§4.2.3). An unreadable `Expires` is in the past
    /// (§5.3). `now` is when the answer was received.
    pub(crate) fn freshness(&self, headers: &HeaderMap, now: SystemTime) -> OriginFreshness {
        let date = |name: header::HeaderName| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| httpdate::parse_http_date(v.trim()).ok())
        };
        let lifetime = if let Some(secs) = self.s_maxage.or(self.max_age) {
            Duration::from_secs(secs)
        } else if headers.contains_key(header::EXPIRES) {
            let Some(expires) = date(header::EXPIRES) else {
                return OriginFreshness::Spent;
            };
            let sent = date(header::DATE).unwrap_or(now);
            expires.duration_since(sent).unwrap_or(Duration::ZERO)
        } else {
            return OriginFreshness::Unspecified;
        };
        match lifetime.checked_sub(origin_age(headers)) {
            Some(left) if !left.is_zero() => OriginFreshness::Fresh(left),
            _ => OriginFreshness::Spent,
        }
    }
}

/// The field a cache may be targeted with instead of `Cache-Control`
/// (RFC 9213).
pub(crate) const CDN_CACHE_CONTROL: &str = "cdn-cache-control";

/// RFC 9213: the answer's `CDN-Cache-Control` as directives, if it has one
/// that is a valid Dictionary (RFC 9651; several lines are one field).
/// `None` when it is absent or invalid, including a known directive with
/// a value of the wrong type: then `Cache-Control` decides.
pub(crate) fn targeted(headers: &HeaderMap) -> Option<CacheControl> {
    let lines: Vec<&[u8]> = headers
        .get_all(CDN_CACHE_CONTROL)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    if lines.is_empty() {
        return None;
    }
    let field = lines.join(&b", "[..]);
    let dict: sfv::Dictionary = sfv::Parser::new(&field).parse().ok()?;
    let mut cc = CacheControl::default();
    for (name, member) in &dict {
        let sfv::ListEntry::Item(item) = member else {
            continue;
        };
        // A lifetime must be a non-negative integer, or the field is invalid.
        let seconds = || match &item.bare_item {
            sfv::BareItem::Integer(n) => u64::try_from(i64::from(*n)).ok(),
            _ => None,
        };
        match name.as_str() {
            "max-age" => cc.max_age = Some(seconds()?),
            "s-maxage" => cc.s_maxage = Some(seconds()?),
            "stale-while-revalidate" => cc.stale_while_revalidate = Some(seconds()?),
            "stale-if-error" => cc.stale_if_error = Some(seconds()?),
            // A qualified form (a string of field names) counts as the
            // whole directive, as in `Cache-Control`.
            "no-store" => cc.no_store = true,
            "no-cache" => cc.no_cache = true,
            "private" => cc.private = true,
            "must-revalidate" | "proxy-revalidate" => cc.must_revalidate = true,
            _ => {}
        }
    }
    Some(cc)
}

/// What an answer's headers say about its freshness (`ttl: origin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OriginFreshness {
    /// Fresh for this long after it was received.
    Fresh(Duration),
    /// A lifetime was given and is already used up (`Expires` at or before
    /// `Date` or unreadable, `Age` at least the lifetime, a zero `max-age`).
    Spent,
    /// No `s-maxage`, `max-age` or `Expires`.
    Unspecified,
}

/// The largest `Age` a cache transmits (RFC 9111 §5.1: 2^31 on overflow).
pub(crate) const MAX_AGE_SECONDS: u64 = 1 << 31;

/// The origin's `Age` (RFC 9111 §5.1): the first member of the first line,
/// non-negative decimal digits only, capped at 2^31 seconds; anything else
/// (negative, fractional, not a number) is ignored as if absent.
pub(crate) fn origin_age(headers: &HeaderMap) -> Duration {
    let first = headers
        .get(header::AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(str::trim)
        .unwrap_or("");
    if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
        return Duration::ZERO;
    }
    // Digits only: a parse failure can only be an overflow.
    let secs = first.parse::<u64>().unwrap_or(u64::MAX);
    Duration::from_secs(secs.min(MAX_AGE_SECONDS))
}

/// The directive that set a zero freshness lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ZeroLifetime {
    SMaxAge,
    MaxAge,
}

/// Splits one header line into `(name, value)` directives; quoted values
/// are unquoted (`\"` → `"`), anything after a closing quote up to the next
/// `,` is junk and dropped.
fn directives(line: &str) -> Vec<(&str, Option<String>)> {
    elements(line)
        .into_iter()
        .filter_map(|element| {
            let (name, value) = match element.split_once('=') {
                Some((name, value)) => (name.trim(), Some(unquote(value.trim()))),
                None => (element, None),
            };
            (!name.is_empty()).then_some((name, value))
        })
        .collect()
}

/// The elements of one comma-separated header line (RFC 9110 §5.6.1),
/// trimmed, split at commas outside quoted strings; empty ones skipped.
pub(crate) fn elements(line: &str) -> Vec<&str> {
    let bytes = line.as_bytes();
    let mut out = Vec::new();
    let (mut start, mut quoted, mut i) = (0, false, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b',' if !quoted => {
                out.push(line[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(line[start..].trim());
    out.retain(|e| !e.is_empty());
    out
}

/// A token as it is, or a quoted string's content (up to its closing
/// quote, escapes resolved).
fn unquote(value: &str) -> String {
    let Some(quoted) = value.strip_prefix('"') else {
        return value.to_owned();
    };
    let mut out = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => break,
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// What the response's `Vary` says about sharing it on this route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VaryVerdict {
    /// Every listed header is one the key includes (or there is no `Vary`).
    Keyed,
    /// `Vary: *`: the answer depends on more than the request's headers.
    Star,
    /// A header the route does not key on (or an unreadable `Vary`).
    Unkeyed,
}

/// Judges `Vary` against the route's key headers. `Accept-Encoding` outside
/// the key is accepted when the answer is not content-coded: a fill never
/// sends `Accept-Encoding` unless the route keys on it, so the origin chose
/// the identity coding, which every client accepts.
pub(crate) fn judge_vary(headers: &HeaderMap, keyed: &[HeaderName]) -> VaryVerdict {
    let mut verdict = VaryVerdict::Keyed;
    for line in headers.get_all(header::VARY) {
        let Ok(line) = line.to_str() else {
            return VaryVerdict::Unkeyed;
        };
        for name in line.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                return VaryVerdict::Star;
            }
            let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                verdict = VaryVerdict::Unkeyed;
                continue;
            };
            if keyed.contains(&name) {
                continue;
            }
            if name == header::ACCEPT_ENCODING && !content_coded(headers) {
                continue;
            }
            verdict = VaryVerdict::Unkeyed;
        }
    }
    verdict
}

/// `vary_from_origin`: the header names an answer varies on beyond the
/// route's `keyed` ones, sorted and deduplicated: what the object's
/// variants are keyed on and its fills carry from then on. `vary` are the
/// answer's `Vary` lines, `coded` whether it is content-coded
/// (`Accept-Encoding` is skipped on an uncoded answer, as in
/// [`judge_vary`]). `Err`: not storable: `Vary: *` ([`VaryVerdict::Star`]),
/// or ([`VaryVerdict::Unkeyed`]) an unreadable `Vary`, more than `max`
/// names, or a name a fill cannot carry for the key (`Host`, which fills
/// set themselves; hop-by-hop fields; conditionals and `Range`, which
/// would make a fill ask for a 304 or 206).
pub(crate) fn learned_vary<'a>(
    vary: impl Iterator<Item = &'a HeaderValue>,
    coded: bool,
    keyed: &[HeaderName],
    max: usize,
) -> Result<Vec<HeaderName>, VaryVerdict> {
    const UNCARRIABLE: &[&str] = &[
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "upgrade",
        "transfer-encoding",
        "content-length",
        "if-match",
        "if-none-match",
        "if-modified-since",
        "if-unmodified-since",
        "if-range",
        "range",
    ];
    let mut names: Vec<HeaderName> = Vec::new();
    for line in vary {
        let line = line.to_str().map_err(|_| VaryVerdict::Unkeyed)?;
        for name in line.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                return Err(VaryVerdict::Star);
            }
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| VaryVerdict::Unkeyed)?;
            if keyed.contains(&name) || names.contains(&name) {
                continue;
            }
            if name == header::ACCEPT_ENCODING && !coded {
                continue;
            }
            if UNCARRIABLE.contains(&name.as_str()) {
                return Err(VaryVerdict::Unkeyed);
            }
            // Bounded before it grows: a hostile origin cannot make this
            // list (and every key built from it) long.
            if names.len() == max {
                return Err(VaryVerdict::Unkeyed);
            }
            names.push(name);
        }
    }
    names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
    Ok(names)
}

/// [`learned_vary`] of an answer's headers.
pub(crate) fn learned_vary_of(
    headers: &HeaderMap,
    keyed: &[HeaderName],
    max: usize,
) -> Result<Vec<HeaderName>, VaryVerdict> {
    let vary = headers.get_all(header::VARY).iter();
    learned_vary(vary, content_coded(headers), keyed, max)
}

fn content_coded(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(lines: &[&'static str]) -> CacheControl {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(header::CACHE_CONTROL, HeaderValue::from_static(l));
        }
        CacheControl::parse(&h)
    }

    fn age(lines: &[&'static str]) -> u64 {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(header::AGE, HeaderValue::from_static(l));
        }
        origin_age(&h).as_secs()
    }

    #[test]
    fn origin_age_reads_the_first_value_and_ignores_what_is_not_a_number() {
        assert_eq!(age(&[]), 0);
        assert_eq!(age(&["30"]), 30);
        assert_eq!(age(&[" 30 "]), 30);
        assert_eq!(age(&["7200, 0"]), 7200);
        assert_eq!(age(&["0, 7200"]), 0);
        assert_eq!(age(&["7200", "0"]), 7200);
        for bad in ["abc", "-7200", "7200.0", "", "7200;foo=bar"] {
            assert_eq!(age(&[bad]), 0, "{bad:?}");
        }
        assert_eq!(age(&["2147483647"]), 2_147_483_647);
        assert_eq!(age(&["2147483649"]), MAX_AGE_SECONDS);
        assert_eq!(age(&["99999999999999999999999"]), MAX_AGE_SECONDS);
    }

    #[test]
    fn directives_across_lines_case_and_quotes() {
        let c = cc(&["Public, MAX-AGE=60", "No-Cache=\"Set-Cookie, X-A\""]);
        assert!(c.no_cache && !c.no_store && !c.private);
        assert_eq!(c.max_age, Some(60));
        // A quoted comma does not start a new directive.
        let c = cc(&["private=\"a,no-store\", s-maxage=\"30\""]);
        assert!(c.private && !c.no_store);
        assert_eq!(c.s_maxage, Some(30));
        let c = cc(&[" ,, no-store ,"]);
        assert!(c.no_store);
        assert_eq!(cc(&[]), CacheControl::default());
        // Quoted strings with escapes, and junk after them.
        let c = cc(&["x=\"a\\\"b,c\"junk, max-age=5"]);
        assert_eq!(c.max_age, Some(5));
    }

    #[test]
    fn stale_windows_narrow_never_widen() {
        let route = Duration::from_secs(30);
        let c = cc(&["max-age=5, stale-while-revalidate=10, stale-if-error=3600"]);
        assert_eq!(
            c.narrow(route, c.stale_while_revalidate),
            Duration::from_secs(10)
        );
        assert_eq!(c.narrow(route, c.stale_if_error), route);
        let c = cc(&["stale-while-revalidate=10", "stale-while-revalidate=2"]);
        assert_eq!(
            c.narrow(route, c.stale_while_revalidate),
            Duration::from_secs(2)
        );
        for closed in ["must-revalidate", "Proxy-Revalidate", "no-cache"] {
            let c = cc(&[closed]);
            assert_eq!(c.narrow(route, None), Duration::ZERO, "{closed}");
        }
        assert_eq!(cc(&["public"]).narrow(route, None), route);
    }

    #[test]
    fn lifetimes_s_maxage_wins_and_bad_values_are_zero() {
        assert_eq!(
            cc(&["max-age=0"]).zero_lifetime(),
            Some(ZeroLifetime::MaxAge)
        );
        assert_eq!(
            cc(&["s-maxage=0, max-age=60"]).zero_lifetime(),
            Some(ZeroLifetime::SMaxAge)
        );
        assert_eq!(cc(&["s-maxage=10, max-age=0"]).zero_lifetime(), None);
        assert_eq!(
            cc(&["max-age=abc"]).zero_lifetime(),
            Some(ZeroLifetime::MaxAge)
        );
        assert_eq!(
            cc(&["max-age=60", "max-age=0"]).zero_lifetime(),
            Some(ZeroLifetime::MaxAge)
        );
        assert_eq!(cc(&["max-age=60"]).zero_lifetime(), None);
        assert_eq!(cc(&["public"]).zero_lifetime(), None);
    }

    #[test]
    fn origin_freshness_prefers_s_maxage_then_max_age_then_expires() {
        use OriginFreshness::*;
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let fresh = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
            }
            CacheControl::parse(&h).freshness(&h, now)
        };
        let secs = |s| Fresh(Duration::from_secs(s));
        assert_eq!(fresh(&[("cache-control", "max-age=60")]), secs(60));
        assert_eq!(
            fresh(&[("cache-control", "max-age=60, s-maxage=5")]),
            secs(5)
        );
        // Expires minus Date, whatever our clock says.
        let expires = [
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("expires", "Sun, 06 Nov 1994 08:49:39 GMT"),
        ];
        assert_eq!(fresh(&expires), secs(2));
        // max-age wins over Expires (RFC 9111 §5.3).
        let mut both = expires.to_vec();
        both.push(("cache-control", "max-age=7"));
        assert_eq!(fresh(&both), secs(7));
        // Without Date: Expires minus the time received.
        assert_eq!(
            fresh(&[("expires", "Tue, 14 Nov 2023 22:13:30 GMT")]),
            secs(10)
        );
        assert_eq!(
            fresh(&[("expires", "Tue, 14 Nov 2023 22:13:10 GMT")]),
            Spent
        );
        assert_eq!(fresh(&[("expires", "0")]), Spent);
        assert_eq!(
            fresh(&[
                ("date", "Sun, 06 Nov 1994 08:49:39 GMT"),
                ("expires", "Sun, 06 Nov 1994 08:49:37 GMT")
            ]),
            Spent
        );
        // The age it arrived with counts against the lifetime.
        assert_eq!(
            fresh(&[("cache-control", "max-age=60"), ("age", "45")]),
            secs(15)
        );
        assert_eq!(
            fresh(&[("cache-control", "max-age=60"), ("age", "60")]),
            Spent
        );
        assert_eq!(
            fresh(&[("cache-control", "max-age=60"), ("age", "x")]),
            secs(60)
        );
        assert_eq!(fresh(&[("cache-control", "max-age=0")]), Spent);
        assert_eq!(fresh(&[("cache-control", "public")]), Unspecified);
        assert_eq!(fresh(&[]), Unspecified);
    }

    #[test]
    fn vary_names_learned_from_the_answer() {
        let keyed = [HeaderName::from_static("accept")];
        let learn = |pairs: &[(&'static str, &'static str)], max: usize| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(*k, HeaderValue::from_static(v));
            }
            learned_vary_of(&h, &keyed, max)
                .map(|n| n.iter().map(|n| n.as_str().to_owned()).collect::<Vec<_>>())
        };
        assert_eq!(learn(&[], 4), Ok(vec![]));
        assert_eq!(
            learn(&[("vary", "Zed, Abc"), ("vary", "accept, abc")], 4),
            Ok(vec!["abc".to_owned(), "zed".to_owned()])
        );
        assert_eq!(learn(&[("vary", "Accept-Encoding")], 4), Ok(vec![]));
        assert_eq!(
            learn(
                &[("vary", "Accept-Encoding"), ("content-encoding", "gzip")],
                4
            ),
            Ok(vec!["accept-encoding".to_owned()])
        );
        assert_eq!(learn(&[("vary", "a, *")], 4), Err(VaryVerdict::Star));
        assert_eq!(learn(&[("vary", "a, b, c")], 2), Err(VaryVerdict::Unkeyed));
        assert_eq!(learn(&[("vary", "Host")], 4), Err(VaryVerdict::Unkeyed));
        assert_eq!(learn(&[("vary", "Range")], 4), Err(VaryVerdict::Unkeyed));
        assert_eq!(learn(&[("vary", "bad name")], 4), Err(VaryVerdict::Unkeyed));
    }

    #[test]
    fn vary_against_the_key() {
        let keyed = [HeaderName::from_static("accept")];
        let judge = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
            }
            judge_vary(&h, &keyed)
        };
        assert_eq!(judge(&[]), VaryVerdict::Keyed);
        assert_eq!(judge(&[("vary", "Accept")]), VaryVerdict::Keyed);
        assert_eq!(judge(&[("vary", "accept, *")]), VaryVerdict::Star);
        assert_eq!(judge(&[("vary", "X-User")]), VaryVerdict::Unkeyed);
        assert_eq!(
            judge(&[("vary", "Accept"), ("vary", "x-user")]),
            VaryVerdict::Unkeyed
        );
        assert_eq!(judge(&[("vary", "Accept-Encoding")]), VaryVerdict::Keyed);
        assert_eq!(
            judge(&[("vary", "Accept-Encoding"), ("content-encoding", "gzip")]),
            VaryVerdict::Unkeyed
        );
        assert_eq!(judge(&[("vary", "bad header")]), VaryVerdict::Unkeyed);
    }

    #[test]
    fn cdn_cache_control_is_read_only_when_valid() {
        let cdn = |lines: &[&'static str]| {
            let mut h = HeaderMap::new();
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            for l in lines {
                h.append(CDN_CACHE_CONTROL, HeaderValue::from_static(l));
            }
            targeted(&h)
        };
        assert_eq!(cdn(&[]), None, "absent: Cache-Control decides");
        let long = cdn(&["foobar, max-age=3600"]).expect("valid");
        assert_eq!((long.max_age, long.no_store), (Some(3600), false));
        let two = cdn(&["private", "s-maxage=5"]).expect("two lines, one field");
        assert_eq!((two.private, two.s_maxage), (true, Some(5)));
        let flags = cdn(&["no-cache=\"x-a\", no-store, must-revalidate"]).expect("valid");
        assert!(flags.no_cache && flags.no_store && flags.must_revalidate);
        for invalid in [
            "max-age=10000, &&&&&",
            "max-age=\"10000\"",
            "max-age=-1",
            "MaX-aGe=3600",
        ] {
            assert_eq!(cdn(&[invalid]), None, "{invalid}");
        }
    }
}

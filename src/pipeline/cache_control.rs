//! The origin's own say on caching (RFC 9111 §5.2.2, §4.1): the
//! `Cache-Control` directives a shared cache must honour, and `Vary`.
//!
//! Parsing follows RFC 9110 §5.6: a header may come as several lines, each a
//! comma-separated list; directive names are case-insensitive; a value is a
//! token or a quoted-string (which may itself contain commas and escaped
//! quotes). Anything this parser cannot read is resolved towards not
//! caching: an unparseable `max-age` counts as 0 (RFC 9111 §4.2.1 calls such
//! a response stale), a repeated `max-age` takes its smallest value.

use http::header::{self, HeaderMap, HeaderName};
use std::time::Duration;

/// The directives of a response that decide whether a shared cache may
/// store it. Absent directives are `false` / `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheControl {
    pub no_store: bool,
    /// `no-cache`, qualified (`no-cache="field"`) or not: a shared cache
    /// that never revalidates treats both as "do not reuse".
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
    pub fn parse(headers: &HeaderMap) -> CacheControl {
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
    pub fn narrow(&self, route_window: Duration, limit: Option<u64>) -> Duration {
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
    pub fn zero_lifetime(&self) -> Option<ZeroLifetime> {
        match (self.s_maxage, self.max_age) {
            (Some(0), _) => Some(ZeroLifetime::SMaxAge),
            (Some(_), _) => None,
            (None, Some(0)) => Some(ZeroLifetime::MaxAge),
            _ => None,
        }
    }
}

/// The largest `Age` a cache transmits (RFC 9111 §5.1: 2^31 on overflow).
pub const MAX_AGE_SECONDS: u64 = 1 << 31;

/// The origin's `Age` (RFC 9111 §5.1): the first member of the first line,
/// non-negative decimal digits only, capped at 2^31 seconds; anything else
/// (negative, fractional, not a number) is ignored as if absent.
pub fn origin_age(headers: &HeaderMap) -> Duration {
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
pub enum ZeroLifetime {
    SMaxAge,
    MaxAge,
}

/// Splits one header line into `(name, value)` directives; quoted values
/// are unquoted (`\"` → `"`). Empty list elements are skipped.
fn directives(line: &str) -> Vec<(&str, Option<String>)> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // Name: up to '=', ',' or the end.
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && bytes[i] != b',' {
            i += 1;
        }
        let name = line[start..i].trim();
        let mut value = None;
        if i < bytes.len() && bytes[i] == b'=' {
            i += 1;
            while i < bytes.len() && bytes[i] == b' ' {
                i += 1;
            }
            if i < bytes.len() && bytes[i] == b'"' {
                i += 1;
                let mut v = String::new();
                while i < bytes.len() && bytes[i] != b'"' {
                    if bytes[i] == b'\\' && i + 1 < bytes.len() {
                        i += 1;
                    }
                    v.push(bytes[i] as char);
                    i += 1;
                }
                i += 1; // the closing quote (or past the end if unclosed)
                        // Anything between the quote and the next ',' is junk.
                while i < bytes.len() && bytes[i] != b',' {
                    i += 1;
                }
                value = Some(v);
            } else {
                let vstart = i;
                while i < bytes.len() && bytes[i] != b',' {
                    i += 1;
                }
                value = Some(line[vstart..i].trim().to_owned());
            }
        }
        i += 1; // the ','
        if !name.is_empty() {
            out.push((name, value));
        }
    }
    out
}

/// What the response's `Vary` says about sharing it on this route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VaryVerdict {
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
pub fn judge_vary(headers: &HeaderMap, keyed: &[HeaderName]) -> VaryVerdict {
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

fn content_coded(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

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
}

//! A route's headers: the `Host` and client headers its fills send (`host`,
//! `fill_headers`), the request headers learned from the origin's `Vary`
//! (`vary_from_origin`), the `Cache-Control` clients get
//! (`client_cache_control`), and the response headers that carry tags and
//! versions (`tags_from`, `version_from`).

use crate::config::file::FileClientCacheControl;
use crate::config::route::{ClientCacheControl, OriginCacheControl, OriginVary};
use crate::config::validate::{err, Result};
use http::{HeaderName, HeaderValue};

/// `host`: the `Host` fills send instead of the upstream's authority; it
/// contradicts keying on the client's `Host`.
pub(super) fn fill_host(
    at: &str,
    host: Option<&str>,
    vary: &[HeaderName],
) -> Result<Option<HeaderValue>> {
    let host = match host {
        None => None,
        Some(h) => {
            let valid = h
                .parse::<http::uri::Authority>()
                .is_ok_and(|a| a.as_str() == h);
            match HeaderValue::from_str(h) {
                Ok(v) if valid => Some(v),
                _ => return err(format!("{at}.host"), format!("{h:?} is not a host[:port]")),
            }
        }
    };
    if host.is_some() && vary.contains(&http::header::HOST) {
        return err(
            format!("{at}.host"),
            "the route keys on the client's Host (vary); a fixed fill Host contradicts it",
        );
    }
    Ok(host)
}

/// `fill_headers`: client headers a fill may carry besides `vary`. Refused
/// here: headers the fill sets itself or that describe one connection,
/// credentials (they make a request BYPASS unless keyed, so they belong in
/// `vary`), `accept-encoding` (the encoding must be keyed, or the fill asks
/// for identity) and conditional or range headers (a fill must fetch the
/// whole object, never a 304 or 206).
pub(super) fn fill_headers(at: &str, names: Vec<String>) -> Result<Vec<HeaderName>> {
    const REFUSED: &[(&str, &str)] = &[
        ("host", "set the route's `host` instead"),
        ("content-length", "a fill has no body"),
        ("transfer-encoding", "a fill has no body"),
        ("connection", "hop-by-hop"),
        ("keep-alive", "hop-by-hop"),
        ("proxy-connection", "hop-by-hop"),
        ("te", "hop-by-hop"),
        ("upgrade", "hop-by-hop"),
        ("proxy-authorization", "hop-by-hop"),
        (
            "authorization",
            "credentials: list it in `vary` to cache per credential",
        ),
        (
            "cookie",
            "credentials: list it in `vary` to cache per cookie",
        ),
        (
            "accept-encoding",
            "list it in `vary`: the encoding must be part of the key",
        ),
        ("if-match", "a fill fetches the whole object"),
        ("if-none-match", "a fill fetches the whole object"),
        ("if-modified-since", "a fill fetches the whole object"),
        ("if-unmodified-since", "a fill fetches the whole object"),
        ("if-range", "a fill fetches the whole object"),
        ("range", "a fill fetches the whole object"),
    ];
    let mut out: Vec<HeaderName> = Vec::with_capacity(names.len());
    for (i, h) in names.iter().enumerate() {
        let path = format!("{at}.fill_headers[{i}]");
        let Ok(name) = HeaderName::from_bytes(h.as_bytes()) else {
            return err(path, format!("{h:?} is not a header name"));
        };
        if let Some((_, why)) = REFUSED.iter().find(|(n, _)| *n == name.as_str()) {
            return err(path, format!("{h:?} cannot be sent on fills: {why}"));
        }
        if !out.contains(&name) {
            out.push(name);
        }
    }
    Ok(out)
}

/// `vary_from_origin` and its bounds (`max_vary_headers`, 1..=16, default
/// 4; `max_vary_value`, 1..=8192 bytes, default 256). The bounds belong to
/// it, and it needs `origin_cache_control: honor` (`ignore` drops `Vary`).
pub(super) fn origin_vary(
    at: &str,
    on: bool,
    max_headers: Option<usize>,
    max_value: Option<usize>,
    origin_cache_control: OriginCacheControl,
) -> Result<Option<OriginVary>> {
    if !on {
        for (key, set) in [
            ("max_vary_headers", max_headers.is_some()),
            ("max_vary_value", max_value.is_some()),
        ] {
            if set {
                return err(format!("{at}.{key}"), "only with vary_from_origin: true");
            }
        }
        return Ok(None);
    }
    if origin_cache_control == OriginCacheControl::Ignore {
        return err(
            format!("{at}.vary_from_origin"),
            "needs origin_cache_control: honor (ignore drops the answer's Vary)",
        );
    }
    let max_headers = max_headers.unwrap_or(4);
    if !(1..=16).contains(&max_headers) {
        return err(
            format!("{at}.max_vary_headers"),
            format!("{max_headers}: must be between 1 and 16"),
        );
    }
    let max_value = max_value.unwrap_or(256);
    if !(1..=8192).contains(&max_value) {
        return err(
            format!("{at}.max_vary_value"),
            format!("{max_value}: must be between 1 and 8192"),
        );
    }
    Ok(Some(OriginVary {
        max_headers,
        max_value,
    }))
}

/// Response directives of RFC 9111 §5.2.2 (and RFC 5861, RFC 8246) that a
/// literal `client_cache_control` may use; anything else is a typo.
const CLIENT_DIRECTIVES: &[&str] = &[
    "max-age",
    "s-maxage",
    "no-cache",
    "no-store",
    "no-transform",
    "must-revalidate",
    "proxy-revalidate",
    "must-understand",
    "private",
    "public",
    "immutable",
    "stale-while-revalidate",
    "stale-if-error",
];

/// `client_cache_control`: `pass`, `remaining`, or a literal header value
/// made of known directives.
pub(super) fn client_cache_control(
    at: &str,
    raw: FileClientCacheControl,
) -> Result<ClientCacheControl> {
    let path = format!("{at}.client_cache_control");
    let literal = match raw {
        FileClientCacheControl::Pass => return Ok(ClientCacheControl::Pass),
        FileClientCacheControl::Remaining => return Ok(ClientCacheControl::Remaining),
        FileClientCacheControl::Literal(l) => l,
    };
    let trimmed = literal.trim();
    if trimmed.eq_ignore_ascii_case("pass") || trimmed.eq_ignore_ascii_case("remaining") {
        return err(
            path,
            format!("{literal:?}: the modes are spelled `pass` and `remaining`"),
        );
    }
    let Ok(value) = http::HeaderValue::from_str(trimmed) else {
        return err(
            path,
            format!("{literal:?} is not a header value (visible ASCII only)"),
        );
    };
    let mut names = 0;
    for element in split_list(trimmed) {
        let name = element.split('=').next().unwrap_or_default().trim();
        if name.is_empty() {
            continue;
        }
        names += 1;
        if !CLIENT_DIRECTIVES
            .iter()
            .any(|d| d.eq_ignore_ascii_case(name))
        {
            return err(
                path,
                format!(
                    "{name:?} is not a Cache-Control response directive; use `pass`, \
                     `remaining` or a list of: {}",
                    CLIENT_DIRECTIVES.join(", ")
                ),
            );
        }
    }
    if names == 0 {
        return err(
            path,
            "is empty; use `pass`, `remaining` or directives such as \"private, max-age=0\"",
        );
    }
    Ok(ClientCacheControl::Literal(value))
}

/// Splits a header list at commas outside quoted strings.
fn split_list(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// A header name setting (`tags_from`, `version_from`), if given.
pub(super) fn optional_header(path: &str, name: Option<&str>) -> Result<Option<HeaderName>> {
    name.map(|n| {
        HeaderName::from_bytes(n.as_bytes())
            .or_else(|_| err(path, format!("{n:?} is not a header name")))
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{parse, APP};

    #[test]
    fn client_cache_control_modes_and_literals() {
        let mode = |v: &str| {
            parse(&APP.replace(
                "ttl: 60s",
                &format!("ttl: 60s\n    client_cache_control: {v}"),
            ))
            .map(|c| c.routes.routes[0].client_cache_control.clone())
        };
        assert_eq!(
            parse(APP).expect("valid").routes.routes[0].client_cache_control,
            ClientCacheControl::Pass
        );
        assert_eq!(mode("pass").expect("valid"), ClientCacheControl::Pass);
        assert_eq!(
            mode("remaining").expect("valid"),
            ClientCacheControl::Remaining
        );
        assert_eq!(
            mode("\"private, max-age=0\"").expect("valid"),
            ClientCacheControl::Literal(http::HeaderValue::from_static("private, max-age=0"))
        );
        mode("\"no-cache=\\\"Set-Cookie, X-A\\\", Public\"")
            .expect("quoted commas are one directive");
        for (v, words) in [
            ("\"\"", "empty"),
            ("\" , \"", "empty"),
            ("Remaining", "spelled"),
            ("\"privat, max-age=0\"", "privat"),
            ("\"max-age=0\\u0001\"", "header value"),
        ] {
            let e = mode(v).map(|_| ()).expect_err(v);
            let e = e.to_string();
            assert!(e.contains("routes[0].client_cache_control"), "{v}: {e}");
            assert!(e.contains(words), "{v}: {e}");
        }
    }
}

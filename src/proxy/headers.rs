//! Header rules shared by forwarding and cache fills: hop-by-hop removal
//! (RFC 9110 §7.6.1), `X-Forwarded-*`, and the framing check that refuses
//! requests whose body length is ambiguous (RFC 9112 §6.3).

use crate::error::ProxyError;
use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};
use http::{Uri, Version};
use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};

/// Headers that describe one connection, not the message. `Trailer` is not
/// here on purpose: RFC 9110 treats it as end-to-end, and hyper only emits
/// chunked trailers that a `Trailer` header announces.
/// As `HeaderName`s: removing by `&str` parses the name again on every call.
static HOP_BY_HOP: [HeaderName; 8] = {
    let n = HOP_BY_HOP_NAMES;
    [
        HeaderName::from_static(n[0]),
        HeaderName::from_static(n[1]),
        HeaderName::from_static(n[2]),
        HeaderName::from_static(n[3]),
        HeaderName::from_static(n[4]),
        HeaderName::from_static(n[5]),
        HeaderName::from_static(n[6]),
        HeaderName::from_static(n[7]),
    ]
};
const HOP_BY_HOP_NAMES: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
];

/// Bit `n` set: some hop-by-hop name is `n` bytes long. A name of another
/// length (most: `host`, `accept`, `content-type`, ...) is none of them,
/// which one length check says instead of eight comparisons.
const HOP_BY_HOP_LENGTHS: u32 = {
    let mut mask = 0;
    let mut i = 0;
    while i < HOP_BY_HOP_NAMES.len() {
        mask |= 1 << HOP_BY_HOP_NAMES[i].len();
        i += 1;
    }
    mask
};

fn is_hop_by_hop(name: &HeaderName) -> bool {
    let len = name.as_str().len();
    len < 32 && HOP_BY_HOP_LENGTHS & (1 << len) != 0 && HOP_BY_HOP.contains(name)
}

pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Comma-separated tokens of every value of `name`, trimmed, empty ones dropped.
pub(crate) fn tokens<'h>(h: &'h HeaderMap, name: &HeaderName) -> impl Iterator<Item = &'h str> {
    h.get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Removes hop-by-hop headers, including every header named in `Connection`.
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Most messages carry none of them (headers named in `Connection` only
    // count when `Connection` is there): one pass over the names decides,
    // instead of eight removals that each hash and probe.
    if !h.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = tokens(h, &header::CONNECTION)
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    for name in named {
        h.remove(name);
    }
    for name in &HOP_BY_HOP {
        h.remove(name);
    }
}

/// Appends the peer to `X-Forwarded-For` and sets `X-Forwarded-Proto`.
/// Several `X-Forwarded-For` lines are folded into one list, in order.
pub(crate) fn append_forwarded(h: &mut HeaderMap, peer: SocketAddr, proto: &str) {
    // One lookup for both cases (`entry`), not `contains_key` and `insert`.
    match h.entry(&X_FORWARDED_FOR) {
        // The usual case: we are the first hop. An IP literal is a valid value.
        Entry::Vacant(slot) => {
            slot.insert(ip_value(peer.ip()));
        }
        Entry::Occupied(mut slot) => {
            let ip = ip_value(peer.ip());
            let mut chain: Vec<&str> = slot
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|s| s.split(','))
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .collect();
            chain.push(ip.to_str().unwrap_or("unknown"));
            // Values came from valid header values plus an IP literal: still
            // valid; if not (obs-text), fall back to our hop alone rather
            // than failing.
            let value = HeaderValue::from_str(&chain.join(", ")).unwrap_or_else(|_| ip.clone());
            slot.insert(value);
        }
    }
    h.insert(X_FORWARDED_PROTO.clone(), proto_value(proto));
}

fn proto_value(proto: &str) -> HeaderValue {
    match proto {
        "http" => HeaderValue::from_static("http"),
        "https" => HeaderValue::from_static("https"),
        other => HeaderValue::from_str(other).unwrap_or(HeaderValue::from_static("unknown")),
    }
}

/// The peer's address as a header value (IPv4-mapped IPv6 shown as IPv4).
/// The last value built is kept per thread and reused when the next
/// request comes from the same address, as nearly all of a sidecar's do
/// (the Pod's own loopback, one ingress): building it (digits, validation,
/// an allocation) was a measurable part of every forwarded request
/// (bench/README.md); the clone is a reference count.
fn ip_value(ip: std::net::IpAddr) -> HeaderValue {
    thread_local! {
        static LAST: RefCell<Option<(IpAddr, HeaderValue)>> = const { RefCell::new(None) };
    }
    let ip = ip.to_canonical();
    LAST.with_borrow_mut(|last| match last {
        Some((seen, value)) if *seen == ip => value.clone(),
        _ => {
            let value = build_ip_value(ip);
            *last = Some((ip, value.clone()));
            value
        }
    })
}

/// IPv4 by hand into a stack buffer: `to_string` goes through the
/// formatting machinery, a large part of `append_forwarded` (bench/README.md),
/// and a `String` would be one more allocation before the value's own.
fn build_ip_value(ip: IpAddr) -> HeaderValue {
    let value = match ip {
        IpAddr::V4(v4) => {
            let mut text = [0u8; 15];
            let mut len = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text[len] = b'.';
                    len += 1;
                }
                if octet >= 100 {
                    text[len] = b'0' + octet / 100;
                    len += 1;
                }
                if octet >= 10 {
                    text[len] = b'0' + octet / 10 % 10;
                    len += 1;
                }
                text[len] = b'0' + octet % 10;
                len += 1;
            }
            HeaderValue::from_bytes(&text[..len])
        }
        v6 => HeaderValue::from_str(&v6.to_string()),
    };
    value.unwrap_or(HeaderValue::from_static("unknown"))
}

/// Refuses request framing sidecache will not forward: ambiguous framing
/// (CL + TE, or differing CLs) is a 400 ([`ProxyError::BadRequest`]), a
/// transfer coding other than a lone `chunked` a 501
/// ([`ProxyError::NotImplemented`], RFC 9112 §6.1: hyper decodes the
/// chunked framing and forwarding re-frames the body, so the other codings,
/// e.g. the `gzip` of `gzip, chunked`, would be silently lost).
///
/// hyper's HTTP/1 parser already answers 400 itself for differing or invalid
/// `Content-Length` values and a `Transfer-Encoding` whose last coding is not
/// chunked, but it accepts CL + TE by dropping the CL before we see the
/// headers; the connection-level [`crate::server::framing`] guard catches that case.
/// This check covers what is left visible in the header map (and HTTP/2,
/// where hyper checks less).
pub(crate) fn check_framing(h: &HeaderMap) -> Result<(), ProxyError> {
    let bad = |why: String| Err(ProxyError::BadRequest(why));
    if h.contains_key(header::TRANSFER_ENCODING) {
        if h.contains_key(header::CONTENT_LENGTH) {
            return bad("both Content-Length and Transfer-Encoding".to_owned());
        }
        let mut chunked = 0;
        for coding in tokens(h, &header::TRANSFER_ENCODING) {
            if !coding.eq_ignore_ascii_case("chunked") {
                return Err(ProxyError::NotImplemented(format!(
                    "transfer coding {coding:?} (only chunked is supported)"
                )));
            }
            chunked += 1;
        }
        if chunked != 1 {
            return bad("chunked must be applied exactly once".to_owned());
        }
    }
    let mut seen: Option<u64> = None;
    for v in h.get_all(header::CONTENT_LENGTH) {
        let Ok(text) = v.to_str() else {
            return bad("unreadable Content-Length".to_owned());
        };
        for part in text.split(',') {
            let part = part.trim();
            let n = part
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| part.parse::<u64>().ok())
                .flatten();
            let Some(n) = n else {
                return bad(format!("invalid Content-Length {part:?}"));
            };
            match seen {
                Some(prev) if prev != n => {
                    return bad("differing Content-Length values".to_owned());
                }
                _ => seen = Some(n),
            }
        }
    }
    Ok(())
}

/// RFC 9112 §3.2: an HTTP/1.1 request needs exactly one `Host`, and no
/// request may carry more than one. RFC 9113 §8.3.1: over HTTP/2, a `Host`
/// next to `:authority` must name the same authority. `Err(reason)` → 400.
pub(crate) fn check_host(version: Version, h: &HeaderMap, uri: &Uri) -> Result<(), &'static str> {
    let mut hosts = h.get_all(header::HOST).iter();
    let (first, second) = (hosts.next(), hosts.next());
    if second.is_some() {
        return Err("more than one Host header");
    }
    match (version, first) {
        (Version::HTTP_11, None) => Err("no Host header"),
        (Version::HTTP_2, Some(host)) => match uri.authority() {
            Some(authority)
                if !host
                    .as_bytes()
                    .eq_ignore_ascii_case(authority.as_str().as_bytes()) =>
            {
                Err("Host differs from :authority")
            }
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn strips_listed_and_connection_named() {
        let mut h = map(&[
            ("connection", "close, X-Secret"),
            ("x-secret", "1"),
            ("keep-alive", "5"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("trailer", "x-checksum"),
            ("x-kept", "yes"),
        ]);
        strip_hop_by_hop(&mut h);
        let names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["trailer", "x-kept"]);
    }

    #[test]
    fn hop_by_hop_names_are_recognised_in_any_map() {
        for name in HOP_BY_HOP_NAMES {
            let mut h = map(&[(name, "x"), ("x-kept", "yes")]);
            strip_hop_by_hop(&mut h);
            assert!(!h.contains_key(name), "{name} kept");
            assert!(h.contains_key("x-kept"));
        }
    }

    #[test]
    fn xff_for_each_peer_its_own_address() {
        // One thread, peers alternating: the value kept for the last peer
        // is never another peer's.
        for peer in ["10.0.0.1:5", "10.0.0.2:6", "10.0.0.1:7", "[2001:db8::1]:8"] {
            let mut h = HeaderMap::new();
            let addr: SocketAddr = peer.parse().unwrap();
            append_forwarded(&mut h, addr, "http");
            assert_eq!(h["x-forwarded-for"], addr.ip().to_string().as_str());
        }
    }

    #[test]
    fn xff_appends_and_folds() {
        let mut h = map(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
        ]);
        append_forwarded(&mut h, "[::ffff:10.0.0.1]:5".parse().unwrap(), "http");
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 10.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "http");
    }

    #[test]
    fn xff_first_hop_and_ip_value() {
        let mut h = map(&[("x-kept", "yes")]);
        append_forwarded(&mut h, "10.20.0.255:5".parse().unwrap(), "http");
        assert_eq!(h["x-forwarded-for"], "10.20.0.255");
        assert_eq!(h["x-forwarded-proto"], "http");
        for ip in ["0.0.0.0", "1.2.3.4", "9.99.100.255", "::1", "2001:db8::7"] {
            let parsed: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(ip_value(parsed), ip);
        }
        assert_eq!(
            ip_value("::ffff:192.168.1.10".parse().unwrap()),
            "192.168.1.10"
        );
    }

    #[test]
    fn no_hop_by_hop_leaves_the_map_alone() {
        let mut h = map(&[("host", "a"), ("x-kept", "yes"), ("accept", "*/*")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 3);
        let mut h = map(&[("proxy-connection", "keep-alive"), ("x-kept", "yes")]);
        strip_hop_by_hop(&mut h);
        let names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-kept"]);
    }

    #[test]
    fn framing() {
        assert!(check_framing(&map(&[("content-length", "5")])).is_ok());
        assert!(check_framing(&map(&[("content-length", "5"), ("content-length", "5")])).is_ok());
        assert!(check_framing(&map(&[("content-length", "5"), ("content-length", "6")])).is_err());
        assert!(check_framing(&map(&[("content-length", "5, 6")])).is_err());
        assert!(check_framing(&map(&[("content-length", "-1")])).is_err());
        assert!(check_framing(&map(&[
            ("content-length", "5"),
            ("transfer-encoding", "chunked")
        ]))
        .is_err());
    }

    #[test]
    fn transfer_codings() {
        let status = |te: &[&str]| {
            let pairs: Vec<_> = te.iter().map(|v| ("transfer-encoding", *v)).collect();
            check_framing(&map(&pairs)).map_err(|e| e.status().as_u16())
        };
        assert_eq!(status(&["chunked"]), Ok(()));
        assert_eq!(status(&["Chunked"]), Ok(()));
        assert_eq!(status(&["gzip, chunked"]), Err(501));
        assert_eq!(status(&["gzip", "chunked"]), Err(501));
        assert_eq!(status(&["chunked, chunked"]), Err(400));
        assert_eq!(status(&[""]), Err(400));
    }

    #[test]
    fn host_rules() {
        let origin: Uri = "/a".parse().unwrap();
        let absolute: Uri = "http://a.example:8080/a".parse().unwrap();
        let h1 = Version::HTTP_11;
        let h2 = Version::HTTP_2;
        let one = map(&[("host", "a.example:8080")]);
        let two = map(&[("host", "a.example:8080"), ("host", "b")]);
        let none = map(&[]);
        assert!(check_host(h1, &one, &origin).is_ok());
        assert!(check_host(h1, &two, &origin).is_err());
        assert!(check_host(h1, &none, &origin).is_err());
        assert!(check_host(Version::HTTP_10, &none, &origin).is_ok());
        assert!(check_host(h2, &none, &absolute).is_ok());
        assert!(check_host(h2, &one, &absolute).is_ok());
        assert!(check_host(h2, &map(&[("host", "b")]), &absolute).is_err());
        assert!(check_host(h2, &two, &absolute).is_err());
    }
}

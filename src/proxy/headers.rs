//! Header rules shared by forwarding and cache fills: hop-by-hop removal
//! (RFC 9110 §7.6.1), `X-Forwarded-*`, and the framing check that refuses
//! requests whose body length is ambiguous (RFC 9112 §6.3).

use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};
use std::net::SocketAddr;

/// Headers that describe one connection, not the message. `Trailer` is not
/// here on purpose: RFC 9110 treats it as end-to-end, and hyper only emits
/// chunked trailers that a `Trailer` header announces.
/// As `HeaderName`s: removing by `&str` parses the name again on every call.
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Comma-separated tokens of every value of `name`, trimmed, empty ones dropped.
pub fn tokens<'h>(h: &'h HeaderMap, name: &HeaderName) -> impl Iterator<Item = &'h str> {
    h.get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Removes hop-by-hop headers, including every header named in `Connection`.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Most messages carry none of them (headers named in `Connection` only
    // count when `Connection` is there): one pass over the names decides,
    // instead of eight removals that each hash and probe.
    if !h.keys().any(|k| HOP_BY_HOP.contains(k)) {
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
pub fn append_forwarded(h: &mut HeaderMap, peer: SocketAddr, proto: &str) {
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
/// IPv4 by hand into a stack buffer: `to_string` goes through the
/// formatting machinery, which was a third of `append_forwarded` per
/// forwarded request (callgrind), and a `String` would be one more
/// allocation before the value's own.
fn ip_value(ip: std::net::IpAddr) -> HeaderValue {
    let value = match ip.to_canonical() {
        std::net::IpAddr::V4(v4) => {
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

/// `Err(reason)` for ambiguous framing: CL + TE, or differing CLs.
///
/// hyper's HTTP/1 parser already answers 400 itself for differing or invalid
/// `Content-Length` values and non-chunked `Transfer-Encoding`, but it accepts
/// CL + TE by dropping the CL before we see the headers; the connection-level
/// [`crate::server::framing`] guard catches that case. This check covers what is left
/// visible in the header map (and HTTP/2, where hyper checks less).
pub fn check_framing(h: &HeaderMap) -> Result<(), String> {
    if h.contains_key(header::TRANSFER_ENCODING) && h.contains_key(header::CONTENT_LENGTH) {
        return Err("both Content-Length and Transfer-Encoding".to_owned());
    }
    let mut seen: Option<u64> = None;
    for v in h.get_all(header::CONTENT_LENGTH) {
        let text = v
            .to_str()
            .map_err(|_| "unreadable Content-Length".to_owned())?;
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("invalid Content-Length {part:?}"));
            }
            let n: u64 = part
                .parse()
                .map_err(|_| format!("invalid Content-Length {part:?}"))?;
            match seen {
                Some(prev) if prev != n => {
                    return Err("differing Content-Length values".to_owned());
                }
                _ => seen = Some(n),
            }
        }
    }
    Ok(())
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
}

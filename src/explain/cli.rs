//! `sidecache lookup --config FILE URL`: asks the running instance's admin
//! listener (`admin.listen` and `admin.token` from FILE) for
//! `/admin/lookup` and prints the answer as a two-column table, for a shell
//! in the Pod. The instance's own near cache is part of the answer, which
//! is why it asks the process instead of reading Redis itself.

use crate::config::Config;
use bytes::Bytes;
use http::{header, Request};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::fmt::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// The whole exchange with the admin listener is bounded by this.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("cannot reach the admin listener at {0}: {1}")]
    Connect(SocketAddr, String),
    #[error("the admin listener at {0} did not answer within {TIMEOUT:?}")]
    Timeout(SocketAddr),
    #[error("the admin listener answered {0}: {1}")]
    Status(u16, String),
    #[error("the admin listener's answer is not JSON: {0}")]
    Body(String),
    #[error("header {0:?} is not `Name: value`")]
    BadHeader(String),
}

/// Where to reach the admin listener from this host: an unspecified bind
/// address (`0.0.0.0`, `[::]`) is reached on loopback.
pub(crate) fn admin_target(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// The `/admin/lookup` request target for `url` and `headers` (`Name: value`).
pub(crate) fn lookup_target(url: &str, headers: &[String]) -> Result<String, LookupError> {
    let mut target = format!("/admin/lookup?url={}", encode(url));
    for h in headers {
        let (name, value) = h
            .split_once(':')
            .filter(|(n, _)| !n.trim().is_empty())
            .ok_or_else(|| LookupError::BadHeader(h.clone()))?;
        let _ = write!(target, "&{}={}", encode(name.trim()), encode(value.trim()));
    }
    Ok(target)
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Asks the instance that `cfg` describes to explain `url`.
pub async fn fetch(cfg: &Config, url: &str, headers: &[String]) -> Result<Value, LookupError> {
    let addr = admin_target(cfg.admin.listen);
    let target = lookup_target(url, headers)?;
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| LookupError::Connect(addr, e.to_string()))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| LookupError::Connect(addr, e.to_string()))?;
        tokio::spawn(conn);
        let mut req = Request::get(target).header(header::HOST, addr.to_string());
        if let Some(token) = &cfg.admin.token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(|e| LookupError::BadHeader(e.to_string()))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| LookupError::Connect(addr, e.to_string()))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| LookupError::Body(e.to_string()))?
            .to_bytes();
        let text = String::from_utf8_lossy(&body).into_owned();
        if status != 200 {
            return Err(LookupError::Status(status, text.trim().to_owned()));
        }
        serde_json::from_str(&text).map_err(|e| LookupError::Body(e.to_string()))
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .unwrap_or(Err(LookupError::Timeout(addr)))
}

/// The explanation as `field  value` lines, most telling first.
pub fn table(v: &Value) -> String {
    const ORDER: [&str; 21] = [
        "url",
        "verdict",
        "why",
        "route",
        "template",
        "params",
        "bypass",
        "identity",
        "variant",
        "normalized_query",
        "learned_vary",
        "vary",
        "entry",
        "generation",
        "lease",
        "near_cache",
        "bloom",
        "store",
        "keys",
        "routes",
        "method",
    ];
    let mut rows: Vec<(String, String)> = Vec::new();
    let Some(map) = v.as_object() else {
        return format!("{v}\n");
    };
    for key in ORDER {
        if let Some(value) = map.get(key) {
            flatten(key, value, &mut rows);
        }
    }
    // Fields a newer server added that this list does not know yet.
    for (key, value) in map {
        if !ORDER.contains(&key.as_str()) {
            flatten(key, value, &mut rows);
        }
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{k:<width$}  {v}");
    }
    out
}

fn flatten(prefix: &str, value: &Value, rows: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                flatten(&format!("{prefix}.{k}"), v, rows);
            }
        }
        Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), item, rows);
            }
        }
        Value::String(s) => rows.push((prefix.to_owned(), s.clone())),
        Value::Null => rows.push((prefix.to_owned(), "-".to_owned())),
        other => rows.push((prefix.to_owned(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn targets_and_headers() {
        assert_eq!(
            admin_target("0.0.0.0:9090".parse().expect("addr")),
            "127.0.0.1:9090".parse().expect("addr")
        );
        assert_eq!(
            admin_target("[::]:9090".parse().expect("addr")),
            "[::1]:9090".parse().expect("addr")
        );
        assert_eq!(
            admin_target("10.1.2.3:9090".parse().expect("addr")),
            "10.1.2.3:9090".parse().expect("addr")
        );
        assert_eq!(
            lookup_target("/a/b?x=1&y=2", &["Accept: application/json".into()]).expect("ok"),
            "/admin/lookup?url=%2Fa%2Fb%3Fx%3D1%26y%3D2&Accept=application%2Fjson"
        );
        assert!(lookup_target("/a", &["no colon".into()]).is_err());
    }

    #[test]
    fn table_puts_the_verdict_first_and_flattens() {
        let v = json!({
            "method": "GET",
            "url": "/a/1",
            "verdict": "HIT",
            "why": "fresh",
            "entry": {"exists": true, "status": 200},
            "lease": {"held": false},
            "bloom": null,
            "new_field": 1,
        });
        let t = table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "url           /a/1");
        assert_eq!(lines[1], "verdict       HIT");
        assert!(t.contains("entry.exists  true\n"), "{t}");
        assert!(t.contains("entry.status  200\n"), "{t}");
        assert!(t.contains("bloom         -\n"), "{t}");
        assert!(t.ends_with("new_field     1\n"), "{t}");
    }
}

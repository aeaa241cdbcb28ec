//! One [`Line`] as text (logfmt: `key=value`, values quoted when needed)
//! or as a JSON object, each ending in a newline. Everything that came from
//! the client (path, method, ids) is escaped, so no request can forge a
//! line or break the format, and ids are bounded in length.

use super::Line;
use crate::config::file::FileLogFormat;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Client-sent ids longer than this are cut (and marked with `…`).
pub const MAX_ID: usize = 128;

/// The id of a line: the W3C trace id of a valid `traceparent`, else the
/// request's `X-Request-Id` (printable ASCII, at most [`MAX_ID`] bytes).
pub fn id(line: &Line) -> Option<String> {
    if let Some(trace) = &line.trace_id {
        return Some(trace.clone());
    }
    let raw = line.request_id.as_ref()?.as_ref();
    let mut out: String = raw
        .iter()
        .take(MAX_ID)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '?'
            }
        })
        .collect();
    if raw.len() > MAX_ID {
        out.push('…');
    }
    Some(out)
}

/// The trace id of a `traceparent` value (W3C Trace Context §3.2:
/// `version-traceid-parentid-flags`, lower-case hex, neither id all zeros,
/// version `ff` invalid; later versions may append fields).
pub fn trace_id(value: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let mut parts = text.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    let valid = hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && nonzero(trace)
        && hex(parent, 16)
        && nonzero(parent)
        && hex(flags, 2)
        && (version != "00" || parts.next().is_none());
    valid.then_some(trace)
}

/// Formats lines; remembers the text of the current second, so a busy log
/// formats a date once per second, not once per line.
#[derive(Default)]
pub struct Formatter {
    second: u64,
    /// `YYYY-MM-DDTHH:MM:SS` of `second`.
    stamp: String,
    /// Reused for each line's time and peer text.
    time: String,
    peer: String,
}

/// Appends fields in one format: JSON (`{"k":v,...}`) or logfmt
/// (`k=v k=v`). Values are written straight into the output: the writer
/// thread formats every line, so this avoids allocations and the
/// formatting machinery where a line's values are plain.
struct Fields<'o> {
    out: &'o mut Vec<u8>,
    json: bool,
    first: bool,
}

impl Fields<'_> {
    fn key(&mut self, key: &str) {
        match (self.json, self.first) {
            (true, true) => self.out.push(b'{'),
            (true, false) => self.out.push(b','),
            (false, true) => {}
            (false, false) => self.out.push(b' '),
        }
        self.first = false;
        if self.json {
            self.out.push(b'"');
            self.out.extend_from_slice(key.as_bytes());
            self.out.extend_from_slice(b"\":");
        } else {
            self.out.extend_from_slice(key.as_bytes());
            self.out.push(b'=');
        }
    }

    /// A string value (quoted and escaped as the format needs).
    fn str(&mut self, key: &str, v: &str) {
        self.key(key);
        if !self.json {
            return value(v, self.out);
        }
        let plain = plain(v, &PLAIN_JSON);
        if plain {
            self.out.push(b'"');
            self.out.extend_from_slice(v.as_bytes());
            self.out.push(b'"');
        } else {
            // Serializing a string into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *self.out, v);
        }
    }

    /// A string or null (logfmt: `-`).
    fn opt_str(&mut self, key: &str, v: Option<&str>) {
        match v {
            Some(v) => self.str(key, v),
            None => self.null(key),
        }
    }

    fn null(&mut self, key: &str) {
        self.key(key);
        self.out
            .extend_from_slice(if self.json { b"null" } else { b"-" });
    }

    fn uint(&mut self, key: &str, n: u64) {
        self.key(key);
        push_uint(self.out, n);
    }

    /// Milliseconds with three decimals (microsecond resolution).
    fn millis(&mut self, key: &str, d: Option<Duration>) {
        let Some(d) = d else {
            return self.null(key);
        };
        self.key(key);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        push_uint(self.out, micros / 1000);
        self.out.push(b'.');
        let frac = micros % 1000;
        self.out.extend_from_slice(&[
            b'0' + (frac / 100) as u8,
            b'0' + (frac / 10 % 10) as u8,
            b'0' + (frac % 10) as u8,
        ]);
    }

    fn end(self) {
        if self.json {
            self.out.push(b'}');
        }
        self.out.push(b'\n');
    }
}

/// Bytes a JSON string (`json`) or a logfmt value (`!json`) takes as they
/// are: printable ASCII but the quote and the backslash (and, for logfmt,
/// the space and `=`). One table lookup per byte.
const fn plain_table(json: bool) -> [bool; 256] {
    let mut t = [false; 256];
    let mut b = 0x20;
    while b < 0x7f {
        t[b] = b != b'"' as usize
            && b != b'\\' as usize
            && (json || (b != b' ' as usize && b != b'=' as usize));
        b += 1;
    }
    t
}
static PLAIN_JSON: [bool; 256] = plain_table(true);
static PLAIN_TEXT: [bool; 256] = plain_table(false);

fn plain(v: &str, table: &[bool; 256]) -> bool {
    v.bytes().all(|b| table[usize::from(b)])
}

/// Decimal digits of `n`, without the formatting machinery: the buffer and
/// where the digits start in it.
fn digits(mut n: u64) -> ([u8; 20], usize) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    (buf, i)
}

fn push_uint(out: &mut Vec<u8>, n: u64) {
    let (buf, start) = digits(n);
    out.extend_from_slice(&buf[start..]);
}

impl Formatter {
    /// Appends `line` in its format, with a final newline.
    pub fn write_line(&mut self, line: &Line, out: &mut Vec<u8>) {
        let mut time = std::mem::take(&mut self.time);
        time.clear();
        self.time(line.time, &mut time);
        let mut peer = std::mem::take(&mut self.peer);
        peer.clear();
        peer_text(line.peer, &mut peer);
        let id = id(line);
        let mut f = Fields {
            out,
            json: line.format == FileLogFormat::Json,
            first: true,
        };
        f.str("time", &time);
        f.str("peer", &peer);
        f.str("method", line.method.as_str());
        f.str("path", &line.path);
        if let Some(query) = &line.query {
            f.str("query", query);
        }
        f.uint("status", u64::from(line.status));
        f.str(
            "cache",
            line.cache
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-"),
        );
        f.str(
            "route",
            line.route.as_ref().map_or("-", |r| r.name.as_str()),
        );
        f.millis("duration_ms", Some(line.duration));
        f.millis("upstream_ms", line.upstream);
        f.uint("bytes", line.bytes);
        f.opt_str("id", id.as_deref());
        f.end();
        self.time = time;
        self.peer = peer;
    }

    /// `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
    fn time(&mut self, t: SystemTime, out: &mut String) {
        let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs();
        if secs != self.second || self.stamp.is_empty() {
            let whole = UNIX_EPOCH + Duration::from_secs(secs);
            let text = humantime::format_rfc3339_seconds(whole).to_string();
            self.stamp = text.trim_end_matches('Z').to_owned();
            self.second = secs;
        }
        out.push_str(&self.stamp);
        let ms = since.subsec_millis();
        out.push('.');
        out.push(char::from(b'0' + (ms / 100) as u8));
        out.push(char::from(b'0' + (ms / 10 % 10) as u8));
        out.push(char::from(b'0' + (ms % 10) as u8));
        out.push('Z');
    }
}

/// `ip:port`; IPv4 without the formatting machinery (most peers).
fn peer_text(peer: SocketAddr, out: &mut String) {
    match peer {
        SocketAddr::V4(v4) => {
            fn push(out: &mut String, n: u64) {
                let (buf, start) = digits(n);
                // Digits are ASCII.
                out.push_str(std::str::from_utf8(&buf[start..]).unwrap_or("?"));
            }
            for (i, octet) in v4.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                push(out, octet.into());
            }
            out.push(':');
            push(out, v4.port().into());
        }
        v6 => {
            let _ = std::fmt::Write::write_fmt(out, format_args!("{v6}"));
        }
    }
}

/// Appends `line` in its format, with a final newline (a one-off
/// [`Formatter`]; the writer keeps one).
#[cfg(test)]
pub fn write_line(line: &Line, out: &mut Vec<u8>) {
    Formatter::default().write_line(line, out);
}

/// A logfmt value: as is when it is plain, else quoted with `"` and `\`
/// escaped and control characters as `\xNN`.
fn value(v: &str, out: &mut Vec<u8>) {
    let plain = !v.is_empty() && plain(v, &PLAIN_TEXT);
    if plain {
        out.extend_from_slice(v.as_bytes());
        return;
    }
    out.push(b'"');
    for c in v.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::header::HeaderValue;

    fn line(format: FileLogFormat) -> Line {
        Line {
            time: UNIX_EPOCH + Duration::from_millis(1_764_580_225_123),
            peer: "192.0.2.7:4711".parse().expect("addr"),
            method: http::Method::GET,
            path: "/api/tenants/acme/apps/1".into(),
            query: None,
            format,
            status: 200,
            cache: Some(HeaderValue::from_static("MISS")),
            route: Some(crate::config::testing::route(
                "  - name: app\n    path: /api/tenants/{t}/apps/{id}\n    params: { t: \".+\", id: \".+\" }\n    ttl: 1s\n",
            )),
            duration: Duration::from_micros(1234),
            upstream: Some(Duration::from_micros(1000)),
            bytes: 42,
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
            request_id: Some(Bytes::from_static(b"r-1")),
        }
    }

    fn render(l: &Line) -> String {
        let mut out = Vec::new();
        write_line(l, &mut out);
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn text_line() {
        assert_eq!(
            render(&line(FileLogFormat::Text)),
            "time=2025-12-01T09:10:25.123Z peer=192.0.2.7:4711 method=GET \
             path=/api/tenants/acme/apps/1 status=200 cache=MISS route=app \
             duration_ms=1.234 upstream_ms=1.000 bytes=42 id=4bf92f3577b34da6a3ce929d0e0e4736\n"
        );
        let mut l = line(FileLogFormat::Text);
        l.query = Some("token=secret".into());
        l.upstream = None;
        l.cache = None;
        l.route = None;
        l.trace_id = None;
        l.request_id = Some(Bytes::from_static(b"a \"b\" c"));
        let text = render(&l);
        assert!(text.contains(" query=\"token=secret\" "), "{text}");
        assert!(text.contains(" cache=- route=- "), "{text}");
        assert!(text.contains(" upstream_ms=- "), "{text}");
        assert!(text.ends_with(" id=\"a \\\"b\\\" c\"\n"), "{text}");
    }

    #[test]
    fn json_line() {
        let text = render(&line(FileLogFormat::Json));
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["time"], "2025-12-01T09:10:25.123Z");
        assert_eq!(v["peer"], "192.0.2.7:4711");
        assert_eq!(v["method"], "GET");
        assert_eq!(v["path"], "/api/tenants/acme/apps/1");
        assert!(v.get("query").is_none(), "query is off by default");
        assert_eq!(v["status"], 200);
        assert_eq!(v["cache"], "MISS");
        assert_eq!(v["route"], "app");
        assert_eq!(v["duration_ms"], 1.234);
        assert_eq!(v["upstream_ms"], 1.0);
        assert_eq!(v["bytes"], 42);
        assert_eq!(v["id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        let mut l = line(FileLogFormat::Json);
        l.upstream = None;
        l.query = Some("token=secret".into());
        let v: serde_json::Value = serde_json::from_str(&render(&l)).expect("json");
        assert!(v["upstream_ms"].is_null());
        assert_eq!(v["query"], "token=secret");
    }

    #[test]
    fn hostile_values_cannot_forge_lines() {
        let mut l = line(FileLogFormat::Text);
        l.trace_id = None;
        l.request_id = Some(Bytes::from_static(b"x\" status=500 \xff\t"));
        let text = render(&l);
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        assert!(text.ends_with(" id=\"x\\\" status=500 ??\"\n"), "{text}");
        // Long ids are cut.
        l.request_id = Some(Bytes::from(vec![b'a'; MAX_ID + 1]));
        assert_eq!(id(&l).expect("id").chars().count(), MAX_ID + 1);
        // A quote or a line break in the path is escaped in both formats.
        l.path = "/a\"b\nc".into();
        let text = render(&l);
        assert!(text.contains(" path=\"/a\\\"b\\x0ac\" "), "{text}");
        l.format = FileLogFormat::Json;
        let json = render(&l);
        assert_eq!(json.matches('\n').count(), 1, "{json}");
        let v: serde_json::Value = serde_json::from_str(&json).expect("json");
        assert_eq!(v["path"], "/a\"b\nc");
    }

    #[test]
    fn trace_ids_follow_w3c_trace_context() {
        let good = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(trace_id(good), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        // A later version may carry more fields.
        assert!(trace_id(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz").is_some());
        for bad in [
            &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz"[..],
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"garbage",
            b"",
        ] {
            assert_eq!(trace_id(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        // Without a (valid) traceparent: the request id.
        let mut l = line(FileLogFormat::Text);
        l.trace_id = None;
        assert_eq!(id(&l).as_deref(), Some("r-1"));
        l.request_id = None;
        assert_eq!(id(&l), None);
    }
}

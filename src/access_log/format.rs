//! One [`Line`] as text (logfmt: `key=value`, values quoted when needed)
//! or as a JSON object, each ending in a newline. Everything that came from
//! the client (path, method, ids) is escaped, so no request can forge a
//! line or break the format, and ids are bounded in length.

use super::{IdKind, Line};
use crate::config::file::FileLogFormat;
use crate::outcome::CacheOutcome;
use std::borrow::Cow;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, UNIX_EPOCH};

/// Client-sent ids longer than this are cut (and marked with `…`).
pub(crate) const MAX_ID: usize = 128;

/// A line's id as written: the trace id as it is; a request id with every
/// byte that is not printable ASCII as `?`, cut at [`MAX_ID`] bytes (and
/// marked with `…`). Borrowed when there is nothing to change.
pub(crate) fn id(kind: IdKind, raw: &[u8]) -> Option<Cow<'_, [u8]>> {
    match kind {
        IdKind::None => None,
        IdKind::Trace => Some(Cow::Borrowed(raw)),
        IdKind::Request
            if raw.len() <= MAX_ID && raw.iter().all(|&b| PRINTABLE[usize::from(b)]) =>
        {
            Some(Cow::Borrowed(raw))
        }
        IdKind::Request => {
            let mut out: Vec<u8> = raw
                .iter()
                .take(MAX_ID)
                .map(|&b| if PRINTABLE[usize::from(b)] { b } else { b'?' })
                .collect();
            if raw.len() > MAX_ID {
                out.extend_from_slice("…".as_bytes());
            }
            Some(Cow::Owned(out))
        }
    }
}

/// The trace id of a `traceparent` value (W3C Trace Context §3.2:
/// `version-traceid-parentid-flags`, lower-case hex, neither id all zeros,
/// version `ff` invalid; later versions may append fields).
pub(crate) fn trace_id(value: &[u8]) -> Option<&str> {
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
pub(crate) struct Formatter {
    /// The second `stamp` is for; `None` before the first line.
    second: Option<u64>,
    /// `YYYY-MM-DDTHH:MM:SS.` of `second`.
    stamp: [u8; 20],
}

/// The constant text around a line's values in one format: each field's
/// separator and key (`,"status":` or ` status=`), and in JSON the quotes
/// that close the string before it and open its own, is one constant, so
/// its copy is a few moves, not a call. Every logged request formats its
/// line on its own thread, so the line is built from these and the
/// values' bytes, without the formatting machinery.
trait Syntax {
    const JSON: bool;
    const TIME: &'static [u8];
    /// Closes the time and opens the peer.
    const PEER: &'static [u8];
    /// Closes the peer and opens the method.
    const METHOD: &'static [u8];
    const PATH: &'static [u8];
    const QUERY: &'static [u8];
    const STATUS: &'static [u8];
    const CACHE: &'static [u8];
    const ROUTE: &'static [u8];
    const DURATION: &'static [u8];
    const UPSTREAM: &'static [u8];
    const BYTES: &'static [u8];
    const ID: &'static [u8];
    const END: &'static [u8];
    const NULL: &'static [u8];
    /// Quotes around a value known to be plain (no escaping needed).
    const QUOTE: &'static [u8];
}

struct Json;
struct Logfmt;

impl Syntax for Json {
    const JSON: bool = true;
    const TIME: &'static [u8] = b"{\"time\":\"";
    const PEER: &'static [u8] = b"Z\",\"peer\":\"";
    const METHOD: &'static [u8] = b"\",\"method\":\"";
    const PATH: &'static [u8] = b"\",\"path\":\"";
    const QUERY: &'static [u8] = b"\",\"query\":\"";
    const STATUS: &'static [u8] = b"\",\"status\":";
    const CACHE: &'static [u8] = b",\"cache\":\"";
    const ROUTE: &'static [u8] = b"\",\"route\":\"";
    const DURATION: &'static [u8] = b"\",\"duration_ms\":";
    const UPSTREAM: &'static [u8] = b",\"upstream_ms\":";
    const BYTES: &'static [u8] = b",\"bytes\":";
    const ID: &'static [u8] = b",\"id\":";
    const END: &'static [u8] = b"}\n";
    const NULL: &'static [u8] = b"null";
    const QUOTE: &'static [u8] = b"\"";
}

impl Syntax for Logfmt {
    const JSON: bool = false;
    const TIME: &'static [u8] = b"time=";
    const PEER: &'static [u8] = b"Z peer=";
    const METHOD: &'static [u8] = b" method=";
    const PATH: &'static [u8] = b" path=";
    const QUERY: &'static [u8] = b" query=";
    const STATUS: &'static [u8] = b" status=";
    const CACHE: &'static [u8] = b" cache=";
    const ROUTE: &'static [u8] = b" route=";
    const DURATION: &'static [u8] = b" duration_ms=";
    const UPSTREAM: &'static [u8] = b" upstream_ms=";
    const BYTES: &'static [u8] = b" bytes=";
    const ID: &'static [u8] = b" id=";
    const END: &'static [u8] = b"\n";
    const NULL: &'static [u8] = b"-";
    const QUOTE: &'static [u8] = b"";
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

/// Printable ASCII, the space included: what a request id keeps.
static PRINTABLE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0x20;
    while b < 0x7f {
        t[b] = true;
        b += 1;
    }
    t
};

/// Whether every byte of `v` is plain in the format (`json`: see
/// [`plain_table`]). Eight bytes at a time (a path is checked for every
/// line; a table lookup per byte cost more: bench/README.md), the tail through
/// the table.
fn plain(v: &[u8], json: bool) -> bool {
    let mut words = v.chunks_exact(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        if !plain_word(u64::from_le_bytes(w), json) {
            return false;
        }
    }
    let table = if json { &PLAIN_JSON } else { &PLAIN_TEXT };
    words.remainder().iter().all(|&b| table[usize::from(b)])
}

/// [`plain_table`] for eight bytes at once: no byte below 0x20 or at or
/// above 0x7f, none a quote or a backslash (or, for logfmt, a space or
/// `=`). The zero-byte tests are exact for "is there one" (a borrow only
/// marks bytes above a byte that is a hit itself).
fn plain_word(x: u64, json: bool) -> bool {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let has_zero = |y: u64| y.wrapping_sub(LO) & !y & HI != 0;
    let has = |b: u8| has_zero(x ^ (LO * u64::from(b)));
    let below_space = x.wrapping_sub(LO * 0x20) & !x & HI != 0;
    let del_or_high = (x | x.wrapping_add(LO)) & HI != 0;
    !(below_space || del_or_high || has(b'"') || has(b'\\') || (!json && (has(b' ') || has(b'='))))
}

/// A string value, escaped as the format needs: in JSON, between the
/// quotes that the keys around it write; in logfmt, quoted when needed.
fn value<S: Syntax>(v: &[u8], out: &mut Vec<u8>) {
    if S::JSON {
        if plain(v, true) {
            return out.extend_from_slice(v);
        }
        // serde_json writes the string with its quotes: in place of the
        // key's opening one, and the next key writes the closing one.
        out.pop();
        // Serializing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, &String::from_utf8_lossy(v));
        out.pop();
    } else if !v.is_empty() && plain(v, false) {
        out.extend_from_slice(v);
    } else {
        quoted(&String::from_utf8_lossy(v), out);
    }
}

/// A value known to need no escaping in either format (sidecache's own
/// words, a trace id's hex digits, a method: HTTP tokens have no quote,
/// backslash, space or `=`), quoted for JSON.
fn plain_value<S: Syntax>(v: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(S::QUOTE);
    out.extend_from_slice(v);
    out.extend_from_slice(S::QUOTE);
}

fn uint(n: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Milliseconds with three decimals (microsecond resolution).
fn millis(d: Duration, out: &mut Vec<u8>) {
    // Not `as_micros`: its u128 arithmetic costs more than the rest.
    let micros = d
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()));
    uint(micros / 1000, out);
    let frac = micros % 1000;
    out.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

impl Formatter {
    /// Appends `line`, which started at `time` (since the Unix epoch), in
    /// its format, with a final newline.
    pub(crate) fn write_line(&mut self, line: &Line, time: Duration, out: &mut Vec<u8>) {
        match line.format {
            FileLogFormat::Json => self.write::<Json>(line, time, out),
            FileLogFormat::Text => self.write::<Logfmt>(line, time, out),
        }
    }

    fn write<S: Syntax>(&mut self, line: &Line, time: Duration, out: &mut Vec<u8>) {
        out.extend_from_slice(S::TIME);
        self.time(time, out);
        out.extend_from_slice(S::PEER);
        peer_text(line.peer, out);
        // The method: a token (see `plain_value`); JSON's quotes are in the
        // keys around it.
        out.extend_from_slice(S::METHOD);
        out.extend_from_slice(line.method.as_str().as_bytes());
        out.extend_from_slice(S::PATH);
        value::<S>(line.text.path(), out);
        if let Some(query) = line.text.query() {
            out.extend_from_slice(S::QUERY);
            value::<S>(query, out);
        }
        out.extend_from_slice(S::STATUS);
        status(line.status, out);
        // The cache word: sidecache's own (see `plain_value`).
        out.extend_from_slice(S::CACHE);
        out.extend_from_slice(line.cache.map_or("-", CacheOutcome::as_str).as_bytes());
        out.extend_from_slice(S::ROUTE);
        let route = line.route.as_ref().map_or("-", |r| r.name.as_str());
        value::<S>(route.as_bytes(), out);
        out.extend_from_slice(S::DURATION);
        millis(line.duration, out);
        out.extend_from_slice(S::UPSTREAM);
        match line.upstream {
            Some(d) => millis(d, out),
            None => out.extend_from_slice(S::NULL),
        }
        out.extend_from_slice(S::BYTES);
        uint(line.bytes, out);
        out.extend_from_slice(S::ID);
        match line.text.id() {
            (IdKind::None, _) => out.extend_from_slice(S::NULL),
            (IdKind::Trace, hex) => plain_value::<S>(hex, out),
            (IdKind::Request, raw) => match id(IdKind::Request, raw) {
                Some(id) => {
                    out.extend_from_slice(S::QUOTE);
                    value::<S>(&id, out);
                    out.extend_from_slice(S::QUOTE);
                }
                None => out.extend_from_slice(S::NULL),
            },
        }
        out.extend_from_slice(S::END);
    }

    /// `YYYY-MM-DDTHH:MM:SS.mmm` (UTC; the format's key text adds the
    /// `Z`).
    fn time(&mut self, since: Duration, out: &mut Vec<u8>) {
        let secs = since.as_secs();
        if self.second != Some(secs) {
            let whole = UNIX_EPOCH + Duration::from_secs(secs);
            let text = humantime::format_rfc3339_seconds(whole).to_string();
            // `YYYY-MM-DDTHH:MM:SSZ` for every time after 1970 and before
            // the year 10000; anything else keeps the epoch's text.
            let mut stamp = *b"1970-01-01T00:00:00.";
            if let Some(head) = text.as_bytes().get(..19) {
                stamp[..19].copy_from_slice(head);
            }
            self.stamp = stamp;
            self.second = Some(secs);
        }
        let ms = since.subsec_millis();
        out.extend_from_slice(&self.stamp);
        out.extend_from_slice(&[
            b'0' + (ms / 100) as u8,
            b'0' + (ms / 10 % 10) as u8,
            b'0' + (ms % 10) as u8,
        ]);
    }
}

/// `ip:port`; IPv4 without the formatting machinery (most peers), built
/// on the stack and appended with one copy.
fn peer_text(peer: SocketAddr, out: &mut Vec<u8>) {
    match peer {
        SocketAddr::V4(v4) => {
            let mut text = [0u8; 21]; // 255.255.255.255:65535
            let mut len = 0;
            for octet in v4.ip().octets() {
                // Each octet with its separator (`.`, the last `:`) from
                // the table: one 4-byte copy.
                let (digits, n) = OCTETS[usize::from(octet)];
                text[len..len + 4].copy_from_slice(&digits);
                len += usize::from(n);
            }
            // The last octet's separator is the port's `:`.
            text[len - 1] = b':';
            let mut digits = itoa::Buffer::new();
            let port = digits.format(v4.port()).as_bytes();
            text[len..len + port.len()].copy_from_slice(port);
            out.extend_from_slice(&text[..len + port.len()]);
        }
        v6 => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// Every octet's decimal digits followed by `.`, and how many bytes of
/// that are the octet's text and dot.
static OCTETS: [([u8; 4], u8); 256] = {
    let mut t = [([0u8; 4], 0u8); 256];
    let mut n = 0;
    while n < 256 {
        let (h, d, o) = ((n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8);
        t[n] = if n >= 100 {
            ([b'0' + h, b'0' + d, b'0' + o, b'.'], 4)
        } else if n >= 10 {
            ([b'0' + d, b'0' + o, b'.', 0], 3)
        } else {
            ([b'0' + o, b'.', 0, 0], 2)
        };
        n += 1;
    }
    t
};

/// An HTTP status: three digits (hyper's `StatusCode` is 100-999), one
/// copy; anything else through `itoa`.
fn status(code: u16, out: &mut Vec<u8>) {
    if (100..1000).contains(&code) {
        out.extend_from_slice(&[
            b'0' + (code / 100) as u8,
            b'0' + (code / 10 % 10) as u8,
            b'0' + (code % 10) as u8,
        ]);
    } else {
        uint(u64::from(code), out);
    }
}

/// Appends `line` in its format, with a final newline (a one-off
/// [`Formatter`]; each shard keeps one).
#[cfg(test)]
pub(crate) fn write_line(line: &Line, time: std::time::SystemTime, out: &mut Vec<u8>) {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    Formatter::default().write_line(line, since, out);
}

/// A logfmt value that is not plain: quoted with `"`, and `\` escaped
/// and control characters as `\xNN`.
fn quoted(v: &str, out: &mut Vec<u8>) {
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
    use crate::access_log::Text;
    use std::time::Instant;

    const TIME_MS: u64 = 1_764_580_225_123;

    fn line(format: FileLogFormat) -> Line {
        Line {
            start: Instant::now(),
            peer: "192.0.2.7:4711".parse().expect("addr"),
            method: http::Method::GET,
            format,
            status: 200,
            cache: Some(CacheOutcome::Miss),
            route: Some(crate::config::testing::route(
                "  - name: app\n    path: /api/tenants/{t}/apps/{id}\n    params: { t: \".+\", id: \".+\" }\n    ttl: 1s\n",
            )),
            duration: Duration::from_micros(1234),
            upstream: Some(Duration::from_micros(1000)),
            bytes: 42,
            text: Text::new(
                "/api/tenants/acme/apps/1",
                None,
                Some((IdKind::Trace, b"4bf92f3577b34da6a3ce929d0e0e4736")),
            ),
        }
    }

    fn render(l: &Line) -> String {
        let mut out = Vec::new();
        write_line(l, UNIX_EPOCH + Duration::from_millis(TIME_MS), &mut out);
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
        l.text = Text::new(
            "/api/tenants/acme/apps/1",
            Some("token=secret"),
            Some((IdKind::Request, b"a \"b\" c")),
        );
        l.upstream = None;
        l.cache = None;
        l.route = None;
        let text = render(&l);
        assert!(text.contains(" query=\"token=secret\" "), "{text}");
        assert!(text.contains(" cache=- route=- "), "{text}");
        assert!(text.contains(" upstream_ms=- "), "{text}");
        assert!(text.ends_with(" id=\"a \\\"b\\\" c\"\n"), "{text}");
        l.text = Text::new("/", None, None);
        assert!(render(&l).ends_with(" id=-\n"));
    }

    #[test]
    fn json_line() {
        let text = render(&line(FileLogFormat::Json));
        assert_eq!(
            text,
            "{\"time\":\"2025-12-01T09:10:25.123Z\",\"peer\":\"192.0.2.7:4711\",\"method\":\"GET\",\
             \"path\":\"/api/tenants/acme/apps/1\",\"status\":200,\"cache\":\"MISS\",\"route\":\"app\",\
             \"duration_ms\":1.234,\"upstream_ms\":1.000,\"bytes\":42,\"id\":\"4bf92f3577b34da6a3ce929d0e0e4736\"}\n"
        );
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
        l.text = Text::new("/a", Some("token=secret"), None);
        let v: serde_json::Value = serde_json::from_str(&render(&l)).expect("json");
        assert!(v["upstream_ms"].is_null());
        assert!(v["id"].is_null());
        assert_eq!(v["query"], "token=secret");
    }

    #[test]
    fn ipv4_peers_of_every_length() {
        for peer in [
            "0.0.0.0:0",
            "10.9.99.100:8080",
            "255.255.255.255:65535",
            "127.0.0.1:1",
        ] {
            let mut out = Vec::new();
            peer_text(peer.parse().expect("addr"), &mut out);
            assert_eq!(String::from_utf8(out).expect("utf-8"), peer);
        }
    }

    #[test]
    fn ipv6_peers_and_times_in_the_same_second() {
        let mut l = line(FileLogFormat::Json);
        l.peer = "[2001:db8::1]:443".parse().expect("addr");
        let mut f = Formatter::default();
        let mut out = Vec::new();
        let t = Duration::from_millis(TIME_MS);
        f.write_line(&l, t, &mut out);
        f.write_line(&l, t + Duration::from_millis(800), &mut out);
        f.write_line(&l, t + Duration::from_millis(900), &mut out);
        let times: Vec<String> = String::from_utf8(out)
            .expect("utf-8")
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json");
                assert_eq!(v["peer"], "[2001:db8::1]:443");
                v["time"].as_str().expect("time").to_owned()
            })
            .collect();
        assert_eq!(
            times,
            [
                "2025-12-01T09:10:25.123Z",
                "2025-12-01T09:10:25.923Z",
                "2025-12-01T09:10:26.023Z"
            ]
        );
    }

    #[test]
    fn hostile_values_cannot_forge_lines() {
        let mut l = line(FileLogFormat::Text);
        l.text = Text::new("/", None, Some((IdKind::Request, b"x\" status=500 \xff\t")));
        let text = render(&l);
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        assert!(text.ends_with(" id=\"x\\\" status=500 ??\"\n"), "{text}");
        l.format = FileLogFormat::Json;
        let v: serde_json::Value = serde_json::from_str(&render(&l)).expect("json");
        assert_eq!(v["id"], "x\" status=500 ??");
        l.format = FileLogFormat::Text;
        // Long ids are cut.
        let long = vec![b'a'; MAX_ID + 1];
        let cut = id(IdKind::Request, &long).expect("id");
        assert_eq!(String::from_utf8_lossy(&cut).chars().count(), MAX_ID + 1);
        assert!(cut.ends_with("…".as_bytes()));
        // A quote or a line break in the path is escaped in both formats.
        l.text = Text::new("/a\"b\nc", None, None);
        let text = render(&l);
        assert!(text.contains(" path=\"/a\\\"b\\x0ac\" "), "{text}");
        l.format = FileLogFormat::Json;
        let json = render(&l);
        assert_eq!(json.matches('\n').count(), 1, "{json}");
        let v: serde_json::Value = serde_json::from_str(&json).expect("json");
        assert_eq!(v["path"], "/a\"b\nc");
    }

    #[test]
    fn the_word_check_agrees_with_the_tables() {
        for json in [true, false] {
            let table = if json { &PLAIN_JSON } else { &PLAIN_TEXT };
            for b in 0..=255u8 {
                // The byte at every place of a word, and in the tail.
                for at in 0..11 {
                    let mut v = vec![b'a'; 11];
                    v[at] = b;
                    assert_eq!(plain(&v, json), table[usize::from(b)], "{b:#x} at {at}");
                }
            }
            // A borrow or carry from a neighbour marks nothing plain.
            for pair in [[0x1f, 0x21], [0x7e, 0x7e], [0xff, 0x7e], [0x20, 0x1f]] {
                let v = [pair[0], pair[1], b'a', b'a', b'a', b'a', b'a', b'a'];
                let want = v.iter().all(|&b| table[usize::from(b)]);
                assert_eq!(plain(&v, json), want, "{v:?}");
            }
        }
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
        assert_eq!(id(IdKind::None, b""), None);
        assert_eq!(id(IdKind::Request, b"r-1").as_deref(), Some(&b"r-1"[..]));
    }
}

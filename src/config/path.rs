//! The normal form of a request path, in which route templates are matched
//! (docs/configuration.md#path-normalisation). Normalising first means that no
//! spelling of a path (`/static/../admin`, `/static/%2e%2e/admin`,
//! `/static//x`) can match a cached route that the path does not name once
//! resolved, and that every spelling of one object reads and fills the same
//! entry.
//!
//! Rules, in order, per segment:
//! 1. percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are
//!    decoded (`%41` → `A`, `%2e` → `.`); other escapes stay, with upper-case
//!    hex (`%c3%a9` → `%C3%A9`), RFC 3986 §6.2.2.1-2;
//! 2. empty segments (`//`) are merged, except a trailing slash, which stays;
//! 3. `.` and `..` segments are resolved (RFC 3986 §5.2.4); `..` above the
//!    root stays at the root.
//!
//! Paths that origins resolve in incompatible ways have no trusted normal
//! form ([`Ambiguous`]) and are never a cache read: an encoded `/` or `\`
//! (`%2F`, `%5C`), a raw `\`, an encoded NUL, a broken escape (`%zz`, `%`),
//! a dot segment carrying `;` parameters (`..;`, which some servers resolve
//! as `..`).
//!
//! A path without escapes, `//` or segments starting with `.` is normal as
//! it is and returned without allocating after one cheap pass: that is
//! nearly every path a client sends.

use std::borrow::Cow;

/// Why a path has no normal form sidecache trusts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Ambiguous {
    #[error("a '%' not followed by two hex digits")]
    BadEscape,
    #[error("an encoded '/' or '\\' inside a segment")]
    EncodedSeparator,
    #[error("a '\\' in the path")]
    Backslash,
    #[error("an encoded NUL")]
    EncodedNul,
    #[error("a dot segment with ';' parameters")]
    DotParams,
}

/// The normal form of `path` (which starts with `/`; anything else is
/// returned unchanged and matches no template).
pub(crate) fn normalize(path: &str) -> Result<Cow<'_, str>, Ambiguous> {
    if is_normal(path) {
        return Ok(Cow::Borrowed(path));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Ok(Cow::Borrowed(path));
    };
    // `..` above the root stays at the root (RFC 3986 §5.2.4).
    let Resolved { segments, trailing } = resolve(rest, Above::Clamp)?.unwrap_or_default();
    let mut normal = String::with_capacity(path.len());
    for seg in &segments {
        normal.push('/');
        normal.push_str(seg);
    }
    if trailing || segments.is_empty() {
        normal.push('/');
    }
    Ok(Cow::Owned(normal))
}

/// A param value as a request path would carry it, normalised the same way
/// (so an invalidation event names the object a read of that path would):
/// `prefix` values may span segments (`css/site.css`), others are one
/// segment. `None`: no path that matches the route could carry this value
/// (empty, a `/` in a one-segment value, a `..` that climbs out of the
/// value into the template, ambiguous).
pub(crate) fn normalize_value(value: &str, prefix: bool) -> Option<String> {
    let Resolved { segments, trailing } = resolve(value, Above::Refuse).ok()??;
    let fits = !segments.is_empty() && (prefix || (segments.len() == 1 && !trailing));
    if !fits {
        return None;
    }
    let mut out = segments.join("/");
    if trailing {
        out.push('/');
    }
    Some(out)
}

/// What a `..` above the start does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Above {
    /// Stays at the start (a whole path: the root).
    Clamp,
    /// Has no meaning (a value: it would climb into the template).
    Refuse,
}

#[derive(Default)]
struct Resolved {
    segments: Vec<String>,
    /// Ends with `/` (also after a final `.` or `..`).
    trailing: bool,
}

/// Rules 1-3 over the segments of `rest` (a path without its leading `/`,
/// or a value). `Ok(None)`: a `..` above the start, with [`Above::Refuse`].
fn resolve(rest: &str, above: Above) -> Result<Option<Resolved>, Ambiguous> {
    let mut out = Resolved::default();
    let mut raw = rest.split('/').peekable();
    while let Some(seg) = raw.next() {
        let last = raw.peek().is_none();
        let seg = decode_segment(seg)?;
        match seg.as_ref() {
            "" | "." => out.trailing = last,
            ".." => {
                if out.segments.pop().is_none() && above == Above::Refuse {
                    return Ok(None);
                }
                out.trailing = last;
            }
            _ => {
                out.segments.push(seg.into_owned());
                out.trailing = false;
            }
        }
    }
    Ok(Some(out))
}

/// True if `segment` is a template literal that a normal path can contain:
/// non-empty, not a dot segment, and its own normal form.
pub(crate) fn is_normal_segment(segment: &str) -> bool {
    !matches!(segment, "" | "." | "..")
        && !segment.starts_with(".;")
        && !segment.starts_with("..;")
        && matches!(decode_segment(segment), Ok(Cow::Borrowed(_)))
}

/// The fast check (it runs on every request): true if `path` has no
/// escape, no `\\`, no `//` and no segment starting with `.`, so it is
/// normal as it is. Anything else takes the slow path, which judges it (a
/// segment like `.well-known` comes back unchanged from there).
///
/// Eight bytes at a time (SWAR): a byte loop was over the hit path's budget
/// (bench/README.md). [`is_normal_bytewise`] is the plain statement of the same
/// rule; a test holds them equal.
fn is_normal(path: &str) -> bool {
    let bytes = path.as_bytes();
    let mut chunks = bytes.chunks_exact(8);
    // Whether the byte before the current chunk was '/'.
    let mut carry = false;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        if eq_mask(w, b'%') | eq_mask(w, b'\\') != 0 {
            return false;
        }
        let slash = eq_mask(w, b'/');
        let next_bad = slash | eq_mask(w, b'.');
        // Byte i+1 sits 8 bits above byte i (little-endian).
        if (slash << 8) & next_bad != 0 || (carry && next_bad & 0x80 != 0) {
            return false;
        }
        carry = slash >> 63 != 0;
    }
    let rest = chunks.remainder();
    match rest.first() {
        Some(b'/' | b'.') if carry => false,
        _ => is_normal_bytewise(rest),
    }
}

/// 0x80 in every byte of `w` equal to `c`, 0 elsewhere (exact, no carries
/// between bytes).
fn eq_mask(w: u64, c: u8) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let x = w ^ (u64::from(c) * 0x0101_0101_0101_0101);
    !(((x & LOW7) + LOW7) | x | LOW7)
}

/// [`is_normal`], one byte at a time.
fn is_normal_bytewise(bytes: &[u8]) -> bool {
    let mut after_slash = false;
    for &b in bytes {
        match b {
            b'%' | b'\\' => return false,
            b'/' | b'.' if after_slash => return false,
            _ => after_slash = b == b'/',
        }
    }
    true
}

/// Rule 1 for one segment, plus the ambiguity checks that need decoding.
fn decode_segment(seg: &str) -> Result<Cow<'_, str>, Ambiguous> {
    if seg.contains('\\') {
        return Err(Ambiguous::Backslash);
    }
    let decoded = if seg.contains('%') {
        Cow::Owned(decode_unreserved(seg)?)
    } else {
        Cow::Borrowed(seg)
    };
    if decoded.starts_with(".;") || decoded.starts_with("..;") {
        return Err(Ambiguous::DotParams);
    }
    // Unchanged text borrows, so callers can tell a normal segment apart.
    match decoded {
        Cow::Owned(s) if s == seg => Ok(Cow::Borrowed(seg)),
        other => Ok(other),
    }
}

fn decode_unreserved(seg: &str) -> Result<String, Ambiguous> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = seg.as_bytes();
    let mut out = String::with_capacity(seg.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            // Copy up to the next escape as text (keeps multi-byte chars whole).
            let end = seg[i..].find('%').map_or(seg.len(), |n| i + n);
            out.push_str(&seg[i..end]);
            i = end;
            continue;
        }
        let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
        let (Some(hi), Some(lo)) = (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) else {
            return Err(Ambiguous::BadEscape);
        };
        let b = (hi * 16 + lo) as u8;
        match b {
            b'/' | b'\\' => return Err(Ambiguous::EncodedSeparator),
            0 => return Err(Ambiguous::EncodedNul),
            b if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') => {
                out.push(b as char)
            }
            b => {
                out.push('%');
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 0x0f)] as char);
            }
        }
        i += 3;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(p: &str) -> Result<String, Ambiguous> {
        normalize(p).map(Cow::into_owned)
    }

    #[test]
    fn normal_paths_are_borrowed_unchanged() {
        for p in [
            "/",
            "/api/tenants/acme/apps/42",
            "/docs/",
            "/a.b/c..d/e...",
            "/static/a;b",
        ] {
            assert!(
                matches!(normalize(p), Ok(Cow::Borrowed(b)) if b == p),
                "{p}: {:?}",
                normalize(p)
            );
        }
        // Escapes and dot-led segments are checked on the slow path, and
        // come back unchanged.
        assert_eq!(norm("/x/%C3%A9%20").as_deref(), Ok("/x/%C3%A9%20"));
        assert_eq!(norm("/.well-known/x").as_deref(), Ok("/.well-known/x"));
        assert_eq!(norm("/a/.e/...").as_deref(), Ok("/a/.e/..."));
    }

    #[test]
    fn the_word_check_is_the_byte_check() {
        // Every string over the interesting bytes up to length 11 would be
        // 7^11; instead: each pair of special bytes at every offset of
        // paths of 1..=24 bytes (chunk edges at 8 and 16), on a plain base.
        let special = [b'/', b'.', b'%', b'\\', b'a'];
        for len in 1..=24 {
            for i in 0..len {
                for j in i..len {
                    for &x in &special {
                        for &y in &special {
                            let mut p = vec![b'a'; len];
                            p[i] = x;
                            p[j] = y;
                            let p = String::from_utf8(p).expect("ascii");
                            assert_eq!(is_normal(&p), is_normal_bytewise(p.as_bytes()), "{p:?}");
                        }
                    }
                }
            }
        }
        assert!(is_normal("/api/tenants/acme/apps/1"));
        assert!(!is_normal("/api/tenants/acme/apps/.x"));
        assert!(!is_normal("/api/ten/./acme"));
        assert!(!is_normal("/api/tena//acme"));
        assert!(!is_normal("/api/tenants/acme/%41"));
    }

    #[test]
    fn dots_slashes_and_escapes_resolve() {
        let cases = [
            ("/static/../admin", "/admin"),
            ("/static/%2e%2e/admin", "/admin"),
            ("/static/%2E./admin", "/admin"),
            ("/static/.%2e/admin", "/admin"),
            ("/static/./a", "/static/a"),
            ("/static//a", "/static/a"),
            ("//static///a//", "/static/a/"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/..", "/"),
            ("/../../x", "/x"),
            ("/..", "/"),
            ("//", "/"),
            ("/%41%7e%2D", "/A~-"),
            ("/x/%c3%a9", "/x/%C3%A9"),
            ("/x/%3a%20", "/x/%3A%20"),
        ];
        for (raw, want) in cases {
            assert_eq!(norm(raw).as_deref(), Ok(want), "{raw}");
            // Idempotent: the normal form is its own normal form.
            assert_eq!(norm(want).as_deref(), Ok(want), "{want}");
        }
    }

    #[test]
    fn ambiguous_paths_have_no_normal_form() {
        let cases = [
            ("/static/a%2Fb", Ambiguous::EncodedSeparator),
            ("/static/a%2f..%2fadmin", Ambiguous::EncodedSeparator),
            ("/static/a%5Cb", Ambiguous::EncodedSeparator),
            ("/static/a\\b", Ambiguous::Backslash),
            ("/static/..\\admin", Ambiguous::Backslash),
            ("/static/a%00.css", Ambiguous::EncodedNul),
            ("/static/100%", Ambiguous::BadEscape),
            ("/static/%zz", Ambiguous::BadEscape),
            ("/static/%2", Ambiguous::BadEscape),
            ("/static/..;/admin", Ambiguous::DotParams),
            ("/static/.;x/a", Ambiguous::DotParams),
            ("/static/%2e%2e;/admin", Ambiguous::DotParams),
        ];
        for (raw, want) in cases {
            assert_eq!(norm(raw), Err(want), "{raw}");
        }
    }

    #[test]
    fn values_normalise_like_the_paths_that_carry_them() {
        assert_eq!(
            normalize_value("css/./site.css", true).as_deref(),
            Some("css/site.css")
        );
        assert_eq!(normalize_value("/css//a", true).as_deref(), Some("css/a"));
        assert_eq!(normalize_value("a/", true).as_deref(), Some("a/"));
        assert_eq!(normalize_value("%7e", false).as_deref(), Some("~"));
        assert_eq!(normalize_value("42", false).as_deref(), Some("42"));
        assert_eq!(normalize_value("a/../b", true).as_deref(), Some("b"));
        for (bad, prefix) in [
            ("a/b", false),
            ("a/", false),
            ("..", true),
            // `/static/../x` is not under /static/ at all.
            ("../x", true),
            ("a/../../x", true),
            ("%2e%2e/x", true),
            ("", true),
            ("a/..", true),
            ("a%2Fb", true),
            ("100%", false),
        ] {
            assert_eq!(normalize_value(bad, prefix), None, "{bad}");
        }
    }

    #[test]
    fn template_literals_must_be_normal() {
        for ok in ["api", "a.b", "%C3%A9", "v1;x"] {
            assert!(is_normal_segment(ok), "{ok}");
        }
        for bad in ["", ".", "..", "%7e", "%c3%a9", "a%2Fb", "..;x", "a\\b"] {
            assert!(!is_normal_segment(bad), "{bad}");
        }
    }
}

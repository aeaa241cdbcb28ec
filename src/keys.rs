//! The key layout (docs/architecture.md#key-layout), shared by the read
//! pipeline (stage 1: [`cache_key`]), invalidation (generation keys) and the
//! Bloom filter ([`bloom_keys`]). Identity = route name + param values; variant
//! = a hash of the normalized query (per the route's `query` mode) and the
//! values of the route's `vary` headers. Object keys are
//! `<ns>o:{<route>:<p1>:<p2>…}:e:v3:<variant>` (entry), `…:g` (generation),
//! `…:l:<variant>` (lease), `…:f` (version floor); tag generations
//! `<ns>t:{<tag>}:g`; Bloom keys `<ns>b:{<route>:<scope>}:<suffix>`.
//! One hash tag per object (and per filter), so all its keys live in one
//! Redis Cluster slot and `MGET` and scripts work.

use crate::config::query_ignore::QueryIgnore;
use crate::config::{QueryMode, Route};
use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};
use std::fmt::Write;

/// The keys of one object variant, all in one hash slot
/// (docs/architecture.md#key-layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectKeys {
    /// The three keys one after another: one allocation per read, not
    /// three (every cache read builds them; a hit uses only the first).
    buf: String,
    entry_end: usize,
    generation_end: usize,
}

impl ObjectKeys {
    pub fn from_parts(entry: &str, generation: &str, lease: &str) -> ObjectKeys {
        let mut buf = String::with_capacity(entry.len() + generation.len() + lease.len());
        buf.push_str(entry);
        buf.push_str(generation);
        buf.push_str(lease);
        ObjectKeys {
            buf,
            entry_end: entry.len(),
            generation_end: entry.len() + generation.len(),
        }
    }

    /// `<ns>o:{<route>:<params>}:e:v3:<variant>`
    pub fn entry(&self) -> &str {
        &self.buf[..self.entry_end]
    }

    /// `<ns>o:{<route>:<params>}:g`
    pub fn generation(&self) -> &str {
        &self.buf[self.entry_end..self.generation_end]
    }

    /// `<ns>o:{<route>:<params>}:l:<variant>`
    pub fn lease(&self) -> &str {
        &self.buf[self.generation_end..]
    }
}

/// The keys of one filter (`<ns>b:{<route>:<scope>}:<suffix>`,
/// docs/architecture.md#key-layout). Built by [`bloom_keys`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BloomKeys {
    /// `…:bits`: the active bitmap.
    pub bits: String,
    /// `…:ready`: the active bitmap's signature; absent = filter unknown.
    pub ready: String,
    /// `…:build-lock`: owner token of the running build.
    pub lock: String,
    /// `…:build:`; a build's candidate is this plus its owner token.
    pub candidate_prefix: String,
    /// `…:built`: a scheduled rebuild's claim on the current
    /// `rebuild_every`, so the fleet rebuilds a filter once per interval.
    pub interval: String,
}

impl BloomKeys {
    /// `…:build:<owner>`: the candidate bitmap of the build owned by `owner`.
    pub fn candidate(&self, owner: &str) -> String {
        format!("{}{owner}", self.candidate_prefix)
    }
}

/// The keys of one filter: `<ns>b:{<route>:<scope>}:<suffix>`. The scope
/// value is percent-encoded like a param, so it cannot leave the hash tag.
pub fn bloom_keys(namespace: &str, route: &str, scope: &str) -> BloomKeys {
    let mut tag = String::with_capacity(route.len() + scope.len() + 1);
    tag.push_str(route);
    tag.push(':');
    encode_param(scope, &mut tag);
    let base = format!("{namespace}b:{{{tag}}}:");
    BloomKeys {
        bits: format!("{base}bits"),
        ready: format!("{base}ready"),
        lock: format!("{base}build-lock"),
        candidate_prefix: format!("{base}build:"),
        interval: format!("{base}built"),
    }
}

/// Where a request's cached answer lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKey {
    /// `<route>:<p1>:<p2>…`, params percent-encoded; embedded in entries.
    pub identity: String,
    /// Hex digest of query + vary values; embedded in entries.
    pub variant: String,
    /// The normalized query string sent upstream on a fill (no leading `?`).
    pub query: String,
    pub keys: ObjectKeys,
}

/// `<route>:<p1>:<p2>…`, every param percent-encoded.
pub fn identity<S: AsRef<str>>(route: &str, params: &[S]) -> String {
    let mut id = String::with_capacity(
        route.len() + params.iter().map(|p| p.as_ref().len() + 1).sum::<usize>(),
    );
    id.push_str(route);
    for p in params {
        id.push(':');
        encode_param(p.as_ref(), &mut id);
    }
    id
}

/// Appends `value`, percent-encoding every character that could close the
/// hash tag, split the key or make two objects collide: `{ } : %`,
/// whitespace and control characters. Other Unicode stays as it is.
pub(crate) fn encode_param(value: &str, out: &mut String) {
    // Most values are plain ASCII: one byte test each instead of decoding
    // chars for the Unicode whitespace and control checks.
    let plain = |b: &u8| b.is_ascii_graphic() && !matches!(b, b'{' | b'}' | b':' | b'%');
    if value.as_bytes().iter().all(plain) {
        out.push_str(value);
        return;
    }
    let mut start = 0;
    for (i, c) in value.char_indices() {
        let unsafe_char = matches!(c, '{' | '}' | ':' | '%') || c.is_whitespace() || c.is_control();
        if unsafe_char {
            out.push_str(&value[start..i]);
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).as_bytes() {
                let _ = write!(out, "%{b:02X}");
            }
            start = i + c.len_utf8();
        }
    }
    out.push_str(&value[start..]);
}

/// The generation key of an object, for invalidation (no variant needed).
pub fn generation_key(namespace: &str, identity: &str) -> String {
    format!("{namespace}o:{{{identity}}}:g")
}

/// The version floor of an object (`…:f`, same slot as its generation):
/// the highest revision an invalidation named; fills below it are not
/// published.
pub(crate) fn floor_key(namespace: &str, identity: &str) -> String {
    format!("{namespace}o:{{{identity}}}:f")
}

/// The request header names an object's answers vary on beyond the
/// route's `vary` (`…:n`, space-separated, sorted; routes with
/// `vary_from_origin`), learned from the answers' own `Vary`: which
/// headers the next fill carries and the variant is keyed on.
pub(crate) fn vary_names_key(namespace: &str, identity: &str) -> String {
    format!("{namespace}o:{{{identity}}}:n")
}

/// The tags an object's last answer carried (`…:t`, space-separated), so
/// a fill can take their tickets before its upstream call.
pub(crate) fn tag_list_key(namespace: &str, identity: &str) -> String {
    format!("{namespace}o:{{{identity}}}:t")
}

/// A feed's witness slots: `<ns>w:{<feed>}:<i>` for `i` in `0..k`, one
/// hash tag so that `lua/witness.lua` sees them all on Cluster.
pub(crate) fn witness_keys(namespace: &str, feed: &str, k: u32) -> Vec<String> {
    let mut tag = String::with_capacity(feed.len());
    encode_param(feed, &mut tag);
    (0..k)
        .map(|i| format!("{namespace}w:{{{tag}}}:{i}"))
        .collect()
}

/// The generation key of a cache tag: `<ns>t:{<tag>}:g`, the tag
/// percent-encoded like a param. Each tag is its own hash slot.
pub(crate) fn tag_generation_key(namespace: &str, tag: &str) -> String {
    let mut key = String::with_capacity(namespace.len() + tag.len() + 6);
    key.push_str(namespace);
    key.push_str("t:{");
    encode_param(tag, &mut key);
    key.push_str("}:g");
    key
}

/// The generation of a whole route: `<ns>r:{<route>}:g`. Every entry of
/// the route is stamped with it like with a tag, so replacing it (a
/// route-wide purge) makes every entry of the route unservable at once.
pub(crate) fn route_generation_key(namespace: &str, route: &str) -> String {
    let mut key = String::with_capacity(namespace.len() + route.len() + 6);
    key.push_str(namespace);
    key.push_str("r:{");
    encode_param(route, &mut key);
    key.push_str("}:g");
    key
}

/// Change capture's record that every mapped route was purged since its
/// replication slot was created: `<ns>c:{<slot>}:purged`.
pub(crate) fn capture_marker_key(namespace: &str, slot: &str) -> String {
    let mut key = String::with_capacity(namespace.len() + slot.len() + 12);
    key.push_str(namespace);
    key.push_str("c:{");
    encode_param(slot, &mut key);
    key.push_str("}:purged");
    key
}

pub(crate) fn object_keys(namespace: &str, identity: &str, variant: &str) -> ObjectKeys {
    // Concatenation instead of `format!`: this runs on every cache read and
    // the formatting machinery cost more than the rest of the key (callgrind).
    let prefix = namespace.len() + identity.len() + 5;
    let (entry_len, generation_len) = (prefix + 5 + variant.len(), prefix + 1);
    let mut buf = String::with_capacity(entry_len + generation_len + prefix + 2 + variant.len());
    for (suffix, variant) in [("e:v3:", variant), ("g", ""), ("l:", variant)] {
        buf.push_str(namespace);
        buf.push_str("o:{");
        buf.push_str(identity);
        buf.push_str("}:");
        buf.push_str(suffix);
        buf.push_str(variant);
    }
    ObjectKeys {
        buf,
        entry_end: entry_len,
        generation_end: entry_len + generation_len,
    }
}

/// The query as it takes part in the key and the fill request: `include`
/// sorts all pairs, `ignore` drops it, an allow-list keeps only those names
/// (sorted); pairs `ignore` names (`query_ignore`) are dropped in every mode.
/// Pairs are compared as written (no decoding), so two spellings of one
/// value are two variants, never one poisoned entry.
pub(crate) fn normalize_query(mode: &QueryMode, ignore: &QueryIgnore, raw: Option<&str>) -> String {
    let raw = match (mode, raw) {
        (QueryMode::Ignore, _) | (_, None) => return String::new(),
        (_, Some(q)) => q,
    };
    let mut pairs: Vec<&str> = raw
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| match mode {
            QueryMode::Allow(names) => is_listed(names, p),
            _ => true,
        })
        .filter(|p| !ignore.drops(p))
        .collect();
    pairs.sort_unstable();
    pairs.join("&")
}

/// True if `raw` names a parameter outside an allow-list (`query: [..]`)
/// that `ignore` does not drop either. Such a request is not cached
/// (BYPASS): dropping the parameter from the key would serve one cached
/// answer for requests the service may answer differently, and keeping it
/// would let random values (cache-busting) turn every request into a fill.
/// `include` and `ignore` never refuse; an ignored parameter never does
/// (the operator said it does not change the answer).
pub(crate) fn has_unlisted_param(
    mode: &QueryMode,
    ignore: &QueryIgnore,
    raw: Option<&str>,
) -> bool {
    let (QueryMode::Allow(names), Some(raw)) = (mode, raw) else {
        return false;
    };
    raw.split('&')
        .filter(|p| !p.is_empty())
        .any(|p| !is_listed(names, p) && !ignore.drops(p))
}

/// Whether the name of the query pair `pair` (`name` or `name=value`) is
/// one of `names`.
fn is_listed(names: &[String], pair: &str) -> bool {
    let name = pair.split_once('=').map_or(pair, |(n, _)| n);
    names.iter().any(|n| n == name)
}

/// Hex digest (128 bits) of the normalized query, the values of the
/// route's `vary` headers and of `learned` (the names an object's answers
/// vary on, `vary_from_origin`; sorted, none of them in `vary`). Names are
/// hashed with their values, so an entry stored under a variant is the
/// answer for exactly those names and values, whatever is learned later.
/// An absent header and an empty one are different variants, and no value
/// reads as "absent" (`\x01` cannot occur in a header value).
pub(crate) fn variant(
    query: &str,
    route: &Route,
    learned: &[HeaderName],
    headers: &HeaderMap,
) -> String {
    // The common case (no query, no vary) hashes nothing: its digest is
    // that of the empty input, a constant.
    if query.is_empty() && route.vary.is_empty() && learned.is_empty() {
        return EMPTY_VARIANT.to_owned();
    }
    let mut h = Sha256::new();
    h.update(query.as_bytes());
    for name in route.vary.iter().chain(learned) {
        h.update(b"\n");
        h.update(name.as_str().as_bytes());
        let mut values = headers.get_all(name).iter().peekable();
        if values.peek().is_none() {
            h.update(b"\x01");
        }
        for v in values {
            h.update(b"\x00");
            h.update(v.as_bytes());
        }
    }
    hex128(&h.finalize())
}

/// [`variant`] of an empty query without vary headers: the first 128 bits
/// of SHA-256 of the empty input (checked by a test).
const EMPTY_VARIANT: &str = "e3b0c44298fc1c149afbf4c8996fb924";

/// Lower-case hex of the first 16 bytes (a `write!` per byte costs ~15x more).
fn hex128(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(32);
    for &b in &digest[..16] {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0x0f)] as char);
    }
    out
}

/// Builds the whole key for a request on `route`; `learned`: the header
/// names the object varies on beyond `vary` (see [`variant`]).
pub(crate) fn cache_key<S: AsRef<str>>(
    namespace: &str,
    route: &Route,
    params: &[S],
    raw_query: Option<&str>,
    learned: &[HeaderName],
    headers: &HeaderMap,
) -> CacheKey {
    let identity = identity(&route.name, params);
    let query = normalize_query(&route.query, &route.query_ignore, raw_query);
    let variant = variant(&query, route, learned, headers);
    let keys = object_keys(namespace, &identity, &variant);
    CacheKey {
        identity,
        variant,
        query,
        keys,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag_and_encode_the_scope() {
        let k = bloom_keys("sc:", "app", "acme");
        assert_eq!(k.bits, "sc:b:{app:acme}:bits");
        assert_eq!(k.ready, "sc:b:{app:acme}:ready");
        assert_eq!(k.lock, "sc:b:{app:acme}:build-lock");
        assert_eq!(k.candidate("u1"), "sc:b:{app:acme}:build:u1");
        // A scope value cannot close the tag or split the key.
        let k = bloom_keys("sc:", "app", "a}b:c d");
        assert_eq!(k.bits, "sc:b:{app:a%7Db%3Ac%20d}:bits");
        assert_eq!(bloom_keys("sc:", "app", "").bits, "sc:b:{app:}:bits");
    }

    fn route() -> std::sync::Arc<Route> {
        crate::config::testing::route(
            r#"  - name: app
    path: /t/{tenant}/a/{id}
    params: { tenant: ".+", id: ".+" }
    vary: [Accept]
    ttl: 1s
"#,
        )
    }

    #[test]
    fn keys_share_one_hash_tag() {
        let k = object_keys("sc:", "app:acme:42", "v");
        assert_eq!(k.entry(), "sc:o:{app:acme:42}:e:v3:v");
        assert_eq!(k.generation(), "sc:o:{app:acme:42}:g");
        assert_eq!(k.lease(), "sc:o:{app:acme:42}:l:v");
        assert_eq!(
            k,
            ObjectKeys::from_parts(k.entry(), k.generation(), k.lease())
        );
        let k = object_keys("", "a", "");
        assert_eq!(
            (k.entry(), k.generation(), k.lease()),
            ("o:{a}:e:v3:", "o:{a}:g", "o:{a}:l:")
        );
    }

    #[test]
    fn hostile_params_cannot_move_the_slot_or_collide() {
        let hostile = [
            "a}b",
            "{x}",
            "a:b",
            "line\r\nbreak",
            "tab\there",
            "100%",
            "日本",
            "%7B",
        ];
        let mut seen = std::collections::HashSet::new();
        for h in hostile {
            let id = identity("app", &[h, "1"]);
            // Exactly the tag we open, no other braces, separators only ours.
            assert!(!id.contains(['{', '}', '\r', '\n', '\t', ' ']), "{id}");
            assert_eq!(id.matches(':').count(), 2, "{id}");
            assert!(seen.insert(id.clone()), "collision for {h:?}: {id}");
        }
        assert_eq!(identity("app", &["日本"]), "app:日本");
        assert_eq!(identity("app", &["a:b"]), "app:a%3Ab");
        // "a:b" as one param must differ from params "a" and "b".
        assert_ne!(identity("app", &["a:b"]), identity("app", &["a", "b"]));
        // A literal "%3A" must not collide with an encoded ':'.
        assert_ne!(identity("app", &["%3A"]), identity("app", &[":"]));
    }

    fn tracking() -> QueryIgnore {
        use crate::config::query_ignore::ParamGlob;
        let glob = |t: &str| ParamGlob::parse(t).expect("valid pattern");
        QueryIgnore::new(vec![glob("utm_*"), glob("fbclid")])
    }

    #[test]
    fn query_modes() {
        let none = QueryIgnore::default();
        let q = Some("b=2&a=1&&c=3");
        assert_eq!(
            normalize_query(&QueryMode::Include, &none, q),
            "a=1&b=2&c=3"
        );
        assert_eq!(normalize_query(&QueryMode::Ignore, &none, q), "");
        assert_eq!(
            normalize_query(&QueryMode::Allow(vec!["a".into(), "c".into()]), &none, q),
            "a=1&c=3"
        );
        assert_eq!(normalize_query(&QueryMode::Include, &none, None), "");
    }

    #[test]
    fn ignored_params_leave_the_normalized_query() {
        let q = Some("utm_source=news&b=2&fbclid=x&a=1&utm_medium");
        let allow = QueryMode::Allow(vec!["a".into()]);
        assert_eq!(
            normalize_query(&QueryMode::Include, &tracking(), q),
            "a=1&b=2"
        );
        assert_eq!(normalize_query(&allow, &tracking(), q), "a=1");
        assert_eq!(
            normalize_query(&QueryMode::Include, &tracking(), Some("utm_source=x")),
            normalize_query(&QueryMode::Include, &tracking(), None)
        );
        // Names only: a value that looks like one is kept.
        assert_eq!(
            normalize_query(&QueryMode::Include, &tracking(), Some("ref=utm_x")),
            "ref=utm_x"
        );
    }

    #[test]
    fn unlisted_params_are_found_only_for_allow_lists() {
        let none = QueryIgnore::default();
        let allow = QueryMode::Allow(vec!["a".into(), "c".into()]);
        assert!(has_unlisted_param(&allow, &none, Some("a=1&bust=9")));
        assert!(has_unlisted_param(&allow, &none, Some("bust")));
        assert!(!has_unlisted_param(&allow, &none, Some("c=3&a=1&&")));
        assert!(!has_unlisted_param(&allow, &none, None));
        assert!(!has_unlisted_param(
            &QueryMode::Include,
            &none,
            Some("bust=1")
        ));
        assert!(!has_unlisted_param(
            &QueryMode::Ignore,
            &none,
            Some("bust=1")
        ));
        // Ignored parameters are never a reason to bypass.
        assert!(!has_unlisted_param(
            &allow,
            &tracking(),
            Some("a=1&utm_source=x&fbclid=y")
        ));
        assert!(has_unlisted_param(
            &allow,
            &tracking(),
            Some("a=1&utm_source=x&bust=1")
        ));
    }

    #[test]
    fn variants_follow_query_and_vary_headers() {
        let r = route();
        let mut json = HeaderMap::new();
        json.insert("accept", "application/json".parse().expect("value"));
        let mut empty = HeaderMap::new();
        empty.insert("accept", "".parse().expect("value"));
        let none = HeaderMap::new();
        let mut other = HeaderMap::new();
        other.insert("user-agent", "x".parse().expect("value"));
        let v = |q: &str, h: &HeaderMap| variant(q, &r, &[], h);
        assert_ne!(v("", &json), v("", &none));
        assert_ne!(v("", &empty), v("", &none));
        assert_ne!(v("a=1", &none), v("", &none));
        // Headers outside `vary` do not split the cache.
        assert_eq!(v("", &other), v("", &none));
        assert_eq!(v("", &json).len(), 32);
        // No value reads as the header's absence.
        let mut absent = HeaderMap::new();
        absent.insert("accept", "absent".parse().expect("value"));
        assert_ne!(v("", &absent), v("", &none));
    }

    #[test]
    fn learned_names_split_variants_by_their_values() {
        let r = route();
        let abc = [HeaderName::from_static("abc")];
        let with = |val: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("abc", val.parse().expect("value"));
            h
        };
        let none = HeaderMap::new();
        let v = |learned: &[HeaderName], h: &HeaderMap| variant("", &r, learned, h);
        assert_ne!(v(&abc, &with("1")), v(&abc, &with("2")));
        assert_ne!(v(&abc, &with("1")), v(&abc, &none));
        // Learning a name is a different variant even for requests without it.
        assert_ne!(v(&abc, &none), v(&[], &none));
        // Unlearned headers do not split the cache.
        assert_eq!(v(&[], &with("1")), v(&[], &none));
    }

    #[test]
    fn empty_variant_is_the_digest_of_nothing() {
        let mut plain = route();
        std::sync::Arc::get_mut(&mut plain)
            .expect("unshared")
            .vary
            .clear();
        assert_eq!(
            variant("", &plain, &[], &HeaderMap::new()),
            hex128(&Sha256::digest(b""))
        );
        assert_eq!(variant("", &plain, &[], &HeaderMap::new()), EMPTY_VARIANT);
        // With a query the digest is computed, and differs.
        assert_ne!(
            variant("a=1", &plain, &[], &HeaderMap::new()),
            EMPTY_VARIANT
        );
        let mut hex = String::new();
        for b in &Sha256::digest(b"a=1")[..16] {
            let _ = write!(hex, "{b:02x}");
        }
        assert_eq!(variant("a=1", &plain, &[], &HeaderMap::new()), hex);
    }
}

//! Origin-driven variants (`vary_from_origin`): the request header names an
//! object's answers name in `Vary`, learned per object and stored beside
//! its entries under the object's hash tag (`keys::vary_names_key`).
//!
//! What keeps the cache-poisoning defence
//! (docs/architecture.md#fills-are-built-from-the-key): names come only from
//! the origin's answers, never from a client, and are bounded
//! (`max_vary_headers`); a fill carries exactly the learned names' values
//! from the client, and the variant hashes the names with those values. An
//! answer is stored under the variant of the names *it* declares and the
//! values its fill *sent* (absent for a name the fill did not carry), so
//! an entry is the origin's answer for exactly its key, whatever is
//! learned later: stale or lost names can cost a miss, never serve a
//! client another variant's answer. A request whose variant under the
//! answer's names differs from the answer's (it sent a header the fill did
//! not carry) is keyed again with those names and fetches its own answer
//! ([`not_this_variant`]).

use super::cache_control::learned_vary;
use super::flight::Answer;
use crate::config::{Config, Route};
use crate::store::GuardedStore;
use http::header::{self, HeaderMap, HeaderName};

/// The names learned for the object of `params` on `route` (empty: none
/// learned yet, or the store could not say; the lookup that follows then
/// decides between a miss and the degraded path).
pub(crate) async fn learned(
    store: &GuardedStore,
    cfg: &Config,
    route: &Route,
    params: &[String],
) -> Vec<HeaderName> {
    let Some(bounds) = route.origin_vary else {
        return Vec::new();
    };
    let identity = crate::keys::identity(&route.name, params);
    let key = crate::keys::vary_names_key(&cfg.store.namespace, &identity);
    match store.read_tags(&[key.as_str()]).await {
        Ok(values) => values
            .into_iter()
            .next()
            .flatten()
            .map(|v| parse(&v, route, bounds.max_headers))
            .unwrap_or_default(),
        Err(e) => {
            tracing::debug!(route = %route.name, error = %e, "learned vary names unreadable");
            Vec::new()
        }
    }
}

/// The stored form of `names`: space-separated (already sorted).
pub(crate) fn text(names: &[HeaderName]) -> String {
    let mut out = String::new();
    for n in names {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(n.as_str());
    }
    out
}

/// Reads a stored list back, within the route's current bound (the list
/// may predate a reload that lowered it: then it counts as not learned).
fn parse(stored: &[u8], route: &Route, max: usize) -> Vec<HeaderName> {
    let mut names: Vec<HeaderName> = Vec::new();
    for part in stored.split(|b| *b == b' ').filter(|p| !p.is_empty()) {
        let Ok(name) = HeaderName::from_bytes(part) else {
            return Vec::new();
        };
        if !route.vary.contains(&name) && !names.contains(&name) {
            names.push(name);
        }
    }
    if names.len() > max {
        return Vec::new();
    }
    names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
    names
}

/// Whether the client sends a value of a learned header longer than `max`
/// bytes (then the request is forwarded uncached).
pub(crate) fn too_long(headers: &HeaderMap, learned: &[HeaderName], max: usize) -> bool {
    learned
        .iter()
        .any(|n| headers.get_all(n).iter().map(|v| v.len()).sum::<usize>() > max)
}

/// The names to key this client's request with again, if `answer` is an
/// answer of another variant: its `Vary` names headers the key did not
/// include, and this client's values of them differ from what the fill
/// sent. `None`: the answer is this client's (or carries no entry).
pub(crate) fn not_this_variant(
    route: &Route,
    answer: &Answer,
    query: &str,
    client: &HeaderMap,
) -> Option<Vec<HeaderName>> {
    let bounds = route.origin_vary?;
    let entry = match answer {
        Answer::Shared(_, e, _) | Answer::Starter(_, e) => e,
        Answer::Streaming(_, s) => &s.head,
        Answer::Exclusive(..) | Answer::Failed(..) => return None,
    };
    let named = |h: HeaderName| {
        entry
            .headers
            .iter()
            .filter(move |(n, _)| *n == h)
            .map(|(_, v)| v)
    };
    let coded =
        named(header::CONTENT_ENCODING).any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    let names = learned_vary(named(header::VARY), coded, &route.vary, bounds.max_headers).ok()?;
    let own = crate::keys::variant(query, route, &names, client);
    (own != entry.variant).then_some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> std::sync::Arc<Route> {
        crate::config::testing::route(
            "  - { name: app, path: \"/a/{id}\", params: { id: \"[0-9]+\" }, ttl: 10s, vary: [accept], vary_from_origin: true, max_vary_headers: 2 }\n",
        )
    }

    #[test]
    fn stored_names_round_trip_within_the_bound() {
        let r = route();
        let names = vec![
            HeaderName::from_static("abc"),
            HeaderName::from_static("zed"),
        ];
        assert_eq!(text(&names), "abc zed");
        assert_eq!(parse(b"zed abc", &r, 2), names);
        // Keyed names are not learned twice; garbage and excess are dropped.
        assert_eq!(parse(b"accept abc", &r, 2), names[..1].to_vec());
        assert!(parse(b"a b c", &r, 2).is_empty());
        assert!(parse(b"bad\x01name", &r, 2).is_empty());
        let mut h = HeaderMap::new();
        h.insert("abc", "x".repeat(10).parse().expect("value"));
        assert!(too_long(&h, &names, 9));
        assert!(!too_long(&h, &names, 10));
    }
}

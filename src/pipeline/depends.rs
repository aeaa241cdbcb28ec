//! What an entry depends on besides its object's generation
//! (docs/invalidation.md#dependent-invalidation): its route's generation,
//! the object's version floor (`version_from`) and cache tags
//! (`tags_from`). All keep the guarantee of
//! docs/architecture.md#fills-cannot-backfill-stale-data:
//!
//! - **The route.** Every fill takes its route's generation as a ticket
//!   with the lease (one more store call per fill), every entry is stamped
//!   with it, and publish and every hit check it like a tag's: a route-wide
//!   purge replaces it, O(1), and no fill that began before the purge is
//!   served after it.
//! - **Tags.** Before its upstream call a fill reads the tags the object's
//!   last answer carried (`…:t`) and takes their tickets (current tag
//!   generations, created if missing), reading the store's clock in the
//!   same step: the fill's start. An answer whose tags are all among them
//!   is stamped with those tickets; publish re-checks them (in the script
//!   on a single node), and every hit checks them again. For a tag the fill
//!   holds no ticket for (a first fill, a changed tag set), one atomic step
//!   at publish reads its generation (created if missing) and accepts it
//!   only if it was made before the fill's start: no invalidation of that
//!   tag happened during the fill. Otherwise, or where there is no one
//!   clock to compare with (Redis Cluster), it is not published, and its
//!   tags are remembered so the next fill takes their tickets.
//! - **Floors.** An answer's version (the `version_from` header: an
//!   integer, or a numeric `ETag`) below the object's floor is not
//!   published (`below_floor`); the publish script compares it.

use crate::keys;
use crate::store::{FillDepends, GuardedStore, StoreError};
use bytes::Bytes;
use http::HeaderMap;

/// The tickets a fill took before its upstream call: its route's
/// generation (every entry is stamped with it, so a route-wide purge
/// reaches every entry) and, with `tags_from`, the generations of the tags
/// the object's last answer carried.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tickets {
    /// (route generation key, ticket).
    route: (String, Bytes),
    /// The object's tag list key (`tags_from` only).
    pub(crate) list_key: Option<String>,
    /// (tag, tag generation key, ticket), sorted by tag.
    tags: Vec<(String, String, Bytes)>,
    /// The store's clock when the tickets were taken, where all tag keys
    /// share one clock (`tags_from`, not on a cluster).
    pub(crate) start: Option<Bytes>,
}

/// What a fill's answer carries, judged against the tickets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// (generation key, ticket): the route's first, then one per tag of
    /// the answer.
    Stamps(Vec<(String, Bytes)>),
    /// The answer carries tags the fill holds no ticket for: the stamps of
    /// the route and the ticketed tags, and the tags without a ticket.
    Unticketed {
        stamps: Vec<(String, Bytes)>,
        missing: Vec<String>,
    },
}

impl Tickets {
    /// Takes the route's ticket and, with `tags_from`, reads the object's
    /// last tag list and takes tickets for its tags, in one store call.
    pub(crate) async fn take(
        store: &GuardedStore,
        namespace: &str,
        route: &str,
        identity: &str,
        tags_from: bool,
        nonce: &str,
        gen_ttl: std::time::Duration,
    ) -> Result<Tickets, StoreError> {
        let route_key = keys::route_generation_key(namespace, route);
        let (list_key, tags) = match tags_from {
            false => (None, Vec::new()),
            true => {
                let list_key = keys::tag_list_key(namespace, identity);
                let list = store.read_tags(&[list_key.as_str()]).await?;
                let tags: Vec<String> = list
                    .into_iter()
                    .flatten()
                    .next()
                    .map(|l| {
                        String::from_utf8_lossy(&l)
                            .split(' ')
                            .filter(|t| crate::tags::check(t).is_ok())
                            .take(crate::tags::MAX_TAGS)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                (Some(list_key), tags)
            }
        };
        let mut gen_keys = Vec::with_capacity(tags.len() + 1);
        gen_keys.push(route_key);
        gen_keys.extend(tags.iter().map(|t| keys::tag_generation_key(namespace, t)));
        let (generations, start) = match tags_from {
            true => store.tag_tickets_timed(&gen_keys, nonce, gen_ttl).await?,
            false => (store.tag_tickets(&gen_keys, nonce, gen_ttl).await?, None),
        };
        let mut generations = generations.into_iter();
        let mut gen_keys = gen_keys.into_iter();
        let (Some(route_key), Some(route_ticket)) = (gen_keys.next(), generations.next()) else {
            return Err(StoreError::Protocol("no ticket for the route".into()));
        };
        let mut tags: Vec<_> = tags
            .into_iter()
            .zip(gen_keys)
            .zip(generations)
            .map(|((t, k), g)| (t, k, g))
            .collect();
        tags.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(Tickets {
            route: (route_key, route_ticket),
            list_key,
            tags,
            start,
        })
    }

    /// What the fill depends on, as recorded beside its lease: the route's
    /// ticket and those of the tags it took tickets for.
    pub(crate) fn depends(&self) -> FillDepends {
        FillDepends {
            route: Some(self.route.clone()),
            tags: self
                .tags
                .iter()
                .map(|(_, key, ticket)| (key.clone(), ticket.clone()))
                .collect(),
        }
    }

    /// Stamps for an answer with `tags` (sorted, as `tags::from_header`
    /// returns them): the route's ticket, then each tag's.
    pub(crate) fn stamp(&self, tags: &[String]) -> Stamp {
        let mut stamps = Vec::with_capacity(tags.len() + 1);
        stamps.push(self.route.clone());
        let mut missing = Vec::new();
        for tag in tags {
            match self.tags.binary_search_by(|t| t.0.as_str().cmp(tag)) {
                Ok(i) => stamps.push((self.tags[i].1.clone(), self.tags[i].2.clone())),
                Err(_) => missing.push(tag.clone()),
            }
        }
        match missing.is_empty() {
            true => Stamp::Stamps(stamps),
            false => Stamp::Unticketed { stamps, missing },
        }
    }
}

/// The answer's version from `header`: an integer, or an `ETag` whose
/// opaque value is one (`"7"`, `W/"7"`). `None`: absent or not a number.
pub(crate) fn version(headers: &HeaderMap, header: &http::HeaderName) -> Option<i64> {
    let text = headers.get(header)?.to_str().ok()?.trim();
    let text = text.strip_prefix("W/").unwrap_or(text);
    let text = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    #[test]
    fn versions_from_numbers_and_numeric_etags() {
        let name = HeaderName::from_static("x-revision");
        let at = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(name.clone(), HeaderValue::from_static(v));
            version(&h, &name)
        };
        assert_eq!(at("7"), Some(7));
        assert_eq!(at(" 12 "), Some(12));
        assert_eq!(at("\"7\""), Some(7));
        assert_eq!(at("W/\"8\""), Some(8));
        assert_eq!(at("\"abc\""), None);
        assert_eq!(at(""), None);
        assert_eq!(version(&HeaderMap::new(), &name), None);
    }

    #[test]
    fn the_route_and_only_ticketed_tags_are_stamped() {
        let route = ("sc:r:{a}:g".to_owned(), Bytes::from_static(b"gr"));
        let t = Tickets {
            route: route.clone(),
            list_key: Some("sc:o:{a:1}:t".into()),
            tags: vec![
                ("a".into(), "sc:t:{a}:g".into(), Bytes::from_static(b"ga")),
                ("b".into(), "sc:t:{b}:g".into(), Bytes::from_static(b"gb")),
            ],
            start: None,
        };
        assert_eq!(
            t.stamp(&["b".into()]),
            Stamp::Stamps(vec![
                route.clone(),
                ("sc:t:{b}:g".into(), Bytes::from_static(b"gb"))
            ])
        );
        assert_eq!(t.stamp(&[]), Stamp::Stamps(vec![route.clone()]));
        assert_eq!(
            t.stamp(&["a".into(), "c".into()]),
            Stamp::Unticketed {
                stamps: vec![route, ("sc:t:{a}:g".into(), Bytes::from_static(b"ga"))],
                missing: vec!["c".into()]
            }
        );
    }
}

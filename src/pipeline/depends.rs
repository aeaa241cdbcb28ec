//! What an entry depends on besides its object's generation
//! (docs/invalidation.md#dependent-invalidation): the object's version floor
//! (`version_from`) and cache tags (`tags_from`). Both keep the guarantee of
//! docs/architecture.md#fills-cannot-backfill-stale-data:
//!
//! - **Tags.** Before its upstream call a fill reads the tags the object's
//!   last answer carried (`…:t`) and takes their tickets (current tag
//!   generations, created if missing). An answer whose tags are all among
//!   them is stamped with those tickets; publish re-checks them (in the
//!   script on a single node), and every hit checks them again. An answer
//!   with a tag the fill holds no ticket for cannot prove that tag was not
//!   invalidated during the fill: it is not published (`tags_changed`),
//!   and its tags are remembered so the next fill takes their tickets.
//! - **Floors.** An answer's version (the `version_from` header: an
//!   integer, or a numeric `ETag`) below the object's floor is not
//!   published (`below_floor`); the publish script compares it.

use crate::keys;
use crate::store::{GuardedStore, StoreError};
use bytes::Bytes;
use http::HeaderMap;

/// Tag tickets a fill took before its upstream call.
#[derive(Debug, Clone, Default)]
pub(crate) struct TagTickets {
    /// The object's tag list key.
    pub list_key: String,
    /// (tag, tag generation key, ticket), sorted by tag.
    tickets: Vec<(String, String, Bytes)>,
}

/// What a fill's answer carries, judged against the tickets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// (tag generation key, ticket) per tag of the answer.
    Tags(Vec<(String, Bytes)>),
    /// The answer carries tags the fill holds no ticket for: these are its
    /// tags, to remember for the next fill.
    Unticketed(Vec<String>),
}

impl TagTickets {
    /// Reads the object's last tag list and takes tickets for its tags.
    pub(crate) async fn take(
        store: &GuardedStore,
        namespace: &str,
        identity: &str,
        nonce: &str,
        gen_ttl: std::time::Duration,
    ) -> Result<TagTickets, StoreError> {
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
        let tag_keys: Vec<String> = tags
            .iter()
            .map(|t| keys::tag_generation_key(namespace, t))
            .collect();
        let generations = match tag_keys.is_empty() {
            true => Vec::new(),
            false => store.tag_tickets(&tag_keys, nonce, gen_ttl).await?,
        };
        let mut tickets: Vec<_> = tags
            .into_iter()
            .zip(tag_keys)
            .zip(generations)
            .map(|((t, k), g)| (t, k, g))
            .collect();
        tickets.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(TagTickets { list_key, tickets })
    }

    /// Stamps for an answer with `tags` (sorted, as `tags::from_header`
    /// returns them).
    pub(crate) fn stamp(&self, tags: &[String]) -> Stamp {
        let mut stamps = Vec::with_capacity(tags.len());
        for tag in tags {
            match self.tickets.binary_search_by(|t| t.0.as_str().cmp(tag)) {
                Ok(i) => stamps.push((self.tickets[i].1.clone(), self.tickets[i].2.clone())),
                Err(_) => return Stamp::Unticketed(tags.to_vec()),
            }
        }
        Stamp::Tags(stamps)
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
    fn only_ticketed_tags_are_stamped() {
        let t = TagTickets {
            list_key: "sc:o:{a:1}:t".into(),
            tickets: vec![
                ("a".into(), "sc:t:{a}:g".into(), Bytes::from_static(b"ga")),
                ("b".into(), "sc:t:{b}:g".into(), Bytes::from_static(b"gb")),
            ],
        };
        assert_eq!(
            t.stamp(&["b".into()]),
            Stamp::Tags(vec![("sc:t:{b}:g".into(), Bytes::from_static(b"gb"))])
        );
        assert_eq!(t.stamp(&[]), Stamp::Tags(vec![]));
        assert_eq!(
            t.stamp(&["a".into(), "c".into()]),
            Stamp::Unticketed(vec!["a".into(), "c".into()])
        );
    }
}

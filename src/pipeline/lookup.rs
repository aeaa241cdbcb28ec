//! Stages 2 and 3: read the entry and the object's generation in one round
//! trip, then decide whether the entry may be served. Only an entry that
//! decodes, names this request's identity and variant, and carries the
//! current generation is a hit, and only while it is fresh; an expired one
//! of the current generation is returned as [`Found::Expired`] for the
//! stale rules (grace, stale-if-error) to judge. An entry of another
//! generation, or with no readable generation, is a miss in every mode
//! (docs/architecture.md#the-serving-rule). So is an entry stamped with a tag
//! generation that is no longer current. A corrupt entry is removed with a
//! compare-and-delete (so a fresh entry written meanwhile survives).

use super::answer::Prepared;
use super::entry::Entry;
use crate::keys::CacheKey;
use crate::metrics::Metrics;
use crate::store::{GuardedStore, Snapshot, StoreError};
use bytes::Bytes;
use std::sync::Arc;

/// The verdict of stage 3 on one snapshot.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Hit(Entry),
    /// No entry, or one stamped with an old generation; with the
    /// generation read (none if the key is missing).
    Miss(Option<Bytes>),
    /// Undecodable, or it names another object or variant.
    Corrupt(&'static str, Bytes),
}

/// Stage 3, pure: judges a snapshot for `key`.
pub(crate) fn check_entry(snapshot: Snapshot, key: &CacheKey) -> Verdict {
    let Some(raw) = snapshot.entry else {
        return Verdict::Miss(snapshot.generation);
    };
    let entry = match Entry::decode(&raw) {
        Ok(e) => e,
        Err(e) => return Verdict::Corrupt(e.0, raw),
    };
    match current(&entry, snapshot.generation.as_ref(), key) {
        Err(why) => Verdict::Corrupt(why, raw),
        Ok(true) => Verdict::Hit(entry),
        Ok(false) => Verdict::Miss(snapshot.generation),
    }
}

/// Stage 3's test of a decoded entry: it must name `key`'s identity and
/// variant (else it is corrupt), and it is a hit only under the generation
/// read with it. A missing generation (evicted, restarted) can only mean a
/// miss: the entry cannot be proven current.
fn current(
    entry: &Entry,
    generation: Option<&Bytes>,
    key: &CacheKey,
) -> Result<bool, &'static str> {
    if entry.identity != key.identity || entry.variant != key.variant {
        return Err("identity or variant mismatch");
    }
    Ok(generation == Some(&entry.generation))
}

/// What stages 2+3 found for a key.
#[derive(Debug)]
pub(crate) enum Found {
    /// Current generation and fresh: a HIT.
    Fresh(Entry),
    /// Current generation but past its freshness: servable only as STALE,
    /// within its windows.
    Expired(Entry),
    /// Nothing servable; the object's generation as read (none: the key is
    /// missing). A miss joins only fills of this generation
    /// (docs/architecture.md#no-older-answer-after-an-invalidation).
    Miss(Option<Bytes>),
}

impl Found {
    /// The fresh entry, if any (an expired one is not a hit).
    pub(crate) fn fresh(self) -> Option<Entry> {
        match self {
            Found::Fresh(e) => Some(e),
            Found::Expired(_) | Found::Miss(_) => None,
        }
    }
}

/// Splits a current-generation entry by its freshness at `now_ms`.
pub(crate) fn by_freshness(entry: Entry, now_ms: u64) -> Found {
    if entry.expired(now_ms) {
        Found::Expired(entry)
    } else {
        Found::Fresh(entry)
    }
}

/// Stages 2+3: read, judge, and remove a corrupt entry.
pub(crate) async fn lookup(
    store: &GuardedStore,
    key: &CacheKey,
    route: &str,
    metrics: &Metrics,
) -> Result<Found, StoreError> {
    let snapshot = store.read(&key.keys).await?;
    resolve(store, key, check_entry(snapshot, key), route, metrics).await
}

/// What the near cache said about a key before [`lookup_from`] runs.
#[derive(Debug, Default)]
pub(crate) enum Near {
    /// Not asked: the read asks it.
    #[default]
    Unasked,
    /// It holds nothing for the key (or there is none): the store is read
    /// past it.
    Nothing,
    /// Its entry, judged, but not a fresh hit (boxed: rare, and large).
    Held(Box<Verdict>),
}

/// Stages 2+3 from the near cache alone, without waiting: the entry if it
/// is a fresh hit (current generation, every stamped tag current), exactly
/// as [`lookup`] would find it. Otherwise what was found, for
/// [`lookup_from`]. The entry is decoded (and its head built) once per
/// near-cache copy, in its [`crate::store::Memo`], and shared by every
/// hit on it; each hit still makes every check.
pub(crate) fn near_hit(store: &GuardedStore, key: &CacheKey) -> Result<Arc<Prepared>, Near> {
    let snapshot = store.read_near(&key.keys).ok_or(Near::Nothing)?;
    let prepared = match (&snapshot.memo, &snapshot.entry) {
        (Some(memo), Some(raw)) => memo.get_or_make(|| Entry::decode(raw).ok().map(Prepared::new)),
        _ => None,
    };
    if let Some(p) = prepared {
        let e = &p.entry;
        // Tags the near cache does not hold (or that moved) take the
        // async path, which asks the store.
        if current(e, snapshot.generation.as_ref(), key) == Ok(true)
            && (e.tags.is_empty() || store.tags_current_near(&e.tags) == Some(true))
            && !e.expired(super::publish::now_ms())
        {
            return Ok(p);
        }
    }
    // Not a fresh hit: judged the long way, for `lookup_from` (rare).
    Err(Near::Held(Box::new(check_entry(snapshot, key))))
}

/// [`lookup`], going on from what the near cache said.
pub(crate) async fn lookup_from(
    store: &GuardedStore,
    key: &CacheKey,
    near: Near,
    route: &str,
    metrics: &Metrics,
) -> Result<Found, StoreError> {
    let verdict = match near {
        Near::Unasked => check_entry(store.read(&key.keys).await?, key),
        Near::Nothing => check_entry(store.read_far(&key.keys).await?, key),
        Near::Held(verdict) => *verdict,
    };
    resolve(store, key, verdict, route, metrics).await
}

/// Stage 3 after [`check_entry`]: the tag check, freshness, and the removal
/// of a corrupt entry.
async fn resolve(
    store: &GuardedStore,
    key: &CacheKey,
    verdict: Verdict,
    route: &str,
    metrics: &Metrics,
) -> Result<Found, StoreError> {
    match verdict {
        // An untagged entry costs nothing more here.
        Verdict::Hit(e) if !e.tags.is_empty() && !tags_current(store, &e).await? => {
            Ok(Found::Miss(Some(e.generation)))
        }
        Verdict::Hit(e) => Ok(by_freshness(e, super::publish::now_ms())),
        Verdict::Miss(generation) => Ok(Found::Miss(generation)),
        Verdict::Corrupt(why, raw) => {
            metrics.corrupt.with_label_values(&[route]).inc();
            tracing::warn!(key = %key.keys.entry(), reason = why, "corrupt cache entry removed");
            // Failure to delete is harmless: the entry is never served and
            // the next publish overwrites it.
            let _ = store.delete_if_equals(key.keys.entry(), &raw).await;
            // Rare: the request then takes a ticket for its generation.
            Ok(Found::Miss(None))
        }
    }
}

/// Stage 3 for a tagged entry: every tag generation it was stamped with
/// is still the current one (a missing one is not: a lost tag record can
/// only cause misses). From the near cache where it holds them, else in
/// one more round trip.
async fn tags_current(store: &GuardedStore, entry: &Entry) -> Result<bool, StoreError> {
    store.tags_current(&entry.tags).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::object_keys;

    fn key() -> CacheKey {
        CacheKey {
            identity: "app:acme:1".into(),
            variant: "v1".into(),
            query: String::new(),
            keys: object_keys("sc:", "app:acme:1", "v1"),
        }
    }

    fn entry(generation: &'static [u8], identity: &str) -> Entry {
        Entry {
            status: 200,
            negative: false,
            stored_at_ms: 1,
            fresh_until_ms: 100,
            grace_ms: 50,
            stale_if_error_ms: 0,
            generation: Bytes::from_static(generation),
            identity: Bytes::copy_from_slice(identity.as_bytes()),
            variant: "v1".into(),
            headers: vec![],
            body: Bytes::from_static(b"x"),
            tags: vec![],
        }
    }

    fn snap(e: Option<Bytes>, g: Option<&'static [u8]>) -> Snapshot {
        Snapshot {
            entry: e,
            generation: g.map(Bytes::from_static),
            memo: None,
        }
    }

    #[test]
    fn verdicts() {
        let good = entry(b"g1", "app:acme:1");
        let raw = good.encode();
        assert_eq!(
            check_entry(snap(Some(raw.clone()), Some(b"g1")), &key()),
            Verdict::Hit(good)
        );
        // Invalidated: generation moved on; the miss carries the new one.
        assert_eq!(
            check_entry(snap(Some(raw.clone()), Some(b"g2")), &key()),
            Verdict::Miss(Some(Bytes::from_static(b"g2")))
        );
        // Generation lost (eviction/restart): never a hit.
        assert_eq!(
            check_entry(snap(Some(raw), None), &key()),
            Verdict::Miss(None)
        );
        assert_eq!(
            check_entry(snap(None, Some(b"g1")), &key()),
            Verdict::Miss(Some(Bytes::from_static(b"g1")))
        );
        let other = entry(b"g1", "app:globex:1").encode();
        assert!(matches!(
            check_entry(snap(Some(other), Some(b"g1")), &key()),
            Verdict::Corrupt("identity or variant mismatch", _)
        ));
        // An expired entry of the current generation is not a hit, and its
        // windows decide what it may still do.
        let e = entry(b"g1", "app:acme:1");
        assert!(matches!(by_freshness(e.clone(), 99), Found::Fresh(_)));
        assert!(matches!(by_freshness(e.clone(), 100), Found::Expired(_)));
        assert!(e.within_grace(149) && !e.within_grace(150) && !e.within_grace(99));
        assert!(!e.within_stale_if_error(120));
        let garbage = Bytes::from_static(b"not an entry");
        assert!(matches!(
            check_entry(snap(Some(garbage), Some(b"g1")), &key()),
            Verdict::Corrupt(_, _)
        ));
    }
}

//! The near cache: an in-process copy of recently read objects in front of
//! Redis (single node, Sentinel's primary, or each master of a Cluster),
//! kept coherent by Redis's server-assisted client-side caching (`CLIENT
//! TRACKING`, RESP3 invalidation pushes).
//!
//! Reads that may fill it go over a dedicated connection with tracking on
//! (one per node that serves objects: the single node, the current
//! Sentinel primary, or the Cluster master owning the object's slot per
//! the [`SlotMap`]; kept up by [`super::near_tracking`]), so that node
//! remembers which keys this instance holds and pushes the key names as
//! soon as anything modifies them (an invalidation, a publish, an expiry,
//! an eviction, `FLUSHALL`). A push drops the whole object (entry variants
//! and generation). Each object remembers the connection it was read over.
//! What it guarantees:
//!
//! - **No stale insert.** Each read notes its object's epoch before it is
//!   sent; pushes bump the epoch (synchronously, in the connection's reader,
//!   before later replies are handed out), and a reply is kept only if the
//!   epoch has not moved. Checking and inserting happen under the same lock
//!   as bumping and removing. redis-rs's own `cache-aio` inserts after the
//!   reply without such a check, so a push that overtakes the insert leaves
//!   a stale value for the whole client TTL; that is why this is not it.
//! - **Own writes are visible at once.** The Redis store calls [`NearCache::forget`]
//!   after every write it makes (publish, invalidate, compare-and-delete),
//!   so a write-through invalidation is never followed by an old answer
//!   from this instance.
//! - **Other instances' writes** are visible here when their push arrives
//!   (the same event-loop turn of Redis that runs the write sends it).
//! - **Lost connection = its objects gone.** A disconnect or a failed
//!   heartbeat drops the connection and everything read over it (and
//!   refuses every read in flight); a new connection starts empty, and
//!   reads go to the shared connection until it is up. On a Cluster the
//!   other masters' objects stay; a slot map change (failover, resharding)
//!   and a Sentinel primary switch drop everything.
//! - **`max_age`** bounds how long an entry is served without Redis
//!   confirming it, which bounds staleness if pushes stop arriving without
//!   the connection noticing (a silent network partition). A read confirms
//!   what it returned; so does every heartbeat answered on the connection
//!   the object was read over, for everything read over it: its `PING` was
//!   sent after the confirmed time, and Redis writes a key's push to that
//!   connection before any later reply, which the reader applies before it
//!   hands the reply out. So an object is served while it was read, or its
//!   connection answered a heartbeat sent, less than `max_age` ago; the
//!   tracked connections are pinged every `max_age / 4` for that (a
//!   long-tail object need not be read again every `max_age`).
//! - **Stale answers** (grace, stale-if-error) need nothing here: the
//!   object is held with its generation, and the pipeline applies the same
//!   generation and freshness checks to what it answers.

use crate::config::NearCacheConfig;
use crate::keys::ObjectKeys;
use crate::metrics::Metrics;
use crate::store::protocol::{Memo, Snapshot};
use crate::store::slot_map::SlotMap;
use arc_swap::ArcSwap;
use bytes::Bytes;
use prometheus::{IntCounter, IntGauge};
use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Epoch buckets: a push refuses the in-flight inserts of 1/64th of the
/// objects, not of all of them.
const BUCKETS: usize = 64;
/// Bookkeeping bytes per object, on top of keys and values.
const OBJECT_OVERHEAD: u64 = 96;
/// What a variant's memo is counted as (the decoded entry's struct and
/// header list; its body and header values are slices of the raw bytes).
const MEMO_WEIGHT: u64 = 512;
/// Tag generations held (each well under 200 bytes).
const MAX_TAGS_HELD: usize = 65_536;

/// One cached object: its generation and the entries of the variants read.
struct Object {
    generation: Bytes,
    /// The tracked connection it was read over.
    link: Arc<Link>,
    /// (entry key suffix after the object's `}`, raw entry, what the
    /// pipeline derived from it).
    variants: Vec<(Box<str>, Bytes, Memo)>,
    expires: Instant,
    weight: u64,
}

#[derive(Clone)]
struct ByBytes;

impl quick_cache::Weighter<Box<str>, Arc<Object>> for ByBytes {
    fn weight(&self, _key: &Box<str>, obj: &Arc<Object>) -> u64 {
        obj.weight
    }
}

/// A tracked connection's identity and the last time it proved that no
/// push is missing (what objects read over it refer to).
pub(crate) struct Link {
    pub id: u64,
    /// Nanoseconds from the cache's `base` to the sending of the last
    /// heartbeat the connection answered; 0: none yet.
    confirmed: AtomicU64,
}

impl Link {
    pub(crate) fn new(id: u64) -> Arc<Link> {
        Arc::new(Link {
            id,
            confirmed: AtomicU64::new(0),
        })
    }
}

/// A connection reads go over while tracking is on.
pub(crate) struct Tracked {
    pub link: Arc<Link>,
    /// `host:port` of the node (Cluster: as in `CLUSTER SLOTS`).
    pub node: Arc<str>,
    pub conn: MultiplexedConnection,
    /// Wakes its keeper when the connection is dropped.
    pub(super) lost: Notify,
}

/// The near cache's metric handles, resolved once.
struct NearMetrics {
    hits: IntCounter,
    misses: IntCounter,
    invalidations: IntCounter,
    flushes: IntCounter,
    tracking: IntGauge,
}

pub(crate) struct NearCache {
    objects: quick_cache::sync::Cache<Box<str>, Arc<Object>, ByBytes>,
    /// Single keys by their full name (tag generations `<ns>t:{<tag>}:g`,
    /// objects' tag lists) -> (value, read at, connection), for the hit
    /// check of tagged entries; kept coherent exactly like objects (same
    /// epochs, dropped by the key's push).
    tags: quick_cache::sync::Cache<Bytes, (Bytes, Instant, Arc<Link>)>,
    epochs: [AtomicU64; BUCKETS],
    /// Serialises "check epoch, insert" against "bump epoch, remove".
    write: Mutex<()>,
    hasher: RandomState,
    max_age: Duration,
    /// What [`Link::confirmed`] counts from.
    base: Instant,
    /// Cluster: which master a key's reads go to. `None`: the one node.
    route: Option<Arc<SlotMap>>,
    /// The tracked connections up now (one per node; a handful).
    tracked: ArcSwap<Vec<Arc<Tracked>>>,
    next_id: AtomicU64,
    /// Wakes the keeper: on a Cluster when the slot map changed (new
    /// masters get their connections at once), with Sentinel when the
    /// primary switched (no reconnect backoff left from the old one).
    pub(super) reconcile: Notify,
    metrics: NearMetrics,
}

/// Splits `<ns>o:{<route>:<params>}:<suffix>` into the object part (up to
/// and including `}`) and the suffix. Params are percent-encoded, so the
/// first `}` after the first `{` ends the object.
fn split_key(key: &str) -> Option<(&str, &str)> {
    // Bytes, not `str::find`'s char searcher: this runs on every lookup,
    // and both braces are ASCII (so the cut is on a char boundary).
    let b = key.as_bytes();
    let open = memchr::memchr(b'{', b)?;
    let close = open + memchr::memchr(b'}', &b[open..])?;
    Some(key.split_at(close + 1))
}

impl NearCache {
    /// `route`: on a Cluster, the slot map that picks a key's connection.
    pub(crate) fn new(
        cfg: &NearCacheConfig,
        route: Option<Arc<SlotMap>>,
        metrics: &Metrics,
    ) -> NearCache {
        let estimated_items = usize::try_from(cfg.max_bytes / 2048)
            .unwrap_or(1 << 20)
            .max(64);
        NearCache {
            objects: quick_cache::sync::Cache::with_weighter(
                estimated_items,
                cfg.max_bytes,
                ByBytes,
            ),
            tags: quick_cache::sync::Cache::new(MAX_TAGS_HELD),
            epochs: std::array::from_fn(|_| AtomicU64::new(0)),
            write: Mutex::new(()),
            hasher: RandomState::new(),
            max_age: cfg.max_age,
            base: Instant::now(),
            route,
            tracked: ArcSwap::default(),
            next_id: AtomicU64::new(1),
            reconcile: Notify::new(),
            metrics: NearMetrics {
                hits: metrics.near_cache.with_label_values(&["hit"]),
                misses: metrics.near_cache.with_label_values(&["miss"]),
                invalidations: metrics.near_cache_invalidations.clone(),
                flushes: metrics.near_cache_flushes.clone(),
                tracking: metrics.near_cache_tracking.clone(),
            },
        }
    }

    /// Whether `link` answered a heartbeat sent less than `max_age` before
    /// `now` (see the module doc).
    fn confirmed(&self, link: &Link, now: Instant) -> bool {
        let at = link.confirmed.load(Ordering::Acquire);
        at != 0 && self.base + Duration::from_nanos(at) + self.max_age > now
    }

    /// `link` answered a heartbeat sent at `sent`.
    pub(super) fn confirm(&self, link: &Link, sent: Instant) {
        let at = sent.saturating_duration_since(self.base).as_nanos();
        let at = u64::try_from(at).unwrap_or(u64::MAX).max(1);
        link.confirmed.fetch_max(at, Ordering::AcqRel);
    }

    /// How often the tracked connections are pinged: often enough that an
    /// answered heartbeat keeps confirming what was read over them.
    pub(super) fn confirm_every(&self) -> Duration {
        self.max_age / 4
    }

    fn bucket(&self, object: &str) -> &AtomicU64 {
        &self.epochs[(self.hasher.hash_one(object) as usize) % BUCKETS]
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // The guarded data is `()`: a panic elsewhere cannot leave it torn.
        self.write.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The object's entry and generation if held and younger than
    /// `max_age`; counted as a near-cache hit or miss.
    pub(crate) fn get(&self, keys: &ObjectKeys) -> Option<Snapshot> {
        let found = self.peek(keys);
        match found {
            Some(_) => self.metrics.hits.inc(),
            None => self.metrics.misses.inc(),
        }
        found
    }

    /// [`Self::get`] without counting (for a second look in the same read).
    pub(crate) fn peek(&self, keys: &ObjectKeys) -> Option<Snapshot> {
        let (object, suffix) = split_key(keys.entry())?;
        let obj = self.objects.get(object)?;
        let now = Instant::now();
        if now >= obj.expires && !self.confirmed(&obj.link, now) {
            return None;
        }
        let (_, entry, memo) = obj.variants.iter().find(|(s, ..)| &**s == suffix)?;
        Some(Snapshot {
            entry: Some(entry.clone()),
            generation: Some(obj.generation.clone()),
            memo: Some(memo.clone()),
        })
    }

    /// The value of each key if all are held and younger than `max_age`
    /// (a partial answer is no answer: one round trip reads all).
    pub(crate) fn tags(&self, keys: &[&str]) -> Option<Vec<Option<Bytes>>> {
        let now = Instant::now();
        keys.iter()
            .map(|k| {
                let (value, read_at, link) = self.tags.get(k.as_bytes())?;
                (now < read_at + self.max_age || self.confirmed(&link, now)).then_some(Some(value))
            })
            .collect()
    }

    /// Whether every stamped `(key, generation)` is current: `Some(false)`
    /// as soon as a held value differs, `None` if one is not held (or too
    /// old). Allocates nothing: this is a tagged hit's whole extra cost.
    pub(crate) fn tags_current(&self, stamped: &[(Bytes, Bytes)]) -> Option<bool> {
        let now = Instant::now();
        for (key, generation) in stamped {
            let (value, read_at, link) = self.tags.get(key.as_ref())?;
            if now >= read_at + self.max_age && !self.confirmed(&link, now) {
                return None;
            }
            if value != *generation {
                return Some(false);
            }
        }
        Some(true)
    }

    /// The epoch to note before sending a read of `key` (any key with a
    /// hash tag: an object's or a tag's).
    pub(crate) fn key_epoch(&self, key: &str) -> u64 {
        match split_key(key) {
            Some((object, _)) => self.bucket(object).load(Ordering::Acquire),
            None => u64::MAX,
        }
    }

    /// Keeps a tag generation a read over tracked connection `conn`
    /// returned, unless anything invalidated its bucket since `epoch` was
    /// noted.
    pub(crate) fn offer_tag(&self, key: &str, epoch: u64, link: &Arc<Link>, value: &Bytes) {
        let Some((object, _)) = split_key(key) else {
            return;
        };
        let _guard = self.lock();
        if self.bucket(object).load(Ordering::Acquire) != epoch {
            return;
        }
        let key = Bytes::copy_from_slice(key.as_bytes());
        self.tags
            .insert(key, (value.clone(), Instant::now(), link.clone()));
    }

    /// The tracked connection a read of `key` goes over, if it is up: the
    /// one node's, or (Cluster) that of the master owning `key`'s slot.
    pub(crate) fn tracked_for(&self, key: &str) -> Option<Arc<Tracked>> {
        let tracked = self.tracked.load();
        match &self.route {
            None => tracked.first().cloned(),
            Some(map) => {
                let node = map.node_of(key.as_bytes())?;
                tracked.iter().find(|t| t.node == node).cloned()
            }
        }
    }

    /// How many tracked connections are up.
    pub(crate) fn connections(&self) -> usize {
        self.tracked.load().len()
    }

    /// The epoch to note before sending a read of `keys`.
    pub(crate) fn epoch(&self, keys: &ObjectKeys) -> u64 {
        self.key_epoch(keys.entry())
    }

    /// Keeps what a read over tracked connection `conn` returned, unless
    /// anything invalidated the object's bucket since `epoch` was noted.
    /// Only complete hits are kept (entry and generation present); the
    /// pipeline still judges them.
    pub(crate) fn offer(
        &self,
        keys: &ObjectKeys,
        epoch: u64,
        link: &Arc<Link>,
        snapshot: &Snapshot,
    ) {
        let (Some(entry), Some(generation)) = (&snapshot.entry, &snapshot.generation) else {
            return;
        };
        let Some((object, suffix)) = split_key(keys.entry()) else {
            return;
        };
        let _guard = self.lock();
        if self.bucket(object).load(Ordering::Acquire) != epoch {
            return;
        }
        let now = Instant::now();
        // Keep the other variants read under the same generation.
        let mut variants: Vec<(Box<str>, Bytes, Memo)> = match self.objects.get(object) {
            Some(old)
                if old.generation == *generation
                    && old.link.id == link.id
                    && (now < old.expires || self.confirmed(&old.link, now)) =>
            {
                old.variants
                    .iter()
                    .filter(|(s, ..)| &**s != suffix)
                    .cloned()
                    .collect()
            }
            _ => Vec::new(),
        };
        variants.push((suffix.into(), entry.clone(), Memo::default()));
        let weight = OBJECT_OVERHEAD
            + object.len() as u64
            + generation.len() as u64
            + variants
                .iter()
                .map(|(s, e, _)| (s.len() + e.len()) as u64 + 32 + MEMO_WEIGHT)
                .sum::<u64>();
        let obj = Object {
            generation: generation.clone(),
            link: link.clone(),
            variants,
            expires: now + self.max_age,
            weight,
        };
        self.objects.insert(object.into(), Arc::new(obj));
    }

    /// Drops the object `key` belongs to (any of its keys will do) and
    /// refuses reads of it that are in flight.
    pub(crate) fn forget(&self, key: &[u8]) {
        let Ok(key) = std::str::from_utf8(key) else {
            return;
        };
        let Some((object, _)) = split_key(key) else {
            return;
        };
        let _guard = self.lock();
        self.bucket(object).fetch_add(1, Ordering::AcqRel);
        self.objects.remove(object);
        self.tags.remove(key.as_bytes());
        self.metrics.invalidations.inc();
    }

    /// Drops everything and refuses every read in flight.
    pub(crate) fn flush(&self) {
        let _guard = self.lock();
        for epoch in &self.epochs {
            epoch.fetch_add(1, Ordering::AcqRel);
        }
        self.objects.clear();
        self.tags.clear();
        self.metrics.flushes.inc();
    }

    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes `conn` (tracking already on) the connection reads of `node`'s
    /// keys go over, if `valid()` still holds (checked under the lock that
    /// [`Self::lost`] takes, so a switch that drops all connections cannot
    /// miss one installed just now). Replaces `node`'s previous one.
    pub(super) fn install(
        &self,
        id: u64,
        node: Arc<str>,
        conn: MultiplexedConnection,
        valid: impl FnOnce() -> bool,
    ) -> Option<Arc<Tracked>> {
        let _guard = self.lock();
        if !valid() {
            return None;
        }
        let tracked = Arc::new(Tracked {
            link: Link::new(id),
            node,
            conn,
            lost: Notify::new(),
        });
        let mut all: Vec<Arc<Tracked>> = self
            .tracked
            .load()
            .iter()
            .filter(|t| t.node != tracked.node)
            .cloned()
            .collect();
        all.push(tracked.clone());
        self.metrics.tracking.set(all.len() as i64);
        self.tracked.store(Arc::new(all));
        Some(tracked)
    }

    /// Connection `id` can no longer be trusted to deliver pushes: stop
    /// using it and drop what was read over it. A no-op for a connection
    /// that was already replaced.
    pub(crate) fn lost(&self, id: u64) {
        self.drop_where(|t| t.link.id == id);
    }

    /// Drops the connection of `node` (Cluster: no longer a master).
    pub(super) fn lost_node(&self, node: &str) {
        self.drop_where(|t| &*t.node == node);
    }

    /// Drops every connection (Sentinel: the primary switched).
    pub(super) fn lost_all(&self) {
        self.drop_where(|_| true);
    }

    fn drop_where(&self, gone: impl Fn(&Tracked) -> bool) {
        let _guard = self.lock();
        let current = self.tracked.load_full();
        let (dropped, kept): (Vec<_>, Vec<_>) = current.iter().cloned().partition(|t| gone(t));
        if dropped.is_empty() {
            return;
        }
        // Readers note the epoch before they load the connection: one that
        // noted it before the bump below is refused at insert, one that
        // noted it after finds no connection here.
        self.tracked.store(Arc::new(kept));
        self.metrics.tracking.set(self.tracked.load().len() as i64);
        for epoch in &self.epochs {
            epoch.fetch_add(1, Ordering::AcqRel);
        }
        let ids: Vec<u64> = dropped.iter().map(|t| t.link.id).collect();
        self.objects.retain(|_, o| !ids.contains(&o.link.id));
        self.tags.retain(|_, (_, _, link)| !ids.contains(&link.id));
        self.metrics.flushes.inc();
        for t in &dropped {
            t.lost.notify_one();
        }
    }

    /// Handles a push from connection `id` (called by its reader, in order
    /// with the replies).
    pub(crate) fn on_push(&self, id: u64, push: PushInfo) {
        match push.kind {
            PushKind::Invalidate => match push.data.first() {
                Some(Value::Array(keys)) => {
                    for key in keys {
                        if let Value::BulkString(k) = key {
                            self.forget(k);
                        }
                    }
                }
                // Redis sends nil after FLUSHALL / FLUSHDB.
                _ => self.flush(),
            },
            PushKind::Disconnection => self.lost(id),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::object_keys;

    fn cache(max_age: Duration) -> NearCache {
        NearCache::new(
            &NearCacheConfig {
                max_bytes: 1 << 20,
                max_age,
            },
            None,
            &Metrics::new(),
        )
    }

    /// The link of tracked connection 1.
    fn link() -> Arc<Link> {
        Link::new(1)
    }

    /// Redis's invalidation push for `key` on tracked connection 1.
    fn invalidated(c: &NearCache, key: &str) {
        c.on_push(
            1,
            PushInfo {
                kind: PushKind::Invalidate,
                data: vec![Value::Array(vec![Value::BulkString(
                    key.as_bytes().to_vec(),
                )])],
            },
        );
    }

    #[test]
    fn an_answered_heartbeat_keeps_objects_past_max_age() {
        let max_age = Duration::from_millis(300);
        let c = cache(max_age);
        let k = object_keys("sc:", "app:acme:1", "v1");
        let l = link();
        c.offer(&k, c.epoch(&k), &l, &snap("E", "g1"));
        std::thread::sleep(max_age + Duration::from_millis(50));
        // Read too long ago, and nothing confirmed it since.
        assert_eq!(c.get(&k), None);
        // Another connection's heartbeat says nothing about it.
        c.confirm(&Link::new(2), Instant::now());
        assert_eq!(c.get(&k), None);
        // Its own connection's does (retried: one try could be preempted
        // for max_age between the two calls).
        assert!((0..10).any(|_| {
            c.confirm(&l, Instant::now());
            c.get(&k).is_some()
        }));
        // And only for max_age after the heartbeat was sent.
        std::thread::sleep(max_age + Duration::from_millis(50));
        assert_eq!(c.get(&k), None);
        // A push still drops it at once.
        c.confirm(&l, Instant::now());
        invalidated(&c, k.entry());
        assert_eq!(c.get(&k), None);
    }

    fn snap(entry: &'static str, generation: &'static str) -> Snapshot {
        Snapshot {
            entry: Some(Bytes::from_static(entry.as_bytes())),
            generation: Some(Bytes::from_static(generation.as_bytes())),
            memo: None,
        }
    }

    #[test]
    fn split_key_cuts_after_the_object() {
        let k = object_keys("sc:", "app:acme:1", "v1");
        assert_eq!(
            split_key(k.entry()),
            Some(("sc:o:{app:acme:1}", ":e:v3:v1"))
        );
        assert_eq!(split_key(k.generation()), Some(("sc:o:{app:acme:1}", ":g")));
        assert_eq!(split_key("no-braces"), None);
    }

    #[test]
    fn offer_then_get_and_push_removes() {
        let c = cache(Duration::from_secs(60));
        let k = object_keys("sc:", "app:acme:1", "v1");
        assert_eq!(c.get(&k), None);
        let e = c.epoch(&k);
        c.offer(&k, e, &link(), &snap("E", "g1"));
        assert_eq!(c.get(&k), Some(snap("E", "g1")));
        // A push for the generation key drops the entry too.
        invalidated(&c, k.generation());
        assert_eq!(c.get(&k), None);
    }

    #[test]
    fn a_reply_overtaken_by_a_push_is_not_kept() {
        let c = cache(Duration::from_secs(60));
        let k = object_keys("sc:", "app:acme:1", "v1");
        let e = c.epoch(&k);
        // The push for the key arrives between the reply and the insert.
        c.forget(k.entry().as_bytes());
        c.offer(&k, e, &link(), &snap("OLD", "g1"));
        assert_eq!(c.get(&k), None);
        // A read noted after the push is kept.
        let e = c.epoch(&k);
        c.offer(&k, e, &link(), &snap("NEW", "g2"));
        assert_eq!(c.get(&k), Some(snap("NEW", "g2")));
    }

    #[test]
    fn variants_share_the_generation() {
        let c = cache(Duration::from_secs(60));
        let a = object_keys("sc:", "app:acme:1", "a");
        let b = object_keys("sc:", "app:acme:1", "b");
        c.offer(&a, c.epoch(&a), &link(), &snap("A", "g1"));
        c.offer(&b, c.epoch(&b), &link(), &snap("B", "g1"));
        assert_eq!(c.get(&a), Some(snap("A", "g1")));
        assert_eq!(c.get(&b), Some(snap("B", "g1")));
        // A newer generation replaces the object: `a` is no longer held.
        c.offer(&b, c.epoch(&b), &link(), &snap("B2", "g2"));
        assert_eq!(c.get(&a), None);
        assert_eq!(c.get(&b), Some(snap("B2", "g2")));
    }

    #[test]
    fn a_held_entry_is_decoded_once_and_a_new_one_starts_afresh() {
        let c = cache(Duration::from_secs(60));
        let k = object_keys("sc:", "app:acme:1", "v1");
        c.offer(&k, c.epoch(&k), &link(), &snap("E", "g1"));
        let made = std::sync::atomic::AtomicUsize::new(0);
        let decode = |s: Snapshot| {
            s.memo.and_then(|m| {
                m.get_or_make(|| {
                    made.fetch_add(1, Ordering::Relaxed);
                    s.entry
                })
            })
        };
        let first = decode(c.get(&k).expect("held"));
        let second = decode(c.get(&k).expect("held"));
        let (Some(first), Some(second)) = (first, second) else {
            panic!("nothing made");
        };
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(made.load(Ordering::Relaxed), 1);
        // New bytes (here a new generation) never see the old value.
        c.offer(&k, c.epoch(&k), &link(), &snap("E2", "g2"));
        let third = decode(c.get(&k).expect("held")).expect("made");
        assert_eq!(&*third, &Bytes::from_static(b"E2"));
        assert_eq!(made.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn misses_flush_and_age_are_not_kept() {
        let c = cache(Duration::from_secs(60));
        let k = object_keys("sc:", "app:acme:1", "v1");
        c.offer(
            &k,
            c.epoch(&k),
            &link(),
            &Snapshot {
                entry: None,
                generation: Some(Bytes::from_static(b"g1")),
                memo: None,
            },
        );
        assert_eq!(c.get(&k), None);
        c.offer(&k, c.epoch(&k), &link(), &snap("E", "g1"));
        c.on_push(
            1,
            PushInfo {
                kind: PushKind::Invalidate,
                data: vec![Value::Nil],
            },
        );
        assert_eq!(c.get(&k), None);

        let young = cache(Duration::from_millis(1));
        young.offer(&k, young.epoch(&k), &link(), &snap("E", "g1"));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(young.get(&k), None);
    }

    #[test]
    fn losing_the_connection_empties_the_cache() {
        let c = cache(Duration::from_secs(60));
        let k = object_keys("sc:", "app:acme:1", "v1");
        let e = c.epoch(&k);
        c.offer(&k, e, &link(), &snap("E", "g1"));
        // No connection installed: a Disconnection from connection 7 is stale.
        c.on_push(
            7,
            PushInfo {
                kind: PushKind::Disconnection,
                data: vec![],
            },
        );
        assert!(c.get(&k).is_some());
        c.flush();
        assert_eq!(c.get(&k), None);
        // A read in flight across the flush is refused.
        c.offer(&k, e, &link(), &snap("E", "g1"));
        assert_eq!(c.get(&k), None);
    }

    #[test]
    fn tag_generations_are_checked_in_place_and_dropped_by_pushes() {
        let c = cache(Duration::from_secs(60));
        let key = "sc:t:{a}:g";
        let stamped = |g: &'static str| {
            vec![(
                Bytes::from_static(key.as_bytes()),
                Bytes::from_static(g.as_bytes()),
            )]
        };
        assert_eq!(c.tags_current(&stamped("g1")), None, "not held: ask Redis");
        let e = c.key_epoch(key);
        c.offer_tag(key, e, &link(), &Bytes::from_static(b"g1"));
        assert_eq!(c.tags_current(&stamped("g1")), Some(true));
        assert_eq!(c.tags_current(&stamped("g0")), Some(false));
        assert_eq!(c.tags(&[key]), Some(vec![Some(Bytes::from_static(b"g1"))]));
        // The tag's push drops it; a read noted before the push is refused.
        let e = c.key_epoch(key);
        c.forget(key.as_bytes());
        assert_eq!(c.tags_current(&stamped("g1")), None);
        c.offer_tag(key, e, &link(), &Bytes::from_static(b"g1"));
        assert_eq!(
            c.tags_current(&stamped("g1")),
            None,
            "overtaken by its push"
        );
        c.offer_tag(key, c.key_epoch(key), &link(), &Bytes::from_static(b"g2"));
        assert_eq!(c.tags_current(&stamped("g1")), Some(false));
        c.flush();
        assert_eq!(c.tags(&[key]), None);
    }
}

//! The embedded in-process store (docs/architecture.md#embedded-store): the
//! generation protocol of `lua/*.lua` on a sharded map, bounded in bytes,
//! for a single instance without Redis.
//!
//! **Sharding.** Keys are spread over a power-of-two number of shards, each
//! a map behind its own mutex, by a hash of the key's hash tag (the part
//! between the first `{` and the next `}`, the rule Redis Cluster uses for
//! slots), so one object's entries, generation, lease, floor and lists
//! share a shard, and so do one Bloom filter's keys. Every step that
//! touches only one object (read, ticket, lease, renew, unlock, publish,
//! invalidate) locks that one shard for its whole run, which gives it the
//! atomicity a Lua script has in Redis, and reads of different objects do
//! not contend. A publish that also compares tag generations (each in its
//! tag's shard) locks every shard it touches in ascending index order (no
//! deadlock) and runs as one step too, which is stronger than Redis
//! Cluster's compare-just-before. Steps over many independent keys
//! (`invalidate_many`, `invalidate_marked`, `tag_tickets`, `raise_floors`,
//! the tagged hit check) are atomic per key, as on a Cluster. No lock is
//! ever held across an `.await`.
//!
//! **Budget.** `store.memory.max_bytes` is split evenly between the shards;
//! a write over its shard's share evicts (entries first, S3-FIFO; anchors
//! such as generations and leases only when no entry is left: see
//! [`evict`]). An evicted generation or lease is exactly a lost key in
//! Redis: entries stamped with it are misses and a fill in flight is
//! refused at publish. An answer larger than a shard's share is not stored
//! ([`StoreError::WriteRefused`]).
//!
//! **Expiry.** Every key the protocol writes has a TTL, measured with
//! `tokio::time::Instant` so tests can drive expiry with paused time.
//! Expired keys are dropped lazily when touched, and a shard sweeps after
//! every `max(SWEEP_MIN_WRITES, live keys / 2)` writes, so keys written once
//! and never read again are dropped at an amortised O(1) cost per write.
//!
//! Why not `moka` or `quick_cache` (already used by the near cache): the
//! protocol needs several keys of one object changed in one locked step,
//! and an eviction order across two classes of keys (answers before the
//! generations and leases they depend on) under one byte budget. Both
//! crates evict within one cache by their own policy (`quick_cache`'s
//! pinning would make anchors unevictable, so unbounded), and `moka`
//! applies evictions asynchronously, so the bound is loose. A shard is a
//! plain map plus three FIFOs, small enough to own.

mod bitmap;
mod bloom;
pub(crate) mod evict;
#[cfg(test)]
mod proptests;
mod shard;

use super::backend::Store;
use super::feeds::FeedStore;
use super::object::ObjectStore;
use super::protocol::{
    covers, lease_depends_key, lease_ticket, FillDepends, Inspection, LeaseReply, PublishChecks,
    PublishOutcome, Snapshot, StoreError, Superseded, WitnessSlot,
};
use super::slot_map::hash_tag;
use super::tags::{TagStore, TimedTickets};
use crate::keys::ObjectKeys;
use crate::metrics::MemoryStoreMetrics;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use shard::Shard;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Labels of `sidecache_memory_store_evictions_total`, in the order of
/// [`MemoryStoreMetrics`]'s counters.
pub(crate) const EVICTION_KINDS: [&str; 5] = [
    evict::Kind::ALL[0].as_str(),
    evict::Kind::ALL[1].as_str(),
    evict::Kind::ALL[2].as_str(),
    evict::Kind::ALL[3].as_str(),
    evict::Kind::ALL[4].as_str(),
];

/// Shards of a store built from the config: enough that the cores rarely
/// meet on one lock, few enough that a shard's share of the smallest
/// budget still holds the largest answer (docs/configuration.md).
pub(crate) const SHARDS: usize = 16;

/// The default `store.memory.max_bytes`.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// The embedded store: the whole keyspace of one process, in shards.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// The default budget and shards, metrics unexported.
    pub fn new() -> MemoryStore {
        MemoryStore::with_budget(DEFAULT_MAX_BYTES, SHARDS, MemoryStoreMetrics::new(None))
    }

    /// `max_bytes` split over `shards` (rounded up to a power of two).
    pub fn with_budget(max_bytes: u64, shards: usize, metrics: MemoryStoreMetrics) -> MemoryStore {
        let shards = shards.max(1).next_power_of_two();
        let max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
        metrics
            .budget
            .set(i64::try_from(max_bytes).unwrap_or(i64::MAX));
        MemoryStore {
            shards: (0..shards)
                .map(|_| Mutex::new(Shard::new(max_bytes / shards, metrics.clone())))
                .collect(),
            hasher: RandomState::new(),
        }
    }

    /// Keys held, including expired ones not yet swept.
    #[cfg(test)]
    fn len(&self) -> usize {
        (0..self.shards.len())
            .map(|i| self.lock_index(i).len())
            .sum()
    }

    /// Bytes charged over all shards.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        (0..self.shards.len())
            .map(|i| self.lock_index(i).bytes())
            .sum()
    }

    fn index(&self, key: &str) -> usize {
        let tag = hash_tag(key.as_bytes()).unwrap_or(key.as_bytes());
        // Truncating the hash is fine: only its low bits pick the shard.
        (self.hasher.hash_one(tag) as usize) & (self.shards.len() - 1)
    }

    fn lock_index(&self, index: usize) -> MutexGuard<'_, Shard> {
        // Every operation leaves its shard consistent before it can panic,
        // so a poisoned lock still guards valid data.
        self.shards[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The shard of `key` (and of every key with the same hash tag).
    fn lock(&self, key: &str) -> MutexGuard<'_, Shard> {
        self.lock_index(self.index(key))
    }

    /// The shards of all `keys`, locked in ascending index order so two
    /// multi-shard steps cannot deadlock.
    fn lock_all<'k>(&self, keys: impl Iterator<Item = &'k str>) -> Locked<'_> {
        let mut indices: Vec<usize> = keys.map(|k| self.index(k)).collect();
        indices.sort_unstable();
        indices.dedup();
        Locked {
            guards: indices
                .into_iter()
                .map(|i| (i, self.lock_index(i)))
                .collect(),
            store: self,
        }
    }
}

/// Several shards held at once, for one step.
struct Locked<'a> {
    guards: Vec<(usize, MutexGuard<'a, Shard>)>,
    store: &'a MemoryStore,
}

impl Locked<'_> {
    /// The shard of `key`; `None` if the step did not lock it (a bug: the
    /// caller passes every key it touches to `lock_all`).
    fn shard(&mut self, key: &str) -> Option<&mut Shard> {
        let index = self.store.index(key);
        self.guards
            .iter_mut()
            .find(|(i, _)| *i == index)
            .map(|(_, guard)| &mut **guard)
    }

    fn get(&mut self, key: &str, now: Instant) -> Option<Bytes> {
        self.shard(key)?.get(key, now).cloned()
    }
}

impl Shard {
    /// `lua/ticket.lua`: the current generation, created if missing.
    fn ticket(&mut self, gen_key: &str, nonce: &str, gen_ttl: Duration, now: Instant) -> Bytes {
        if let Some(current) = self.get(gen_key, now).cloned() {
            self.touch(gen_key, gen_ttl, now);
            return current;
        }
        let generation = Bytes::from(fresh_generation(nonce));
        self.set(gen_key, generation.clone(), gen_ttl, now);
        generation
    }

    fn delete_if(&mut self, key: &str, expected: &[u8], now: Instant) -> bool {
        if self.get(key, now).is_some_and(|v| v.as_ref() == expected) {
            return self.remove(key);
        }
        false
    }
}

/// `lua/publish.lua`, and `lua/publish_checked.lua` with `checks`, in one
/// step over the object's shard and its tags' shards.
fn publish(
    locked: &mut Locked<'_>,
    keys: &ObjectKeys,
    owner: &str,
    ticket: &[u8],
    entry: Bytes,
    ttl: Duration,
    checks: &PublishChecks,
) -> Result<PublishOutcome, StoreError> {
    let now = Instant::now();
    // A missing generation counts as changed: it was lost (expired or
    // evicted) and any recreation would be a value this ticket never saw.
    if locked.get(keys.generation(), now).as_deref() != Some(ticket) {
        return Ok(PublishOutcome::GenerationChanged);
    }
    // Tags before the lease, as `lua/publish_checked.lua` (a fill taken
    // over because a tag moved learns that the tag moved).
    for (key, tag_ticket) in &checks.tags {
        if locked.get(key, now).as_ref() != Some(tag_ticket) {
            return Ok(PublishOutcome::TagChanged);
        }
    }
    if locked.get(keys.lease(), now).as_deref() != Some(owner.as_bytes()) {
        return Ok(PublishOutcome::LeaseLost);
    }
    if let Some(floor_key) = &checks.floor_key {
        if let Some(floor) = locked.get(floor_key, now).and_then(|f| parse_i64(&f)) {
            if checks.version.is_none_or(|v| v < floor) {
                return Ok(PublishOutcome::BelowFloor);
            }
        }
    }
    let Some(shard) = locked.shard(keys.entry()) else {
        return Err(StoreError::Protocol(
            "publish: entry shard not locked".into(),
        ));
    };
    if !shard.fits(keys.entry(), entry.len()) {
        return Err(StoreError::WriteRefused(
            "answer larger than a shard's share of store.memory.max_bytes".into(),
        ));
    }
    shard.set(keys.entry(), entry, ttl, now);
    Ok(PublishOutcome::Published)
}

/// `record` if it is the dependency record of the lease value `held` (its
/// first line), as `lua/lease.lua` accepts one.
fn held_record(held: &[u8], record: Bytes) -> Option<Bytes> {
    let ours = record.len() > held.len() && record.starts_with(held) && record[held.len()] == b'\n';
    ours.then_some(record)
}

fn parse_i64(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// A fresh generation value, same shape as the Lua scripts build from
/// `TIME`: `<unix secs>.<micros>-<nonce>`. The nonce makes it unique across
/// callers within one microsecond.
fn fresh_generation(nonce: &str) -> String {
    let now = unix_micros();
    format!("{}.{:06}-{}", now / 1_000_000, now % 1_000_000, nonce)
}

/// The clock generations are made from, in microseconds since the epoch.
fn unix_micros() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.as_secs() * 1_000_000 + u64::from(now.subsec_micros())
}

/// The time a generation (or a `tag_tickets_timed` clock) was made, in
/// microseconds: its `<secs>.<micros>` prefix.
fn micros_of(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?;
    let (secs, rest) = text.split_once('.')?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let micros: u64 = rest[..end].parse().ok()?;
    Some(secs.parse::<u64>().ok()? * 1_000_000 + micros)
}

impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }
}

impl ObjectStore for MemoryStore {
    fn read<'a>(&'a self, keys: &'a ObjectKeys) -> BoxFuture<'a, Result<Snapshot, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(keys.entry());
            Ok(Snapshot {
                entry: inner.get(keys.entry(), now).cloned(),
                generation: inner.get(keys.generation(), now).cloned(),
                memo: None,
            })
        })
    }

    fn inspect<'a>(
        &'a self,
        keys: &'a ObjectKeys,
    ) -> BoxFuture<'a, Result<Inspection, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(keys.entry());
            Ok(Inspection {
                entry: inner.get_with_ttl(keys.entry(), now),
                generation: inner.get_with_ttl(keys.generation(), now),
                lease: inner.get_with_ttl(keys.lease(), now),
            })
        })
    }

    fn take_lease<'a>(
        &'a self,
        keys: &'a ObjectKeys,
        owner: &'a str,
        nonce: &'a str,
        ttl: Duration,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<LeaseReply, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let depends_key = lease_depends_key(keys.lease());
            // The record names keys of other shards: read it first, then
            // take every shard it names and decide in one step.
            let record = {
                let mut inner = self.lock(keys.entry());
                let held = inner.get(keys.lease(), now).cloned();
                let record = inner.get(&depends_key, now).cloned();
                held.zip(record)
                    .and_then(|(held, record)| held_record(&held, record))
            };
            let listed = record
                .as_ref()
                .and_then(|r| FillDepends::parse(r))
                .map(|(_, deps)| deps)
                .unwrap_or_default();
            let object = [keys.entry(), keys.generation(), keys.lease()];
            let dep_keys = listed.iter().map(|(_, k, _)| *k);
            let mut locked = self.lock_all(object.into_iter().chain(dep_keys));
            let Some(shard) = locked.shard(keys.entry()) else {
                return Err(StoreError::Protocol(
                    "lease: object shard not locked".into(),
                ));
            };
            let ticket = shard.ticket(keys.generation(), nonce, gen_ttl, now);
            let superseded = match shard.get(keys.lease(), now).cloned() {
                None => None,
                Some(held) if lease_ticket(&held) == Some(ticket.as_ref()) => {
                    let now_record = shard.get(&depends_key, now).cloned();
                    let now_record = now_record.and_then(|r| held_record(&held, r));
                    // Only the record read above names the shards held.
                    if now_record.is_none() || now_record != record {
                        return Ok(LeaseReply::Held);
                    }
                    let moved = listed
                        .iter()
                        .find(|(_, key, t)| locked.get(key, now).as_deref() != Some(*t));
                    match moved {
                        Some((why, ..)) => Some(*why),
                        None => return Ok(LeaseReply::Held),
                    }
                }
                Some(_) => Some(Superseded::Generation),
            };
            let reply = LeaseReply::won(owner, ticket, superseded);
            let Some(shard) = locked.shard(keys.entry()) else {
                return Err(StoreError::Protocol(
                    "lease: object shard not locked".into(),
                ));
            };
            if let LeaseReply::Won { value, .. } = &reply {
                shard.set(keys.lease(), Bytes::from(value.clone()), ttl, now);
                shard.remove(&depends_key);
            }
            Ok(reply)
        })
    }

    fn ticket<'a>(
        &'a self,
        gen_key: &'a str,
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Bytes, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            Ok(self.lock(gen_key).ticket(gen_key, nonce, gen_ttl, now))
        })
    }

    fn publish_checked<'a>(
        &'a self,
        keys: &'a ObjectKeys,
        owner: &'a str,
        ticket: &'a [u8],
        entry: Bytes,
        ttl: Duration,
        checks: &'a PublishChecks,
    ) -> BoxFuture<'a, Result<PublishOutcome, StoreError>> {
        Box::pin(async move {
            let object = [keys.entry(), keys.generation(), keys.lease()];
            let floor = checks.floor_key.as_deref();
            let tags = checks.tags.iter().map(|(k, _)| k.as_str());
            let mut locked = self.lock_all(object.into_iter().chain(floor).chain(tags));
            publish(&mut locked, keys, owner, ticket, entry, ttl, checks)
        })
    }

    fn record_lease_depends<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
        depends: &'a FillDepends,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(lease_key);
            let Some((held, Some(left))) = inner.get_with_ttl(lease_key, now) else {
                return Ok(false);
            };
            if held.as_ref() != owner.as_bytes() || left.is_zero() {
                return Ok(false);
            }
            let record = Bytes::from(depends.record(owner));
            inner.set(&lease_depends_key(lease_key), record, left, now);
            Ok(true)
        })
    }

    fn renew_lease<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(lease_key);
            let Some(held) = inner.get(lease_key, now).cloned() else {
                return Ok(false);
            };
            if held.as_ref() != owner.as_bytes() {
                return Ok(false);
            }
            inner.touch(lease_key, ttl, now);
            let depends_key = lease_depends_key(lease_key);
            let record = inner.get(&depends_key, now).cloned();
            if record.and_then(|r| held_record(&held, r)).is_some() {
                inner.touch(&depends_key, ttl, now);
            }
            Ok(true)
        })
    }

    fn unlock<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(lease_key);
            if !inner.delete_if(lease_key, owner.as_bytes(), now) {
                return Ok(false);
            }
            inner.remove(&lease_depends_key(lease_key));
            Ok(true)
        })
    }

    fn delete_if_equals<'a>(
        &'a self,
        key: &'a str,
        expected: &'a [u8],
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Ok(self.lock(key).delete_if(key, expected, Instant::now())) })
    }
}

impl FeedStore for MemoryStore {
    fn invalidate<'a>(
        &'a self,
        gen_key: &'a str,
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Bytes, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(gen_key);
            let mut generation = fresh_generation(nonce);
            // Same guard as invalidate.lua: the new value never equals the
            // old one, even if a caller reuses a nonce within a microsecond.
            if inner.get(gen_key, now).map(Bytes::as_ref) == Some(generation.as_bytes()) {
                generation.push('+');
            }
            let generation = Bytes::from(generation);
            inner.set(gen_key, generation.clone(), gen_ttl, now);
            Ok(generation)
        })
    }

    fn invalidate_marked<'a>(
        &'a self,
        gen_keys: &'a [String],
        marks: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if marks.len() != gen_keys.len() {
                return Err(StoreError::Protocol("one mark per key expected".into()));
            }
            let now = Instant::now();
            for (key, mark) in gen_keys.iter().zip(marks) {
                let mut inner = self.lock(key);
                if inner.get(key, now).is_some_and(|g| covers(g, mark)) {
                    continue;
                }
                let generation = format!("{}@{mark}", fresh_generation(nonce));
                inner.set(key, Bytes::from(generation), gen_ttl, now);
            }
            Ok(())
        })
    }

    /// The embedded store serves one process: it is always the witness.
    fn witness<'a>(
        &'a self,
        _slots: &'a [String],
        _owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<WitnessSlot, StoreError>> {
        Box::pin(async move {
            Ok(WitnessSlot {
                held: Some(0),
                free_in: ttl,
            })
        })
    }
}

impl TagStore for MemoryStore {
    /// In process, so always known: the hit check of a stamped entry
    /// (every entry carries its route's generation) costs a lookup, not a
    /// future.
    fn tags_current_near(&self, stamped: &[(Bytes, Bytes)]) -> Option<bool> {
        let now = Instant::now();
        Some(stamped.iter().all(|(key, generation)| {
            std::str::from_utf8(key)
                .ok()
                .and_then(|k| self.lock(k).get(k, now).cloned())
                .is_some_and(|current| current == generation)
        }))
    }

    fn tag_tickets<'a>(
        &'a self,
        tag_keys: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Bytes>, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            Ok(tag_keys
                .iter()
                .map(|k| self.lock(k).ticket(k, nonce, gen_ttl, now))
                .collect())
        })
    }

    fn tag_tickets_timed<'a>(
        &'a self,
        tag_keys: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<TimedTickets, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let tickets = tag_keys
                .iter()
                .map(|k| self.lock(k).ticket(k, nonce, gen_ttl, now))
                .collect();
            let clock = unix_micros();
            let clock = format!("{}.{:06}", clock / 1_000_000, clock % 1_000_000);
            Ok((tickets, Some(Bytes::from(clock))))
        })
    }

    fn tag_tickets_since<'a>(
        &'a self,
        tag_keys: &'a [String],
        since: &'a [u8],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Option<Vec<Bytes>>, StoreError>> {
        Box::pin(async move {
            let since = micros_of(since)
                .ok_or_else(|| StoreError::Protocol("tag_tickets_since: bad start".into()))?;
            let now = Instant::now();
            // All tags' shards at once: the check and the tickets are one step.
            let mut locked = self.lock_all(tag_keys.iter().map(String::as_str));
            let moved = tag_keys.iter().any(|k| {
                locked
                    .get(k, now)
                    .is_some_and(|g| micros_of(&g).is_none_or(|at| at >= since))
            });
            if moved {
                return Ok(None);
            }
            tag_keys
                .iter()
                .map(|k| {
                    let shard = locked.shard(k).ok_or_else(|| {
                        StoreError::Protocol("tag_tickets_since: tag shard not locked".into())
                    })?;
                    Ok(shard.ticket(k, nonce, gen_ttl, now))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some)
        })
    }

    fn read_tags<'a>(
        &'a self,
        tag_keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<Option<Bytes>>, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            Ok(tag_keys
                .iter()
                .map(|k| self.lock(k).get(k, now).cloned())
                .collect())
        })
    }

    fn remember_tags<'a>(
        &'a self,
        list_key: &'a str,
        tags: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let value = Bytes::copy_from_slice(tags.as_bytes());
            self.lock(list_key).set(list_key, value, ttl, now);
            Ok(())
        })
    }

    fn raise_floors<'a>(
        &'a self,
        floors: &'a [(String, i64)],
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            for (key, revision) in floors {
                let mut inner = self.lock(key);
                let current = inner.get(key, now).and_then(|f| parse_i64(f));
                let floor = current.map_or(*revision, |c| c.max(*revision));
                inner.set(key, Bytes::from(floor.to_string()), gen_ttl, now);
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::shard::SWEEP_MIN_WRITES;
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn expired_keys_are_swept_without_being_read() {
        // One shard: the sweep threshold is per shard.
        let store = MemoryStore::with_budget(DEFAULT_MAX_BYTES, 1, MemoryStoreMetrics::new(None));
        let ttl = Duration::from_millis(10);
        for i in 0..SWEEP_MIN_WRITES {
            store.ticket(&format!("l{i}"), "o", ttl).await.unwrap();
        }
        tokio::time::advance(Duration::from_millis(20)).await;
        // Each batch of writes lets the map grow only until the next sweep.
        for i in 0..4 * SWEEP_MIN_WRITES {
            store.ticket(&format!("m{i}"), "o", ttl).await.unwrap();
            if i % SWEEP_MIN_WRITES == SWEEP_MIN_WRITES - 1 {
                tokio::time::advance(Duration::from_millis(20)).await;
            }
        }
        assert!(store.len() <= 2 * SWEEP_MIN_WRITES, "len {}", store.len());
    }

    #[tokio::test(start_paused = true)]
    async fn ticket_refreshes_generation_ttl() {
        let store = MemoryStore::new();
        let ttl = Duration::from_secs(10);
        let first = store.ticket("g", "n1", ttl).await.unwrap();
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(store.ticket("g", "n2", ttl).await.unwrap(), first);
        tokio::time::advance(Duration::from_secs(8)).await;
        // 16 s after creation, alive because the second ticket refreshed it.
        assert_eq!(store.ticket("g", "n3", ttl).await.unwrap(), first);
    }

    fn object(id: usize) -> ObjectKeys {
        ObjectKeys::from_parts(
            &format!("sc:o:{{r:{id}}}:e:v3:v"),
            &format!("sc:o:{{r:{id}}}:g"),
            &format!("sc:o:{{r:{id}}}:l:v"),
        )
    }

    /// One whole fill of `keys`: lease with ticket, publish `len` bytes.
    /// The lease of `keys`, which must be free: (owner, ticket).
    async fn win(store: &MemoryStore, keys: &ObjectKeys) -> (String, Bytes) {
        let long = Duration::from_secs(3600);
        let LeaseReply::Won { value, ticket, .. } =
            store.take_lease(keys, "o", "n", long, long).await.unwrap()
        else {
            panic!("lease held");
        };
        (value, ticket)
    }

    async fn fill(store: &MemoryStore, keys: &ObjectKeys, len: usize) -> PublishOutcome {
        let long = Duration::from_secs(3600);
        let (value, ticket) = win(store, keys).await;
        let body = Bytes::from(vec![b'x'; len]);
        let outcome = store
            .publish(keys, &value, &ticket, body, long)
            .await
            .unwrap();
        store.unlock(keys.lease(), &value).await.unwrap();
        outcome
    }

    fn tiny(max_bytes: u64) -> (MemoryStore, MemoryStoreMetrics) {
        let metrics = MemoryStoreMetrics::new(None);
        (
            MemoryStore::with_budget(max_bytes, 1, metrics.clone()),
            metrics,
        )
    }

    fn evicted(metrics: &MemoryStoreMetrics, kind: evict::Kind) -> u64 {
        let i = evict::Kind::ALL.iter().position(|k| *k == kind).unwrap();
        metrics.evictions[i].get()
    }

    #[tokio::test(start_paused = true)]
    async fn writes_beyond_the_budget_evict_entries_and_keep_the_bytes_bounded() {
        let (store, metrics) = tiny(64 << 10);
        for id in 0..1000 {
            assert_eq!(
                fill(&store, &object(id), 500).await,
                PublishOutcome::Published
            );
            assert!(store.bytes() <= 64 << 10, "{} bytes", store.bytes());
        }
        assert!(evicted(&metrics, evict::Kind::Entry) > 800);
        assert_eq!(metrics.bytes.get() as usize, store.bytes());
    }

    #[tokio::test(start_paused = true)]
    async fn generations_outlive_the_entries_that_depend_on_them() {
        let (store, metrics) = tiny(64 << 10);
        for id in 0..1000 {
            fill(&store, &object(id), 500).await;
        }
        assert!(evicted(&metrics, evict::Kind::Entry) > 800);
        assert!(evicted(&metrics, evict::Kind::Generation) > 0);
        // Only generations nothing depended on went: every entry left
        // still has its generation.
        let mut entries = 0;
        for id in 0..1000 {
            let snap = store.read(&object(id)).await.unwrap();
            if snap.entry.is_some() {
                entries += 1;
                assert!(snap.generation.is_some(), "object {id}");
            }
        }
        assert!(entries > 10, "{entries} entries left");
    }

    #[tokio::test(start_paused = true)]
    async fn leases_go_only_once_no_entry_is_left() {
        let (store, metrics) = tiny(16 << 10);
        let long = Duration::from_secs(3600);
        fill(&store, &object(0), 100).await;
        // Fills in flight: leases held, nothing published.
        for id in 1..30 {
            store
                .take_lease(&object(id), "o", "n", long, long)
                .await
                .unwrap();
        }
        assert_eq!(evicted(&metrics, evict::Kind::Lease), 0);
        assert!(store.read(&object(0)).await.unwrap().entry.is_some());
        for id in 30..200 {
            store
                .take_lease(&object(id), "o", "n", long, long)
                .await
                .unwrap();
        }
        assert!(evicted(&metrics, evict::Kind::Lease) > 0);
        assert!(store.read(&object(0)).await.unwrap().entry.is_none());
        assert!(store.bytes() <= 16 << 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fill_across_the_eviction_of_its_generation_is_refused() {
        let (store, _) = tiny(16 << 10);
        let long = Duration::from_secs(3600);
        let keys = object(0);
        let (value, ticket) = win(&store, &keys).await;
        // Other fills in flight push this one's generation and lease out.
        for id in 1..500 {
            store
                .take_lease(&object(id), "o", "n", long, long)
                .await
                .unwrap();
        }
        assert!(store.read(&keys).await.unwrap().generation.is_none());
        let body = Bytes::from_static(b"old");
        let outcome = store.publish(&keys, &value, &ticket, body, long).await;
        assert_ne!(outcome.unwrap(), PublishOutcome::Published);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hot_key_survives_a_scan_of_one_off_ids() {
        let (store, _) = tiny(256 << 10);
        let hot = object(0);
        fill(&store, &hot, 500).await;
        for id in 1..5000 {
            // The hot key is read between every two scanned ids.
            assert!(
                store.read(&hot).await.unwrap().entry.is_some(),
                "evicted at {id}"
            );
            fill(&store, &object(id), 500).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_larger_than_a_shard_is_refused_not_stored() {
        let (store, _) = tiny(16 << 10);
        let long = Duration::from_secs(3600);
        let keys = object(0);
        let (value, ticket) = win(&store, &keys).await;
        let body = Bytes::from(vec![0; 32 << 10]);
        let outcome = store.publish(&keys, &value, &ticket, body, long).await;
        assert!(matches!(outcome, Err(StoreError::WriteRefused(_))));
        assert!(store.read(&keys).await.unwrap().entry.is_none());
    }

    #[test]
    fn generation_has_the_lua_shape() {
        let g = fresh_generation("abc");
        let (time, nonce) = g.split_once('-').unwrap();
        assert_eq!(nonce, "abc");
        let (secs, micros) = time.split_once('.').unwrap();
        assert!(secs.parse::<u64>().unwrap() > 1_600_000_000);
        assert_eq!(micros.len(), 6);
    }
}

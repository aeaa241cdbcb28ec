//! The embedded in-process store (docs/architecture.md#embedded-store): the
//! generation protocol of `lua/*.lua` on one mutex-guarded map, for a single
//! instance without Redis.
//!
//! Every key the protocol writes has a TTL, measured with
//! `tokio::time::Instant` so tests can drive expiry with paused time.
//! Expired keys are dropped lazily when touched, and a sweep runs after every
//! `max(SWEEP_MIN_WRITES, live keys / 2)` writes, so keys that are written
//! once and never read again cannot grow the map without bound while the
//! amortised sweep cost stays O(1) per write.
//!
//! Each operation runs entirely under the lock, which gives it the same
//! atomicity a Lua script has in Redis. The lock is never held across an
//! `.await`.

mod bitmap;
mod bloom;

use super::backend::Store;
use super::feeds::FeedStore;
use super::object::ObjectStore;
use super::protocol::{
    covers, lease_ticket, Inspection, LeaseReply, PublishChecks, PublishOutcome, Snapshot,
    StoreError, WitnessSlot,
};
use super::tags::{TagStore, TimedTickets};
use crate::keys::ObjectKeys;
use bitmap::Bitmap;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Lower bound on writes between sweeps, so small maps are not swept on
/// every write.
const SWEEP_MIN_WRITES: usize = 1024;

/// The embedded store: the whole keyspace of one process in one map.
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Slot>,
    writes_since_sweep: usize,
    /// Bloom bitmaps (active and candidates), mutable in place.
    bitmaps: HashMap<String, Bitmap>,
}

struct Slot {
    value: Bytes,
    expires: Instant,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Keys held, including expired ones not yet swept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().map.len()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every operation leaves the map consistent before it can panic, so
        // a poisoned lock still guards valid data.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    fn get(&mut self, key: &str, now: Instant) -> Option<&Bytes> {
        if self.map.get(key).is_some_and(|slot| slot.expires <= now) {
            self.map.remove(key);
        }
        self.map.get(key).map(|slot| &slot.value)
    }

    fn set(&mut self, key: &str, value: Bytes, ttl: Duration, now: Instant) {
        let expires = deadline(now, ttl);
        self.map.insert(key.to_owned(), Slot { value, expires });
        self.writes_since_sweep += 1;
        if self.writes_since_sweep >= SWEEP_MIN_WRITES.max(self.map.len() / 2) {
            self.map.retain(|_, slot| slot.expires > now);
            self.writes_since_sweep = 0;
        }
    }

    /// `PEXPIRE`: a new TTL for a live key, without rewriting it.
    fn touch(&mut self, key: &str, ttl: Duration, now: Instant) {
        if let Some(slot) = self.map.get_mut(key) {
            slot.expires = deadline(now, ttl);
        }
    }

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

    /// The value and its remaining TTL.
    fn get_with_ttl(&mut self, key: &str, now: Instant) -> Option<(Bytes, Option<Duration>)> {
        self.get(key, now)?;
        let slot = self.map.get(key)?;
        Some((
            slot.value.clone(),
            Some(slot.expires.saturating_duration_since(now)),
        ))
    }

    /// `lua/publish.lua`, and `lua/publish_checked.lua` with `checks`.
    fn publish(
        &mut self,
        keys: &ObjectKeys,
        owner: &str,
        ticket: &[u8],
        entry: Bytes,
        ttl: Duration,
        checks: &PublishChecks,
    ) -> PublishOutcome {
        let now = Instant::now();
        // A missing generation counts as changed: it was lost and any
        // recreation would be a value this ticket never saw (ABA).
        if self.get(keys.generation(), now).map(Bytes::as_ref) != Some(ticket) {
            return PublishOutcome::GenerationChanged;
        }
        if self.get(keys.lease(), now).map(Bytes::as_ref) != Some(owner.as_bytes()) {
            return PublishOutcome::LeaseLost;
        }
        if let Some(floor_key) = &checks.floor_key {
            if let Some(floor) = self.get(floor_key, now).and_then(|f| parse_i64(f)) {
                if checks.version.is_none_or(|v| v < floor) {
                    return PublishOutcome::BelowFloor;
                }
            }
        }
        for (key, tag_ticket) in &checks.tags {
            if self.get(key, now) != Some(tag_ticket) {
                return PublishOutcome::TagChanged;
            }
        }
        self.set(keys.entry(), entry, ttl, now);
        PublishOutcome::Published
    }

    fn delete_if(&mut self, key: &str, expected: &[u8], now: Instant) -> bool {
        if self.get(key, now).is_some_and(|v| v.as_ref() == expected) {
            self.map.remove(key);
            return true;
        }
        false
    }
}

/// `now + ttl`, with Redis' rule that a TTL is at least 1 ms.
fn deadline(now: Instant, ttl: Duration) -> Instant {
    let ttl = ttl.max(Duration::from_millis(1));
    now.checked_add(ttl)
        // A TTL beyond the clock's range means "practically forever".
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
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
            let mut inner = self.lock();
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
            let mut inner = self.lock();
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
            let mut inner = self.lock();
            let ticket = inner.ticket(keys.generation(), nonce, gen_ttl, now);
            let superseded = match inner.get(keys.lease(), now) {
                None => false,
                Some(held) if lease_ticket(held) == Some(ticket.as_ref()) => {
                    return Ok(LeaseReply::Held);
                }
                Some(_) => true,
            };
            let reply = LeaseReply::won(owner, ticket, superseded);
            if let LeaseReply::Won { value, .. } = &reply {
                inner.set(keys.lease(), Bytes::from(value.clone()), ttl, now);
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
            Ok(self.lock().ticket(gen_key, nonce, gen_ttl, now))
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
        Box::pin(async move { Ok(self.lock().publish(keys, owner, ticket, entry, ttl, checks)) })
    }

    fn renew_lease<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock();
            if inner.get(lease_key, now).map(Bytes::as_ref) != Some(owner.as_bytes()) {
                return Ok(false);
            }
            inner.touch(lease_key, ttl, now);
            Ok(true)
        })
    }

    fn unlock<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            Ok(self
                .lock()
                .delete_if(lease_key, owner.as_bytes(), Instant::now()))
        })
    }

    fn delete_if_equals<'a>(
        &'a self,
        key: &'a str,
        expected: &'a [u8],
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Ok(self.lock().delete_if(key, expected, Instant::now())) })
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
            let mut inner = self.lock();
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
            let mut inner = self.lock();
            for (key, mark) in gen_keys.iter().zip(marks) {
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
        let mut inner = self.lock();
        Some(stamped.iter().all(|(key, generation)| {
            std::str::from_utf8(key)
                .ok()
                .and_then(|k| inner.get(k, now))
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
            let mut inner = self.lock();
            Ok(tag_keys
                .iter()
                .map(|k| inner.ticket(k, nonce, gen_ttl, now))
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
            let mut inner = self.lock();
            let tickets = tag_keys
                .iter()
                .map(|k| inner.ticket(k, nonce, gen_ttl, now))
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
            let mut inner = self.lock();
            let moved = tag_keys.iter().any(|k| {
                inner
                    .get(k, now)
                    .is_some_and(|g| micros_of(g).is_none_or(|at| at >= since))
            });
            if moved {
                return Ok(None);
            }
            Ok(Some(
                tag_keys
                    .iter()
                    .map(|k| inner.ticket(k, nonce, gen_ttl, now))
                    .collect(),
            ))
        })
    }

    fn read_tags<'a>(
        &'a self,
        tag_keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<Option<Bytes>>, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock();
            Ok(tag_keys
                .iter()
                .map(|k| inner.get(k, now).cloned())
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
            self.lock().set(list_key, value, ttl, now);
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
            let mut inner = self.lock();
            for (key, revision) in floors {
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
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn expired_keys_are_swept_without_being_read() {
        let store = MemoryStore::new();
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

//! The cache store: the [`Store`] trait that the read pipeline and the
//! invalidation sources talk to, its two backends ([`redis::RedisStore`],
//! [`memory::MemoryStore`]), how redis-rs clients are built from the config
//! (TLS and server names: [`redis_client`]; one node's connection: [`redis_node`];
//! Sentinel: [`redis_sentinel`]), the Lua scripts ([`scripts`]), and the
//! [`guarded::GuardedStore`] wrapper that puts a timeout and the circuit
//! breaker ([`breaker`]; on Redis Cluster one per master, [`node_breakers`]
//! over the [`slot_map`] that [`redis_slots`] keeps current) around every call.
//!
//! The trait speaks in keys the caller built (see `pipeline::key`), so both
//! backends implement exactly the same protocol (SPEC §5.1):
//! - `read`: one round trip for the entry and the object's generation
//!   (`read_near`: the same answer from process memory, where the backend
//!   keeps a coherent copy: the Redis near cache, [`near`]);
//! - `ticket`: current generation, created fresh if missing — never absent;
//! - `take_lease` / `renew_lease` / `unlock`: the fill lease taken together
//!   with the fill's ticket (a lease held for an older generation is
//!   superseded), compare-and-`PEXPIRE` (a slow fill keeps its lease),
//!   compare-and-delete;
//! - `publish`: write the entry only if the lease is still ours and the
//!   generation still equals the ticket;
//! - `invalidate`: replace the generation with a fresh unique value;
//! - `invalidate_many`: the same for many objects in one round trip where
//!   the backend can (invalidation sources apply events in batches);
//! - `invalidate_marked`: the same for events a feed delivers to every
//!   instance, a no-op where the event (or a later stream entry) already
//!   replaced the generation;
//! - `publish_checked`, `tag_tickets`, `read_tags`, `raise_floors`: the
//!   same protocol for version floors and cache tags (issue 13);
//! - `delete_if_equals`: remove a corrupt entry only if it is unchanged;
//! - `bloom_*` ([`bloom`]): the Bloom filter's check, build, activation and
//!   growth (SPEC §6).

pub mod bloom;
pub mod breaker;
pub mod guarded;
pub mod memory;
pub mod near;
pub mod near_tracking;
pub mod node_breakers;
pub mod redis;
pub mod redis_client;
pub mod redis_node;
pub mod redis_sentinel;
pub mod redis_slots;
pub mod scripts;
pub mod slot_map;

use crate::keys::ObjectKeys;
use bytes::Bytes;
use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a store call failed. Every kind means "store unavailable" to the read
/// pipeline (degraded path); the kinds differ in logs and metrics, and in
/// one more way: [`StoreError::WriteRefused`] does not open the breaker.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store call timed out")]
    Timeout,
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("unexpected store reply: {0}")]
    Protocol(String),
    #[error("circuit breaker open")]
    BreakerOpen,
    /// The store answered but refuses writes (Redis `OOM` at `maxmemory`
    /// with `noeviction`, `READONLY` replica, `NOREPLICAS`, `MISCONF`).
    /// Reads still work, so this one does not open the breaker: hits go on
    /// being served, and misses go to the origin without caching.
    #[error("store refuses writes: {0}")]
    WriteRefused(String),
    /// An invalidation was applied by the primary but fewer replicas than
    /// `store.redis.replicas_ack` confirmed it in time: a failover now could
    /// lose it, so its event stays pending and is retried. Not a store
    /// failure: the breaker stays closed.
    #[error(
        "invalidation reached {acked} of {wanted} replicas within store.redis.replicas_timeout"
    )]
    ReplicaShortfall { acked: i64, wanted: u32 },
}

/// Everything stored for one object variant, with remaining TTLs (`None`:
/// the key is missing; `Some(None)`: it has no TTL). For the operator's
/// `/admin/lookup`, never for serving.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inspection {
    pub entry: Option<(Bytes, Option<Duration>)>,
    pub generation: Option<(Bytes, Option<Duration>)>,
    pub lease: Option<(Bytes, Option<Duration>)>,
}

/// What one `read` round trip returned. Two snapshots are equal when
/// their entry and generation are: a memo never changes what they say.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub entry: Option<Bytes>,
    pub generation: Option<Bytes>,
    /// From the near cache: the slot kept with `entry`'s bytes for what a
    /// reader derives from them (see [`Memo`]).
    pub memo: Option<Memo>,
}

/// A value a reader derives from an entry's bytes (the pipeline's decoded
/// entry), made on first use and kept by the near cache beside the bytes
/// for as long as it keeps them, so a hit does not decode the same bytes
/// again. Opaque to the store.
#[derive(Clone, Default)]
pub struct Memo(Arc<OnceLock<Arc<dyn Any + Send + Sync>>>);

impl Memo {
    /// The value made from the bytes, `make`-ing it on first use; `None`
    /// when `make` gives none (nothing is kept: corrupt bytes are removed
    /// from the store, and with them from the near cache) or the slot
    /// holds another type.
    pub fn get_or_make<T: Any + Send + Sync>(
        &self,
        make: impl FnOnce() -> Option<T>,
    ) -> Option<Arc<T>> {
        if let Some(v) = self.0.get() {
            return Arc::clone(v).downcast::<T>().ok();
        }
        let made = Arc::new(make()?);
        // Two readers may both make it; the first one set is kept.
        let _ = self.0.set(made.clone());
        Some(made)
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Memo(made)"
        } else {
            "Memo(empty)"
        })
    }
}

impl PartialEq for Snapshot {
    fn eq(&self, other: &Snapshot) -> bool {
        self.entry == other.entry && self.generation == other.generation
    }
}

impl Eq for Snapshot {}

/// What `take_lease` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseReply {
    /// The lease is ours: `value` (`<owner>@<ticket>`) is what publish,
    /// renew and unlock compare; `ticket` the generation the fill is for.
    Won {
        value: String,
        ticket: Bytes,
        /// A fill of an older generation held it and was superseded.
        superseded: bool,
    },
    /// A fill of the current generation holds it: wait for its answer.
    Held,
}

impl LeaseReply {
    /// The reply for a lease taken by `owner` for `ticket`. Generations are
    /// ASCII (built from server time and a hex nonce); a value someone else
    /// wrote that is not UTF-8 makes a value that never compares equal, so
    /// that fill's publish is refused: a miss, never a wrong answer.
    pub fn won(owner: &str, ticket: Bytes, superseded: bool) -> LeaseReply {
        LeaseReply::Won {
            value: format!("{owner}@{}", String::from_utf8_lossy(&ticket)),
            ticket,
            superseded,
        }
    }
}

/// Whether a generation value `current` was created by applying an event
/// marked `mark` or, for stream marks (`s:<ms>-<seq>`), a later entry of the
/// stream: then it was created after that event committed, and replacing it
/// again would only cost a miss. Mirrors `lua/invalidate_marked.lua`.
pub fn covers(current: &[u8], mark: &str) -> bool {
    let Some(seen) = lease_ticket(current) else {
        return false;
    };
    if seen == mark.as_bytes() {
        return true;
    }
    let (Some(seen), Some(mark)) = (stream_mark(seen), stream_mark(mark.as_bytes())) else {
        return false;
    };
    seen >= mark
}

/// `s:<ms>-<seq>` as comparable numbers (`None` if not a stream mark).
fn stream_mark(mark: &[u8]) -> Option<(u128, u128)> {
    let id = std::str::from_utf8(mark.strip_prefix(b"s:")?).ok()?;
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// The ticket a lease value was taken for (`<owner>@<ticket>`), or the
/// mark a generation value carries (`<time>-<nonce>@<mark>`): what follows
/// the first `@`.
pub fn lease_ticket(value: &[u8]) -> Option<&[u8]> {
    let at = value.iter().position(|b| *b == b'@')?;
    Some(&value[at + 1..])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishOutcome {
    Published,
    /// The lease expired or another filler holds it now.
    LeaseLost,
    /// The generation moved since the ticket (invalidated, or lost and recreated).
    GenerationChanged,
    /// The answer's version is below the object's floor (or it has none
    /// while a floor exists).
    BelowFloor,
    /// A tag generation moved since the filler read it (or was lost).
    TagChanged,
}

/// What [`Store::publish_checked`] checks besides generation and lease.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishChecks {
    /// The object's floor key, for routes with `version_from`.
    pub floor_key: Option<String>,
    /// The answer's version (`None`: it sent none).
    pub version: Option<i64>,
    /// (tag generation key, the generation read before the upstream call).
    pub tags: Vec<(String, Bytes)>,
}

/// No checks: a plain publish (generation and lease only).
pub static NO_CHECKS: PublishChecks = PublishChecks {
    floor_key: None,
    version: None,
    tags: Vec::new(),
};

impl PublishChecks {
    /// Nothing to check besides generation and lease (a version without a
    /// floor key is not compared with anything).
    pub fn is_none(&self) -> bool {
        self.floor_key.is_none() && self.tags.is_empty()
    }
}

/// The Bloom operations are a supertrait ([`bloom::BloomStore`]) so they
/// live in their own files.
pub trait Store: bloom::BloomStore + Send + Sync + 'static {
    /// Backend name for logs: `redis`, `redis-cluster`, `memory`.
    fn kind(&self) -> &'static str;

    /// Redis Cluster: which master serves which slot, kept current by the
    /// backend; the guard keeps one breaker per master with it.
    fn slot_map(&self) -> Option<std::sync::Arc<slot_map::SlotMap>> {
        None
    }

    fn read<'a>(&'a self, keys: &'a ObjectKeys) -> BoxFuture<'a, Result<Snapshot, StoreError>>;

    /// The answer `read` would give, if the backend holds it in process
    /// (the Redis near cache); `None` means "ask with `read`". Never blocks.
    fn read_near(&self, _keys: &ObjectKeys) -> Option<Snapshot> {
        None
    }

    /// Whether [`Store::read_near`] can ever answer.
    fn has_near(&self) -> bool {
        false
    }

    /// What the near cache holds for `keys`, without counting a lookup;
    /// `None` when it holds nothing (or there is no near cache).
    fn peek_near(&self, _keys: &ObjectKeys) -> Option<Snapshot> {
        None
    }

    /// The entry, generation and lease of `keys` with their TTLs, in one
    /// round trip (`/admin/lookup`).
    fn inspect<'a>(
        &'a self,
        _keys: &'a ObjectKeys,
    ) -> BoxFuture<'a, Result<Inspection, StoreError>> {
        Box::pin(async { Err(StoreError::Protocol("inspect is not supported".into())) })
    }

    /// Takes the fill lease of `keys` for `owner` (`lua/lease.lua`), with
    /// the fill's ticket: the current generation, created fresh (`nonce`,
    /// `gen_ttl`) if missing. Free, or held by a fill whose ticket is not
    /// the current generation: ours (that fill is superseded). Held by a
    /// fill of the current generation: [`LeaseReply::Held`].
    fn take_lease<'a>(
        &'a self,
        keys: &'a ObjectKeys,
        owner: &'a str,
        nonce: &'a str,
        ttl: Duration,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<LeaseReply, StoreError>>;

    /// The current generation; created as a fresh unique value if missing.
    /// Refreshes the generation key's TTL to `gen_ttl`.
    fn ticket<'a>(
        &'a self,
        gen_key: &'a str,
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Bytes, StoreError>>;

    /// Writes `entry` with `ttl` if `gen == ticket` and `lease == owner`
    /// (the lease value), checked in that order.
    fn publish<'a>(
        &'a self,
        keys: &'a ObjectKeys,
        owner: &'a str,
        ticket: &'a [u8],
        entry: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<PublishOutcome, StoreError>> {
        self.publish_checked(keys, owner, ticket, entry, ttl, &NO_CHECKS)
    }

    /// [`Store::publish`] that also refuses an answer below the object's
    /// version floor or whose tags moved (`lua/publish_checked.lua`).
    /// Where tag keys cannot be checked in the same script (Redis
    /// Cluster: other slots) they are compared just before; the hit check
    /// then keeps an entry whose tag moved in between from being served.
    fn publish_checked<'a>(
        &'a self,
        keys: &'a ObjectKeys,
        owner: &'a str,
        ticket: &'a [u8],
        entry: Bytes,
        ttl: Duration,
        checks: &'a PublishChecks,
    ) -> BoxFuture<'a, Result<PublishOutcome, StoreError>>;

    /// The current generation of each tag key, created fresh where missing
    /// (`lua/tag_tickets.lua`), TTL refreshed to `gen_ttl`.
    fn tag_tickets<'a>(
        &'a self,
        tag_keys: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Bytes>, StoreError>> {
        let _ = (tag_keys, nonce, gen_ttl);
        Box::pin(async { Err(StoreError::Protocol("tags are not supported".into())) })
    }

    /// The current value of each key (`None`: missing): tag generations
    /// for the hit check of a tagged entry, an object's tag list before a
    /// fill; from the near cache where it holds them.
    fn read_tags<'a>(
        &'a self,
        tag_keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<Option<Bytes>>, StoreError>> {
        let _ = tag_keys;
        Box::pin(async { Err(StoreError::Protocol("tags are not supported".into())) })
    }

    /// Whether every `(tag generation key, stamped generation)` is still
    /// current, if the backend can tell from process memory (the near
    /// cache): `Some(false)` as soon as one it holds differs, `None` when
    /// it does not hold them all ("ask with `read_tags`"). Never blocks.
    fn tags_current_near(&self, _stamped: &[(Bytes, Bytes)]) -> Option<bool> {
        None
    }

    /// Records the tags an object's last answer carried (`SET key value
    /// PX ttl`), so the next fill takes their tickets before its upstream
    /// call.
    fn remember_tags<'a>(
        &'a self,
        list_key: &'a str,
        tags: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (list_key, tags, ttl);
        Box::pin(async { Err(StoreError::Protocol("tags are not supported".into())) })
    }

    /// Raises version floors (`lua/floor.lua`): `floors[i]` is (floor key,
    /// revision); TTL `gen_ttl`. Same error contract as `invalidate_many`.
    fn raise_floors<'a>(
        &'a self,
        floors: &'a [(String, i64)],
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (floors, gen_ttl);
        Box::pin(async { Err(StoreError::Protocol("floors are not supported".into())) })
    }

    /// Sets the lease's TTL to `ttl` only if `owner` still holds it. True if
    /// renewed; false if it expired or another filler holds it.
    fn renew_lease<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Deletes the lease only if `owner` still holds it. True if deleted.
    fn unlock<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Deletes `key` only if its value equals `expected`. True if deleted.
    fn delete_if_equals<'a>(
        &'a self,
        key: &'a str,
        expected: &'a [u8],
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Replaces the generation with a fresh unique value (server time +
    /// `nonce`), TTL `gen_ttl`. Returns the new generation.
    fn invalidate<'a>(
        &'a self,
        gen_key: &'a str,
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Bytes, StoreError>>;

    /// [`Store::invalidate`] for every key in `gen_keys`, all with the same
    /// `nonce` (each value is still unique: it embeds the key's own server
    /// time and is never equal to the value it replaces). All or nothing for
    /// the caller: an error means "retry the whole batch", which is safe
    /// because invalidation is idempotent. The default calls `invalidate`
    /// once per key; backends override it to save round trips.
    fn invalidate_many<'a>(
        &'a self,
        gen_keys: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            for key in gen_keys {
                self.invalidate(key, nonce, gen_ttl).await?;
            }
            Ok(())
        })
    }

    /// [`Store::invalidate_many`] for events marked with their position in
    /// a feed (`marks[i]` for `gen_keys[i]`, see [`covers`]), as
    /// `lua/invalidate_marked.lua`: the new generation carries the mark,
    /// and a generation whose mark covers the event's is left alone. Every
    /// instance applies every feed event (the fan-out); this makes all
    /// deliveries but the first cost no cache miss. Same error contract as
    /// `invalidate_many`. The default replaces every time (correct, dearer).
    fn invalidate_marked<'a>(
        &'a self,
        gen_keys: &'a [String],
        marks: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = marks;
        self.invalidate_many(gen_keys, nonce, gen_ttl)
    }

    /// Takes or renews one of a feed's witness slots for `owner`
    /// (`lua/witness.lua`; `slots` share one hash tag). Only witnesses run
    /// the fan-out (`crate::invalidation::witness`).
    fn witness<'a>(
        &'a self,
        slots: &'a [String],
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<WitnessSlot, StoreError>>;

    /// Whether the connection the invalidations take answers (`PING`): the
    /// feeds' early probe ([`GuardedStore::feeds_ready`]). A backend that
    /// cannot fail answers at once.
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}
pub use guarded::{open, GuardedStore};

/// What [`Store::witness`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WitnessSlot {
    /// The slot held now (renewed or just taken); `None`: others hold all.
    pub held: Option<usize>,
    /// Held: the TTL. Not held: until the first slot expires (when trying
    /// again can succeed).
    pub free_in: Duration,
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_memo_keeps_what_was_made_and_nothing_that_failed() {
        let memo = Memo::default();
        assert_eq!(memo.get_or_make(|| None::<u32>), None);
        let a = memo.get_or_make(|| Some(7u32)).expect("made");
        let b = memo.get_or_make(|| Some(8u32)).expect("kept");
        assert!(Arc::ptr_eq(&a, &b));
        // Another type is not the value kept.
        assert_eq!(memo.get_or_make(|| Some("x")), None);
        // Clones share the slot (the near cache hands out clones).
        assert_eq!(memo.clone().get_or_make(|| Some(9u32)).as_deref(), Some(&7));
    }

    use super::*;

    #[test]
    fn marks_cover_the_same_event_and_later_stream_entries() {
        let g = |mark: &str| format!("1796118908.010000-abc@{mark}").into_bytes();
        assert!(covers(&g("s:100-1"), "s:100-1"));
        assert!(covers(&g("s:100-2"), "s:100-1"), "a later entry");
        assert!(covers(&g("s:101-0"), "s:100-9"), "a later millisecond");
        assert!(covers(&g("s:1000-0"), "s:999-0"), "numbers, not text");
        assert!(!covers(&g("s:100-1"), "s:100-2"), "an earlier entry");
        assert!(!covers(&g("s:99-9"), "s:100-0"));
        assert!(covers(&g("o:7:123"), "o:7:123"));
        assert!(
            !covers(&g("o:7:123"), "o:8:123"),
            "outbox rows: only the same row"
        );
        assert!(
            !covers(&g("o:7:123"), "o:7:124"),
            "a row id handed out again"
        );
        assert!(!covers(&g("o:7:123"), "s:1-0"));
        assert!(!covers(b"1796118908.010000-abc", "s:1-0"), "no mark");
        assert!(!covers(&g("s:x-1"), "s:1-0"));
    }

    #[test]
    fn lease_values_name_their_ticket() {
        let ticket = Bytes::from_static(b"1.000001-n@s:5-0");
        let LeaseReply::Won { value, .. } = LeaseReply::won("owner", ticket.clone(), false) else {
            panic!("won");
        };
        assert_eq!(value, "owner@1.000001-n@s:5-0");
        assert_eq!(lease_ticket(value.as_bytes()), Some(ticket.as_ref()));
    }
}

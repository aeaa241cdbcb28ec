//! The cache store: the [`Store`] trait that the read pipeline and the
//! invalidation sources talk to, its two backends ([`redis::RedisStore`],
//! [`memory::MemoryStore`]), the Lua scripts ([`scripts`]), and the
//! [`guarded::GuardedStore`] wrapper that puts a timeout and the circuit
//! breaker ([`breaker`]) around every call.
//!
//! The trait speaks in keys the caller built (see `pipeline::key`), so both
//! backends implement exactly the same protocol (SPEC §5.1):
//! - `read`: one round trip for the entry and the object's generation
//!   (`read_near`: the same answer from process memory, where the backend
//!   keeps a coherent copy: the Redis near cache, [`near`]);
//! - `ticket`: current generation, created fresh if missing — never absent;
//! - `try_lease` / `renew_lease` / `unlock`: `SET NX PX` with an owner token,
//!   compare-and-`PEXPIRE` (a slow fill keeps its lease), compare-and-delete;
//! - `publish`: write the entry only if the lease is still ours and the
//!   generation still equals the ticket;
//! - `invalidate`: replace the generation with a fresh unique value;
//! - `invalidate_many`: the same for many objects in one round trip where
//!   the backend can (invalidation sources apply events in batches);
//! - `delete_if_equals`: remove a corrupt entry only if it is unchanged;
//! - `bloom_*` ([`bloom`]): the Bloom filter's check, build, activation and
//!   growth (SPEC §6).

pub mod bloom;
pub mod breaker;
pub mod guarded;
pub mod memory;
pub mod near;
pub mod redis;
pub mod scripts;

use crate::keys::ObjectKeys;
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
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

/// What one `read` round trip returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub entry: Option<Bytes>,
    pub generation: Option<Bytes>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishOutcome {
    Published,
    /// The lease expired or another filler holds it now.
    LeaseLost,
    /// The generation moved since the ticket (invalidated, or lost and recreated).
    GenerationChanged,
}

/// The Bloom operations are a supertrait ([`bloom::BloomStore`]) so they
/// live in their own files.
pub trait Store: bloom::BloomStore + Send + Sync + 'static {
    /// Backend name for logs: `redis`, `redis-cluster`, `memory`.
    fn kind(&self) -> &'static str;

    fn read<'a>(&'a self, keys: &'a ObjectKeys) -> BoxFuture<'a, Result<Snapshot, StoreError>>;

    /// The answer `read` would give, if the backend holds it in process
    /// (the Redis near cache); `None` means "ask with `read`". Never blocks.
    fn read_near(&self, _keys: &ObjectKeys) -> Option<Snapshot> {
        None
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

    /// `SET lease owner NX PX ttl`: true if we now hold the lease.
    fn try_lease<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The current generation; created as a fresh unique value if missing.
    /// Refreshes the generation key's TTL to `gen_ttl`.
    fn ticket<'a>(
        &'a self,
        gen_key: &'a str,
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Bytes, StoreError>>;

    /// Writes `entry` with `ttl` if `lease == owner` and `gen == ticket`.
    fn publish<'a>(
        &'a self,
        keys: &'a ObjectKeys,
        owner: &'a str,
        ticket: &'a [u8],
        entry: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<PublishOutcome, StoreError>>;

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
}
pub use guarded::{open, GuardedStore};

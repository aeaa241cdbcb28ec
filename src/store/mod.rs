//! The cache store: what the read pipeline and the invalidation sources
//! talk to. Bottom up:
//! - [`protocol`]: the values the calls take and answer, and [`StoreError`];
//! - the contract, one trait per capability: [`ObjectStore`] (reads,
//!   leases, publish: [`object`]), [`FeedStore`] (invalidation and the
//!   feeds' witness slots: [`feeds`]), [`TagStore`] (cache tags and version
//!   floors: [`tags`]), [`BloomStore`] (the Bloom filter: [`bloom`]), and
//!   [`Store`], their union and what a backend is ([`backend`]);
//! - the backends, a folder each: [`redis`] (single node, Sentinel or
//!   Cluster, with the near cache) and [`memory`] (embedded);
//! - [`GuardedStore`] ([`guarded`]): the only way the rest of sidecache
//!   calls the store, a timeout and the circuit breaker around every call
//!   (one per master on Redis Cluster, over the [`slot_map`] the Redis
//!   backend keeps current; the invalidation feeds keep their own);
//! - [`open`]: builds the configured backend, guarded. Adding a backend is
//!   a folder that implements the contract and one arm of its `match`.
//!
//! The traits speak in keys the caller built ([`crate::keys`]), so both
//! backends implement exactly the same protocol
//! (docs/architecture.md#generation-protocol):
//! - `read`: one round trip for the entry and the object's generation
//!   (`read_near`: the same answer from process memory, where the backend
//!   keeps a coherent copy: the Redis near cache, [`redis::near`]);
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
//!   same protocol for version floors and cache tags
//!   (docs/invalidation.md#dependent-invalidation);
//! - `delete_if_equals`: remove a corrupt entry only if it is unchanged;
//! - `bloom_*` ([`bloom`]): the Bloom filter's check, build, activation and
//!   growth (docs/architecture.md#bloom-filter).

pub(crate) mod backend;
pub(crate) mod bloom;
pub(crate) mod feeds;
pub(crate) mod guarded;
pub(crate) mod memory;
pub(crate) mod object;
pub(crate) mod protocol;
pub(crate) mod redis;
pub(crate) mod slot_map;
pub(crate) mod tags;

pub use backend::Store;
pub use bloom::{BloomAnswer, BloomStore};
pub use feeds::FeedStore;
pub use guarded::GuardedStore;
pub use memory::MemoryStore;
pub use object::ObjectStore;
pub use protocol::{
    FillDepends, Inspection, LeaseReply, Memo, PublishChecks, PublishOutcome, Snapshot, StoreError,
    Superseded, WitnessSlot,
};
pub use redis::RedisStore;
pub use tags::TagStore;

use crate::config::StoreConfig;
use crate::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;

/// Builds the configured backend wrapped in a `GuardedStore`. Must not fail
/// because Redis is unreachable at start: sidecache starts degraded and the
/// connection is (re)established in the background.
pub async fn open(cfg: &StoreConfig, metrics: &Metrics) -> Result<Arc<GuardedStore>, StoreError> {
    crate::tls::use_ring();
    let cooldown = cfg.breaker_cooldown;
    let guarded = match &cfg.redis {
        None => {
            let store = MemoryStore::with_budget(
                cfg.memory_max_bytes,
                memory::SHARDS,
                metrics.memory_store.clone(),
            );
            GuardedStore::new(Arc::new(store), None, cooldown, metrics)
        }
        Some(redis) => {
            // Ping often enough that a recovered Redis is reconnected before
            // the breaker's next probe.
            let heartbeat =
                (cooldown / 2).clamp(Duration::from_millis(100), Duration::from_secs(1));
            let store = RedisStore::connect(redis, heartbeat, metrics)?;
            tracing::info!(
                kind = store.kind(),
                "store configured (connecting in the background)"
            );
            GuardedStore::new(
                Arc::new(store),
                Some(redis.command_timeout),
                cooldown,
                metrics,
            )
            .with_replicas_wait(redis.replicas_ack.map_or(Duration::ZERO, |a| a.timeout))
        }
    };
    Ok(Arc::new(guarded))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn open_without_redis_is_the_memory_store() {
        let metrics = Metrics::new();
        let cooldown = Duration::from_secs(2);
        let cfg = StoreConfig {
            redis: None,
            namespace: "sc:".into(),
            breaker_cooldown: cooldown,
            memory_max_bytes: 64 << 20,
        };
        let store = open(&cfg, &metrics).await.unwrap();
        assert_eq!(store.inner().kind(), "memory");
        assert!(store.ticket("g", "n", cooldown).await.is_ok());
    }
}

//! Invalidation as [`FeedStore`]: replacing generations (one key, a
//! batch, or a feed's marked events), and the feeds' witness slots.

use super::protocol::{StoreError, WitnessSlot};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::time::Duration;

/// Invalidations and the feeds' witness slots.
pub trait FeedStore: Sync {
    /// Replaces the generation with a fresh unique value (server time +
    /// `nonce`), TTL `gen_ttl`. Returns the new generation.
    fn invalidate<'a>(
        &'a self,
        gen_key: &'a str,
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Bytes, StoreError>>;

    /// [`FeedStore::invalidate`] for every key in `gen_keys`, all with the same
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

    /// [`FeedStore::invalidate_many`] for events marked with their position in
    /// a feed (`marks[i]` for `gen_keys[i]`, see [`super::protocol::covers`]), as
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
    /// feeds' early probe ([`super::GuardedStore::feeds_ready`]). A backend that
    /// cannot fail answers at once.
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

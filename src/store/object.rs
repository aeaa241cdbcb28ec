//! The object protocol (docs/architecture.md#generation-protocol) as
//! [`ObjectStore`]: reading an object's entry and generation, the fill lease
//! and its ticket, publishing the filled entry, and the corrupt-entry delete.

use super::protocol::{
    unsupported, FillDepends, Inspection, LeaseReply, PublishChecks, PublishOutcome, Snapshot,
    StoreError, NO_CHECKS,
};
use crate::keys::ObjectKeys;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::time::Duration;

/// Reads, leases and publishes of one object variant's keys.
pub trait ObjectStore {
    fn read<'a>(&'a self, keys: &'a ObjectKeys) -> BoxFuture<'a, Result<Snapshot, StoreError>>;

    /// The answer `read` would give, if the backend holds it in process
    /// (the Redis near cache); `None` means "ask with `read`". Never blocks.
    fn read_near(&self, _keys: &ObjectKeys) -> Option<Snapshot> {
        None
    }

    /// Whether [`ObjectStore::read_near`] can ever answer.
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
        unsupported("inspect is not supported")
    }

    /// Takes the fill lease of `keys` for `owner` (`lua/lease.lua`), with
    /// the fill's ticket: the current generation, created fresh (`nonce`,
    /// `gen_ttl`) if missing. Free, or held by a fill that can never
    /// publish: ours (that fill is superseded). A fill can never publish
    /// when its ticket is not the current generation, or when one of the
    /// dependencies it recorded ([`ObjectStore::record_lease_depends`]) is
    /// no longer current: decided in one atomic step with the take-over.
    /// Held by any other fill: [`LeaseReply::Held`].
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

    /// [`ObjectStore::publish`] that also refuses an answer below the
    /// object's version floor or whose tags moved
    /// (`lua/publish_checked.lua`). Where tag keys cannot be checked in the
    /// same script (Redis Cluster: other slots) they are compared just
    /// before; the hit check then keeps an entry whose tag moved in between
    /// from being served.
    fn publish_checked<'a>(
        &'a self,
        keys: &'a ObjectKeys,
        owner: &'a str,
        ticket: &'a [u8],
        entry: Bytes,
        ttl: Duration,
        checks: &'a PublishChecks,
    ) -> BoxFuture<'a, Result<PublishOutcome, StoreError>>;

    /// Records beside the lease what the fill holding it (lease value
    /// `owner`) depends on, for as long as the lease lives (renewed and
    /// released with it), so that [`ObjectStore::take_lease`] supersedes it once one of
    /// those moves. Written only while `owner` holds the lease; true if so.
    /// A lost record only means waiters wait for that fill, as before.
    fn record_lease_depends<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
        depends: &'a FillDepends,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = (lease_key, owner, depends);
        unsupported("lease dependencies are not supported")
    }

    /// Sets the lease's TTL to `ttl` only if `owner` still holds it (and
    /// the lease's dependency record with it). True if
    /// renewed; false if it expired or another filler holds it.
    fn renew_lease<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Deletes the lease (and its dependency record) only if `owner` still
    /// holds it. True if deleted.
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
}

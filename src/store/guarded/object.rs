//! The object protocol's calls behind the breaker and the timeout. The
//! read pipeline's hit path is `GuardedStore::read` (or `read_near` then
//! `read_far`): a near-cache answer skips the breaker and the timeout.

use super::node_breakers::Breakers;
use super::{GuardedStore, Op};
use crate::keys::ObjectKeys;
use crate::store::protocol::{
    FillDepends, Inspection, LeaseReply, PublishChecks, PublishOutcome, Snapshot, StoreError,
};
use bytes::Bytes;
use std::time::Duration;

/// The object protocol behind the breaker and the timeout: each call goes
/// through the breaker of its object's master.
impl GuardedStore {
    pub async fn read(&self, keys: &ObjectKeys) -> Result<Snapshot, StoreError> {
        // A near-cache answer is coherent with Redis by construction (its
        // tracked connection is alive) and costs no round trip: no breaker
        // admission or timeout needed.
        if let Some(snapshot) = self.inner.read_near(keys) {
            return Ok(snapshot);
        }
        self.call(Op::Read, keys.generation(), |s| s.read(keys))
            .await
    }

    /// What the near cache holds for `keys`, counted as a near-cache hit
    /// or miss; never waits.
    pub(crate) fn read_near(&self, keys: &ObjectKeys) -> Option<Snapshot> {
        self.inner.read_near(keys)
    }

    /// Whether there is a near cache for [`Self::read_near`] to ask.
    pub(crate) fn has_near(&self) -> bool {
        self.inner.has_near()
    }

    /// [`Self::read`] after [`Self::read_near`] found nothing: not counted
    /// as a second near-cache lookup.
    pub(crate) async fn read_far(&self, keys: &ObjectKeys) -> Result<Snapshot, StoreError> {
        self.call(Op::Read, keys.generation(), |s| s.read(keys))
            .await
    }

    /// Everything stored for one variant, with TTLs (`/admin/lookup`).
    pub(crate) async fn inspect(&self, keys: &ObjectKeys) -> Result<Inspection, StoreError> {
        self.call(Op::Inspect, keys.generation(), |s| s.inspect(keys))
            .await
    }

    /// What the near cache holds for `keys`, not counted as a lookup.
    pub(crate) fn peek_near(&self, keys: &ObjectKeys) -> Option<Snapshot> {
        self.inner.peek_near(keys)
    }

    pub async fn take_lease(
        &self,
        keys: &ObjectKeys,
        owner: &str,
        nonce: &str,
        ttl: Duration,
        gen_ttl: Duration,
    ) -> Result<LeaseReply, StoreError> {
        self.call(Op::TakeLease, keys.lease(), |s| {
            s.take_lease(keys, owner, nonce, ttl, gen_ttl)
        })
        .await
    }

    pub async fn ticket(
        &self,
        gen_key: &str,
        nonce: &str,
        gen_ttl: Duration,
    ) -> Result<Bytes, StoreError> {
        self.call(Op::Ticket, gen_key, |s| s.ticket(gen_key, nonce, gen_ttl))
            .await
    }

    pub async fn publish(
        &self,
        keys: &ObjectKeys,
        owner: &str,
        ticket: &[u8],
        entry: Bytes,
        ttl: Duration,
    ) -> Result<PublishOutcome, StoreError> {
        self.call(Op::Publish, keys.entry(), |s| {
            s.publish(keys, owner, ticket, entry, ttl)
        })
        .await
    }

    pub(crate) async fn publish_checked(
        &self,
        keys: &ObjectKeys,
        owner: &str,
        ticket: &[u8],
        entry: Bytes,
        ttl: Duration,
        checks: &PublishChecks,
    ) -> Result<PublishOutcome, StoreError> {
        if matches!(self.breakers, Breakers::PerNode(_)) && !checks.tags.is_empty() {
            // Tag keys live on other masters: compared just before, each
            // through its master's breaker (the hit check covers a change
            // in between), then the object's script on its own master.
            let tag_keys: Vec<&str> = checks.tags.iter().map(|(k, _)| k.as_str()).collect();
            let current = self.read_tags_as(Op::Publish, &tag_keys).await?;
            if current
                .iter()
                .zip(&checks.tags)
                .any(|(now, (_, then))| now.as_ref() != Some(then))
            {
                return Ok(PublishOutcome::TagChanged);
            }
            let rest = PublishChecks {
                floor_key: checks.floor_key.clone(),
                version: checks.version,
                tags: Vec::new(),
            };
            return self
                .call(Op::Publish, keys.entry(), |s| {
                    s.publish_checked(keys, owner, ticket, entry, ttl, &rest)
                })
                .await;
        }
        self.call(Op::Publish, keys.entry(), |s| {
            s.publish_checked(keys, owner, ticket, entry, ttl, checks)
        })
        .await
    }

    pub(crate) async fn renew_lease(
        &self,
        lease_key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.call(Op::RenewLease, lease_key, |s| {
            s.renew_lease(lease_key, owner, ttl)
        })
        .await
    }

    /// Lease upkeep, like a renewal: counted under its `op`.
    pub(crate) async fn record_lease_depends(
        &self,
        lease_key: &str,
        owner: &str,
        depends: &FillDepends,
    ) -> Result<bool, StoreError> {
        self.call(Op::RenewLease, lease_key, |s| {
            s.record_lease_depends(lease_key, owner, depends)
        })
        .await
    }

    pub(crate) async fn unlock(&self, lease_key: &str, owner: &str) -> Result<bool, StoreError> {
        self.call(Op::Unlock, lease_key, |s| s.unlock(lease_key, owner))
            .await
    }

    pub(crate) async fn delete_if_equals(
        &self,
        key: &str,
        expected: &[u8],
    ) -> Result<bool, StoreError> {
        self.call(Op::DeleteIfEquals, key, |s| {
            s.delete_if_equals(key, expected)
        })
        .await
    }
}

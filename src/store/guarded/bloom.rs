//! The Bloom filter's calls behind the breaker and the timeout.

use super::{GuardedStore, Op};
use crate::keys::BloomKeys;
use crate::store::bloom::BloomAnswer;
use crate::store::protocol::StoreError;
use std::time::Duration;

/// Bloom calls behind the breaker and the timeout. Checks are on the request
/// path and count as `bloom_check`; build steps as `bloom_build`; growth as
/// `bloom_add`.
impl GuardedStore {
    pub(crate) async fn bloom_check(
        &self,
        keys: &BloomKeys,
        signature: &str,
        m: u64,
        positions: &[u64],
    ) -> Result<BloomAnswer, StoreError> {
        self.call(Op::BloomCheck, &keys.bits, |s| {
            s.bloom_check(keys, signature, m, positions)
        })
        .await
    }

    pub(crate) async fn bloom_begin(
        &self,
        keys: &BloomKeys,
        owner: &str,
        lock_ttl: Duration,
        m: u64,
        candidate_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.call(Op::BloomBuild, &keys.bits, |s| {
            s.bloom_begin(keys, owner, lock_ttl, m, candidate_ttl)
        })
        .await
    }

    pub(crate) async fn bloom_set_bits(
        &self,
        candidate: &str,
        positions: &[u64],
    ) -> Result<(), StoreError> {
        if positions.is_empty() {
            return Ok(());
        }
        self.call(Op::BloomBuild, candidate, |s| {
            s.bloom_set_bits(candidate, positions)
        })
        .await
    }

    pub(crate) async fn bloom_renew(
        &self,
        keys: &BloomKeys,
        owner: &str,
        lock_ttl: Duration,
        candidate_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.call(Op::BloomBuild, &keys.bits, |s| {
            s.bloom_renew(keys, owner, lock_ttl, candidate_ttl)
        })
        .await
    }

    pub(crate) async fn bloom_activate(
        &self,
        keys: &BloomKeys,
        owner: &str,
        signature: &str,
        m: u64,
    ) -> Result<bool, StoreError> {
        self.call(Op::BloomBuild, &keys.bits, |s| {
            s.bloom_activate(keys, owner, signature, m)
        })
        .await
    }

    pub(crate) async fn bloom_add(
        &self,
        keys: &BloomKeys,
        positions: &[u64],
    ) -> Result<(), StoreError> {
        self.call(Op::BloomAdd, &keys.bits, |s| s.bloom_add(keys, positions))
            .await
    }

    pub(crate) async fn bloom_disable(
        &self,
        keys: &BloomKeys,
        owner: Option<&str>,
    ) -> Result<(), StoreError> {
        self.call(Op::BloomBuild, &keys.bits, |s| s.bloom_disable(keys, owner))
            .await
    }

    pub(crate) async fn bloom_bitcount(&self, bits: &str) -> Result<u64, StoreError> {
        self.call(Op::BloomBuild, bits, |s| s.bloom_bitcount(bits))
            .await
    }

    pub(crate) async fn bloom_claim_interval(
        &self,
        keys: &BloomKeys,
        owner: &str,
        interval: Duration,
    ) -> Result<bool, StoreError> {
        self.call(Op::BloomBuild, &keys.bits, |s| {
            s.bloom_claim_interval(keys, owner, interval)
        })
        .await
    }
}

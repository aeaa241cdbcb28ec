//! The Bloom filter's part of the store contract (SPEC §6), as a supertrait
//! of [`super::Store`] so both backends implement it with the same
//! semantics: the Redis backend with `lua/bloom_*.lua` and pipelined
//! `SETBIT`s (`redis/bloom.rs`), the embedded store with in-memory bitmaps
//! (`memory/bloom.rs`). Also the [`GuardedStore`] wrappers: Bloom calls go
//! through the breaker and the command timeout like every other call.
//!
//! One filter's keys share the hash tag `{<route>:<scope>}`, so every
//! script and pipeline here runs in one Cluster slot.

use super::guarded::{GuardedStore, Op};
use super::StoreError;
use crate::keys::BloomKeys;
use futures_util::future::BoxFuture;
use std::time::Duration;

/// The three answers of a check. Only `Absent` may reject a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BloomAnswer {
    /// The filter is complete, current, and some bit is 0.
    Absent,
    /// Every bit is 1 (a member, or a false positive).
    Maybe,
    /// No usable filter: `ready` missing or with another signature, bitmap
    /// missing or short. Never a reason to reject.
    Unknown,
}

impl BloomAnswer {
    /// The script's integer: 0, 1, -1.
    pub fn from_code(code: i64) -> Result<BloomAnswer, StoreError> {
        match code {
            0 => Ok(BloomAnswer::Absent),
            1 => Ok(BloomAnswer::Maybe),
            -1 => Ok(BloomAnswer::Unknown),
            other => Err(StoreError::Protocol(format!(
                "bloom_check returned {other}"
            ))),
        }
    }

    /// Metric label: `reject`, `maybe`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            BloomAnswer::Absent => "reject",
            BloomAnswer::Maybe => "maybe",
            BloomAnswer::Unknown => "unknown",
        }
    }
}

/// Bloom operations of a store backend. Positions come from
/// `crate::bloom::hash`; `m` is the bitmap size in bits. Optional for a
/// backend: one without Bloom filters keeps the defaults, which fail every
/// call.
pub trait BloomStore {
    /// Three-state check of one element (`bloom_check.lua`).
    fn bloom_check<'a>(
        &'a self,
        keys: &'a BloomKeys,
        signature: &'a str,
        m: u64,
        positions: &'a [u64],
    ) -> BoxFuture<'a, Result<BloomAnswer, StoreError>> {
        let _ = (keys, signature, m, positions);
        unsupported()
    }

    /// Takes the build lock for `owner` (`SET NX PX lock_ttl`) and creates
    /// the empty `m`-bit candidate with `candidate_ttl`, atomically. False:
    /// another build holds the lock.
    fn bloom_begin<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: &'a str,
        lock_ttl: Duration,
        m: u64,
        candidate_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = (keys, owner, lock_ttl, m, candidate_ttl);
        unsupported()
    }

    /// Sets bits in a candidate: one pipeline of `SETBIT`s per call (the
    /// builder sends bounded batches, never one giant script).
    fn bloom_set_bits<'a>(
        &'a self,
        candidate: &'a str,
        positions: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (candidate, positions);
        unsupported()
    }

    /// If `owner` holds the lock and its candidate is complete: renames the
    /// candidate over `bits`, drops its TTL, writes `signature` to `ready`.
    fn bloom_activate<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: &'a str,
        signature: &'a str,
        m: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = (keys, owner, signature, m);
        unsupported()
    }

    /// Keeps a running build alive: if `owner` still holds the lock,
    /// extends the lock to `lock_ttl` and its candidate to `candidate_ttl`.
    fn bloom_renew<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: &'a str,
        lock_ttl: Duration,
        candidate_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = (keys, owner, lock_ttl, candidate_ttl);
        unsupported()
    }

    /// Growth: sets a member's bits in the active bitmap (if any) and in the
    /// candidate of the running build (if any), atomically with respect to
    /// `bloom_begin` and `bloom_activate`.
    fn bloom_add<'a>(
        &'a self,
        keys: &'a BloomKeys,
        positions: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (keys, positions);
        unsupported()
    }

    /// Makes the filter unknown: deletes `ready` (and the candidate of
    /// `owner`, if given). Used when the catalogue outgrew `capacity`.
    fn bloom_disable<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (keys, owner);
        unsupported()
    }

    /// Bits set in a bitmap (`BITCOUNT`), for the fill-ratio gauge.
    fn bloom_bitcount<'a>(&'a self, bits: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        let _ = bits;
        unsupported()
    }

    /// Claims the current rebuild interval for `owner` (`SET NX PX`):
    /// false if another instance's scheduled rebuild claimed it already.
    fn bloom_claim_interval<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: &'a str,
        interval: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = (keys, owner, interval);
        unsupported()
    }
}

/// The default of every Bloom call: a backend without Bloom filters.
fn unsupported<'a, T: Send + 'a>() -> BoxFuture<'a, Result<T, StoreError>> {
    Box::pin(async {
        Err(StoreError::Protocol(
            "bloom filters are not supported".into(),
        ))
    })
}

/// Bloom calls behind the breaker and the timeout. Checks are on the request
/// path and count as `bloom_check`; build steps as `bloom_build`; growth as
/// `bloom_add`.
impl GuardedStore {
    pub async fn bloom_check(
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

    pub async fn bloom_begin(
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

    pub async fn bloom_set_bits(
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

    pub async fn bloom_renew(
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

    pub async fn bloom_activate(
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

    pub async fn bloom_add(&self, keys: &BloomKeys, positions: &[u64]) -> Result<(), StoreError> {
        self.call(Op::BloomAdd, &keys.bits, |s| s.bloom_add(keys, positions))
            .await
    }

    pub async fn bloom_disable(
        &self,
        keys: &BloomKeys,
        owner: Option<&str>,
    ) -> Result<(), StoreError> {
        self.call(Op::BloomBuild, &keys.bits, |s| s.bloom_disable(keys, owner))
            .await
    }

    pub async fn bloom_bitcount(&self, bits: &str) -> Result<u64, StoreError> {
        self.call(Op::BloomBuild, bits, |s| s.bloom_bitcount(bits))
            .await
    }

    pub async fn bloom_claim_interval(
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

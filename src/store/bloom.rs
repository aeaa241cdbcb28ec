//! The Bloom filter's part of the store contract
//! (docs/architecture.md#bloom-filter), as a supertrait of [`super::Store`] so
//! both backends implement it with the same semantics: the Redis backend with
//! `lua/bloom_*.lua` and pipelined `SETBIT`s (`redis/bloom.rs`), the embedded
//! store with in-memory bitmaps (`memory/bloom.rs`).
//!
//! One filter's keys share the hash tag `{<route>:<scope>}`, so every
//! Bloom script and pipeline runs in one Cluster slot.

use super::protocol::{unsupported, StoreError};
use crate::keys::BloomKeys;
use futures_util::future::BoxFuture;
use std::time::Duration;

/// What every call of a backend without Bloom filters answers.
const UNSUPPORTED: &str = "bloom filters are not supported";

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
    pub(crate) fn from_code(code: i64) -> Result<BloomAnswer, StoreError> {
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
    pub(crate) fn as_str(self) -> &'static str {
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
        unsupported(UNSUPPORTED)
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
        unsupported(UNSUPPORTED)
    }

    /// Sets bits in a candidate: one pipeline of `SETBIT`s per call (the
    /// builder sends bounded batches, never one giant script).
    fn bloom_set_bits<'a>(
        &'a self,
        candidate: &'a str,
        positions: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (candidate, positions);
        unsupported(UNSUPPORTED)
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
        unsupported(UNSUPPORTED)
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
        unsupported(UNSUPPORTED)
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
        unsupported(UNSUPPORTED)
    }

    /// Makes the filter unknown: deletes `ready` (and the candidate of
    /// `owner`, if given). Used when the catalogue outgrew `capacity`.
    fn bloom_disable<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (keys, owner);
        unsupported(UNSUPPORTED)
    }

    /// Bits set in a bitmap (`BITCOUNT`), for the fill-ratio gauge.
    fn bloom_bitcount<'a>(&'a self, bits: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        let _ = bits;
        unsupported(UNSUPPORTED)
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
        unsupported(UNSUPPORTED)
    }
}

//! [`BloomStore`] on the embedded store: bitmaps as byte vectors in their
//! own map (so a `SETBIT` does not copy an immutable value), with the same
//! bit order as Redis (offset 0 is the most significant bit of byte 0) and
//! the same three-state, lock and rename semantics as `lua/bloom_*.lua`.
//! Lock and `ready` are ordinary string keys. One filter's keys share a
//! hash tag, so a shard: every operation runs under that shard's lock,
//! like a script.

use super::bitmap::Bitmap;
use super::shard::{deadline, Shard};
use super::MemoryStore;
use crate::keys::BloomKeys;
use crate::store::bloom::{BloomAnswer, BloomStore};
use crate::store::protocol::StoreError;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::time::Duration;
use tokio::time::Instant;

impl Shard {
    fn bitmap(&mut self, key: &str, now: Instant) -> Option<&mut Bitmap> {
        if self
            .bitmaps
            .get(key)
            .is_some_and(|b| b.expires.is_some_and(|e| e <= now))
        {
            self.bitmaps.remove(key);
        }
        self.bitmaps.get_mut(key)
    }
}

impl BloomStore for MemoryStore {
    fn bloom_check<'a>(
        &'a self,
        keys: &'a BloomKeys,
        signature: &'a str,
        m: u64,
        positions: &'a [u64],
    ) -> BoxFuture<'a, Result<BloomAnswer, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(&keys.bits);
            if inner.get(&keys.ready, now).map(Bytes::as_ref) != Some(signature.as_bytes()) {
                return Ok(BloomAnswer::Unknown);
            }
            let Some(bits) = inner.bitmap(&keys.bits, now) else {
                return Ok(BloomAnswer::Unknown);
            };
            if bits.len_bits() < m {
                return Ok(BloomAnswer::Unknown);
            }
            if positions.iter().all(|p| bits.get(*p)) {
                Ok(BloomAnswer::Maybe)
            } else {
                Ok(BloomAnswer::Absent)
            }
        })
    }

    fn bloom_begin<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: &'a str,
        lock_ttl: Duration,
        m: u64,
        candidate_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(&keys.bits);
            if inner.get(&keys.lock, now).is_some() {
                return Ok(false);
            }
            inner.set(
                &keys.lock,
                Bytes::copy_from_slice(owner.as_bytes()),
                lock_ttl,
                now,
            );
            // Candidates of crashed builds are only dropped when touched;
            // sweep them here, where new ones are made.
            inner
                .bitmaps
                .retain(|_, b| b.expires.is_none_or(|e| e > now));
            let len = usize::try_from(m.div_ceil(8)).unwrap_or(usize::MAX);
            inner.bitmaps.insert(
                keys.candidate(owner),
                Bitmap {
                    bytes: vec![0; len],
                    expires: Some(deadline(now, candidate_ttl)),
                },
            );
            Ok(true)
        })
    }

    fn bloom_set_bits<'a>(
        &'a self,
        candidate: &'a str,
        positions: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(candidate);
            // Like SETBIT on a missing key: creates it (without TTL; Redis
            // would too — the builder only writes candidates it created).
            if inner.bitmap(candidate, now).is_none() {
                inner.bitmaps.insert(
                    candidate.to_owned(),
                    Bitmap {
                        bytes: Vec::new(),
                        expires: None,
                    },
                );
            }
            if let Some(bits) = inner.bitmaps.get_mut(candidate) {
                for p in positions {
                    bits.set(*p);
                }
            }
            Ok(())
        })
    }

    fn bloom_activate<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: &'a str,
        signature: &'a str,
        m: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(&keys.bits);
            if inner.get(&keys.lock, now).map(Bytes::as_ref) != Some(owner.as_bytes()) {
                return Ok(false);
            }
            let candidate = keys.candidate(owner);
            if inner
                .bitmap(&candidate, now)
                .is_none_or(|b| b.len_bits() < m)
            {
                return Ok(false);
            }
            let Some(mut bits) = inner.bitmaps.remove(&candidate) else {
                return Ok(false);
            };
            bits.expires = None;
            inner.bitmaps.insert(keys.bits.clone(), bits);
            inner.set(
                &keys.ready,
                Bytes::copy_from_slice(signature.as_bytes()),
                Duration::MAX,
                now,
            );
            Ok(true)
        })
    }

    fn bloom_renew<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: &'a str,
        lock_ttl: Duration,
        candidate_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(&keys.bits);
            if inner.get(&keys.lock, now).map(Bytes::as_ref) != Some(owner.as_bytes()) {
                return Ok(false);
            }
            inner.set(
                &keys.lock,
                Bytes::copy_from_slice(owner.as_bytes()),
                lock_ttl,
                now,
            );
            if let Some(candidate) = inner.bitmaps.get_mut(&keys.candidate(owner)) {
                candidate.expires = Some(deadline(now, candidate_ttl));
            }
            Ok(true)
        })
    }

    fn bloom_add<'a>(
        &'a self,
        keys: &'a BloomKeys,
        positions: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(&keys.bits);
            // One critical section: no owner can change between reading the
            // lock and writing the candidate (the Redis side retries instead).
            let owner = inner.get(&keys.lock, now).cloned();
            if let Some(bits) = inner.bitmap(&keys.bits, now) {
                for p in positions {
                    bits.set(*p);
                }
            }
            if let Some(owner) = owner {
                let candidate = keys.candidate(&String::from_utf8_lossy(&owner));
                if let Some(bits) = inner.bitmap(&candidate, now) {
                    for p in positions {
                        bits.set(*p);
                    }
                }
            }
            Ok(())
        })
    }

    fn bloom_disable<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut inner = self.lock(&keys.bits);
            inner.remove(&keys.ready);
            if let Some(owner) = owner {
                inner.bitmaps.remove(&keys.candidate(owner));
            }
            Ok(())
        })
    }

    /// The embedded store serves one process: no fleet to share the
    /// interval with.
    fn bloom_claim_interval<'a>(
        &'a self,
        _keys: &'a BloomKeys,
        _owner: &'a str,
        _interval: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async { Ok(true) })
    }

    fn bloom_bitcount<'a>(&'a self, bits: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock(bits);
            Ok(inner.bitmap(bits, now).map_or(0, |b| {
                b.bytes.iter().map(|x| u64::from(x.count_ones())).sum()
            }))
        })
    }
}

//! [`BloomStore`] on Redis: the `bloom_*.lua` scripts for every step that
//! must be atomic (check, begin, activate, add), plain pipelined `SETBIT`s
//! for filling a candidate, `DEL` and `BITCOUNT` for the rest. A child of
//! `store::redis` so it shares the connection and the error mapping.

use super::connection::{map_error, px};
use super::scripts;
use super::RedisStore;
use crate::keys::BloomKeys;
use crate::store::bloom::{BloomAnswer, BloomStore};
use crate::store::protocol::StoreError;
use futures_util::future::BoxFuture;
use std::time::Duration;

/// `bloom_add` re-reads the lock owner and retries when a build started or
/// ended between the read and the script. Builds are minutes apart, so two
/// changes in a row are already rare; more means something is wrong.
const ADD_ATTEMPTS: usize = 5;

impl BloomStore for RedisStore {
    fn bloom_check<'a>(
        &'a self,
        keys: &'a BloomKeys,
        signature: &'a str,
        m: u64,
        positions: &'a [u64],
    ) -> BoxFuture<'a, Result<BloomAnswer, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let mut inv = scripts::BLOOM_CHECK.prepare_invoke();
            inv.key(&keys.bits).key(&keys.ready).arg(signature).arg(m);
            for p in positions {
                inv.arg(*p);
            }
            let code: i64 = inv.invoke_async(&mut conn).await.map_err(map_error)?;
            BloomAnswer::from_code(code)
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
            let mut conn = self.conn.clone();
            let code: i64 = scripts::BLOOM_BEGIN
                .key(&keys.lock)
                .key(keys.candidate(owner))
                .arg(owner)
                .arg(px(lock_ttl))
                .arg(m)
                .arg(px(candidate_ttl))
                .invoke_async(&mut conn)
                .await
                .map_err(map_error)?;
            Ok(code == 1)
        })
    }

    fn bloom_set_bits<'a>(
        &'a self,
        candidate: &'a str,
        positions: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if positions.is_empty() {
                return Ok(());
            }
            let mut conn = self.conn.clone();
            // One key per pipeline: routed to one slot on Cluster.
            let mut pipe = redis::pipe();
            for p in positions {
                pipe.cmd("SETBIT").arg(candidate).arg(*p).arg(1).ignore();
            }
            pipe.query_async::<()>(&mut conn).await.map_err(map_error)
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
            let mut conn = self.conn.clone();
            let code: i64 = scripts::BLOOM_ACTIVATE
                .key(&keys.lock)
                .key(keys.candidate(owner))
                .key(&keys.bits)
                .key(&keys.ready)
                .arg(owner)
                .arg(signature)
                .arg(m)
                .invoke_async(&mut conn)
                .await
                .map_err(map_error)?;
            Ok(code == 1)
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
            let mut conn = self.conn.clone();
            let code: i64 = scripts::BLOOM_RENEW
                .key(&keys.lock)
                .key(keys.candidate(owner))
                .arg(owner)
                .arg(px(lock_ttl))
                .arg(px(candidate_ttl))
                .invoke_async(&mut conn)
                .await
                .map_err(map_error)?;
            Ok(code == 1)
        })
    }

    fn bloom_add<'a>(
        &'a self,
        keys: &'a BloomKeys,
        positions: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            for _ in 0..ADD_ATTEMPTS {
                let owner: Option<String> = redis::cmd("GET")
                    .arg(&keys.lock)
                    .query_async(&mut conn)
                    .await
                    .map_err(map_error)?;
                let mut inv = scripts::BLOOM_ADD.prepare_invoke();
                inv.key(&keys.bits).key(&keys.lock);
                if let Some(owner) = &owner {
                    inv.key(keys.candidate(owner));
                }
                inv.arg(owner.as_deref().unwrap_or(""));
                for p in positions {
                    inv.arg(*p);
                }
                let code: i64 = inv.invoke_async(&mut conn).await.map_err(map_error)?;
                if code == 1 {
                    return Ok(());
                }
            }
            Err(StoreError::Protocol(format!(
                "bloom_add: build lock changed {ADD_ATTEMPTS} times in a row"
            )))
        })
    }

    fn bloom_disable<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let mut del = redis::cmd("DEL");
            del.arg(&keys.ready);
            if let Some(owner) = owner {
                del.arg(keys.candidate(owner));
            }
            del.query_async::<()>(&mut conn).await.map_err(map_error)
        })
    }

    fn bloom_bitcount<'a>(&'a self, bits: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            redis::cmd("BITCOUNT")
                .arg(bits)
                .query_async(&mut conn)
                .await
                .map_err(map_error)
        })
    }

    fn bloom_claim_interval<'a>(
        &'a self,
        keys: &'a BloomKeys,
        owner: &'a str,
        interval: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let set: Option<String> = redis::cmd("SET")
                .arg(&keys.interval)
                .arg(owner)
                .arg("NX")
                .arg("PX")
                .arg(px(interval))
                .query_async(&mut conn)
                .await
                .map_err(map_error)?;
            Ok(set.is_some())
        })
    }
}

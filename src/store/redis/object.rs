//! [`ObjectStore`] on Redis: `MGET` of an object's entry and generation
//! (over the near cache's tracked connection when there is one, so the
//! answer may be kept), and the lease, ticket and publish scripts.

use super::connection::{map_error, px, Conn};
use super::scripts;
use super::tags::get_each;
use super::RedisStore;
use crate::keys::ObjectKeys;
use crate::store::object::ObjectStore;
use crate::store::protocol::{
    Inspection, LeaseReply, PublishChecks, PublishOutcome, Snapshot, StoreError,
};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::Script;
use std::time::Duration;

impl ObjectStore for RedisStore {
    fn read_near(&self, keys: &ObjectKeys) -> Option<Snapshot> {
        self.near.as_ref()?.get(keys)
    }

    fn has_near(&self) -> bool {
        self.near.is_some()
    }

    fn peek_near(&self, keys: &ObjectKeys) -> Option<Snapshot> {
        self.near.as_ref()?.peek(keys)
    }

    fn inspect<'a>(
        &'a self,
        keys: &'a ObjectKeys,
    ) -> BoxFuture<'a, Result<Inspection, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.current();
            type Pair = (Option<Vec<u8>>, i64);
            type Reply = (
                Option<Vec<u8>>,
                i64,
                Option<Vec<u8>>,
                i64,
                Option<Vec<u8>>,
                i64,
            );
            let (e, e_ttl, g, g_ttl, l, l_ttl): Reply = scripts::INSPECT
                .key(keys.entry())
                .key(keys.generation())
                .key(keys.lease())
                .invoke_async(&mut conn)
                .await
                .map_err(map_error)?;
            let value = |(v, pttl): Pair| {
                v.map(|v| {
                    let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
                    (Bytes::from(v), ttl)
                })
            };
            Ok(Inspection {
                entry: value((e, e_ttl)),
                generation: value((g, g_ttl)),
                lease: value((l, l_ttl)),
            })
        })
    }

    fn read<'a>(&'a self, keys: &'a ObjectKeys) -> BoxFuture<'a, Result<Snapshot, StoreError>> {
        Box::pin(async move {
            // Over the tracked connection when there is one, so Redis
            // reports later changes of these keys and the answer may be kept.
            if let Some(near) = &self.near {
                // Usually `read_near` just missed; a fill in between may not.
                if let Some(snapshot) = near.peek(keys) {
                    return Ok(snapshot);
                }
                // Epoch first: a connection lost after this point bumps it,
                // so nothing read over that connection can be kept.
                let epoch = near.epoch(keys);
                if let Some(tracked) = near.tracked_for(keys.entry()) {
                    match mget(&mut tracked.conn.clone(), keys).await {
                        Ok(snapshot) => {
                            near.offer(keys, epoch, &tracked.link, &snapshot);
                            return Ok(snapshot);
                        }
                        // Cluster: the slot moved or is moving (`MOVED`,
                        // `ASK`) or the node is failing: the cluster path
                        // follows it, and nothing is kept.
                        Err(e) if self.slots.is_some() => {
                            tracing::debug!(error = %e, "near cache: tracked read refused, via the cluster");
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            mget(&mut self.conn.current(), keys).await
        })
    }

    fn take_lease<'a>(
        &'a self,
        keys: &'a ObjectKeys,
        owner: &'a str,
        nonce: &'a str,
        ttl: Duration,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<LeaseReply, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.current();
            let (code, ticket): (i64, Vec<u8>) = scripts::LEASE
                .key(keys.lease())
                .key(keys.generation())
                .arg(owner)
                .arg(nonce)
                .arg(px(ttl))
                .arg(px(gen_ttl))
                .invoke_async(&mut conn)
                .await
                .map_err(map_error)?;
            match code {
                0 => Ok(LeaseReply::Held),
                1 | 2 => Ok(LeaseReply::won(owner, Bytes::from(ticket), code == 2)),
                other => Err(StoreError::Protocol(format!("lease.lua returned {other}"))),
            }
        })
    }

    fn ticket<'a>(
        &'a self,
        gen_key: &'a str,
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Bytes, StoreError>> {
        Box::pin(self.generation_script(
            self.conn.current(),
            &scripts::TICKET,
            gen_key,
            nonce,
            gen_ttl,
        ))
    }

    fn publish_checked<'a>(
        &'a self,
        keys: &'a ObjectKeys,
        owner: &'a str,
        ticket: &'a [u8],
        entry: Bytes,
        ttl: Duration,
        checks: &'a PublishChecks,
    ) -> BoxFuture<'a, Result<PublishOutcome, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.current();
            if checks.is_none() {
                // The common case: the shorter script.
                let code: i64 = scripts::PUBLISH
                    .key(keys.lease())
                    .key(keys.generation())
                    .key(keys.entry())
                    .arg(owner)
                    .arg(ticket)
                    .arg(entry.as_ref())
                    .arg(px(ttl))
                    .invoke_async(&mut conn)
                    .await
                    .map_err(map_error)?;
                self.forget(keys.entry());
                return match code {
                    1 => Ok(PublishOutcome::Published),
                    0 => Ok(PublishOutcome::LeaseLost),
                    -1 => Ok(PublishOutcome::GenerationChanged),
                    other => Err(StoreError::Protocol(format!(
                        "publish.lua returned {other}"
                    ))),
                };
            }
            // On a cluster, tag keys live in other slots: compare them just
            // before (the hit check covers a change in between).
            let in_script = !matches!(conn, Conn::Cluster(_));
            if !in_script {
                let tag_keys: Vec<&str> = checks.tags.iter().map(|(k, _)| k.as_str()).collect();
                let current = get_each(&conn, &tag_keys).await?;
                let moved = current
                    .iter()
                    .zip(&checks.tags)
                    .any(|(now, (_, t))| now.as_ref() != Some(t));
                if moved {
                    return Ok(PublishOutcome::TagChanged);
                }
            }
            let mut call = scripts::PUBLISH_CHECKED.key(keys.lease());
            call.key(keys.generation())
                .key(keys.entry())
                // Any key of the object's slot when there is no floor.
                .key(checks.floor_key.as_deref().unwrap_or(keys.generation()))
                .arg(owner)
                .arg(ticket)
                .arg(entry.as_ref())
                .arg(px(ttl))
                .arg(checks.version.map(|v| v.to_string()).unwrap_or_default())
                .arg(if checks.floor_key.is_some() { "1" } else { "0" });
            if in_script {
                for (key, tag_ticket) in &checks.tags {
                    call.key(key).arg(tag_ticket.as_ref());
                }
            }
            let code: i64 = call.invoke_async(&mut conn).await.map_err(map_error)?;
            self.forget(keys.entry());
            match code {
                1 => Ok(PublishOutcome::Published),
                0 => Ok(PublishOutcome::LeaseLost),
                -1 => Ok(PublishOutcome::GenerationChanged),
                -2 => Ok(PublishOutcome::BelowFloor),
                -3 => Ok(PublishOutcome::TagChanged),
                other => Err(StoreError::Protocol(format!(
                    "publish_checked.lua returned {other}"
                ))),
            }
        })
    }

    fn renew_lease<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.current();
            let renewed: i64 = scripts::LEASE_RENEW
                .key(lease_key)
                .arg(owner)
                .arg(px(ttl))
                .invoke_async(&mut conn)
                .await
                .map_err(map_error)?;
            Ok(renewed == 1)
        })
    }

    fn unlock<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.current();
            let deleted: i64 = scripts::UNLOCK
                .key(lease_key)
                .arg(owner)
                .invoke_async(&mut conn)
                .await
                .map_err(map_error)?;
            Ok(deleted == 1)
        })
    }

    fn delete_if_equals<'a>(
        &'a self,
        key: &'a str,
        expected: &'a [u8],
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.current();
            let deleted: i64 = scripts::COMPARE_DELETE
                .key(key)
                .arg(expected)
                .invoke_async(&mut conn)
                .await
                .map_err(map_error)?;
            self.forget(key);
            Ok(deleted == 1)
        })
    }
}

impl RedisStore {
    /// Runs a generation script (the ticket's; invalidations go through
    /// `feeds::invalidate_pipelined`): it takes the generation key, a nonce and
    /// the generation TTL, and returns the generation.
    async fn generation_script(
        &self,
        mut conn: Conn,
        script: &Script,
        gen_key: &str,
        nonce: &str,
        gen_ttl: Duration,
    ) -> Result<Bytes, StoreError> {
        let generation: Vec<u8> = script
            .key(gen_key)
            .arg(nonce)
            .arg(px(gen_ttl))
            .invoke_async(&mut conn)
            .await
            .map_err(map_error)?;
        Ok(Bytes::from(generation))
    }
}

/// Entry and generation of one object in one round trip.
async fn mget(conn: &mut impl ConnectionLike, keys: &ObjectKeys) -> Result<Snapshot, StoreError> {
    let (entry, generation): (Option<Vec<u8>>, Option<Vec<u8>>) = redis::cmd("MGET")
        .arg(keys.entry())
        .arg(keys.generation())
        .query_async(conn)
        .await
        .map_err(map_error)?;
    Ok(Snapshot {
        entry: entry.map(Bytes::from),
        generation: generation.map(Bytes::from),
        memo: None,
    })
}

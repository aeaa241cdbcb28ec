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
    lease_depends_key, FillDepends, Inspection, LeaseReply, PublishChecks, PublishOutcome,
    Snapshot, StoreError, Superseded,
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
            let conn = self.conn.current();
            let depends_key = lease_depends_key(keys.lease());
            let lease = Lease {
                keys,
                depends_key: &depends_key,
                owner,
                nonce,
                ttl,
                gen_ttl,
            };
            let (code, ticket, record) = lease.call(&conn, None).await?;
            if code != 0 || record.is_empty() {
                return lease_reply(code, owner, ticket);
            }
            // Held, with the fill's dependencies: the second call takes it
            // over if one moved. On a single node the script compares them;
            // on a cluster they live in other slots, so they are compared
            // here first (a moved generation stays moved).
            let Some((_, depends)) = FillDepends::parse(&record) else {
                return Ok(LeaseReply::Held);
            };
            let dep_keys: Vec<&str> = depends.iter().map(|(_, k, _)| *k).collect();
            let check = if matches!(conn, Conn::Cluster(_)) {
                let current = get_each(&conn, &dep_keys).await?;
                let moved = current
                    .iter()
                    .zip(&depends)
                    .position(|(now, (_, _, t))| now.as_deref() != Some(*t));
                let Some(moved) = moved else {
                    return Ok(LeaseReply::Held);
                };
                Check::Found(moved + 1)
            } else {
                Check::InScript(&dep_keys)
            };
            let (code, ticket, _) = lease.call(&conn, Some((&record, check))).await?;
            lease_reply(code, owner, ticket)
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
                .key(lease_depends_key(lease_key))
                .arg(owner)
                .arg(px(ttl))
                .invoke_async(&mut conn)
                .await
                .map_err(map_error)?;
            Ok(renewed == 1)
        })
    }

    fn record_lease_depends<'a>(
        &'a self,
        lease_key: &'a str,
        owner: &'a str,
        depends: &'a FillDepends,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.current();
            let recorded: i64 = scripts::LEASE_DEPENDS
                .key(lease_key)
                .key(lease_depends_key(lease_key))
                .arg(owner)
                .arg(depends.record(owner))
                .invoke_async(&mut conn)
                .await
                .map_err(map_error)?;
            Ok(recorded == 1)
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
                .key(lease_depends_key(lease_key))
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

/// One `lua/lease.lua` call's inputs.
struct Lease<'a> {
    keys: &'a ObjectKeys,
    depends_key: &'a str,
    owner: &'a str,
    nonce: &'a str,
    ttl: Duration,
    gen_ttl: Duration,
}

/// How a held fill's dependencies are checked by the second call.
enum Check<'a> {
    /// By the script: these are the record's keys, in its order.
    InScript(&'a [&'a str]),
    /// Already: the 1-based index of the one found moved.
    Found(usize),
}

impl Lease<'_> {
    /// (code, ticket, the holder's dependency record) as the script returns
    /// them; with `known`, the record a first call returned and how to
    /// check it.
    async fn call(
        &self,
        conn: &Conn,
        known: Option<(&[u8], Check<'_>)>,
    ) -> Result<(i64, Vec<u8>, Vec<u8>), StoreError> {
        let mut call = scripts::LEASE.key(self.keys.lease());
        call.key(self.keys.generation())
            .key(self.depends_key)
            .arg(self.owner)
            .arg(self.nonce)
            .arg(px(self.ttl))
            .arg(px(self.gen_ttl));
        if let Some((record, check)) = known {
            call.arg(record);
            match check {
                Check::InScript(keys) => {
                    call.arg("");
                    for key in keys {
                        call.key(*key);
                    }
                }
                Check::Found(index) => {
                    call.arg(index);
                }
            }
        }
        call.invoke_async(&mut conn.clone())
            .await
            .map_err(map_error)
    }
}

/// A `lua/lease.lua` code as the protocol's reply.
fn lease_reply(code: i64, owner: &str, ticket: Vec<u8>) -> Result<LeaseReply, StoreError> {
    let superseded = match code {
        0 => return Ok(LeaseReply::Held),
        1 => None,
        2 => Some(Superseded::Generation),
        3 => Some(Superseded::Route),
        4 => Some(Superseded::Tag),
        other => return Err(StoreError::Protocol(format!("lease.lua returned {other}"))),
    };
    Ok(LeaseReply::won(owner, Bytes::from(ticket), superseded))
}

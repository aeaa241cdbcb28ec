//! [`TagStore`] on Redis: tag tickets, tag reads (from the near cache, or
//! over its tracked connections so the answer may be kept), the remembered
//! tag list and version floors. Tag keys live in slots of their own: on a
//! cluster each goes to its own master.

use super::connection::{map_error, px, Conn};
use super::near::NearCache;
use super::scripts;
use super::RedisStore;
use crate::store::protocol::StoreError;
use crate::store::tags::{TagStore, TimedTickets};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use redis::aio::ConnectionLike;
use std::time::Duration;

impl TagStore for RedisStore {
    fn tags_current_near(&self, stamped: &[(Bytes, Bytes)]) -> Option<bool> {
        self.near.as_ref()?.tags_current(stamped)
    }

    fn tag_tickets<'a>(
        &'a self,
        tag_keys: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Bytes>, StoreError>> {
        Box::pin(async move {
            if tag_keys.is_empty() {
                return Ok(Vec::new());
            }
            let mut conn = self.conn.current();
            let run = |keys: &[String], mut conn: Conn| {
                let mut call = scripts::TAG_TICKETS.prepare_invoke();
                for k in keys {
                    call.key(k);
                }
                call.arg(nonce).arg(px(gen_ttl));
                async move { call.invoke_async::<Vec<Vec<u8>>>(&mut conn).await }
            };
            let generations = match &mut conn {
                Conn::Single(_) | Conn::Sentinel(_) => {
                    run(tag_keys, conn.clone()).await.map_err(map_error)?
                }
                // One slot per call: concurrently, about one round trip.
                Conn::Cluster(_) => {
                    let calls = tag_keys.chunks(1).map(|one| run(one, conn.clone()));
                    let mut out = Vec::with_capacity(tag_keys.len());
                    for result in futures_util::future::join_all(calls).await {
                        out.extend(result.map_err(map_error)?);
                    }
                    out
                }
            };
            if generations.len() != tag_keys.len() {
                return Err(StoreError::Protocol(
                    "tag_tickets.lua: one value per key expected".into(),
                ));
            }
            Ok(generations.into_iter().map(Bytes::from).collect())
        })
    }

    fn tag_tickets_timed<'a>(
        &'a self,
        tag_keys: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<TimedTickets, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.current();
            // A cluster's tag keys live on masters with clocks of their own.
            if tag_keys.is_empty() || matches!(conn, Conn::Cluster(_)) {
                return Ok((self.tag_tickets(tag_keys, nonce, gen_ttl).await?, None));
            }
            let mut call = scripts::TAG_TICKETS.prepare_invoke();
            for k in tag_keys {
                call.key(k);
            }
            call.arg(nonce).arg(px(gen_ttl)).arg("1");
            let mut values: Vec<Vec<u8>> = call.invoke_async(&mut conn).await.map_err(map_error)?;
            if values.len() != tag_keys.len() + 1 {
                return Err(StoreError::Protocol(
                    "tag_tickets.lua: one value per key and the clock expected".into(),
                ));
            }
            let clock = values.pop().map(Bytes::from);
            Ok((values.into_iter().map(Bytes::from).collect(), clock))
        })
    }

    fn tag_tickets_since<'a>(
        &'a self,
        tag_keys: &'a [String],
        since: &'a [u8],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Option<Vec<Bytes>>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.current();
            if matches!(conn, Conn::Cluster(_)) {
                return Err(StoreError::Protocol(
                    "tag tickets since a time: not on a cluster".into(),
                ));
            }
            let mut call = scripts::TAG_TICKETS_SINCE.prepare_invoke();
            for k in tag_keys {
                call.key(k);
            }
            call.arg(nonce).arg(px(gen_ttl)).arg(since);
            let values: Vec<Vec<u8>> = call.invoke_async(&mut conn).await.map_err(map_error)?;
            let mut values = values.into_iter();
            match values.next().as_deref() {
                Some(b"0") => Ok(None),
                Some(b"1") if values.len() == tag_keys.len() => {
                    Ok(Some(values.map(Bytes::from).collect()))
                }
                _ => Err(StoreError::Protocol(
                    "tag_tickets_since.lua: a status and one value per key expected".into(),
                )),
            }
        })
    }

    fn read_tags<'a>(
        &'a self,
        tag_keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<Option<Bytes>>, StoreError>> {
        Box::pin(async move {
            if let Some(near) = &self.near {
                if let Some(held) = near.tags(tag_keys) {
                    return Ok(held);
                }
                if self.slots.is_some() {
                    return self.read_tags_tracked(near, tag_keys).await;
                }
                let epochs: Vec<u64> = tag_keys.iter().map(|k| near.key_epoch(k)).collect();
                if let Some(tracked) = tag_keys.first().and_then(|k| near.tracked_for(k)) {
                    let values = mget_values(&mut tracked.conn.clone(), tag_keys).await?;
                    for ((key, epoch), value) in tag_keys.iter().zip(epochs).zip(&values) {
                        if let Some(value) = value {
                            near.offer_tag(key, epoch, &tracked.link, value);
                        }
                    }
                    return Ok(values);
                }
            }
            get_each(&self.conn.current(), tag_keys).await
        })
    }

    fn remember_tags<'a>(
        &'a self,
        list_key: &'a str,
        tags: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.current();
            redis::cmd("SET")
                .arg(list_key)
                .arg(tags)
                .arg("PX")
                .arg(px(ttl))
                .query_async::<()>(&mut conn)
                .await
                .map_err(map_error)?;
            self.forget(list_key);
            Ok(())
        })
    }

    fn raise_floors<'a>(
        &'a self,
        floors: &'a [(String, i64)],
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let calls = floors.iter().map(|(key, revision)| {
                let mut conn = self.invalidation_conn().0;
                async move {
                    scripts::FLOOR
                        .key(key)
                        .arg(*revision)
                        .arg(px(gen_ttl))
                        .invoke_async::<i64>(&mut conn)
                        .await
                }
            });
            // Multiplexed: concurrent calls share the connection's pipeline.
            for result in futures_util::future::join_all(calls).await {
                result.map_err(map_error)?;
            }
            Ok(())
        })
    }
}

impl RedisStore {
    /// Cluster: each key over the tracked connection of its master
    /// (concurrently, about one round trip), kept if that read was
    /// tracked; a key whose master has none, or that answers `MOVED`, goes
    /// the cluster path and is not kept.
    async fn read_tags_tracked(
        &self,
        near: &NearCache,
        tag_keys: &[&str],
    ) -> Result<Vec<Option<Bytes>>, StoreError> {
        let calls = tag_keys.iter().map(|key| async move {
            let epoch = near.key_epoch(key);
            if let Some(tracked) = near.tracked_for(key) {
                if let Ok(value) = get_one(&mut tracked.conn.clone(), key).await {
                    if let Some(value) = &value {
                        near.offer_tag(key, epoch, &tracked.link, value);
                    }
                    return Ok(value);
                }
            }
            get_one(&mut self.conn.current(), key).await
        });
        futures_util::future::join_all(calls)
            .await
            .into_iter()
            .collect()
    }
}

/// `MGET` of keys in one slot-free connection (single node).
async fn mget_values<S: AsRef<str> + Sync>(
    conn: &mut impl ConnectionLike,
    keys: &[S],
) -> Result<Vec<Option<Bytes>>, StoreError> {
    let mut mget = redis::cmd("MGET");
    for key in keys {
        mget.arg(key.as_ref());
    }
    let values: Vec<Option<Vec<u8>>> = mget.query_async(conn).await.map_err(map_error)?;
    Ok(values.into_iter().map(|v| v.map(Bytes::from)).collect())
}

async fn get_one(conn: &mut impl ConnectionLike, key: &str) -> Result<Option<Bytes>, StoreError> {
    let value: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .map_err(map_error)?;
    Ok(value.map(Bytes::from))
}

/// The values of keys that may live in different slots: one `MGET` on a
/// single node, concurrent `GET`s on a cluster (about one round trip).
pub(super) async fn get_each<S: AsRef<str> + Sync>(
    conn: &Conn,
    keys: &[S],
) -> Result<Vec<Option<Bytes>>, StoreError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    if !matches!(conn, Conn::Cluster(_)) {
        return mget_values(&mut conn.clone(), keys).await;
    }
    let calls = keys.iter().map(|key| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("GET")
                .arg(key.as_ref())
                .query_async::<Option<Vec<u8>>>(&mut conn)
                .await
        }
    });
    let mut out = Vec::with_capacity(keys.len());
    for result in futures_util::future::join_all(calls).await {
        out.push(result.map_err(map_error)?.map(Bytes::from));
    }
    Ok(out)
}

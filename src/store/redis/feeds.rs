//! [`FeedStore`] on Redis: the invalidation scripts, pipelined per hash
//! slot and followed by `WAIT` where `store.redis.replicas_ack` asks for
//! it (over a connection of their own), and the witness slots.

use super::connection::{map_error, px, Conn};
use super::scripts;
use super::RedisStore;
use crate::config::ReplicasAck;
use crate::store::feeds::FeedStore;
use crate::store::protocol::{StoreError, WitnessSlot};
use crate::store::slot_map::slot_of;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ErrorKind, Pipeline, Script, Value};
use std::collections::BTreeMap;
use std::time::Duration;

impl FeedStore for RedisStore {
    fn invalidate<'a>(
        &'a self,
        gen_key: &'a str,
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Bytes, StoreError>> {
        Box::pin(async move {
            let (mut conn, ack) = self.invalidation_conn();
            let mut call = scripts::INVALIDATE.key(gen_key);
            call.arg(nonce).arg(px(gen_ttl));
            let mut pipe = redis::pipe();
            pipe.invoke_script(&call);
            let values = invalidate_pipelined(&mut conn, &scripts::INVALIDATE, pipe, ack).await;
            self.forget(gen_key);
            match values?.into_iter().next() {
                Some(Value::BulkString(generation)) => Ok(Bytes::from(generation)),
                other => Err(StoreError::Protocol(format!(
                    "invalidate.lua returned {other:?}"
                ))),
            }
        })
    }

    fn invalidate_many<'a>(
        &'a self,
        gen_keys: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.invalidate_keys(gen_keys, None, nonce, gen_ttl))
    }

    fn invalidate_marked<'a>(
        &'a self,
        gen_keys: &'a [String],
        marks: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if marks.len() != gen_keys.len() {
                return Err(StoreError::Protocol("one mark per key expected".into()));
            }
            self.invalidate_keys(gen_keys, Some(marks), nonce, gen_ttl)
                .await
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let (mut conn, _) = self.invalidation_conn();
            redis::cmd("PING")
                .query_async::<()>(&mut conn)
                .await
                .map_err(map_error)
        })
    }

    fn witness<'a>(
        &'a self,
        slots: &'a [String],
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<WitnessSlot, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.current();
            let mut call = scripts::WITNESS.prepare_invoke();
            for slot in slots {
                call.key(slot);
            }
            let (held, free_in): (i64, u64) = call
                .arg(owner)
                .arg(px(ttl))
                .invoke_async(&mut conn)
                .await
                .map_err(map_error)?;
            Ok(WitnessSlot {
                held: usize::try_from(held).ok(),
                free_in: Duration::from_millis(free_in),
            })
        })
    }
}

impl RedisStore {
    /// `invalidate.lua` per key, or `invalidate_marked.lua` with
    /// `marks[i]` for `gen_keys[i]`: one pipeline on a single node, one per
    /// hash slot on a cluster (a cluster pipeline goes to its first key's
    /// node), concurrently, so about one round trip either way.
    async fn invalidate_keys(
        &self,
        gen_keys: &[String],
        marks: Option<&[String]>,
        nonce: &str,
        gen_ttl: Duration,
    ) -> Result<(), StoreError> {
        // Redis refuses an empty pipeline.
        if gen_keys.is_empty() {
            return Ok(());
        }
        let script = match marks {
            Some(_) => &*scripts::INVALIDATE_MARKED,
            None => &*scripts::INVALIDATE,
        };
        let (conn, ack) = self.invalidation_conn();
        let mut by_slot: BTreeMap<u16, Pipeline> = BTreeMap::new();
        for (i, key) in gen_keys.iter().enumerate() {
            let slot = match conn {
                Conn::Cluster(_) => slot_of(key.as_bytes()),
                Conn::Single(_) | Conn::Sentinel(_) => 0,
            };
            let mut call = script.key(key);
            call.arg(nonce).arg(px(gen_ttl));
            if let Some(mark) = marks.and_then(|m| m.get(i)) {
                call.arg(mark);
            }
            by_slot
                .entry(slot)
                .or_insert_with(redis::pipe)
                .invoke_script(&call)
                .ignore();
        }
        let calls = by_slot.into_values().map(|pipe| {
            let mut conn = conn.clone();
            async move { invalidate_pipelined(&mut conn, script, pipe, ack).await }
        });
        let results = futures_util::future::join_all(calls).await;
        for key in gen_keys {
            self.forget(key);
        }
        results.into_iter().try_for_each(|r| r.map(drop))
    }
}

/// Sends `pipe` (calls of `script`) and, with `ack`, `WAIT` in the same
/// pipeline; returns the replies of the commands not ignored, `WAIT`'s
/// last. WAIT counts only the writes of the connection it runs on: a
/// pipeline goes out on one connection (on a cluster, the node of its
/// first key), so a reconnect or a Sentinel switch between the writes and
/// the WAIT cannot make it count nothing and succeed at once.
///
/// A pipeline cannot fall back to `EVAL` per command, so on `NOSCRIPT`
/// (Redis restarted or `SCRIPT FLUSH`) the script is loaded and the whole
/// pipeline sent again; commands that did run the first time simply
/// invalidate twice (idempotent).
async fn invalidate_pipelined(
    conn: &mut Conn,
    script: &Script,
    mut pipe: Pipeline,
    ack: Option<ReplicasAck>,
) -> Result<Vec<Value>, StoreError> {
    if let Some(ack) = ack {
        pipe.cmd("WAIT").arg(ack.replicas).arg(px(ack.timeout));
    }
    let values: Vec<Value> = match pipe.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            match conn {
                // redis-rs would load it on every master (failing while
                // one is down): only on the master the batch goes to.
                Conn::Cluster(c) => load_on_master_of(c, script, &pipe).await?,
                _ => {
                    script
                        .prepare_invoke()
                        .load_async(conn)
                        .await
                        .map_err(map_error)?;
                }
            }
            pipe.query_async(conn).await
        }
        other => other,
    }
    .map_err(map_error)?;
    if let Some(ack) = ack {
        let acked = match values.last() {
            Some(Value::Int(n)) => *n,
            other => return Err(StoreError::Protocol(format!("WAIT returned {other:?}"))),
        };
        if acked < i64::from(ack.replicas) {
            return Err(StoreError::ReplicaShortfall {
                acked,
                wanted: ack.replicas,
            });
        }
    }
    Ok(values)
}

/// `SCRIPT LOAD` of `script` on the master of `pipe`'s first key (where
/// the cluster client sends the whole batch).
async fn load_on_master_of(
    conn: &mut ClusterConnection,
    script: &Script,
    pipe: &Pipeline,
) -> Result<(), StoreError> {
    let key = pipe
        .cmd_iter()
        .next()
        .and_then(|cmd| cmd.args_iter().nth(3))
        .and_then(|arg| match arg {
            redis::Arg::Simple(key) => Some(key.to_vec()),
            _ => None,
        })
        .ok_or_else(|| StoreError::Protocol("a script batch without a key".into()))?;
    let source = scripts::source_of(script)
        .ok_or_else(|| StoreError::Protocol("a script not in lua/".into()))?;
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(source);
    let route = Route::new(slot_of(&key), SlotAddr::Master);
    conn.route_command(
        load,
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
    )
    .await
    .map_err(map_error)?;
    Ok(())
}

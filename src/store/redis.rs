//! The Redis backend: the generation protocol over one multiplexed
//! connection (single node, [`super::redis_node`]; with Sentinel, the one
//! to the current primary, [`super::redis_sentinel`]) or a cluster
//! connection (`cluster_async`). Clients are built (TLS) by
//! [`super::redis_client`]. Every multi-key operation is a script from
//! [`super::scripts`]; all keys of one object share a hash slot (SPEC §5.2),
//! so `MGET` and the scripts work on Cluster too.
//!
//! Failure behaviour (see `shared/CRATES.md`, measured on redis-rs 1.8):
//! - Construction never touches the network. sidecache starts with Redis
//!   down and serves degraded; the connection is made on first use and kept
//!   alive by a heartbeat task, so a Redis that comes back is reconnected in
//!   the background and the breaker's next probe finds a live connection
//!   instead of the stale failure of the last reconnect attempt.
//! - The client's reconnect backoff is capped (few retries, short delays)
//!   and every command has a response timeout; [`super::GuardedStore`]
//!   additionally bounds every call with `command_timeout`, so the breaker,
//!   not the client's backoff, decides how long a request waits.
//! - The cluster client has no response timeout by default. The builder's
//!   `response_timeout` sets the per-node and the overall request timeout;
//!   `ClusterConfig` then replaces the per-node one (with `None` unless set),
//!   so it is set in both places. The cluster test fails without them.

use super::near::NearCache;
use super::near_tracking::{self, Source};
use super::redis_client::{self, Pinned};
use super::redis_node::{Node, Timeouts};
use super::redis_sentinel;
use super::redis_slots;
use super::scripts;
use super::slot_map::{slot_of, SlotMap};
use super::{
    BoxFuture, Inspection, LeaseReply, PublishChecks, PublishOutcome, Snapshot, Store, StoreError,
    WitnessSlot,
};
use crate::config::{RedisConfig, RedisTarget, ReplicasAck};
use crate::keys::ObjectKeys;
use crate::metrics::Metrics;
use bytes::Bytes;
use redis::aio::ConnectionLike;
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::io::tcp::TcpSettings;
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    Script, Value,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[path = "redis_bloom.rs"]
mod bloom;

/// Reconnect attempts after the first one fails, before a reconnect gives up
/// (the next command starts a new one). Small, so a dead server does not
/// hold calls in backoff for seconds.
pub(super) const RECONNECT_RETRIES: usize = 2;
pub(super) const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(25);
pub(super) const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(250);
/// Floor for the TCP connect timeout; a connect is slower than a command.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);

/// The Redis backend (single node or Cluster). Cheap to share: every call
/// clones a handle to one multiplexed connection.
pub struct RedisStore {
    conn: Conn,
    kind: &'static str,
    near: Option<Arc<NearCache>>,
    /// `store.redis.replicas_ack`: invalidations go over this connection of
    /// their own, then `WAIT`. WAIT blocks the connection it is sent on and
    /// counts only that connection's writes, so it cannot share `conn`.
    replicated: Option<(Conn, ReplicasAck)>,
    /// Cluster only: the slot table (per-master breakers).
    slots: Option<Arc<SlotMap>>,
    /// Background tasks (heartbeat, near-cache keeper), aborted on drop so
    /// they do not outlive the store.
    tasks: Vec<tokio::task::AbortHandle>,
}

/// A clonable handle to either kind of connection; clones share the one
/// underlying multiplexed connection (or cluster connection task).
#[derive(Clone)]
enum Conn {
    Single(Node),
    Cluster(ClusterConnection),
    /// The primary Sentinel names (see [`redis_sentinel`]); resolved to
    /// `Single` by [`Conn::current`] at the start of every call.
    Sentinel(redis_sentinel::Primary),
}

impl Conn {
    /// The connection to use now: for Sentinel, the current primary's.
    fn current(&self) -> Conn {
        match self {
            Conn::Sentinel(primary) => match primary.load_full() {
                Some(node) => Conn::Single((*node).clone()),
                None => self.clone(),
            },
            other => other.clone(),
        }
    }
}

/// A call before the sentinels named a primary.
fn no_primary_yet() -> RedisError {
    RedisError::from((ErrorKind::Io, "redis sentinel: no primary known yet"))
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            // `invoke_async` would answer NOSCRIPT with `SCRIPT LOAD` on
            // every master (failing while one is down): `EVAL` on the
            // key's own master instead (see `scripts`).
            // (A server's error comes back as a value here.)
            Conn::Cluster(c) => Box::pin(async move {
                let reply = c.req_packed_command(cmd).await?;
                if let Value::ServerError(e) = &reply {
                    if e.kind() == Some(redis::ServerErrorKind::NoScript) {
                        if let Some(eval) = scripts::eval_of(cmd) {
                            return c.req_packed_command(&eval).await;
                        }
                    }
                }
                Ok(reply)
            }),
            Conn::Sentinel(_) => Box::pin(async { Err(no_primary_yet()) }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(_) => Box::pin(async { Err(no_primary_yet()) }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(_) => 0,
        }
    }
}

impl RedisStore {
    /// Builds the client without connecting (Redis may be down at start).
    /// Fails only on a malformed URL. `heartbeat` is how often a background
    /// `PING` keeps the connection established; it should be shorter than
    /// the breaker cooldown. Must be called inside a Tokio runtime.
    /// With `cfg.near_cache`, reads are also answered from the near cache
    /// (see [`super::near`]), whose metrics go to `metrics`.
    pub fn connect(
        cfg: &RedisConfig,
        heartbeat: Duration,
        metrics: &Metrics,
    ) -> Result<RedisStore, StoreError> {
        let command_timeout = cfg.command_timeout;
        let connect_timeout = command_timeout.max(MIN_CONNECT_TIMEOUT);
        let tcp = TcpSettings::default().set_nodelay(true);
        let mut tasks = Vec::new();
        let mut near = None;
        let mut diagnose = None;
        let mut replicated = None;
        let mut slots = None;
        let (conn, kind) = match &cfg.target {
            RedisTarget::Single(url) => {
                let info = url
                    .as_str()
                    .into_connection_info()
                    .map_err(config_error)?
                    .set_tcp_settings(tcp);
                if let Some(near_cfg) = &cfg.near_cache {
                    let tracked_client =
                        near_tracking::tracked_client(info.clone(), cfg.tls.as_ref())
                            .map_err(config_error)?;
                    let cache = Arc::new(NearCache::new(near_cfg, None, metrics));
                    let keeper = near_tracking::keep_tracked(
                        cache.clone(),
                        Source::Fixed(Arc::new(tracked_client)),
                        heartbeat,
                        command_timeout,
                    );
                    tasks.push(tokio::spawn(keeper).abort_handle());
                    near = Some(cache);
                }
                let (info, pinned) = redis_client::pin(info, cfg.tls.as_ref());
                let client = redis_client::client(info, cfg.tls.as_ref()).map_err(config_error)?;
                diagnose = Some((client.clone(), pinned.clone()));
                let node = |response| {
                    let timeouts = Timeouts {
                        response,
                        connect: connect_timeout,
                    };
                    Node::new(client.clone(), pinned.clone(), timeouts).map_err(config_error)
                };
                if let Some(ack) = cfg.replicas_ack {
                    let waiting = node(command_timeout + ack.timeout)?;
                    replicated = Some((Conn::Single(waiting), ack));
                }
                (Conn::Single(node(command_timeout)?), "redis")
            }
            RedisTarget::Sentinel(target) => {
                let sentinel = redis_sentinel::client(target, cfg.tls.as_ref(), tcp.clone())
                    .map_err(config_error)?;
                let timeouts = |response| Timeouts {
                    response,
                    connect: connect_timeout,
                };
                let primary = redis_sentinel::Primary::default();
                let mut primaries = vec![(primary.clone(), timeouts(command_timeout))];
                if let Some(ack) = cfg.replicas_ack {
                    let waiting = redis_sentinel::Primary::default();
                    primaries.push((waiting.clone(), timeouts(command_timeout + ack.timeout)));
                    replicated = Some((Conn::Sentinel(waiting), ack));
                }
                // The near cache tracks the primary the store follows.
                let tracked_primary = Arc::new(arc_swap::ArcSwapOption::empty());
                if let Some(near_cfg) = &cfg.near_cache {
                    let cache = Arc::new(NearCache::new(near_cfg, None, metrics));
                    let keeper = near_tracking::keep_tracked(
                        cache.clone(),
                        Source::Following(tracked_primary.clone()),
                        heartbeat,
                        command_timeout,
                    );
                    tasks.push(tokio::spawn(keeper).abort_handle());
                    near = Some(cache);
                }
                let (switch_near, tls) = (near.clone(), cfg.tls.clone());
                let switched = move |client: &redis::Client, pinned: Option<&Pinned>| {
                    if let Some(near) = &switch_near {
                        near_tracking::primary_switched(
                            near,
                            &tracked_primary,
                            client,
                            pinned,
                            tls.as_ref(),
                        );
                    }
                };
                let follow = redis_sentinel::follow(
                    sentinel,
                    target.clone(),
                    cfg.tls.clone(),
                    tcp.clone(),
                    primaries,
                    heartbeat,
                    switched,
                );
                tasks.push(tokio::spawn(follow).abort_handle());
                (Conn::Sentinel(primary), "redis-sentinel")
            }
            RedisTarget::Cluster(urls) => {
                let connect = |response_timeout| {
                    cluster_conn(urls, cfg, tcp.clone(), connect_timeout, response_timeout)
                };
                if let Some(ack) = cfg.replicas_ack {
                    // Blocked by WAIT: per-node connections of its own.
                    let waiting = connect(command_timeout + ack.timeout)?;
                    replicated = Some((Conn::Cluster(waiting), ack));
                }
                let conn = connect(command_timeout)?;
                let map = Arc::new(SlotMap::default());
                if let Some(near_cfg) = &cfg.near_cache {
                    let template = urls
                        .first()
                        .map(String::as_str)
                        .unwrap_or_default()
                        .into_connection_info()
                        .map_err(config_error)?
                        .set_tcp_settings(tcp.clone());
                    let cache = Arc::new(NearCache::new(near_cfg, Some(map.clone()), metrics));
                    let keeper = near_tracking::keep_cluster(
                        cache.clone(),
                        map.clone(),
                        template,
                        cfg.tls.clone(),
                        heartbeat,
                        command_timeout,
                    );
                    tasks.push(tokio::spawn(keeper).abort_handle());
                    near = Some(cache);
                }
                let slots_near = near.clone();
                let refresh = redis_slots::keep_current(
                    map.clone(),
                    conn.clone(),
                    heartbeat,
                    command_timeout,
                    move || {
                        if let Some(near) = &slots_near {
                            near_tracking::on_slots_changed(near);
                        }
                    },
                );
                tasks.push(tokio::spawn(refresh).abort_handle());
                slots = Some(map);
                (Conn::Cluster(conn), "redis-cluster")
            }
        };
        tasks.push(
            tokio::spawn(keep_alive(
                conn.clone(),
                heartbeat,
                command_timeout,
                diagnose,
            ))
            .abort_handle(),
        );
        Ok(RedisStore {
            conn,
            kind,
            near,
            replicated,
            slots,
            tasks,
        })
    }

    /// The connection invalidations are written on (resolved once per
    /// call: the writes and their `WAIT` must share it), and
    /// `replicas_ack`.
    fn invalidation_conn(&self) -> (Conn, Option<ReplicasAck>) {
        match &self.replicated {
            Some((conn, ack)) => (conn.current(), Some(*ack)),
            None => (self.conn.current(), None),
        }
    }

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

    /// Runs a generation script (the ticket's; invalidations go through
    /// [`invalidate_pipelined`]): it takes the generation key, a nonce and
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

    /// After our own write to an object: drop it from the near cache now,
    /// rather than when Redis's push arrives.
    fn forget(&self, key: &str) {
        if let Some(near) = &self.near {
            near.forget(key.as_bytes());
        }
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Pings every `every` so the client reconnects in the background while the
/// breaker keeps requests away, and logs reachability changes once each.
/// The connection manager retries a failed connect until the call times
/// out, hiding why; on becoming unreachable one direct connect with
/// `diagnose` finds the reason (a failed TLS handshake names its setting).
async fn keep_alive(
    conn: Conn,
    every: Duration,
    timeout: Duration,
    diagnose: Option<(redis::Client, Option<Pinned>)>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reachable: Option<bool> = None;
    let ping_cmd = redis::cmd("PING");
    loop {
        tick.tick().await;
        let mut conn = conn.current();
        let ping = ping_cmd.query_async::<()>(&mut conn);
        let mut outcome = match tokio::time::timeout(timeout, ping).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(map_error(e)),
            Err(_) => Err(StoreError::Timeout),
        };
        if let (Err(StoreError::Timeout), Some((client, pinned)), false) =
            (&outcome, &diagnose, reachable == Some(false))
        {
            let config = redis_client::resolve_with(AsyncConnectionConfig::new(), pinned.as_ref());
            let connect = client.get_multiplexed_async_connection_with_config(&config);
            if let Ok(Err(e)) =
                tokio::time::timeout(timeout.max(MIN_CONNECT_TIMEOUT), connect).await
            {
                outcome = Err(map_error(e));
            }
        }
        match (&outcome, reachable) {
            (Ok(()), Some(true)) | (Err(_), Some(false)) => {}
            (Ok(()), _) => tracing::info!("redis reachable"),
            (Err(e), _) => tracing::warn!(error = %e, "redis unreachable"),
        }
        reachable = Some(outcome.is_ok());
    }
}

/// A cluster connection (not yet connected) whose per-node and overall
/// response timeout is `response_timeout` (module doc).
fn cluster_conn(
    urls: &[String],
    cfg: &RedisConfig,
    tcp: TcpSettings,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> Result<ClusterConnection, StoreError> {
    let mut builder = ClusterClientBuilder::new(urls.iter().map(String::as_str));
    if let Some(tls) = &cfg.tls {
        builder = builder.certs(redis_client::certificates(tls));
    }
    let client = builder
        .tcp_settings(tcp)
        .connection_timeout(connect_timeout)
        .response_timeout(response_timeout)
        .retries(RECONNECT_RETRIES as u32)
        .min_retry_wait(RECONNECT_MIN_DELAY.as_millis() as u64)
        .max_retry_wait(RECONNECT_MAX_DELAY.as_millis() as u64)
        .build()
        .map_err(config_error)?;
    // `with_config` replaces the builder's per-node response timeout with
    // this one (None by default): set it again. The builder's value still
    // bounds the whole request.
    let cluster_cfg = ClusterConfig::new()
        .set_connection_timeout(connect_timeout)
        .set_response_timeout(response_timeout);
    Ok(client.get_pending_async_connection_with_config(cluster_cfg))
}

fn config_error(e: RedisError) -> StoreError {
    StoreError::Unavailable(format!("invalid redis configuration: {e}"))
}

fn map_error(e: RedisError) -> StoreError {
    if let Some(message) = redis_client::tls_failure(&e) {
        return StoreError::Unavailable(message);
    }
    if e.is_timeout() {
        return StoreError::Timeout;
    }
    // Answered, but no writes (maxmemory with noeviction, a read-only
    // replica, too few replicas, failed RDB save): reads still work.
    if matches!(
        e.code(),
        Some("OOM" | "READONLY" | "NOREPLICAS" | "MISCONF")
    ) {
        return StoreError::WriteRefused(e.to_string());
    }
    match e.kind() {
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreError::Protocol(e.to_string()),
        // I/O, server errors (OOM, LOADING, BUSY, CLUSTERDOWN, ...), client
        // errors: all mean the store cannot serve us right now.
        _ => StoreError::Unavailable(e.to_string()),
    }
}

/// Milliseconds for `PX`: Redis rejects 0, and a TTL under 1 ms is 1 ms.
fn px(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn slot_map(&self) -> Option<Arc<SlotMap>> {
        self.slots.clone()
    }

    fn read_near(&self, keys: &ObjectKeys) -> Option<Snapshot> {
        self.near.as_ref()?.get(keys)
    }

    fn has_near(&self) -> bool {
        self.near.is_some()
    }

    fn tags_current_near(&self, stamped: &[(Bytes, Bytes)]) -> Option<bool> {
        self.near.as_ref()?.tags_current(stamped)
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
async fn get_each<S: AsRef<str> + Sync>(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn px_is_at_least_one_millisecond() {
        assert_eq!(px(Duration::ZERO), 1);
        assert_eq!(px(Duration::from_micros(300)), 1);
        assert_eq!(px(Duration::from_millis(1500)), 1500);
    }

    #[tokio::test]
    async fn constructible_while_redis_is_down_and_calls_fail_fast() {
        // Port 1 on loopback: nothing listens, connect is refused at once.
        let cfg = RedisConfig {
            target: RedisTarget::Single("redis://127.0.0.1:1/0".into()),
            command_timeout: Duration::from_millis(200),
            near_cache: None,
            tls: None,
            replicas_ack: None,
        };
        let store = RedisStore::connect(&cfg, Duration::from_secs(1), &Metrics::new()).unwrap();
        let keys = ObjectKeys::from_parts("e", "g", "l");
        let started = tokio::time::Instant::now();
        let result = tokio::time::timeout(Duration::from_secs(5), store.read(&keys)).await;
        assert!(matches!(result, Ok(Err(_))), "{result:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn malformed_url_is_a_configuration_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let cfg = RedisConfig {
            target: RedisTarget::Single("not a url".into()),
            command_timeout: Duration::from_millis(200),
            near_cache: None,
            tls: None,
            replicas_ack: None,
        };
        assert!(RedisStore::connect(&cfg, Duration::from_secs(1), &Metrics::new()).is_err());
    }
}

//! The Redis backend: the generation protocol over one multiplexed
//! connection (single node, via `ConnectionManager`; with Sentinel, the one
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
use super::redis_client;
use super::redis_sentinel;
use super::redis_slots;
use super::scripts;
use super::slot_map::SlotMap;
use super::{
    BoxFuture, Inspection, LeaseReply, PublishChecks, PublishOutcome, Snapshot, Store, StoreError,
    WitnessSlot,
};
use crate::config::{RedisConfig, RedisTarget, ReplicasAck};
use crate::keys::ObjectKeys;
use crate::metrics::Metrics;
use bytes::Bytes;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Script, Value};
use std::sync::Arc;
use std::time::Duration;

#[path = "redis_bloom.rs"]
mod bloom;

/// Reconnect attempts after the first one fails, before a reconnect gives up
/// (the next command starts a new one). Small, so a dead server does not
/// hold calls in backoff for seconds.
const RECONNECT_RETRIES: usize = 2;
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(25);
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(250);
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
    Single(ConnectionManager),
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
                Some(manager) => Conn::Single((*manager).clone()),
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
            Conn::Cluster(c) => c.req_packed_command(cmd),
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
                let client = redis_client::client(info, cfg.tls.as_ref()).map_err(config_error)?;
                diagnose = Some(client.clone());
                let manager_cfg = single_manager_config(command_timeout, connect_timeout);
                if let Some(ack) = cfg.replicas_ack {
                    let wait_cfg = manager_cfg
                        .clone()
                        .set_response_timeout(Some(command_timeout + ack.timeout));
                    let manager = ConnectionManager::new_lazy_with_config(client.clone(), wait_cfg)
                        .map_err(config_error)?;
                    replicated = Some((Conn::Single(manager), ack));
                }
                let manager = ConnectionManager::new_lazy_with_config(client, manager_cfg)
                    .map_err(config_error)?;
                (Conn::Single(manager), "redis")
            }
            RedisTarget::Sentinel(target) => {
                let primary = redis_sentinel::Primary::default();
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
                let switched = move |client: &redis::Client| {
                    if let Some(near) = &switch_near {
                        near_tracking::primary_switched(
                            near,
                            &tracked_primary,
                            client,
                            tls.as_ref(),
                        );
                    }
                };
                let follow = redis_sentinel::follow(
                    target.clone(),
                    primary.clone(),
                    heartbeat,
                    single_manager_config(command_timeout, connect_timeout),
                    tcp.clone(),
                    switched,
                );
                tasks.push(tokio::spawn(follow).abort_handle());
                (Conn::Sentinel(primary), "redis-sentinel")
            }
            RedisTarget::Cluster(urls) => {
                let mut builder = ClusterClientBuilder::new(urls.iter().map(String::as_str));
                if let Some(tls) = &cfg.tls {
                    builder = builder.certs(redis_client::certificates(tls));
                }
                let client = builder
                    .tcp_settings(tcp.clone())
                    .connection_timeout(connect_timeout)
                    .response_timeout(command_timeout)
                    .retries(RECONNECT_RETRIES as u32)
                    .min_retry_wait(RECONNECT_MIN_DELAY.as_millis() as u64)
                    .max_retry_wait(RECONNECT_MAX_DELAY.as_millis() as u64)
                    .build()
                    .map_err(config_error)?;
                // `with_config` replaces the builder's per-node response
                // timeout with this one (None by default): set it again.
                // The builder's value still bounds the whole request.
                let cluster_cfg = ClusterConfig::new()
                    .set_connection_timeout(connect_timeout)
                    .set_response_timeout(command_timeout);
                let conn = client.get_pending_async_connection_with_config(cluster_cfg);
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

    /// The connection invalidations are written on.
    fn invalidation_conn(&self) -> Conn {
        match &self.replicated {
            Some((conn, _)) => conn.clone(),
            None => self.conn.current(),
        }
    }

    /// With `replicas_ack`: waits until that many replicas hold every write
    /// made so far on the invalidation connection.
    async fn replicated(&self) -> Result<(), StoreError> {
        let Some((conn, ack)) = &self.replicated else {
            return Ok(());
        };
        let acked: i64 = redis::cmd("WAIT")
            .arg(ack.replicas)
            .arg(
                u64::try_from(ack.timeout.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
            )
            .query_async(&mut conn.clone())
            .await
            .map_err(map_error)?;
        if acked < i64::from(ack.replicas) {
            return Err(StoreError::ReplicaShortfall {
                acked,
                wanted: ack.replicas,
            });
        }
        Ok(())
    }

    /// Runs the ticket or invalidate script: both take the generation key,
    /// a nonce and the generation TTL, and return the generation.
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
                        near.offer_tag(key, epoch, tracked.id, value);
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
    diagnose: Option<redis::Client>,
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
        if let (Err(StoreError::Timeout), Some(client), false) =
            (&outcome, &diagnose, reachable == Some(false))
        {
            let connect = client.get_multiplexed_async_connection();
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

/// Capped reconnects and a response timeout (module doc).
fn single_manager_config(
    command_timeout: Duration,
    connect_timeout: Duration,
) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(command_timeout))
        .set_connection_timeout(Some(connect_timeout))
        .set_number_of_retries(RECONNECT_RETRIES)
        .set_min_delay(RECONNECT_MIN_DELAY)
        .set_max_delay(RECONNECT_MAX_DELAY)
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
                .key(&keys.entry)
                .key(&keys.generation)
                .key(&keys.lease)
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
                if let Some(tracked) = near.tracked_for(&keys.entry) {
                    match mget(&mut tracked.conn.clone(), keys).await {
                        Ok(snapshot) => {
                            near.offer(keys, epoch, tracked.id, &snapshot);
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
                .key(&keys.lease)
                .key(&keys.generation)
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
                    .key(&keys.lease)
                    .key(&keys.generation)
                    .key(&keys.entry)
                    .arg(owner)
                    .arg(ticket)
                    .arg(entry.as_ref())
                    .arg(px(ttl))
                    .invoke_async(&mut conn)
                    .await
                    .map_err(map_error)?;
                self.forget(&keys.entry);
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
            let mut call = scripts::PUBLISH_CHECKED.key(&keys.lease);
            call.key(&keys.generation)
                .key(&keys.entry)
                // Any key of the object's slot when there is no floor.
                .key(checks.floor_key.as_deref().unwrap_or(&keys.generation))
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
            self.forget(&keys.entry);
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
                            near.offer_tag(key, epoch, tracked.id, value);
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
                let mut conn = self.invalidation_conn();
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
            let generation = self
                .generation_script(
                    self.invalidation_conn(),
                    &scripts::INVALIDATE,
                    gen_key,
                    nonce,
                    gen_ttl,
                )
                .await?;
            self.forget(gen_key);
            self.replicated().await?;
            Ok(generation)
        })
    }

    fn invalidate_many<'a>(
        &'a self,
        gen_keys: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            // Redis refuses an empty pipeline.
            if gen_keys.is_empty() {
                return Ok(());
            }
            let mut conn = self.invalidation_conn();
            match &mut conn {
                // An unresolved Sentinel primary fails the call.
                Conn::Single(_) | Conn::Sentinel(_) => {
                    invalidate_pipelined(&mut conn, gen_keys, None, nonce, px(gen_ttl))
                        .await
                        .map_err(map_error)?;
                    for key in gen_keys {
                        self.forget(key);
                    }
                    self.replicated().await
                }
                // A cluster pipeline is routed by its first key: keys of
                // other slots would be refused. Concurrent single calls keep
                // the latency at about one round trip instead.
                Conn::Cluster(_) => {
                    let calls = gen_keys.iter().map(|key| {
                        let mut conn = conn.clone();
                        async move {
                            scripts::INVALIDATE
                                .key(key)
                                .arg(nonce)
                                .arg(px(gen_ttl))
                                .invoke_async::<Vec<u8>>(&mut conn)
                                .await
                        }
                    });
                    for result in futures_util::future::join_all(calls).await {
                        result.map_err(map_error)?;
                    }
                    Ok(())
                }
            }
        })
    }

    fn invalidate_marked<'a>(
        &'a self,
        gen_keys: &'a [String],
        marks: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if gen_keys.is_empty() {
                return Ok(());
            }
            if marks.len() != gen_keys.len() {
                return Err(StoreError::Protocol("one mark per key expected".into()));
            }
            let mut conn = self.invalidation_conn();
            match &mut conn {
                // An unresolved Sentinel primary fails the call.
                Conn::Single(_) | Conn::Sentinel(_) => {
                    invalidate_pipelined(&mut conn, gen_keys, Some(marks), nonce, px(gen_ttl))
                        .await
                        .map_err(map_error)?;
                }
                // One call per key, concurrently, as in `invalidate_many`.
                Conn::Cluster(_) => {
                    let calls = gen_keys.iter().zip(marks).map(|(key, mark)| {
                        let mut conn = conn.clone();
                        async move {
                            scripts::INVALIDATE_MARKED
                                .key(key)
                                .arg(nonce)
                                .arg(px(gen_ttl))
                                .arg(mark)
                                .invoke_async::<i64>(&mut conn)
                                .await
                        }
                    });
                    for result in futures_util::future::join_all(calls).await {
                        result.map_err(map_error)?;
                    }
                }
            }
            for key in gen_keys {
                self.forget(key);
            }
            self.replicated().await
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
        .arg(&keys.entry)
        .arg(&keys.generation)
        .query_async(conn)
        .await
        .map_err(map_error)?;
    Ok(Snapshot {
        entry: entry.map(Bytes::from),
        generation: generation.map(Bytes::from),
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

/// One pipeline of `EVALSHA invalidate` per key. A pipeline cannot fall back
/// to `EVAL` per command, so on `NOSCRIPT` (Redis restarted or `SCRIPT
/// FLUSH`) the script is loaded and the whole pipeline sent again; commands
/// that did run the first time simply invalidate twice (idempotent).
/// `invalidate.lua` per key in one pipeline, or `invalidate_marked.lua`
/// with `marks[i]` for `gen_keys[i]`.
async fn invalidate_pipelined(
    conn: &mut Conn,
    gen_keys: &[String],
    marks: Option<&[String]>,
    nonce: &str,
    px_ttl: u64,
) -> Result<(), RedisError> {
    let script = match marks {
        Some(_) => &*scripts::INVALIDATE_MARKED,
        None => &*scripts::INVALIDATE,
    };
    let mut pipe = redis::pipe();
    for (i, key) in gen_keys.iter().enumerate() {
        let mut call = script.key(key);
        call.arg(nonce).arg(px_ttl);
        if let Some(mark) = marks.and_then(|m| m.get(i)) {
            call.arg(mark);
        }
        pipe.invoke_script(&call).ignore();
    }
    match pipe.query_async::<()>(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            pipe.query_async::<()>(conn).await
        }
        other => other,
    }
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
        let keys = ObjectKeys {
            entry: "e".into(),
            generation: "g".into(),
            lease: "l".into(),
        };
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

//! The Redis backend: the generation protocol over one multiplexed
//! connection (single node, [`node`]; with Sentinel, the one to the
//! current primary, [`sentinel`]) or a cluster connection
//! (`cluster_async`), each behind the `connection` handle every call
//! takes. Clients are built (TLS) by [`client`]. Every multi-key operation
//! is a script from [`scripts`]; all keys of one object share a hash slot
//! (docs/architecture.md#key-layout), so `MGET` and the scripts work on Cluster
//! too.
//!
//! This file holds the topology: which connections [`RedisStore::connect`]
//! makes for the configured target, and the background tasks that keep
//! them (heartbeat, Sentinel, the cluster's slot table in [`slots`], the
//! near cache's tracked connections in [`near_tracking`]). The protocol
//! lives in one file per capability, as the traits do: `object.rs`,
//! `feeds.rs`, `tags.rs`, `bloom.rs`.
//!
//! Failure behaviour (measured on redis-rs 1.8: docs/architecture.md#redis-rs):
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

pub(crate) mod client;
pub(crate) mod near;
pub(crate) mod near_tracking;
pub(crate) mod node;
pub(crate) mod scripts;
pub(crate) mod sentinel;
pub(crate) mod slots;

mod bloom;
mod connection;
mod feeds;
mod object;
mod tags;

use super::backend::Store;
use super::protocol::StoreError;
use super::slot_map::SlotMap;
use crate::config::{RedisConfig, RedisTarget, ReplicasAck};
use crate::metrics::Metrics;
use client::{self as redis_client, Pinned};
use connection::{cluster_conn, config_error, keep_alive, Conn, MIN_CONNECT_TIMEOUT};
use near::NearCache;
use near_tracking::Source;
use node::{Node, Timeouts};
use redis::io::tcp::TcpSettings;
use redis::IntoConnectionInfo;
use std::sync::Arc;
use std::time::Duration;

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

impl RedisStore {
    /// Builds the client without connecting (Redis may be down at start).
    /// Fails only on a malformed URL. `heartbeat` is how often a background
    /// `PING` keeps the connection established; it should be shorter than
    /// the breaker cooldown. Must be called inside a Tokio runtime.
    /// With `cfg.near_cache`, reads are also answered from the near cache
    /// (see [`near`]), whose metrics go to `metrics`.
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
                let sentinel = sentinel::client(target, cfg.tls.as_ref(), tcp.clone())
                    .map_err(config_error)?;
                let timeouts = |response| Timeouts {
                    response,
                    connect: connect_timeout,
                };
                let primary = sentinel::Primary::default();
                let mut primaries = vec![(primary.clone(), timeouts(command_timeout))];
                if let Some(ack) = cfg.replicas_ack {
                    let waiting = sentinel::Primary::default();
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
                let follow = sentinel::follow(
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
                let refresh = slots::keep_current(
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

impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn slot_map(&self) -> Option<Arc<SlotMap>> {
        self.slots.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::ObjectKeys;
    use crate::store::object::ObjectStore;

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

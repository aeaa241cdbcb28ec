//! Keeps the near cache's tracked connections up ([`super::near`]): one per
//! node that serves objects.
//!
//! - Single node: one, to the URL.
//! - Sentinel: one to the primary the sentinels name. A switch (noticed by
//!   [`super::sentinel::follow`]) drops it and everything read over
//!   it before the store's calls go to the new primary; the keeper then
//!   connects to the new one.
//! - Cluster: one per master in the [`SlotMap`], reconciled every
//!   heartbeat (a new master gets one, a node that is no longer a master
//!   loses its own and what was read over it). Per-node tracking, not
//!   `BCAST`: each master pushes only the keys this instance read from it,
//!   where `BCAST` would push every write of every key under the prefix to
//!   every instance (bench/README.md has the numbers). A slot map change
//!   drops the whole near cache ([`on_slots_changed`]): a slot that moved
//!   away was tracked by its old owner only.
//!
//! Each connection speaks RESP3, turns `CLIENT TRACKING ON`, and is pinged
//! every heartbeat; on loss it is reconnected with a capped backoff.

use super::client::{self as redis_client, Pinned};
use super::near::{NearCache, Tracked};
use crate::config::RedisTls;
use crate::store::slot_map::SlotMap;
use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, ProtocolVersion, PushInfo, RedisResult};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;

/// A tracked connection's client, with the resolver of
/// `store.redis.tls.server_name` when one is set.
pub(crate) struct TrackedClient {
    client: redis::Client,
    pinned: Option<Pinned>,
}

/// Where a keeper gets the client of its node.
pub(crate) enum Source {
    /// Single node, or one Cluster master.
    Fixed(Arc<TrackedClient>),
    /// Sentinel: the current primary's client, replaced on a switch
    /// (empty until the sentinels named one).
    Following(Arc<ArcSwapOption<TrackedClient>>),
}

impl Source {
    fn current(&self) -> Option<Arc<TrackedClient>> {
        match self {
            Source::Fixed(client) => Some(client.clone()),
            Source::Following(primary) => primary.load_full(),
        }
    }

    /// Whether `client` is still the one to track.
    fn is_current(&self, client: &Arc<TrackedClient>) -> bool {
        match self {
            Source::Fixed(_) => true,
            Source::Following(primary) => primary
                .load()
                .as_ref()
                .is_some_and(|now| Arc::ptr_eq(now, client)),
        }
    }
}

/// A client for tracked connections to `info` (its host as configured):
/// RESP3 (invalidation pushes need it), with `store.redis.tls` and its
/// server name.
pub(crate) fn tracked_client(
    info: ConnectionInfo,
    tls: Option<&RedisTls>,
) -> RedisResult<TrackedClient> {
    let (info, pinned) = redis_client::pin(info, tls);
    resp3_client(info, tls, pinned)
}

/// `info` already carries the server name as its host (see
/// [`redis_client::pin`]); `pinned` finds the real host.
fn resp3_client(
    info: ConnectionInfo,
    tls: Option<&RedisTls>,
    pinned: Option<Pinned>,
) -> RedisResult<TrackedClient> {
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let client = redis_client::client(info.set_redis_settings(settings), tls)?;
    Ok(TrackedClient { client, pinned })
}

/// Sentinel: the primary switched to `client`'s node (`pinned`: its
/// server name's resolver, if any). Nothing read from the old primary may
/// be served from now on, and the keeper connects to the new one.
pub(crate) fn primary_switched(
    near: &NearCache,
    source: &ArcSwapOption<TrackedClient>,
    client: &redis::Client,
    pinned: Option<&Pinned>,
    tls: Option<&RedisTls>,
) {
    match resp3_client(client.get_connection_info().clone(), tls, pinned.cloned()) {
        Ok(client) => source.store(Some(Arc::new(client))),
        Err(e) => {
            tracing::warn!(error = %e, "near cache: cannot track the new primary");
            source.store(None);
        }
    }
    near.lost_all();
    near.reconcile.notify_one();
}

/// Cluster: the slot map changed (a failover, a slot moved). Writes to a
/// moved slot now go to a master that does not know what we hold.
pub(crate) fn on_slots_changed(near: &NearCache) {
    // Nothing was read over a tracked connection before the first table.
    if near.connections() > 0 {
        tracing::info!("near cache: cluster slot map changed, cache emptied");
        near.flush();
    }
    near.reconcile.notify_one();
}

/// Cluster: keeps one tracked connection per master of `map` (reconciled
/// every `every`), to the master's address with the settings of
/// `template` (the first `store.redis.cluster` URL). Runs until aborted
/// (its per-node keepers with it).
pub(crate) async fn keep_cluster(
    near: Arc<NearCache>,
    map: Arc<SlotMap>,
    template: ConnectionInfo,
    tls: Option<RedisTls>,
    every: Duration,
    timeout: Duration,
) {
    let mut keepers: HashMap<Arc<str>, AbortHandle> = HashMap::new();
    // Dropped with this task: aborts every per-node keeper.
    let mut tasks = JoinSet::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = near.reconcile.notified() => {}
        }
        let masters = map.nodes();
        keepers.retain(|node, keeper| {
            let master = masters.contains(node);
            if !master {
                // Abort first: the keeper cannot install it again.
                keeper.abort();
                near.lost_node(node);
            }
            master
        });
        for node in masters {
            if keepers.contains_key(&node) {
                continue;
            }
            match node_info(&template, &node).map(|info| tracked_client(info, tls.as_ref())) {
                Some(Ok(client)) => {
                    let keeper = keep_tracked(
                        near.clone(),
                        Source::Fixed(Arc::new(client)),
                        every,
                        timeout,
                    );
                    keepers.insert(node, tasks.spawn(keeper));
                }
                Some(Err(e)) => tracing::warn!(%node, error = %e, "near cache: cannot track node"),
                None => tracing::warn!(%node, "near cache: unexpected node address"),
            }
        }
        while tasks.try_join_next().is_some() {}
    }
}

/// `template` with its address replaced by `node` (`host:port`).
fn node_info(template: &ConnectionInfo, node: &str) -> Option<ConnectionInfo> {
    let (host, port) = node.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let mut addr = template.addr().clone();
    match &mut addr {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => {
            *h = host.to_owned();
            *p = port;
        }
        _ => return None,
    }
    Some(template.clone().set_addr(addr))
}

/// Keeps a tracked connection up for `near` to `source`'s node: connect,
/// turn tracking on, install it, ping it every `every`; on loss, reconnect
/// with a capped backoff. Runs until aborted.
pub(crate) async fn keep_tracked(
    near: Arc<NearCache>,
    source: Source,
    every: Duration,
    timeout: Duration,
) {
    const MIN_BACKOFF: Duration = Duration::from_millis(50);
    const MAX_BACKOFF: Duration = Duration::from_secs(2);
    let mut backoff = MIN_BACKOFF;
    let mut was_up = None;
    loop {
        if let Some(client) = source.current() {
            let node: Arc<str> = client
                .client
                .get_connection_info()
                .addr()
                .to_string()
                .into();
            let id = near.next_id();
            match open_tracked(&near, &client, id, timeout).await {
                Ok(conn) => {
                    backoff = MIN_BACKOFF;
                    // Sentinel: not if the primary switched while connecting.
                    let installed =
                        near.install(id, node.clone(), conn, || source.is_current(&client));
                    if let Some(tracked) = installed {
                        tracing::info!(%node, "near cache: tracked connection up");
                        was_up = Some(true);
                        let every = every.min(near.confirm_every());
                        supervise(&near, &tracked, every, timeout).await;
                        tracing::warn!(%node, "near cache: tracked connection lost, its objects dropped");
                    }
                }
                Err(e) => {
                    if was_up != Some(false) {
                        tracing::warn!(%node, error = %e, "near cache: no tracked connection, reads go to redis");
                    }
                    was_up = Some(false);
                }
            }
        }
        let switched = match source {
            Source::Following(_) => tokio::select! {
                _ = near.reconcile.notified() => true,
                _ = tokio::time::sleep(backoff) => false,
            },
            Source::Fixed(_) => {
                tokio::time::sleep(backoff).await;
                false
            }
        };
        backoff = if switched {
            MIN_BACKOFF
        } else {
            (backoff * 2).min(MAX_BACKOFF)
        };
    }
}

async fn open_tracked(
    near: &Arc<NearCache>,
    client: &TrackedClient,
    id: u64,
    timeout: Duration,
) -> Result<MultiplexedConnection, redis::RedisError> {
    // Weak: the connection's reader holds this closure, and the cache holds
    // the connection.
    let weak = Arc::downgrade(near);
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(250))))
        .set_response_timeout(Some(timeout))
        .set_push_sender(move |push: PushInfo| {
            if let Some(near) = weak.upgrade() {
                near.on_push(id, push);
            }
            Ok::<(), std::convert::Infallible>(())
        });
    let config = redis_client::resolve_with(config, client.pinned.as_ref());
    let mut conn = client
        .client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    redis::cmd("CLIENT")
        .arg("TRACKING")
        .arg("ON")
        .query_async::<()>(&mut conn)
        .await?;
    Ok(conn)
}

/// Returns once `tracked` is lost (push reader saw it close, a heartbeat
/// failed, or the cache dropped it).
async fn supervise(near: &NearCache, tracked: &Tracked, every: Duration, timeout: Duration) {
    let ping = redis::cmd("PING");
    let mut conn = tracked.conn.clone();
    loop {
        tokio::select! {
            _ = tracked.lost.notified() => return,
            _ = tokio::time::sleep(every) => {}
        }
        // A dropped connection (Sentinel switch) ends a hanging ping too.
        let sent = Instant::now();
        tokio::select! {
            _ = tracked.lost.notified() => return,
            alive = tokio::time::timeout(timeout, ping.query_async::<()>(&mut conn)) => {
                if !matches!(alive, Ok(Ok(()))) {
                    near.lost(tracked.link.id);
                    return;
                }
                near.confirm(&tracked.link, sent);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::IntoConnectionInfo;

    #[test]
    fn node_info_keeps_settings_and_replaces_the_address() {
        let template = "redis://user:pw@10.0.0.1:7000/"
            .into_connection_info()
            .unwrap();
        let info = node_info(&template, "127.0.0.1:7002").unwrap();
        assert_eq!(info.addr().to_string(), "127.0.0.1:7002");
        assert_eq!(info.redis_settings().username(), Some("user"));
        assert!(node_info(&template, "no-port").is_none());
        let tls = "rediss://10.0.0.1:7000/".into_connection_info().unwrap();
        let info = node_info(&tls, "10.0.0.3:7001").unwrap();
        assert!(matches!(
            info.addr(),
            ConnectionAddr::TcpTls { port: 7001, .. }
        ));
    }
}

//! Where the stream consumer's own connections go
//! (docs/invalidation.md#redis-stream): to the single node, to the primary
//! Sentinel names now, or on Redis Cluster to the master serving the stream
//! key's slot.
//!
//! With Sentinel every connect asks the sentinels. After a failover the
//! session's connection fails (the old primary is gone, or answers
//! `READONLY` once demoted) and the next connect reaches the promoted
//! replica, which holds the stream and its consumer group as far as they
//! were replicated: entries appended after the promotion are read, and the
//! pending entries it knows are retried.
//!
//! The consumer's commands block (`XREADGROUP`/`XREAD ... BLOCK`), so they
//! cannot share the store's cluster connection (docs/architecture.md#redis-rs);
//! each path opens a plain connection of its own to the stream's master
//! instead. The master is found with `CLUSTER SLOTS` from the first seed node
//! that answers. A `MOVED` reply (failover, slot migrated) ends the session;
//! the next connect goes to the node it names. An `ASK` (the slot is migrating)
//! makes the next connect resolve again: the session resumes on the stream's
//! owner once the migration is over.
//!
//! The dead-letter stream `<stream>:dead` must share the stream's slot
//! (config validation requires a hash tag in the stream's name on Cluster),
//! so every command of a session goes to the one node.

use crate::config::{RedisTls, SentinelTarget};
use crate::store::redis::{
    client as redis_client, sentinel as redis_sentinel, slots as redis_slots,
};
use crate::store::slot_map::{slot_of, SlotMap};
use redis::aio::MultiplexedConnection;
use redis::io::tcp::TcpSettings;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisError,
    ServerErrorKind,
};
use std::sync::Mutex;
use std::time::Duration;
use tracing::info;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Response timeout beyond `BLOCK`, for the round trip itself.
const BLOCK_MARGIN: Duration = Duration::from_secs(2);

/// The store the stream lives in.
#[derive(Debug, Clone)]
pub enum StreamTarget {
    /// `store.redis.url`.
    Single(String),
    /// `store.redis.cluster`: seed nodes.
    Cluster(Vec<String>),
    /// `store.redis.sentinel`.
    Sentinel(SentinelTarget),
}

/// Opens the consumer's connections (see the module doc).
pub(crate) struct StreamConn {
    target: StreamTarget,
    tls: Option<RedisTls>,
    stream: String,
    /// Cluster: the `host:port` a `MOVED` named, tried first.
    moved_to: Mutex<Option<(String, u16)>>,
}

impl StreamConn {
    pub(crate) fn new(target: StreamTarget, tls: Option<RedisTls>, stream: String) -> StreamConn {
        StreamConn {
            target,
            tls,
            stream,
            moved_to: Mutex::new(None),
        }
    }

    /// A connection of its own to the stream's node, whose response timeout
    /// exceeds `block`.
    pub(crate) async fn connect(
        &self,
        block: Duration,
    ) -> Result<MultiplexedConnection, RedisError> {
        crate::tls::use_ring();
        match &self.target {
            StreamTarget::Single(url) => open(url.as_str(), self.tls.as_ref(), block).await,
            StreamTarget::Sentinel(target) => {
                let tcp = TcpSettings::default().set_nodelay(true);
                let mut sentinel = redis_sentinel::client(target, self.tls.as_ref(), tcp.clone())?;
                let ask = redis_sentinel::primary(&mut sentinel, target, self.tls.as_ref(), tcp);
                let (primary, pinned) =
                    tokio::time::timeout(CONNECT_TIMEOUT, ask)
                        .await
                        .map_err(|_| {
                            RedisError::from((ErrorKind::Io, "redis sentinel: no answer in time"))
                        })??;
                let config = redis_client::resolve_with(conn_config(block), pinned.as_ref());
                primary
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
            }
            StreamTarget::Cluster(seeds) => {
                let moved = self
                    .moved_to
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                let (host, port) = match moved {
                    Some(node) => node,
                    None => self.resolve(seeds).await?,
                };
                let seed = seeds.first().map(String::as_str).unwrap_or_default();
                let info = seed.into_connection_info()?;
                let addr = match info.addr() {
                    ConnectionAddr::TcpTls { .. } => ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure: false,
                        tls_params: None,
                    },
                    _ => ConnectionAddr::Tcp(host, port),
                };
                open(info.set_addr(addr), self.tls.as_ref(), block).await
            }
        }
    }

    /// Learns from a session's error: a `MOVED` names the stream's new
    /// master, anything else (an `ASK`, a dead node) means "ask the cluster
    /// again" on the next connect.
    pub(crate) fn follow(&self, error: &RedisError) {
        if !matches!(self.target, StreamTarget::Cluster(_)) {
            return;
        }
        let moved = match (error.kind(), error.redirect_node()) {
            (ErrorKind::Server(ServerErrorKind::Moved), Some((addr, _))) => split_addr(addr),
            _ => None,
        };
        if let Some((host, port)) = &moved {
            info!(node = %format!("{host}:{port}"), "stream's slot moved; following");
        }
        *self.moved_to.lock().unwrap_or_else(|p| p.into_inner()) = moved;
    }

    /// The master serving the stream's slot, from the first seed that
    /// answers `CLUSTER SLOTS`.
    async fn resolve(&self, seeds: &[String]) -> Result<(String, u16), RedisError> {
        let mut last = RedisError::from((ErrorKind::Io, "no cluster seed node given"));
        for seed in seeds {
            let asked = async {
                let mut conn = open(seed.as_str(), self.tls.as_ref(), Duration::ZERO).await?;
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<redis::Value>(&mut conn)
                    .await
            };
            match asked.await {
                Ok(reply) => {
                    let map = SlotMap::default();
                    map.replace(redis_slots::parse(&reply).unwrap_or_default());
                    let node = map
                        .node_of_slot(slot_of(self.stream.as_bytes()))
                        .and_then(|n| split_addr(&n));
                    match node {
                        Some(node) => return Ok(node),
                        None => {
                            last = RedisError::from((
                                ErrorKind::Io,
                                "no cluster master serves the stream's slot",
                            ))
                        }
                    }
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// `host:port` (the host may be an IPv6 address with colons).
fn split_addr(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// A connection whose response timeout exceeds `block`.
async fn open(
    info: impl IntoConnectionInfo,
    tls: Option<&RedisTls>,
    block: Duration,
) -> Result<MultiplexedConnection, RedisError> {
    let (info, pinned) = redis_client::pin(info.into_connection_info()?, tls);
    let client = redis_client::client(info, tls)?;
    let config = redis_client::resolve_with(conn_config(block), pinned.as_ref());
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// Connect timeout, and a response timeout that exceeds `block`.
fn conn_config(block: Duration) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(block + BLOCK_MARGIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_at_the_last_colon() {
        assert_eq!(
            split_addr("127.0.0.1:7000"),
            Some(("127.0.0.1".into(), 7000))
        );
        assert_eq!(split_addr("::1:7000"), Some(("::1".into(), 7000)));
        assert_eq!(split_addr("nohost"), None);
        assert_eq!(split_addr("h:x"), None);
    }
}

//! The connection to one Redis node (single node, or the primary Sentinel
//! names): redis-rs's `ConnectionManager`, or with
//! `store.redis.tls.server_name` a multiplexed connection of our own that
//! is made again after a failure.
//!
//! Why two: redis-rs verifies the certificate against the host of the
//! connection's address, so the server name becomes the host and a DNS
//! resolver maps it to the real one ([`redis_client::pin`]); but
//! `ConnectionManager` builds its connections without a resolver hook. The
//! replacement does what the store needs of the manager: connect lazily,
//! share one connection between concurrent calls, and after a connection
//! failure (or a failed connect) make the next call connect anew. It does
//! not retry within a call; the heartbeat's `PING` reconnects in the
//! background, as with the manager.
//!
//! Also the reconnect policy every connection of the store follows
//! (`RECONNECT_*`: the manager's here, the cluster client's in
//! `connection.rs`).

use super::client::{self as redis_client, Pinned};
use arc_swap::ArcSwap;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, RedisResult, Value};
use std::sync::Arc;
use std::time::Duration;

/// Reconnect attempts after the first one fails, before a reconnect gives up
/// (the next command starts a new one). Small, so a dead server does not
/// hold calls in backoff for seconds. The cluster client's reconnects
/// (`connection::cluster_conn`) follow the same policy.
pub(super) const RECONNECT_RETRIES: usize = 2;
pub(super) const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(25);
pub(super) const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(250);

/// Response and connect timeouts of a node's connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub response: Duration,
    pub connect: Duration,
}

/// One node's connection; clones share it.
#[derive(Clone)]
pub(crate) enum Node {
    Manager(ConnectionManager),
    Pinned(Remade),
}

impl Node {
    /// A node connection to `client` (not connected yet); `pinned`: the
    /// resolver of a server name ([`redis_client::pin`]).
    pub(crate) fn new(
        client: Client,
        pinned: Option<Pinned>,
        timeouts: Timeouts,
    ) -> RedisResult<Node> {
        match pinned {
            None => {
                // Capped reconnects (module doc of `super`).
                let manager = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(timeouts.response))
                    .set_connection_timeout(Some(timeouts.connect))
                    .set_number_of_retries(RECONNECT_RETRIES)
                    .set_min_delay(RECONNECT_MIN_DELAY)
                    .set_max_delay(RECONNECT_MAX_DELAY);
                Ok(Node::Manager(ConnectionManager::new_lazy_with_config(
                    client, manager,
                )?))
            }
            Some(pinned) => {
                let config = AsyncConnectionConfig::new()
                    .set_response_timeout(Some(timeouts.response))
                    .set_connection_timeout(Some(timeouts.connect));
                let config = redis_client::resolve_with(config, Some(&pinned));
                Ok(Node::Pinned(Remade::new(client, config)))
            }
        }
    }
}

impl ConnectionLike for Node {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Node::Manager(c) => c.req_packed_command(cmd),
            Node::Pinned(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Node::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Node::Pinned(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Node::Manager(c) => c.get_db(),
            Node::Pinned(c) => c.get_db(),
        }
    }
}

type Connecting = Shared<BoxFuture<'static, RedisResult<MultiplexedConnection>>>;

/// A multiplexed connection made on first use and again after a failure.
#[derive(Clone)]
pub(crate) struct Remade(Arc<Inner>);

struct Inner {
    client: Client,
    config: AsyncConnectionConfig,
    current: ArcSwap<Connecting>,
}

impl Remade {
    fn new(client: Client, config: AsyncConnectionConfig) -> Remade {
        let current = ArcSwap::from_pointee(connecting(&client, &config));
        Remade(Arc::new(Inner {
            client,
            config,
            current,
        }))
    }

    /// Replaces `failed` by a new connect, unless another call already did.
    fn remake(&self, failed: &Arc<Connecting>) {
        let inner = &self.0;
        inner.current.rcu(|now| {
            if Arc::ptr_eq(now, failed) {
                Arc::new(connecting(&inner.client, &inner.config))
            } else {
                now.clone()
            }
        });
    }

    /// The current connection (connecting if needed), and the connect it
    /// came from; a failed connect makes the next call connect anew.
    async fn conn(&self) -> RedisResult<(MultiplexedConnection, Arc<Connecting>)> {
        let current = self.0.current.load_full();
        match (*current).clone().await {
            Ok(conn) => Ok((conn, current)),
            Err(e) => {
                self.remake(&current);
                Err(e)
            }
        }
    }

    /// After a call on `from`'s connection: a broken connection is made
    /// anew by the next call.
    fn after<T>(&self, from: &Arc<Connecting>, result: &RedisResult<T>) {
        if matches!(result, Err(e) if e.is_unrecoverable_error()) {
            self.remake(from);
        }
    }
}

/// A lazy, shared connect (runs when first awaited).
fn connecting(client: &Client, config: &AsyncConnectionConfig) -> Connecting {
    let (client, config) = (client.clone(), config.clone());
    async move {
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }
    .boxed()
    .shared()
}

impl ConnectionLike for Remade {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (mut conn, from) = self.conn().await?;
            let result = conn.req_packed_command(cmd).await;
            self.after(&from, &result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (mut conn, from) = self.conn().await?;
            let result = conn.req_packed_commands(pipeline, offset, count).await;
            self.after(&from, &result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.0.client.get_connection_info().redis_settings().db()
    }
}

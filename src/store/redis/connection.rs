//! The connection every Redis call takes ([`Conn`]: a single node, the
//! primary Sentinel names, or the cluster), and what every call needs
//! besides: how redis-rs errors become [`StoreError`]s, and the `PX`
//! argument. Also the connections' upkeep: the heartbeat
//! ([`keep_alive`]) and the cluster client's timeouts ([`cluster_conn`]).

use super::client::{self as redis_client, Pinned};
use super::node::{Node, RECONNECT_MAX_DELAY, RECONNECT_MIN_DELAY, RECONNECT_RETRIES};
use super::scripts;
use super::sentinel;
use crate::config::RedisConfig;
use crate::store::protocol::StoreError;
use redis::aio::ConnectionLike;
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};
use std::time::Duration;

/// Floor for the TCP connect timeout; a connect is slower than a command.
pub(super) const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);

/// A clonable handle to either kind of connection; clones share the one
/// underlying multiplexed connection (or cluster connection task).
#[derive(Clone)]
pub(super) enum Conn {
    Single(Node),
    Cluster(ClusterConnection),
    /// The primary Sentinel names (see [`sentinel`]); resolved to
    /// `Single` by [`Conn::current`] at the start of every call.
    Sentinel(sentinel::Primary),
}

impl Conn {
    /// The connection to use now: for Sentinel, the current primary's.
    pub(super) fn current(&self) -> Conn {
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

/// Pings every `every` so the client reconnects in the background while the
/// breaker keeps requests away, and logs reachability changes once each.
/// The connection manager retries a failed connect until the call times
/// out, hiding why; on becoming unreachable one direct connect with
/// `diagnose` finds the reason (a failed TLS handshake names its setting).
pub(super) async fn keep_alive(
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
pub(super) fn cluster_conn(
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

pub(super) fn config_error(e: RedisError) -> StoreError {
    StoreError::Unavailable(format!("invalid redis configuration: {e}"))
}

pub(super) fn map_error(e: RedisError) -> StoreError {
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
pub(super) fn px(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
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
}

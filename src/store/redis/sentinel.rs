//! Redis Sentinel (`store.redis.sentinel`): which node is the primary,
//! followed across failovers without a restart.
//!
//! A background task asks the sentinels (redis-rs `SentinelClient`, which
//! also checks that the node it names answers `ROLE` as a master) every
//! heartbeat. When the primary's address changes, it builds connections
//! ([`super::node`]) to the new one and swaps them in; store calls
//! take whichever connection is current at their start. Between the old primary's death and
//! the promotion, calls fail and the breaker keeps requests away; the first
//! probe after the swap reaches the new primary. Hits resume within the
//! breaker cooldown plus Sentinel's own switch-over (`down-after-milliseconds`
//! and the election).
//!
//! TLS: with `store.redis.tls` the primary and replicas are reached over
//! TLS with its certificates (Sentinel announces addresses, not URLs, so
//! the setting's presence is the switch); `rediss://` sentinel URLs reach
//! the sentinels over TLS with the same certificates. The sentinels'
//! credentials come from their URLs; redis-rs applies one set to all of
//! them, so validation requires the URLs to agree.

use super::client::{self as redis_client, Pinned};
use super::node::{Node, Timeouts};
use crate::config::{RedisTls, SentinelTarget};
use arc_swap::ArcSwapOption;
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ErrorKind, IntoConnectionInfo,
    RedisConnectionInfo, RedisError, RedisResult, Role, TlsMode,
};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// The current primary's connection; empty until the sentinels named one.
pub(crate) type Primary = Arc<ArcSwapOption<Node>>;

/// A client that asks `target`'s sentinels for the primary and hands out
/// clients for it (over TLS with `tls`).
pub(crate) fn client(
    target: &SentinelTarget,
    tls: Option<&RedisTls>,
    tcp: TcpSettings,
) -> RedisResult<SentinelClient> {
    let infos = target
        .nodes
        .iter()
        .map(|url| url.as_str().into_connection_info())
        .collect::<RedisResult<Vec<_>>>()?;
    let sentinel_tls = infos
        .iter()
        .any(|i| matches!(i.addr(), ConnectionAddr::TcpTls { .. }));
    let mut builder = SentinelClientBuilder::new(
        infos.iter().map(|i| i.addr().clone()),
        &target.master,
        SentinelServerType::Master,
    )?
    .set_client_to_redis_db(target.db)
    .set_client_to_redis_tcp_settings(tcp.clone())
    .set_client_to_sentinel_tcp_settings(tcp);
    if let Some(first) = infos.first().map(|i| i.redis_settings()) {
        if let Some(username) = first.username() {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = first.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
    }
    if let Some(username) = &target.username {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = &target.password {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(tls) = tls {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_redis_certificates(redis_client::certificates(tls));
        if sentinel_tls {
            builder = builder.set_client_to_sentinel_certificates(redis_client::certificates(tls));
        }
    }
    builder.build()
}

/// A client for the primary the sentinels name now, with the resolver of
/// `tls`'s server name, if any.
///
/// redis-rs checks the primary a sentinel names by connecting to the
/// announced address and verifying its certificate against that address;
/// with a server name that check cannot pass, so then the lookup is done
/// here: the first sentinel that answers names the primary, whose `ROLE`
/// is checked over a connection verified against the server name.
pub(crate) async fn primary(
    sentinel: &mut SentinelClient,
    target: &SentinelTarget,
    tls: Option<&RedisTls>,
    tcp: TcpSettings,
) -> RedisResult<(Client, Option<Pinned>)> {
    if tls.and_then(|t| t.server_name.as_ref()).is_none() {
        return Ok((sentinel.async_get_client().await?, None));
    }
    let mut asked = sentinel
        .async_get_sentinel_client()
        .await?
        .get_multiplexed_async_connection()
        .await?;
    let (host, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(&target.master)
        .query_async(&mut asked)
        .await?;
    let mut redis = RedisConnectionInfo::default().set_db(target.db);
    if let Some(username) = &target.username {
        redis = redis.set_username(username);
    }
    if let Some(password) = &target.password {
        redis = redis.set_password(password);
    }
    let addr = ConnectionAddr::TcpTls {
        host,
        port,
        insecure: false,
        tls_params: None,
    };
    let info = addr
        .into_connection_info()?
        .set_redis_settings(redis)
        .set_tcp_settings(tcp);
    let (info, pinned) = redis_client::pin(info, tls);
    let client = redis_client::client(info, tls)?;
    let config = redis_client::resolve_with(AsyncConnectionConfig::new(), pinned.as_ref());
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    match redis::cmd("ROLE").query_async(&mut conn).await? {
        Role::Primary { .. } => Ok((client, pinned)),
        _ => Err(RedisError::from((
            ErrorKind::Io,
            "redis sentinel: the node named as primary is not one",
        ))),
    }
}

/// Follows the primary forever (the store aborts the task on drop): every
/// primary in `primaries` gets a connection with its own timeouts (and
/// `tls`'s server name, if any). `switched` runs with the new primary's
/// client before calls go to it (the near cache drops what it read from
/// the old one).
pub(crate) async fn follow(
    mut sentinel: SentinelClient,
    target: SentinelTarget,
    tls: Option<RedisTls>,
    tcp: TcpSettings,
    primaries: Vec<(Primary, Timeouts)>,
    every: Duration,
    switched: impl Fn(&redis::Client, Option<&Pinned>) + Send,
) {
    let master = &target.master;
    let mut current: Option<String> = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let ask = primary(&mut sentinel, &target, tls.as_ref(), tcp.clone());
        let (client, pinned) =
            match tokio::time::timeout(every.max(Duration::from_secs(1)), ask).await {
                Ok(Ok(found)) => found,
                Ok(Err(e)) => {
                    if !failing {
                        let error = redis_client::tls_failure(&e).unwrap_or_else(|| e.to_string());
                        warn!(%master, %error, "redis sentinel: no usable primary");
                    }
                    failing = true;
                    continue;
                }
                Err(_) => {
                    if !failing {
                        warn!(%master, "redis sentinel: no answer in time");
                    }
                    failing = true;
                    continue;
                }
            };
        failing = false;
        // With a server name the address's host is that name: the real
        // host tells primaries apart.
        let mut addr = client.get_connection_info().addr().to_string();
        if let Some(pinned) = &pinned {
            addr = format!("{addr} at {}", pinned.host());
        }
        if current.as_deref() == Some(addr.as_str()) {
            continue;
        }
        switched(&client, pinned.as_ref());
        let nodes = primaries
            .iter()
            .map(|(_, timeouts)| Node::new(client.clone(), pinned.clone(), *timeouts))
            .collect::<RedisResult<Vec<_>>>();
        match nodes {
            Ok(nodes) => {
                for ((primary, _), node) in primaries.iter().zip(nodes) {
                    primary.store(Some(Arc::new(node)));
                }
                info!(%master, primary = %addr, "redis sentinel: following the primary");
                current = Some(addr);
            }
            Err(e) => warn!(error = %e, "redis sentinel: cannot use the primary"),
        }
    }
}

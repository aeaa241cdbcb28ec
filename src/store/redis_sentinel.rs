//! Redis Sentinel (`store.redis.sentinel`): which node is the primary,
//! followed across failovers without a restart.
//!
//! A background task asks the sentinels (redis-rs `SentinelClient`, which
//! also checks that the node it names answers `ROLE` as a master) every
//! heartbeat. When the primary's address changes, it builds connection
//! managers for the new one and swaps them in; store calls take whichever
//! manager is current at their start. Between the old primary's death and
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

use crate::config::{RedisTls, SentinelTarget};
use crate::store::redis_client;
use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisResult, TlsMode};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// The current primary's connection; empty until the sentinels named one.
pub type Primary = Arc<ArcSwapOption<ConnectionManager>>;

/// A client that asks `target`'s sentinels for the primary and hands out
/// clients for it (over TLS with `tls`).
pub fn client(
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

/// Follows the primary forever (the store aborts the task on drop): every
/// primary in `primaries` gets a manager built with its own config.
pub async fn follow(
    mut sentinel: SentinelClient,
    master: String,
    primaries: Vec<(Primary, ConnectionManagerConfig)>,
    every: Duration,
) {
    let mut current: Option<String> = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let ask = sentinel.async_get_client();
        let client = match tokio::time::timeout(every.max(Duration::from_secs(1)), ask).await {
            Ok(Ok(client)) => client,
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
        let addr = client.get_connection_info().addr().to_string();
        if current.as_deref() == Some(addr.as_str()) {
            continue;
        }
        let managers = primaries
            .iter()
            .map(|(_, cfg)| ConnectionManager::new_lazy_with_config(client.clone(), cfg.clone()))
            .collect::<RedisResult<Vec<_>>>();
        match managers {
            Ok(managers) => {
                for ((primary, _), manager) in primaries.iter().zip(managers) {
                    primary.store(Some(Arc::new(manager)));
                }
                info!(%master, primary = %addr, "redis sentinel: following the primary");
                current = Some(addr);
            }
            Err(e) => warn!(error = %e, "redis sentinel: cannot use the primary"),
        }
    }
}

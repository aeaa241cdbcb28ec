//! Redis Sentinel (`store.redis.sentinel`): which node is the primary,
//! followed across failovers without a restart.
//!
//! A background task asks the sentinels (redis-rs `Sentinel`, which also
//! checks that the node it names answers `ROLE` as a master) every
//! heartbeat. When the primary's address changes, it builds a connection
//! manager for the new one and swaps it in; store calls take whichever
//! manager is current at their start. Between the old primary's death and
//! the promotion, calls fail and the breaker keeps requests away; the first
//! probe after the swap reaches the new primary. Hits resume within the
//! breaker cooldown plus Sentinel's own switch-over (`down-after-milliseconds`
//! and the election).

use crate::config::SentinelTarget;
use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::RedisConnectionInfo;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// The current primary's connection; empty until the sentinels named one.
pub type Primary = Arc<ArcSwapOption<ConnectionManager>>;

/// Follows the primary forever (the store aborts the task on drop).
/// `switched` runs with the new primary's client before calls go to it
/// (the near cache drops what it read from the old one).
pub async fn follow(
    target: SentinelTarget,
    primary: Primary,
    every: Duration,
    manager_cfg: ConnectionManagerConfig,
    tcp: TcpSettings,
    switched: impl Fn(&redis::Client) + Send,
) {
    let mut sentinel = match Sentinel::build(target.nodes.clone()) {
        Ok(sentinel) => sentinel,
        // Validation checked the URLs; this cannot fail on the network.
        Err(e) => {
            warn!(error = %e, "redis sentinel: invalid store.redis.sentinel.nodes");
            return;
        }
    };
    let mut redis = RedisConnectionInfo::default().set_db(target.db);
    if let Some(username) = &target.username {
        redis = redis.set_username(username);
    }
    if let Some(password) = &target.password {
        redis = redis.set_password(password);
    }
    let node = SentinelNodeConnectionInfo::default()
        .set_redis_connection_info(redis)
        .set_tcp_settings(tcp);
    let mut current: Option<String> = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let ask = sentinel.async_master_for(&target.master, Some(&node));
        let client = match tokio::time::timeout(every.max(Duration::from_secs(1)), ask).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                if !failing {
                    warn!(master = %target.master, error = %e, "redis sentinel: no usable primary");
                }
                failing = true;
                continue;
            }
            Err(_) => {
                if !failing {
                    warn!(master = %target.master, "redis sentinel: no answer in time");
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
        switched(&client);
        match ConnectionManager::new_lazy_with_config(client, manager_cfg.clone()) {
            Ok(manager) => {
                primary.store(Some(Arc::new(manager)));
                info!(master = %target.master, primary = %addr, "redis sentinel: following the primary");
                current = Some(addr);
            }
            Err(e) => warn!(error = %e, "redis sentinel: cannot use the primary"),
        }
    }
}

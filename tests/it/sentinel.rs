//! Redis Sentinel (issue 15): sidecache follows the primary Sentinel
//! names. A primary, its replica and three sentinels; the primary is
//! killed; sidecache serves DEGRADED until the promotion, then HITs from the
//! promoted replica without a restart. The test measures the time from the
//! kill to the promotion and to the first HIT.

use crate::support::client::{self, x_cache};
use crate::support::redis::RedisServer;
use crate::support::sentinel::{Sentinels, MASTER};
use crate::support::{app_routes, eventually, Origin, SidecacheBuilder};
use std::time::{Duration, Instant};

const P: &str = "/api/tenants/acme/apps/1";
const COOLDOWN: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_and_hits_again() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let sentinels = Sentinels::start(3, primary.port(), 1);
    let origin = Origin::start().await;
    let nodes: Vec<String> = sentinels
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect();
    let sc = SidecacheBuilder::new(origin.url())
        .routes(&app_routes(""))
        .store(&format!(
            "store:\n  redis:\n    sentinel:\n      master: {MASTER}\n      nodes: [{}]\n    command_timeout: 300ms\n  breaker:\n    cooldown: 500ms\n",
            nodes.join(", ")
        ))
        .start()
        .await;
    eventually(
        "a HIT through the primary",
        Duration::from_secs(10),
        || async {
            client::get(&sc.url(P)).await;
            x_cache(&client::get(&sc.url(P)).await) == "HIT"
        },
    )
    .await;
    // The entry reached the replica before the primary dies.
    eventually(
        "the entry is replicated",
        Duration::from_secs(10),
        || async { matches!(replica.cli(&["DBSIZE"]), Ok(redis::Value::Int(n)) if n >= 2) },
    )
    .await;

    let killed = Instant::now();
    primary.kill();
    let mut promoted = None;
    let deadline = killed + Duration::from_secs(30);
    let hit = loop {
        assert!(Instant::now() < deadline, "no HIT within 30 s of the kill");
        if promoted.is_none() && sentinels.primary_port() == Some(replica.port()) {
            promoted = Some(killed.elapsed());
        }
        let status = x_cache(&client::get(&sc.url(P)).await);
        if status == "HIT" {
            break killed.elapsed();
        }
        assert!(
            ["DEGRADED", "MISS"].contains(&status.as_str()),
            "unexpected X-Cache {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let promoted = promoted.unwrap_or(hit);
    eprintln!("sentinel failover: promoted after {promoted:?}, first HIT after {hit:?}");
    assert!(
        sentinels.primary_port() == Some(replica.port()),
        "the HIT came from the promoted replica"
    );
    // Follows within the breaker cooldown and a heartbeat or two.
    assert!(
        hit.saturating_sub(promoted) < COOLDOWN + Duration::from_secs(2),
        "promoted after {promoted:?} but first HIT only after {hit:?}"
    );
}

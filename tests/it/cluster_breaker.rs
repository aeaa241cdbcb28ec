//! Per-master breakers on Redis Cluster, through the real binary (issue
//! 15): three masters, one killed. Objects on the other two are still
//! served as HITs; objects on the dead one take the degraded path
//! (pass-through: docs/operations.md#redis-cluster); when it is back they are
//! cached again. The cluster runs with `cluster-require-full-coverage no`:
//! otherwise Redis itself refuses every key once a slot has no master.

use crate::support::client::{self, x_cache};
use crate::support::redis::RedisCluster;
use crate::support::{app_routes, eventually, Origin, SidecacheBuilder};
use sidecache::keys;
use std::time::{Duration, Instant};

fn path(id: u64) -> String {
    format!("/api/tenants/acme/apps/{id}")
}

fn gen_key(id: u64) -> String {
    let id = id.to_string();
    keys::generation_key("sc:", &keys::identity("app", &["acme", id.as_str()]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_degrades_only_its_objects() {
    let cluster = RedisCluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    let origin = Origin::start().await;
    let seeds: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let sc = SidecacheBuilder::new(origin.url())
        .routes(&app_routes(""))
        .store(&format!(
            "store:\n  redis:\n    cluster: [{}]\n    command_timeout: 2s\n  breaker:\n    cooldown: 500ms\n",
            seeds.join(", ")
        ))
        .start()
        .await;

    const N: u64 = 24;
    for id in 1..=N {
        eventually("a HIT", Duration::from_secs(10), || async {
            client::get(&sc.url(&path(id))).await;
            x_cache(&client::get(&sc.url(&path(id))).await) == "HIT"
        })
        .await;
    }
    let dead = &cluster.nodes[0];
    let (on_dead, on_live): (Vec<u64>, Vec<u64>) =
        (1..=N).partition(|id| cluster.owner(&gen_key(*id)).port() == dead.port());
    assert!(
        !on_dead.is_empty() && on_live.len() >= 2,
        "{on_dead:?} {on_live:?}"
    );

    dead.kill();
    // Past the cluster's node timeout (2 s): the survivors mark it failed.
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        for id in &on_live {
            let status = x_cache(&client::get(&sc.url(&path(*id))).await);
            assert_eq!(status, "HIT", "object {id} on a live master");
        }
        for id in &on_dead {
            let r = client::get(&sc.url(&path(*id))).await;
            assert_eq!(r.status.as_u16(), 200, "object {id}: passed through");
            assert_eq!(x_cache(&r), "DEGRADED", "object {id} on the dead master");
        }
    }
    let node = format!("127.0.0.1:{}", dead.port());
    let open = sc
        .metric(&format!(
            r#"sidecache_store_node_breaker_open{{node="{node}"}}"#
        ))
        .await;
    assert_eq!(open, Some(1.0), "the dead master's breaker");
    assert_eq!(sc.metric("sidecache_breaker_open").await, Some(1.0));

    dead.restart();
    for id in &on_dead {
        eventually(
            "cached again after the restart",
            Duration::from_secs(10),
            || async { x_cache(&client::get(&sc.url(&path(*id))).await) == "HIT" },
        )
        .await;
    }
    assert_eq!(sc.metric("sidecache_breaker_open").await, Some(0.0));
}

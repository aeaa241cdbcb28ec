//! The near cache on Redis Cluster through the real binary
//! (docs/operations.md#near-cache-on-redis-cluster): two instances with
//! `near_cache: { enabled: true }` on a 3-master cluster. A answers objects
//! cluster. A answers objects of every master from memory; an admin
//! invalidation through B reaches A by that master's push, and from then
//! on A answers the new data only (`max_age` is far longer than the test,
//! so only the push can end the old answer).

use crate::support::client;
use crate::support::redis::RedisCluster;
use crate::support::{app_routes, eventually, Origin, Reply, Sidecache, SidecacheBuilder};
use sidecache::keys;
use std::time::{Duration, Instant};

fn path(id: u64) -> String {
    format!("/api/tenants/acme/apps/{id}")
}

fn gen_key(id: u64) -> String {
    let id = id.to_string();
    keys::generation_key("sc:", &keys::identity("app", &["acme", id.as_str()]))
}

async fn near_hits(sc: &Sidecache) -> f64 {
    sc.metric_sum("sidecache_near_cache_total", &[("outcome", "hit")])
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_through_b_reaches_as_near_cache_on_every_master() {
    let cluster = RedisCluster::start(3);
    let origin = Origin::start().await;
    let seeds: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let store = format!(
        "store:\n  redis:\n    cluster: [{}]\n    command_timeout: 2s\n    near_cache: {{ enabled: true, max_age: 60s }}\n",
        seeds.join(", ")
    );
    let start = || {
        SidecacheBuilder::new(origin.url())
            .routes(&app_routes(""))
            .store(&store)
            .start()
    };
    let (a, b) = (start().await, start().await);

    // One object per master.
    let mut ids: Vec<u64> = Vec::new();
    for node in &cluster.nodes {
        let id = (1..1000)
            .find(|id| cluster.owner(&gen_key(*id)).port() == node.port())
            .expect("an object on every master");
        ids.push(id);
    }
    for &id in &ids {
        origin.reply(&path(id), Reply::ok(format!("{id} v1")));
        eventually("a near hit on A", Duration::from_secs(10), || async {
            let before = near_hits(&a).await;
            let r = client::get(&a.url(&path(id))).await;
            r.header("x-cache").as_deref() == Some("HIT") && near_hits(&a).await > before
        })
        .await;
    }

    for &id in &ids {
        origin.reply(&path(id), Reply::ok(format!("{id} v2")));
        let event = format!(r#"{{"route":"app","params":{{"tenant":"acme","id":"{id}"}}}}"#);
        let sent = Instant::now();
        let status = client::post(&b.admin_url("/admin/invalidate"), event)
            .await
            .status;
        assert_eq!(status, 200);
        loop {
            let body = client::get(&a.url(&path(id))).await.text();
            if body == format!("{id} v2") {
                break;
            }
            assert_eq!(body, format!("{id} v1"));
            assert!(
                sent.elapsed() < Duration::from_secs(2),
                "A still answers the old data of object {id} 2 s after B's invalidation"
            );
        }
        for _ in 0..20 {
            assert_eq!(
                client::get(&a.url(&path(id))).await.text(),
                format!("{id} v2"),
                "never the old answer again"
            );
        }
    }
}

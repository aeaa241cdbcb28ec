//! A Redis that answers but refuses writes (`maxmemory` reached with
//! `noeviction`, a read-only replica) must not stop hits: the breaker stays
//! closed, hits are served, misses go to the origin uncached, and caching
//! resumes once writes are accepted again.

use crate::support::client::x_cache;
use crate::support::redis::RedisServer;
use crate::support::{app_routes, client, eventually, Origin, SidecacheBuilder};
use std::time::Duration;

const HOT: &str = "/api/tenants/acme/apps/1";
const COLD: &str = "/api/tenants/acme/apps/2";

fn builder(redis: &RedisServer, origin: &Origin) -> SidecacheBuilder {
    SidecacheBuilder::new(origin.url())
        .routes(&app_routes(""))
        // Near cache off: every hit is a read from this Redis.
        .store(&format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n    near_cache: {{ enabled: false }}\n  breaker:\n    cooldown: 500ms\n",
            redis.url()
        ))
}

async fn refusals(
    redis: &RedisServer,
    refuse: &[&str],
    accept: &[&str],
    invalidation: Option<u16>,
) {
    let origin = Origin::start().await;
    let sc = builder(redis, &origin).start().await;
    client::get(&sc.url(HOT)).await;
    assert_eq!(x_cache(&client::get(&sc.url(HOT)).await), "HIT");

    redis.cli(refuse).expect("refuse writes");
    // Misses: answered by the origin, nothing cached, breaker closed.
    for _ in 0..3 {
        let r = client::get(&sc.url(COLD)).await;
        assert_eq!((r.status.as_u16(), x_cache(&r).as_str()), (200, "DEGRADED"));
    }
    assert_eq!(origin.hits(COLD), 3);
    // Hits go on: reads work on a store that refuses writes.
    for _ in 0..20 {
        assert_eq!(x_cache(&client::get(&sc.url(HOT)).await), "HIT");
    }
    assert_eq!(sc.metric_sum("sidecache_breaker_open", &[]).await, 0.0);
    assert_eq!(
        sc.metric_sum("sidecache_store_writes_refused", &[]).await,
        1.0
    );
    assert!(
        sc.metric_sum("sidecache_store_write_refusals_total", &[])
            .await
            >= 3.0
    );
    if let Some(expected) = invalidation {
        // An invalidation while writes are refused: applied (OOM) or
        // refused (read-only replica); a refused one is retried by its
        // source, the admin endpoint answers 503.
        let resp = client::post(
            &sc.admin_url("/admin/invalidate"),
            r#"{"route":"app","params":{"tenant":"acme","id":"1"}}"#,
        )
        .await;
        assert_eq!(resp.status, expected, "{}", resp.text());
        if expected == 200 {
            assert_eq!(x_cache(&client::get(&sc.url(HOT)).await), "DEGRADED");
        }
    }
    let log = sc.stderr_text();
    assert_eq!(
        log.matches("the store refuses writes").count(),
        1,
        "warned once:\n{log}"
    );

    redis.cli(accept).expect("accept writes");
    eventually("caching resumes", Duration::from_secs(5), || async {
        client::get(&sc.url(COLD)).await;
        x_cache(&client::get(&sc.url(COLD)).await) == "HIT"
    })
    .await;
    assert_eq!(
        sc.metric_sum("sidecache_store_writes_refused", &[]).await,
        0.0
    );
}

#[tokio::test]
async fn out_of_memory_redis_keeps_serving_hits() {
    let redis = RedisServer::start();
    redis
        .cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .expect("policy");
    refusals(
        &redis,
        &["CONFIG", "SET", "maxmemory", "1"],
        &["CONFIG", "SET", "maxmemory", "0"],
        Some(200),
    )
    .await;
}

#[tokio::test]
async fn read_only_redis_keeps_serving_hits() {
    let redis = RedisServer::start();
    refusals(
        &redis,
        // A replica of a master that does not answer: it keeps its data
        // and serves reads (replica-serve-stale-data), refuses writes.
        &["REPLICAOF", "127.0.0.1", "1"],
        &["REPLICAOF", "NO", "ONE"],
        Some(503),
    )
    .await;
}

//! Redis Sentinel with the near cache (docs/operations.md#redis-sentinel): the
//! tracked connection goes to the primary Sentinel names; a switch drops
//! everything read from the old primary and tracking follows to the new one.

use super::near_cache::publish_through;
use super::{binary_entry, eventually, keys, GEN_TTL};
use crate::support::redis::RedisServer;
use crate::support::sentinel::{Sentinels, MASTER};
use sidecache::config::{NearCacheConfig, RedisConfig, RedisTarget, SentinelTarget};
use sidecache::metrics::Metrics;
use sidecache::store::{FeedStore, ObjectStore, RedisStore};
use std::time::{Duration, Instant};

fn sentinel_store(
    sentinels: &Sentinels,
    near: bool,
    timeout: Duration,
    metrics: &Metrics,
) -> RedisStore {
    let cfg = RedisConfig {
        target: RedisTarget::Sentinel(SentinelTarget {
            master: MASTER.into(),
            nodes: sentinels.urls(),
            username: None,
            password: None,
            db: 0,
        }),
        command_timeout: timeout,
        near_cache: near.then_some(NearCacheConfig {
            max_bytes: 8 << 20,
            max_age: Duration::from_secs(30),
        }),
        tls: None,
        replicas_ack: None,
    };
    RedisStore::connect(&cfg, Duration::from_millis(100), metrics).expect("sentinel store")
}

/// Polls `check` (blocking the test, not the stores' tasks) for up to `within`.
async fn within(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A holds an object read from the primary. The primary is paused (the
/// sentinels' pings too) and Sentinel promotes the replica; B writes a new
/// generation there. A's tracked connection to the old primary is still
/// open and its heartbeat would only time out after A's command timeout
/// (longer than the test), so only the switch can drop the old copy: A
/// must not answer it once it follows the new primary. Then A tracks the
/// new primary: it keeps what it reads there and drops it on B's next
/// invalidation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_switch_drops_what_was_read_from_the_old_primary() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let sentinels = Sentinels::start(3, primary.port(), 1);
    let metrics = Metrics::new();
    let a = sentinel_store(&sentinels, true, Duration::from_secs(60), &metrics);
    let b = sentinel_store(
        &sentinels,
        false,
        Duration::from_millis(300),
        &Metrics::new(),
    );
    eventually("A tracks the primary", || async {
        metrics.near_cache_tracking.get() == 1
    })
    .await;
    let k = keys("near-sentinel");
    eventually("B follows the primary", || async {
        b.ticket(k.generation(), "n0", GEN_TTL).await.is_ok()
    })
    .await;
    let g1 = publish_through(&b, &k, binary_entry(1)).await;
    assert_eq!(a.read(&k).await.unwrap().generation, Some(g1.clone()));
    assert!(a.read_near(&k).is_some());
    within("the generation is replicated", Duration::from_secs(10), || {
        matches!(replica.cli(&["GET", k.generation()]), Ok(::redis::Value::BulkString(g)) if g == g1)
    })
    .await;

    primary.pause(30_000);
    within(
        "Sentinel promotes the replica",
        Duration::from_secs(30),
        || sentinels.primary_port() == Some(replica.port()),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let g2 = loop {
        match b.invalidate(k.generation(), "n2", GEN_TTL).await {
            Ok(g) => break g,
            Err(e) => assert!(Instant::now() < deadline, "B cannot write: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eventually("A drops what it read from the old primary", || async {
        a.read_near(&k).is_none()
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap().generation, Some(g2.clone()));

    eventually(
        "A tracks the new primary and keeps what it reads",
        || async {
            a.read(&k).await.unwrap();
            a.read_near(&k).and_then(|s| s.generation) == Some(g2.clone())
        },
    )
    .await;
    assert_eq!(metrics.near_cache_tracking.get(), 1);
    let g3 = b.invalidate(k.generation(), "n3", GEN_TTL).await.unwrap();
    eventually("the new primary's push drops it", || async {
        a.read_near(&k).is_none()
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap().generation, Some(g3));
}

//! Redis Cluster with the near cache
//! (docs/operations.md#near-cache-on-redis-cluster): one tracked connection per
//! master, reads that may fill go to the master owning the object's slot.
//! Another instance's writes reach the near cache on every master; a dead
//! master takes only its own objects out; a slot moved to another master leaves
//! no stale near hit.

use super::near_cache::publish_through;
use super::{binary_entry, eventually, keys, COOLDOWN, GEN_TTL};
use crate::support::redis::{RedisCluster, RedisServer};
use bytes::Bytes;
use sidecache::config::{NearCacheConfig, RedisConfig, RedisTarget};
use sidecache::keys::ObjectKeys;
use sidecache::metrics::Metrics;
use sidecache::store::{FeedStore, GuardedStore, ObjectStore, RedisStore, TagStore};
use std::sync::Arc;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(2);

fn cluster_config(cluster: &RedisCluster, near: bool) -> RedisConfig {
    RedisConfig {
        target: RedisTarget::Cluster(cluster.urls()),
        command_timeout: TIMEOUT,
        near_cache: near.then_some(NearCacheConfig {
            max_bytes: 8 << 20,
            max_age: Duration::from_secs(30),
        }),
        tls: None,
        replicas_ack: None,
    }
}

/// Instance A: near cache on, slot map and tracked connections refreshed
/// every `heartbeat`; returns once every master has its tracked connection.
async fn near_cluster_store(
    cluster: &RedisCluster,
    heartbeat: Duration,
    metrics: &Metrics,
) -> RedisStore {
    let store = RedisStore::connect(&cluster_config(cluster, true), heartbeat, metrics)
        .expect("cluster store");
    let masters = cluster.nodes.len() as i64;
    eventually("a tracked connection per master", || async {
        metrics.near_cache_tracking.get() == masters
    })
    .await;
    store
}

/// Instance B: no near cache.
fn plain_cluster_store(cluster: &RedisCluster) -> RedisStore {
    RedisStore::connect(
        &cluster_config(cluster, false),
        Duration::from_secs(1),
        &Metrics::new(),
    )
    .expect("cluster store")
}

/// One object per master, in the order of `cluster.nodes`.
fn one_per_master(cluster: &RedisCluster, prefix: &str) -> Vec<ObjectKeys> {
    let mut found: Vec<Option<ObjectKeys>> = vec![None; cluster.nodes.len()];
    for i in 0.. {
        let k = keys(&format!("{prefix}-{i}"));
        let port = cluster.owner(k.generation()).port();
        let at = cluster.nodes.iter().position(|n| n.port() == port);
        if let Some(slot) = at.and_then(|at| found.get_mut(at)) {
            slot.get_or_insert(k);
        }
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    found.into_iter().flatten().collect()
}

/// Clients with tracking on (`t` in `CLIENT LIST`'s flags) on `node`.
fn tracked_clients(node: &RedisServer) -> usize {
    let list: String =
        ::redis::FromRedisValue::from_redis_value(node.cli(&["CLIENT", "LIST"]).unwrap()).unwrap();
    list.lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| f.starts_with("flags=") && f.contains('t'))
        })
        .count()
}

/// A holds objects of all three masters, each read over the tracked
/// connection of its master (one per master, seen in `CLIENT LIST`); B's
/// invalidation and publish of each reach A by that master's push, and
/// A's next read gets (and keeps) the new answer. Tag generations on
/// different masters are held and dropped the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_master_pushes_what_another_instance_changes() {
    let cluster = RedisCluster::start(3);
    let metrics = Metrics::new();
    let a = near_cluster_store(&cluster, Duration::from_millis(100), &metrics).await;
    let b = plain_cluster_store(&cluster);
    for node in &cluster.nodes {
        assert_eq!(
            tracked_clients(node),
            1,
            "one tracked connection per master"
        );
    }
    let objects = one_per_master(&cluster, "near-cluster");
    for k in &objects {
        let g1 = publish_through(&b, k, binary_entry(1)).await;
        let read = a.read(k).await.unwrap();
        assert_eq!(read.generation.as_ref(), Some(&g1));
        assert_eq!(a.read_near(k), Some(read), "A keeps what it read");
    }
    for k in &objects {
        let g2 = b.invalidate(k.generation(), "n2", GEN_TTL).await.unwrap();
        eventually("A drops the object after B's invalidation", || async {
            a.read_near(k).is_none()
        })
        .await;
        assert_eq!(a.read(k).await.unwrap().generation, Some(g2.clone()));
        assert_eq!(
            a.read_near(k).and_then(|s| s.generation),
            Some(g2),
            "kept again"
        );
        publish_through(&b, k, binary_entry(2)).await;
        eventually("A drops the object after B's publish", || async {
            a.read_near(k).is_none()
        })
        .await;
        assert_eq!(a.read(k).await.unwrap().entry, Some(binary_entry(2)));
    }

    // Tag generations, one on each master.
    let tag_keys: Vec<String> = objects
        .iter()
        .map(|k| k.generation().replacen(":o:", ":t:", 1))
        .collect();
    let tickets = b.tag_tickets(&tag_keys, "n", GEN_TTL).await.unwrap();
    let refs: Vec<&str> = tag_keys.iter().map(String::as_str).collect();
    let read: Vec<Option<Bytes>> = a.read_tags(&refs).await.unwrap();
    assert_eq!(read, tickets.iter().cloned().map(Some).collect::<Vec<_>>());
    let stamped: Vec<(Bytes, Bytes)> = tag_keys
        .iter()
        .zip(&tickets)
        .map(|(k, t)| (Bytes::from(k.clone()), t.clone()))
        .collect();
    assert_eq!(a.tags_current_near(&stamped), Some(true), "all held near");
    for (i, key) in tag_keys.iter().enumerate() {
        b.invalidate(key, "t2", GEN_TTL).await.unwrap();
        eventually("A drops the tag after B's invalidation", || async {
            a.tags_current_near(&stamped[i..=i]).is_none()
        })
        .await;
    }
}

/// One of three masters is killed: its objects leave A's near cache at
/// once (its tracked connection is gone, so pushes may be lost) and a
/// guarded read of them fails (degraded, as on a single node), while the
/// other masters' objects are still answered from memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_takes_only_its_objects_out_of_the_near_cache() {
    let cluster = RedisCluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    let metrics = Metrics::new();
    let inner = near_cluster_store(&cluster, Duration::from_millis(100), &metrics).await;
    let store = GuardedStore::new(Arc::new(inner), Some(TIMEOUT), COOLDOWN, &metrics);
    let objects = one_per_master(&cluster, "near-dead");
    for k in &objects {
        publish_through(store.inner().as_ref(), k, binary_entry(1)).await;
        store.read(k).await.unwrap();
        assert!(store.inner().read_near(k).is_some());
    }
    let flushes = metrics.near_cache_flushes.get();

    cluster.nodes[0].kill();
    eventually("the dead master's objects leave the near cache", || async {
        store.inner().read_near(&objects[0]).is_none()
    })
    .await;
    for k in &objects[1..] {
        assert!(
            store.inner().read_near(k).is_some(),
            "the live masters' objects stay near"
        );
    }
    assert_eq!(metrics.near_cache_flushes.get(), flushes + 1);
    assert_eq!(metrics.near_cache_tracking.get(), 2);
    assert!(
        store.read(&objects[0]).await.is_err(),
        "degraded, not memory"
    );
    for k in &objects[1..] {
        assert!(store.read(k).await.unwrap().entry.is_some());
    }
}

/// An object's slot is moved to another master (MIGRATE, SETSLOT) while
/// A holds it; the moved keys' deletion on the old owner pushes it out.
/// A's slot map is not refreshed during the test (long heartbeat), so
/// A's reads still go to the old owner's tracked connection: its `MOVED`
/// sends them the cluster path, which answers the new generation B wrote
/// on the new owner and keeps nothing (the new owner does not track it
/// for A). C, whose slot map follows, tracks it on the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_slot_leaves_no_stale_near_hit() {
    let cluster = RedisCluster::start(3);
    let metrics = Metrics::new();
    let a = near_cluster_store(&cluster, Duration::from_secs(600), &metrics).await;
    // C refreshes its slot map every 100 ms.
    let c_metrics = Metrics::new();
    let c = near_cluster_store(&cluster, Duration::from_millis(100), &c_metrics).await;
    let b = plain_cluster_store(&cluster);
    let k = one_per_master(&cluster, "near-moved").remove(0);
    let g1 = publish_through(&b, &k, binary_entry(1)).await;
    assert_eq!(a.read(&k).await.unwrap().generation, Some(g1.clone()));
    assert!(a.read_near(&k).is_some());

    let slot = match cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", k.generation()]) {
        Ok(::redis::Value::Int(n)) => n.to_string(),
        other => panic!("KEYSLOT: {other:?}"),
    };
    cluster.move_slot(&slot, &cluster.nodes[0], &cluster.nodes[1]);
    assert_eq!(
        cluster.owner(k.generation()).port(),
        cluster.nodes[1].port()
    );
    eventually("the moved keys' push drops the object", || async {
        a.read_near(&k).is_none()
    })
    .await;

    for nonce in ["n2", "n3"] {
        let g = b.invalidate(k.generation(), nonce, GEN_TTL).await.unwrap();
        assert_eq!(a.read(&k).await.unwrap().generation, Some(g));
        assert_eq!(
            a.read_near(&k),
            None,
            "not kept: the new owner does not track it"
        );
    }

    // C follows the new slot map: it reads the object over the new
    // owner's tracked connection, keeps it, and the new owner's push for
    // B's next invalidation drops it.
    let g = b.invalidate(k.generation(), "n4", GEN_TTL).await.unwrap();
    eventually("C keeps the object read from its new owner", || async {
        c.read(&k).await.unwrap();
        c.read_near(&k).and_then(|s| s.generation) == Some(g.clone())
    })
    .await;
    let g = b.invalidate(k.generation(), "n5", GEN_TTL).await.unwrap();
    eventually("the new owner's push drops it", || async {
        c.read_near(&k).is_none()
    })
    .await;
    assert_eq!(c.read(&k).await.unwrap().generation, Some(g));
}

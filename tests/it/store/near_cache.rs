//! Redis-only: the near cache stays coherent with writes made by other
//! instances (pushes), FLUSHALL, expiry, a dead tracking connection, a dead
//! Redis, concurrent writers, and a server that refuses tracking.

use super::{
    binary_entry, eventually, keys, lease, near_connect, near_store, redis_store, COMMAND_TIMEOUT,
    COOLDOWN, ENTRY_TTL, GEN_TTL, LEASE,
};
use crate::support::redis::RedisServer;
use bytes::Bytes;
use sidecache::keys::ObjectKeys;
use sidecache::metrics::Metrics;
use sidecache::store::{FeedStore, GuardedStore, ObjectStore, PublishOutcome, Snapshot, Store};
use std::sync::Arc;
use std::time::Duration;

/// Publishes `entry` for `k` through `s` (ticket, lease, publish).
pub(super) async fn publish_through(s: &dyn Store, k: &ObjectKeys, entry: Bytes) -> Bytes {
    let (o, ticket) = lease(s, k, "o", LEASE).await.expect("free");
    let outcome = s.publish(k, &o, &ticket, entry, ENTRY_TTL).await.unwrap();
    assert_eq!(outcome, PublishOutcome::Published);
    s.unlock(k.lease(), &o).await.unwrap();
    ticket
}

/// Instance A keeps what it read in memory; instance B's invalidation and
/// B's publish of a new entry reach A through Redis's pushes, so A never
/// keeps serving what B replaced.
#[tokio::test]
async fn near_cache_drops_what_another_instance_changes() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let a = near_store(&server, &metrics).await;
    let b = redis_store(&server);
    let k = keys("near-other");
    let g1 = publish_through(&b, &k, binary_entry(1)).await;

    let read = a.read(&k).await.unwrap();
    assert_eq!(read.generation.as_ref(), Some(&g1));
    assert_eq!(a.read_near(&k), Some(read), "A keeps what it read");
    let hits = metrics.near_cache.with_label_values(&["hit"]).get();
    assert!(hits >= 1);

    // B invalidates: A's copy goes away, A then reads the new generation.
    let g2 = b.invalidate(k.generation(), "n2", GEN_TTL).await.unwrap();
    eventually("A drops the object after B's invalidation", || async {
        a.read_near(&k).is_none()
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap().generation, Some(g2.clone()));

    // B publishes under the new generation: A's copy (old entry, stamped
    // with g1 but read together with g2) goes away as well.
    let _ = a.read(&k).await.unwrap();
    assert!(a.read_near(&k).is_some());
    publish_through(&b, &k, binary_entry(2)).await;
    eventually("A drops the object after B's publish", || async {
        a.read_near(&k).is_none()
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap().entry, Some(binary_entry(2)));
    assert!(metrics.near_cache_invalidations.get() >= 2);
}

/// FLUSHALL (nil invalidation push) and an expired key empty the near cache.
#[tokio::test]
async fn near_cache_follows_flushall_and_expiry() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let a = near_store(&server, &metrics).await;
    let k = keys("near-flush");
    publish_through(&a, &k, binary_entry(1)).await;
    a.read(&k).await.unwrap();
    assert!(a.read_near(&k).is_some());
    server.cli(&["FLUSHALL"]).unwrap();
    eventually("FLUSHALL empties the near cache", || async {
        a.read_near(&k).is_none()
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap(), Snapshot::default());

    let (o2, ticket) = lease(&a, &k, "o2", LEASE).await.expect("free");
    // Long enough that the read below still finds it on a loaded machine,
    // short enough for the expiry wait.
    let short = Duration::from_secs(2);
    a.publish(&k, &o2, &ticket, binary_entry(3), short)
        .await
        .unwrap();
    assert_eq!(a.read(&k).await.unwrap().entry, Some(binary_entry(3)));
    // The invalidation push of our own publish (the key was tracked by the
    // read of the empty store above) may land after that read and drop the
    // copy it cached; a read after the push caches it for good.
    eventually("the published entry is cached near", || async {
        a.read(&k).await.unwrap();
        a.read_near(&k).is_some()
    })
    .await;
    eventually("the expired entry leaves the near cache", || async {
        a.read(&k).await.unwrap().entry.is_none()
    })
    .await;
}

/// The tracked connection is killed: everything read over it is dropped
/// (pushes may have been lost), a new tracked connection comes up, and
/// invalidations reach the cache again.
#[tokio::test]
async fn near_cache_is_emptied_when_its_connection_dies() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let a = near_store(&server, &metrics).await;
    let b = redis_store(&server);
    let k = keys("near-kill");
    publish_through(&b, &k, binary_entry(1)).await;
    a.read(&k).await.unwrap();
    assert!(a.read_near(&k).is_some());
    let flushes = metrics.near_cache_flushes.get();

    // `t` in CLIENT LIST's flags marks the tracking connection.
    let list: String =
        ::redis::FromRedisValue::from_redis_value(server.cli(&["CLIENT", "LIST"]).unwrap())
            .unwrap();
    let tracked: Vec<&str> = list
        .lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| f.starts_with("flags=") && f.contains('t'))
        })
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .collect();
    assert_eq!(tracked.len(), 1, "one tracked connection: {list}");
    server.cli(&["CLIENT", "KILL", "ID", tracked[0]]).unwrap();

    eventually("the near cache is emptied", || async {
        metrics.near_cache_flushes.get() > flushes && a.read_near(&k).is_none()
    })
    .await;
    eventually("a new tracked connection", || async {
        metrics.near_cache_tracking.get() == 1
    })
    .await;
    a.read(&k).await.unwrap();
    assert!(
        a.read_near(&k).is_some(),
        "kept again over the new connection"
    );
    let g2 = b.invalidate(k.generation(), "n2", GEN_TTL).await.unwrap();
    eventually("invalidations arrive over the new connection", || async {
        a.read_near(&k).is_none()
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap().generation, Some(g2));
}

/// Killing Redis empties the near cache at once, so a guarded read fails
/// (the pipeline then serves degraded) instead of answering from memory
/// with nothing to keep that memory coherent.
#[tokio::test]
async fn near_cache_does_not_outlive_redis() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let inner = near_connect(&server, COMMAND_TIMEOUT, &metrics);
    let store = GuardedStore::new(Arc::new(inner), Some(COMMAND_TIMEOUT), COOLDOWN, &metrics);
    eventually("near cache tracking", || async {
        metrics.near_cache_tracking.get() == 1
    })
    .await;
    let k = keys("near-down");
    publish_through(store.inner().as_ref(), &k, binary_entry(1)).await;
    store.read(&k).await.unwrap();
    assert!(store.inner().read_near(&k).is_some());

    server.kill();
    eventually("the near cache is emptied", || async {
        store.inner().read_near(&k).is_none()
    })
    .await;
    assert!(store.read(&k).await.is_err());
    assert_eq!(metrics.near_cache_tracking.get(), 0);
}

/// Load: readers on instance A race a writer on instance B that keeps
/// replacing the object (new generation, new entry). Whatever interleaving
/// happened, once the writer stops A's memory holds the last version or
/// nothing, never an older one: a reply overtaken by its push is not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_cache_converges_under_concurrent_writes() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let a = Arc::new(near_store(&server, &metrics).await);
    let b = redis_store(&server);
    let k = Arc::new(keys("near-race"));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (a, k, stop) = (a.clone(), k.clone(), stop.clone());
            tokio::spawn(async move {
                let mut reads = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    a.read(&k).await.unwrap();
                    reads += 1;
                    // A memory hit never waits: let the connections run.
                    tokio::task::yield_now().await;
                }
                reads
            })
        })
        .collect();
    let mut last = Bytes::new();
    for i in 0..300u32 {
        b.invalidate(k.generation(), &format!("n{i}"), GEN_TTL)
            .await
            .unwrap();
        last = Bytes::from(format!("version {i}"));
        publish_through(&b, &k, last.clone()).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut reads = 0;
    for r in readers {
        reads += r.await.unwrap();
    }
    assert!(reads > 300, "readers kept up: {reads} reads");
    assert!(metrics.near_cache_invalidations.get() > 0);
    eventually("A's memory holds the last version or nothing", || async {
        match a.read_near(&k) {
            None => true,
            Some(s) => s.entry.as_ref() == Some(&last),
        }
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap().entry, Some(last));
}

/// Without permission for `CLIENT TRACKING` (the same holds for a server
/// without RESP3) no tracked connection comes up: nothing is kept in
/// memory and every read goes to Redis.
#[tokio::test]
async fn near_cache_falls_back_to_redis_reads_when_tracking_is_refused() {
    let server = RedisServer::start();
    server
        .cli(&["ACL", "SETUSER", "default", "-client|tracking"])
        .unwrap();
    let metrics = Metrics::new();
    let a = near_connect(&server, Duration::from_secs(2), &metrics);
    eventually("the refused CLIENT TRACKING in the ACL log", || async {
        let log = server.cli(&["ACL", "LOG"]).unwrap();
        format!("{log:?}").contains("tracking")
    })
    .await;
    let k = keys("near-refused");
    publish_through(&a, &k, binary_entry(1)).await;
    for _ in 0..3 {
        assert_eq!(a.read(&k).await.unwrap().entry, Some(binary_entry(1)));
    }
    assert_eq!(a.read_near(&k), None);
    assert_eq!(metrics.near_cache_tracking.get(), 0);
    assert_eq!(metrics.near_cache.with_label_values(&["hit"]).get(), 0);
}

//! Redis Cluster: the same protocol, with the keys of one object in one
//! slot.

use super::{eventually, keys, whole_suite, COMMAND_TIMEOUT};
use crate::support::redis::RedisCluster;
use sidecache::config::{RedisConfig, RedisTarget};
use sidecache::metrics::Metrics;
use sidecache::store::redis::RedisStore;
use sidecache::store::Store;
use std::time::Duration;
use tokio::time::Instant;

fn cluster_store(cluster: &RedisCluster, command_timeout: Duration) -> RedisStore {
    let cfg = RedisConfig {
        target: RedisTarget::Cluster(cluster.urls()),
        command_timeout,
        near_cache: None,
        tls: None,
        replicas_ack: None,
    };
    RedisStore::connect(&cfg, Duration::from_secs(1), &Metrics::new()).expect("cluster store")
}

/// The whole suite on a 3-master cluster (MGET and the scripts only work if
/// each object's keys share a slot), again after the script caches of all
/// nodes are flushed, and a paused cluster answers within the command
/// timeout (the cluster client has none unless configured).
#[tokio::test]
async fn cluster_runs_the_suite_survives_script_flush_and_times_out() {
    let cluster = RedisCluster::start(3);
    let store = cluster_store(&cluster, COMMAND_TIMEOUT);
    assert_eq!(store.kind(), "redis-cluster");
    whole_suite(&store).await;

    cluster.cli_all(&["SCRIPT", "FLUSH"]);
    cluster.cli_all(&["FLUSHALL"]);
    whole_suite(&store).await;

    for node in &cluster.nodes {
        node.pause(1500);
    }
    let started = Instant::now();
    let result = store.read(&keys("cluster-paused")).await;
    let took = started.elapsed();
    assert!(result.is_err(), "{result:?}");
    assert!(
        took < 2 * COMMAND_TIMEOUT,
        "raw cluster call while paused took {took:?}"
    );
    eventually("cluster answers after the pause", || async {
        store.read(&keys("cluster-paused")).await.is_ok()
    })
    .await;
}

//! Redis Stream invalidation on a Redis Cluster
//! (docs/invalidation.md#redis-stream): the consumer (group path and fan-out)
//! reads the stream from the master of its slot over connections of its own,
//! and applies entries whose objects live on every master through the cluster
//! store.

use crate::support::redis::{RedisCluster, RedisServer};
use crate::support::{eventually, library_config_on, Background};
use sidecache::invalidation::{spawn_sources, Source};
use sidecache::keys;
use std::collections::HashSet;
use std::time::Duration;

/// A hash tag: the dead-letter stream `{sc}:inv:dead` shares the slot.
const STREAM: &str = "{sc}:inv";
const GROUP: &str = "sidecache";

fn gen_key(id: u64) -> String {
    let id = id.to_string();
    keys::generation_key("sc:", &keys::identity("app", &["t", id.as_str()]))
}

fn value(node: &RedisServer, key: &str) -> Option<Vec<u8>> {
    node.get_bytes(key)
}

fn pending(node: &RedisServer) -> i64 {
    node.xpending(STREAM, GROUP)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_invalidates_objects_on_every_master() {
    let cluster = RedisCluster::start(3);
    let stream_node = cluster.owner(STREAM);
    // The stream's master last: a consumer that just used the first seed
    // would be answered `MOVED`.
    let mut seeds: Vec<String> = cluster.urls();
    seeds.sort_by_key(|u| u.ends_with(&format!(":{}", stream_node.port())));
    let seeds: Vec<String> = seeds.iter().map(|u| format!("\"{u}\"")).collect();
    let cfg = library_config_on(
        &format!("cluster: [{}]", seeds.join(", ")),
        &format!(
            r#"redis_stream: {{ stream: "{STREAM}", group: {GROUP}, start: earliest, claim_idle: 30s }}"#
        ),
    );

    // Objects on all three masters, each with a generation from before.
    const N: u64 = 30;
    let mut masters = HashSet::new();
    for id in 1..=N {
        let node = cluster.owner(&gen_key(id));
        masters.insert(node.port());
        node.cli(&["SET", &gen_key(id), "before"]).expect("SET");
    }
    assert_eq!(masters.len(), 3, "objects on every master");

    let consumer = Background::start(cfg, Source::Stream, |cfg, invalidator, stopped| {
        let tasks = spawn_sources(cfg, &invalidator, &stopped);
        assert_eq!(tasks.len(), 1, "the stream consumer runs on a cluster");
        tokio::spawn(async move {
            for task in tasks {
                let _ = task.await;
            }
        })
    })
    .await;
    for id in 1..=N {
        let params = format!(r#"{{"tenant":"t","id":{id}}}"#);
        stream_node
            .cli(&["XADD", STREAM, "*", "route", "app", "params", &params])
            .expect("XADD");
    }
    eventually(
        "every object's generation replaced and every entry acked",
        Duration::from_secs(15),
        || async {
            (1..=N).all(|id| {
                let key = gen_key(id);
                value(cluster.owner(&key), &key).is_some_and(|v| v != b"before")
            }) && pending(stream_node) == 0
        },
    )
    .await;
    consumer.stop().await;
}

/// The stream's slot is resharded to another master while the consumer
/// runs: its sessions end on `MOVED` and resume on the new master, so
/// entries appended there are applied and acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_follows_the_stream_to_another_master() {
    let cluster = RedisCluster::start(3);
    let seeds: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let cfg = library_config_on(
        &format!("cluster: [{}]", seeds.join(", ")),
        &format!(
            r#"redis_stream: {{ stream: "{STREAM}", group: {GROUP}, start: earliest, claim_idle: 30s }}"#
        ),
    );
    let consumer = Background::start(cfg, Source::Stream, |cfg, invalidator, stopped| {
        let tasks = spawn_sources(cfg, &invalidator, &stopped);
        tokio::spawn(async move {
            for task in tasks {
                let _ = task.await;
            }
        })
    })
    .await;
    let add = |node: &RedisServer, ids: std::ops::RangeInclusive<u64>| {
        for id in ids {
            let key = gen_key(id);
            cluster
                .owner(&key)
                .cli(&["SET", &key, "before"])
                .expect("SET");
            let params = format!(r#"{{"tenant":"t","id":{id}}}"#);
            node.cli(&["XADD", STREAM, "*", "route", "app", "params", &params])
                .expect("XADD");
        }
    };
    let applied = |node: &RedisServer, ids: std::ops::RangeInclusive<u64>| {
        ids.clone().all(|id| {
            let key = gen_key(id);
            value(cluster.owner(&key), &key).is_some_and(|v| v != b"before")
        }) && pending(node) == 0
    };

    let before = cluster.owner(STREAM);
    add(before, 1..=10);
    eventually(
        "the first batch applied",
        Duration::from_secs(15),
        || async { applied(before, 1..=10) },
    )
    .await;

    let slot = match before.cli(&["CLUSTER", "KEYSLOT", STREAM]) {
        Ok(redis::Value::Int(n)) => n.to_string(),
        other => panic!("KEYSLOT: {other:?}"),
    };
    let after = cluster
        .nodes
        .iter()
        .find(|n| n.port() != before.port())
        .expect("another master");
    cluster.move_slot(&slot, before, after);
    assert_eq!(cluster.owner(STREAM).port(), after.port(), "slot moved");

    add(after, 11..=20);
    eventually(
        "entries appended on the new master applied and acked",
        Duration::from_secs(15),
        || async { applied(after, 11..=20) },
    )
    .await;
    consumer.stop().await;
}

//! Redis Cluster: the same protocol, with the keys of one object in one
//! slot.

use super::{eventually, keys, whole_suite, COMMAND_TIMEOUT, COOLDOWN, ENTRY_TTL, GEN_TTL, LEASE};
use crate::support::redis::RedisCluster;
use bytes::Bytes;
use sidecache::config::{RedisConfig, RedisTarget};
use sidecache::keys::ObjectKeys;
use sidecache::metrics::Metrics;
use sidecache::store::{GuardedStore, LeaseReply, ObjectStore, PublishOutcome, RedisStore, Store};
use std::sync::Arc;
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

/// A guarded store on `cluster`, once it knows the master of every key in
/// `routed`. Its call timeout is generous: a killed master refuses
/// connections at once, so only a live master's call could take long, on a
/// loaded machine.
async fn guarded_cluster_store<'k>(
    cluster: &RedisCluster,
    metrics: &Metrics,
    routed: impl Iterator<Item = &'k str>,
) -> GuardedStore {
    let timeout = Duration::from_secs(2);
    let store = GuardedStore::new(
        Arc::new(cluster_store(cluster, timeout)),
        Some(timeout),
        COOLDOWN,
        metrics,
    );
    let routed: Vec<&str> = routed.collect();
    eventually("the slot table is known", || async {
        routed.iter().all(|k| store.node_of(k).is_some())
    })
    .await;
    store
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

/// Per-master breakers (docs/operations.md#redis-cluster): one of three masters
/// is killed. Keys on the other two are still read (the entries published
/// before are there), also after the cluster marked the dead master failed
/// (node timeout 2 s; `cluster-require-full-coverage no`, else Redis itself
/// refuses every key); keys on the dead one fail and open only its breaker; a
/// tag check that needs the dead master fails instead of showing the tag
/// current (docs/architecture.md#the-serving-rule); after a restart its keys
/// are served again and every breaker closes.
#[tokio::test]
async fn a_dead_master_degrades_only_its_own_slots() {
    let cluster = RedisCluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    let metrics = Metrics::new();
    let objects: Vec<ObjectKeys> = (0..30).map(|i| keys(&format!("spread-{i}"))).collect();
    let tags: Vec<String> = (0..30).map(|i| format!("sc:t:{{tag-{i}}}:g")).collect();
    let routed = objects
        .iter()
        .map(|k| k.generation())
        .chain(tags.iter().map(String::as_str));
    let store = guarded_cluster_store(&cluster, &metrics, routed).await;
    for k in &objects {
        let LeaseReply::Won { value, ticket, .. } = store
            .take_lease(k, "owner", "n", LEASE, GEN_TTL)
            .await
            .expect("lease")
        else {
            panic!("lease held");
        };
        let published = store
            .publish(k, &value, &ticket, Bytes::from_static(b"body"), ENTRY_TTL)
            .await;
        assert_eq!(published.expect("publish"), PublishOutcome::Published);
    }
    let tag_gens = store
        .tag_tickets(&tags, "n", GEN_TTL)
        .await
        .expect("tag tickets");

    let dead = format!("127.0.0.1:{}", cluster.nodes[0].port());
    let on = |k: &str| store.node_of(k).expect("routed");
    let (on_dead, on_live): (Vec<&ObjectKeys>, Vec<&ObjectKeys>) =
        objects.iter().partition(|k| on(k.generation()) == dead);
    let live_nodes: std::collections::HashSet<String> =
        on_live.iter().map(|k| on(k.generation())).collect();
    assert!(!on_dead.is_empty(), "no object on the master to kill");
    assert_eq!(live_nodes.len(), 2, "objects on both other masters");
    let dead_tag = tags
        .iter()
        .position(|t| on(t) == dead)
        .expect("a tag on it");
    let live_tag = tags
        .iter()
        .position(|t| on(t) != dead)
        .expect("a tag elsewhere");
    let stamped = |i: usize| (Bytes::from(tags[i].clone()), tag_gens[i].clone());

    cluster.nodes[0].kill();
    // Past the node timeout, so the survivors have marked it failed.
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        for k in &on_live {
            let read = store.read(k).await;
            let entry = read.unwrap_or_else(|e| panic!("{} on a live master: {e}", k.entry()));
            assert_eq!(entry.entry.as_deref(), Some(&b"body"[..]), "{}", k.entry());
        }
        for k in &on_dead {
            assert!(
                store.read(k).await.is_err(),
                "{} on the dead master",
                k.entry()
            );
        }
        assert!(store
            .tags_current(&[stamped(live_tag)])
            .await
            .expect("live tag"));
        let both = store
            .tags_current(&[stamped(live_tag), stamped(dead_tag)])
            .await;
        assert!(
            both.is_err(),
            "a tag on the dead master shown current: {both:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(store.breaker_is_open_for(on_dead[0].generation()));
    assert!(!store.breaker_is_open_for(on_live[0].generation()));
    let node_gauge = |node: &str| metrics.node_breaker_open.with_label_values(&[node]).get();
    assert_eq!(node_gauge(&dead), 1);
    for node in &live_nodes {
        assert_eq!(node_gauge(node), 0, "{node}");
    }
    assert_eq!(metrics.breaker_open.get(), 1, "one breaker open");

    cluster.nodes[0].restart();
    eventually("the restarted master's keys are read again", || async {
        let mut all = true;
        for k in &on_dead {
            all &= store.read(k).await.is_ok();
        }
        all
    })
    .await;
    assert_eq!(node_gauge(&dead), 0);
    assert_eq!(metrics.breaker_open.get(), 0);
}

/// A master whose script cache is empty (restarted, or a promoted replica)
/// runs the scripts while another master hangs: `NOSCRIPT` is answered
/// with `EVAL` on that master, not with redis-rs's `SCRIPT LOAD` on every
/// master, which waits for the hung one and fails. (A master that is dead
/// and whose connection redis-rs has dropped is skipped by its fan-out; a
/// hung one, or one it is reconnecting to, is not.) A single call and the
/// pipelined batch both.
#[tokio::test]
async fn scripts_reload_on_their_own_master_while_another_hangs() {
    let cluster = RedisCluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    let metrics = Metrics::new();
    let objects: Vec<ObjectKeys> = (0..30).map(|i| keys(&format!("noscript-{i}"))).collect();
    let routed = objects.iter().map(|k| k.generation());
    let store = guarded_cluster_store(&cluster, &metrics, routed).await;
    let flushed = format!("127.0.0.1:{}", cluster.nodes[1].port());
    let mine: Vec<&ObjectKeys> = objects
        .iter()
        .filter(|k| store.node_of(k.generation()).as_deref() == Some(flushed.as_str()))
        .collect();
    assert!(!mine.is_empty(), "no object on the flushed master");
    let mut before = Vec::new();
    for k in &mine {
        before.push(
            store
                .ticket(k.generation(), "n", GEN_TTL)
                .await
                .expect("ticket"),
        );
    }
    cluster.nodes[1].cli(&["SCRIPT", "FLUSH"]).expect("flush");
    cluster.nodes[0].stop();

    let again = store
        .ticket(mine[0].generation(), "n2", GEN_TTL)
        .await
        .expect("a script after SCRIPT FLUSH, with another master hung");
    assert_eq!(again, before[0]);
    cluster.nodes[1].cli(&["SCRIPT", "FLUSH"]).expect("flush");
    let gen_keys: Vec<String> = mine.iter().map(|k| k.generation().to_owned()).collect();
    store
        .invalidate_many(&gen_keys, "m", GEN_TTL)
        .await
        .expect("the batch after SCRIPT FLUSH, with another master hung");
    for (k, old) in mine.iter().zip(&before) {
        let now = store
            .ticket(k.generation(), "n3", GEN_TTL)
            .await
            .expect("ticket");
        assert_ne!(&now, old, "{} not invalidated", k.generation());
    }
    cluster.nodes[0].resume();
}

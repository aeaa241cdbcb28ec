//! Redis-only: a restart, `SCRIPT FLUSH` or a failover empties the script
//! cache; every script, and the pipelined batch, must reload itself.

use super::{binary_entry, keys, lease, redis_store, ENTRY_TTL, GEN_TTL, LEASE};
use crate::support::redis::RedisServer;
use sidecache::store::{FeedStore, ObjectStore, PublishOutcome};

/// A Redis restart (or `SCRIPT FLUSH`, or a failover) empties the script
/// cache: EVALSHA answers NOSCRIPT and every script must reload itself.
#[tokio::test]
async fn scripts_survive_script_flush() {
    let server = RedisServer::start();
    let s = redis_store(&server);
    let k = keys("flush");
    let ticket = s.ticket(k.generation(), "n", GEN_TTL).await.unwrap();
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    let (o, lease_ticket) = lease(&s, &k, "o", LEASE).await.expect("free");
    assert_eq!(lease_ticket, ticket);

    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    assert_eq!(
        s.ticket(k.generation(), "n2", GEN_TTL).await.unwrap(),
        ticket
    );
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    let outcome = s
        .publish(&k, &o, &ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::Published);
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    assert!(s.unlock(k.lease(), &o).await.unwrap());
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    assert!(s
        .delete_if_equals(k.entry(), &binary_entry(1))
        .await
        .unwrap());
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    assert_ne!(
        s.invalidate(k.generation(), "n3", GEN_TTL).await.unwrap(),
        ticket
    );
}

/// The pipelined batch cannot fall back per command: after `SCRIPT FLUSH` it
/// loads the script and resends, and every key ends up replaced.
#[tokio::test]
async fn invalidate_many_survives_script_flush() {
    let server = RedisServer::start();
    let s = redis_store(&server);
    let gen_keys: Vec<String> = (0..10)
        .map(|i| keys(&format!("mf{i}")).generation().to_owned())
        .collect();
    let mut before = Vec::new();
    for k in &gen_keys {
        before.push(s.ticket(k, "n", GEN_TTL).await.unwrap());
    }
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    s.invalidate_many(&gen_keys, "m", GEN_TTL).await.unwrap();
    for (i, k) in gen_keys.iter().enumerate() {
        assert_ne!(s.ticket(k, "n", GEN_TTL).await.unwrap(), before[i]);
    }
}

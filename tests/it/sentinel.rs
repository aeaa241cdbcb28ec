//! Redis Sentinel (docs/operations.md#redis-sentinel): sidecache follows the
//! primary Sentinel names. A primary, its replica and three sentinels; the
//! primary is killed; sidecache serves DEGRADED until the promotion, then HITs
//! from the promoted replica without a restart. The test measures the time from
//! the kill to the promotion and to the first HIT. The same over mutual TLS
//! (sentinels, primary and replica TLS-only and requiring client
//! certificates: nothing to fall back to), and with a CA that did not sign
//! the servers' certificates.

use crate::support::certs::{Certs, NAMED};
use crate::support::client::{self, x_cache};
use crate::support::redis::RedisServer;
use crate::support::sentinel::{Sentinels, MASTER};
use crate::support::{app_routes, eventually, Origin, Sidecache, SidecacheBuilder};
use std::time::{Duration, Instant};

const P: &str = "/api/tenants/acme/apps/1";
const COOLDOWN: Duration = Duration::from_millis(500);

/// The `store:` section on `sentinels`, with `extra` lines under `redis:`.
fn store(sentinels: &Sentinels, extra: &str) -> String {
    let nodes: Vec<String> = sentinels
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect();
    format!(
        "store:\n  redis:\n    sentinel:\n      master: {MASTER}\n      nodes: [{}]\n    command_timeout: 300ms\n{extra}  breaker:\n    cooldown: 500ms\n",
        nodes.join(", ")
    )
}

/// `store.redis.tls` with `ca` as the CA bundle and the client certificate.
fn tls(certs: &Certs, ca: &str) -> String {
    format!(
        "    tls:\n      ca_file: \"{}\"\n      cert_file: \"{}\"\n      key_file: \"{}\"\n",
        certs.cert(ca).display(),
        certs.cert("client").display(),
        certs.key("client").display()
    )
}

async fn start(origin: &Origin, store: &str) -> Sidecache {
    SidecacheBuilder::new(origin.url())
        .routes(&app_routes(""))
        .store(store)
        .start()
        .await
}

/// HIT through the primary, kill it, HIT again through the promoted replica.
/// Returns sidecache, still running on the promoted replica.
async fn follows_a_failover(
    primary: RedisServer,
    replica: &RedisServer,
    sentinels: &Sentinels,
    tls: &str,
) -> Sidecache {
    let origin = Origin::start().await;
    let sc = start(&origin, &store(sentinels, tls)).await;
    eventually(
        "a HIT through the primary",
        Duration::from_secs(10),
        || async {
            client::get(&sc.url(P)).await;
            x_cache(&client::get(&sc.url(P)).await) == "HIT"
        },
    )
    .await;
    // The entry reached the replica before the primary dies.
    eventually(
        "the entry is replicated",
        Duration::from_secs(10),
        || async { matches!(replica.cli(&["DBSIZE"]), Ok(redis::Value::Int(n)) if n >= 2) },
    )
    .await;

    let killed = Instant::now();
    primary.kill();
    let mut promoted = None;
    let deadline = killed + Duration::from_secs(30);
    let hit = loop {
        assert!(Instant::now() < deadline, "no HIT within 30 s of the kill");
        if promoted.is_none() && sentinels.primary_port() == Some(replica.port()) {
            promoted = Some(killed.elapsed());
        }
        let status = x_cache(&client::get(&sc.url(P)).await);
        if status == "HIT" {
            break killed.elapsed();
        }
        assert!(
            ["DEGRADED", "MISS"].contains(&status.as_str()),
            "unexpected X-Cache {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let promoted = promoted.unwrap_or(hit);
    eprintln!("sentinel failover: promoted after {promoted:?}, first HIT after {hit:?}");
    assert!(
        sentinels.primary_port() == Some(replica.port()),
        "the HIT came from the promoted replica"
    );
    // Follows within the breaker cooldown and a heartbeat or two.
    assert!(
        hit.saturating_sub(promoted) < COOLDOWN + Duration::from_secs(2),
        "promoted after {promoted:?} but first HIT only after {hit:?}"
    );
    sc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_and_hits_again() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let sentinels = Sentinels::start(3, primary.port(), 1);
    follows_a_failover(primary, &replica, &sentinels, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_over_tls() {
    let certs = Certs::generate();
    let primary = RedisServer::start_tls(&certs, "server", true);
    let replica = RedisServer::start_tls_replica_of(&primary, &certs, "server");
    let sentinels = Sentinels::start_tls(3, primary.port(), 1, &certs);
    follows_a_failover(primary, &replica, &sentinels, &tls(&certs, "ca")).await;
}

/// The primary's and replica's certificates name only [`NAMED`]; the
/// sentinels announce 127.0.0.1: `store.redis.tls.server_name` is what
/// both are verified against, before and after the failover, by the
/// store's connections and by the near cache's tracked one, which
/// follows the switch to the promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_with_a_server_name() {
    let certs = Certs::generate();
    let primary = RedisServer::start_tls(&certs, "named", true);
    let replica = RedisServer::start_tls_replica_of(&primary, &certs, "named");
    let sentinels = Sentinels::start_tls(3, primary.port(), 1, &certs);
    let tls = format!(
        "{}      server_name: {NAMED}\n    near_cache: {{ enabled: true }}\n",
        tls(&certs, "ca")
    );
    let sc = follows_a_failover(primary, &replica, &sentinels, &tls).await;
    crate::tls::near_hit_over_tls(&sc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_ca_degrades_and_names_ca_file() {
    let certs = Certs::generate();
    let primary = RedisServer::start_tls(&certs, "server", false);
    let sentinels = Sentinels::start_tls(3, primary.port(), 0, &certs);
    let origin = Origin::start().await;
    let sc = start(&origin, &store(&sentinels, &tls(&certs, "other-ca"))).await;
    for _ in 0..3 {
        let resp = client::get(&sc.url(P)).await;
        assert_eq!(resp.status, 200);
        assert_eq!(x_cache(&resp), "DEGRADED", "no cache without a proven peer");
    }
    assert_eq!(origin.hits(P), 3);
    eventually(
        "the log names store.redis.tls.ca_file",
        Duration::from_secs(10),
        || async {
            let log = sc.stderr_text();
            log.contains("store.redis.tls.ca_file") && log.contains("UnknownIssuer")
        },
    )
    .await;
    assert_eq!(
        primary.cli(&["DBSIZE"]).ok(),
        Some(redis::Value::Int(0)),
        "nothing reached the primary"
    );
}

mod stream {
    //! Redis Stream invalidation on Sentinel: the consumer group continues
    //! on the promoted replica. An entry pending in another consumer (a dead
    //! instance) when the primary dies was replicated with the group, and is
    //! claimed (and acknowledged) on the new primary; an entry appended
    //! after the promotion is applied.

    use crate::support::redis::RedisServer;
    use crate::support::sentinel::{Sentinels, MASTER};
    use crate::support::{eventually, library_config_on, Background};
    use sidecache::invalidation::{spawn_sources, Source};
    use sidecache::keys;
    use std::time::Duration;

    const STREAM: &str = "sc:inv";
    const GROUP: &str = "sidecache";

    fn gen(id: u32) -> String {
        keys::generation_key("sc:", &keys::identity("app", &["t", &id.to_string()]))
    }

    fn get(node: &RedisServer, key: &str) -> Option<Vec<u8>> {
        node.get_bytes(key)
    }

    fn pending(node: &RedisServer) -> i64 {
        node.xpending(STREAM, GROUP)
    }

    /// Entries pending in the consumer `ghost`.
    fn ghost_pending(node: &RedisServer) -> usize {
        match node.cli(&["XPENDING", STREAM, GROUP, "-", "+", "10", "ghost"]) {
            Ok(redis::Value::Array(items)) => items.len(),
            other => panic!("XPENDING ghost: {other:?}"),
        }
    }

    fn xadd(node: &RedisServer, id: u32) {
        let params = format!(r#"{{"tenant":"t","id":{id}}}"#);
        node.cli(&["XADD", STREAM, "*", "route", "app", "params", &params])
            .expect("XADD");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_consumer_group_continues_on_the_promoted_replica() {
        let primary = RedisServer::start();
        let replica = RedisServer::start_replica_of(&primary);
        let sentinels = Sentinels::start(3, primary.port(), 1);
        let nodes: Vec<String> = sentinels
            .urls()
            .iter()
            .map(|u| format!("\"{u}\""))
            .collect();
        for id in 1..=3 {
            primary.cli(&["SET", &gen(id), "before"]).expect("SET");
        }
        // Claims after 10 s idle: the entry pending in `ghost` below is
        // still its after the promotion (checked below).
        let cfg = library_config_on(
            &format!(
                "sentinel: {{ master: {MASTER}, nodes: [{}] }}",
                nodes.join(", ")
            ),
            &format!(
                r#"redis_stream: {{ stream: "{STREAM}", group: {GROUP}, start: earliest, claim_idle: 10s }}"#
            ),
        );
        let consumer = Background::start(cfg, Source::Stream, |cfg, invalidator, stopped| {
            let tasks = spawn_sources(cfg, &invalidator, &stopped);
            assert_eq!(tasks.len(), 1, "the stream consumer runs on Sentinel");
            tokio::spawn(async move {
                for task in tasks {
                    let _ = task.await;
                }
            })
        })
        .await;

        // 1 through the group on the primary.
        xadd(&primary, 1);
        eventually("entry 1 applied", Duration::from_secs(10), || async {
            get(&primary, &gen(1)).as_deref() != Some(b"before".as_slice())
                && pending(&primary) == 0
        })
        .await;

        // 2 is delivered to a consumer that never acks (a dead instance).
        // One script: our consumer blocks in XREADGROUP and would be served
        // a plain XADD's entry before the ghost could read it.
        primary
            .cli(&[
                "EVAL",
                "redis.call('XADD', KEYS[1], '*', 'route', 'app', 'params', ARGV[2]) \
                 return redis.call('XREADGROUP', 'GROUP', ARGV[1], 'ghost', 'STREAMS', KEYS[1], '>')",
                "1",
                STREAM,
                GROUP,
                r#"{"tenant":"t","id":2}"#,
            ])
            .expect("XADD and XREADGROUP as ghost");
        assert_eq!(ghost_pending(&primary), 1, "the ghost holds entry 2");
        eventually(
            "the pending entry reached the replica",
            Duration::from_secs(10),
            || async { pending(&replica) == 1 },
        )
        .await;
        primary.kill();
        eventually(
            "the replica is promoted",
            Duration::from_secs(30),
            || async { sentinels.primary_port() == Some(replica.port()) },
        )
        .await;
        // Checked, not assumed: the ghost still holds entry 2 on the new
        // primary, so only a claim there can clear it.
        assert_eq!(
            ghost_pending(&replica),
            1,
            "entry 2 is still the ghost's after the promotion"
        );

        // 3 appended after the promotion.
        xadd(&replica, 3);
        eventually(
            "entries 2 (claimed) and 3 applied on the new primary, none pending",
            Duration::from_secs(30),
            || async {
                [2, 3]
                    .iter()
                    .all(|id| get(&replica, &gen(*id)).as_deref() != Some(b"before".as_slice()))
                    && pending(&replica) == 0
            },
        )
        .await;
        consumer.stop().await;
    }
}

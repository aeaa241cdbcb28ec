//! The Bloom filter with its real membership source: the `sidecache`
//! binary, a private Postgres (never the shared 5432) holding the catalogue
//! and the outbox, and a private redis-server as the store.
//!
//! - The route's `source` SQL runs per scope value (`$1` = tenant); the
//!   first request for an unbuilt scope answers unknown and builds it
//!   lazily; from then on absent ids get `404 X-Cache: BLOOM` with no
//!   origin call, members reach the origin.
//! - Growth: a `create` row written in the same transaction as the new id
//!   adds it to the filter once applied, also while a rebuild whose query
//!   snapshot predates the insert is running (the delta path).
//! - A build killed mid-way (SIGKILL): the old filter keeps serving, the
//!   dead build's lock and candidate carry bounded TTLs, and the next build
//!   activates once the lease is over.
//!
//! Slow builds are not made slow by sleeping: the source is a SQL function
//! that takes its snapshot, then waits while a row exists in `build_gate`;
//! the test observes it waiting (`pg_stat_activity`, `wait_event =
//! 'PgSleep'`) and lifts the gate when the interleaving is in place.

use crate::support::postgres::PostgresServer;
use crate::support::redis::RedisServer;
use crate::support::{app_routes, client, eventually, Origin, Sidecache, SidecacheBuilder};
use std::time::Duration;

const WITHIN: Duration = Duration::from_secs(20);
const LOCK: &str = "sc:b:{app:acme}:build-lock";
const BITS: &str = "sc:b:{app:acme}:bits";
const READY: &str = "sc:b:{app:acme}:ready";
const CANDIDATES: &str = "sc:b:{app:acme}:build:*";

/// The source the issue names.
const PLAIN_SOURCE: &str = "SELECT id::text FROM app_config WHERE tenant = $1";
/// The same members through a function that can be held mid-build.
const GATED_SOURCE: &str = "SELECT * FROM app_ids($1)";

fn routes(source: &str) -> String {
    app_routes(&format!(
        r#"bloom:
  scope: "{{tenant}}"
  source: "{source}"
  capacity: 1000
  fp_rate: 0.01
  rebuild_every: 10m"#
    ))
}

/// Catalogue: `acme` owns 1..=50, `zeta` owns 1001..=1050. Plus the outbox
/// (DDL from `sidecache::invalidation::ddl`, what `outbox-ddl` prints) and
/// the gated source function.
async fn catalogue(pg: &PostgresServer) {
    let ddl =
        sidecache::invalidation::ddl::outbox_ddl("sidecache_outbox", Some("sidecache_outbox"))
            .expect("outbox ddl");
    pg.execute(&ddl).await;
    pg.execute(
        r#"CREATE TABLE app_config (tenant text NOT NULL, id bigint NOT NULL,
                                    PRIMARY KEY (tenant, id));
           INSERT INTO app_config SELECT 'acme', g FROM generate_series(1, 50) g;
           INSERT INTO app_config SELECT 'zeta', g FROM generate_series(1001, 1050) g;
           CREATE TABLE build_gate (held boolean);
           -- Snapshot first (RETURN QUERY materialises the rows), then wait
           -- while the gate is held: rows committed during the wait are not
           -- in this build's result.
           CREATE FUNCTION app_ids(t text) RETURNS SETOF text LANGUAGE plpgsql AS $$
           BEGIN
             RETURN QUERY SELECT id::text FROM app_config WHERE tenant = t;
             WHILE EXISTS (SELECT 1 FROM build_gate) LOOP PERFORM pg_sleep(0.02); END LOOP;
           END $$;"#,
    )
    .await;
}

fn builder(
    origin: &Origin,
    redis: &RedisServer,
    pg: &PostgresServer,
    source: &str,
) -> SidecacheBuilder {
    SidecacheBuilder::new(origin.url())
        .routes(&routes(source))
        .store(&format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n  breaker:\n    cooldown: 500ms\n",
            redis.url()
        ))
        .extra(&format!(
            "invalidation:\n  outbox:\n    url: \"{}\"\n    poll_interval: 200ms\n",
            pg.url()
        ))
}

fn path(tenant: &str, id: u64) -> String {
    format!("/api/tenants/{tenant}/apps/{id}")
}

fn xcache(r: &client::Resp) -> String {
    r.header("x-cache").unwrap_or_default()
}

/// GET and return `(status, X-Cache)`.
async fn get(sc: &Sidecache, tenant: &str, id: u64) -> (u16, String) {
    let resp = client::get(&sc.url(&path(tenant, id))).await;
    (resp.status.as_u16(), xcache(&resp))
}

/// Absent ids: every one `404 BLOOM`, none reaches the origin.
async fn assert_rejected(sc: &Sidecache, origin: &Origin, tenant: &str, ids: &[u64]) {
    let before = origin.total();
    for &id in ids {
        assert_eq!(
            get(sc, tenant, id).await,
            (404, "BLOOM".to_owned()),
            "{tenant}/{id} should be rejected by the filter"
        );
    }
    assert_eq!(
        origin.total(),
        before,
        "the origin was called for absent ids"
    );
}

/// Members: every one reaches the origin (first request: `200 MISS`).
async fn assert_served(sc: &Sidecache, origin: &Origin, tenant: &str, ids: &[u64]) {
    for &id in ids {
        assert_eq!(
            get(sc, tenant, id).await,
            (200, "MISS".to_owned()),
            "{tenant}/{id} should reach the origin"
        );
        assert_eq!(origin.hits(&path(tenant, id)), 1, "{tenant}/{id}");
    }
}

async fn bloom_state(sc: &Sidecache, scope: &str) -> Option<f64> {
    sc.metric(&format!(
        "sidecache_bloom_state{{route=\"app\",scope=\"{scope}\"}}"
    ))
    .await
}

async fn rebuild(sc: &Sidecache, scope: &str) -> client::Resp {
    client::post(
        &sc.admin_url(&format!("/admin/bloom/app/rebuild?scope={scope}")),
        "",
    )
    .await
}

fn int(value: redis::Value) -> i64 {
    match value {
        redis::Value::Int(n) => n,
        other => panic!("expected an integer reply, got {other:?}"),
    }
}

fn exists(redis: &RedisServer, key: &str) -> bool {
    int(redis.cli(&["EXISTS", key]).expect("EXISTS")) == 1
}

fn pttl(redis: &RedisServer, key: &str) -> i64 {
    int(redis.cli(&["PTTL", key]).expect("PTTL"))
}

fn candidates(redis: &RedisServer) -> Vec<String> {
    match redis.cli(&["KEYS", CANDIDATES]).expect("KEYS") {
        redis::Value::Array(items) => items
            .into_iter()
            .map(|v| match v {
                redis::Value::BulkString(b) => String::from_utf8(b).expect("UTF-8 key"),
                other => panic!("unexpected key {other:?}"),
            })
            .collect(),
        other => panic!("unexpected KEYS reply {other:?}"),
    }
}

fn lock_owner(redis: &RedisServer) -> Option<String> {
    match redis.cli(&["GET", LOCK]).expect("GET lock") {
        redis::Value::BulkString(b) => Some(String::from_utf8(b).expect("UTF-8 owner")),
        _ => None,
    }
}

/// The new id and its `create` outbox row, in one transaction (what the
/// service does).
async fn create(pg: &PostgresServer, tenant: &str, id: u64) {
    pg.execute(&format!(
        "BEGIN;
         INSERT INTO app_config VALUES ('{tenant}', {id});
         INSERT INTO sidecache_outbox (route, params, kind)
           VALUES ('app', '{{\"tenant\": \"{tenant}\", \"id\": {id}}}', 'create');
         COMMIT;"
    ))
    .await;
}

async fn scalar(pg: &PostgresServer, sql: &str) -> i64 {
    pg.client()
        .await
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// Every outbox row applied (and deleted by the worker); none dead.
async fn outbox_drained(pg: &PostgresServer) {
    eventually("outbox rows applied", WITHIN, || async {
        scalar(pg, "SELECT count(*) FROM sidecache_outbox").await == 0
    })
    .await;
}

/// A build is inside the gated source function, its snapshot taken.
async fn build_waiting_at_gate(pg: &PostgresServer) {
    eventually("a build waiting at the gate", WITHIN, || async {
        scalar(
            pg,
            "SELECT count(*) FROM pg_stat_activity \
             WHERE query LIKE '%app_ids(%' AND wait_event = 'PgSleep'",
        )
        .await
            >= 1
    })
    .await;
}

/// The Postgres id source (docs/bloom.md#builds): one filter per tenant from
/// the route's `source` SQL; built lazily by the first request of an unbuilt
/// scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_source_builds_each_tenant_lazily_and_rejects_absent_ids() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    catalogue(&pg).await;
    let sc = builder(&origin, &redis, &pg, PLAIN_SOURCE).start().await;

    // Unbuilt scope: unknown -> origin, and the build starts.
    assert_eq!(get(&sc, "acme", 5000).await, (200, "MISS".to_owned()));
    assert_eq!(origin.hits(&path("acme", 5000)), 1);
    eventually("acme filter ready", WITHIN, || async {
        bloom_state(&sc, "acme").await == Some(1.0)
    })
    .await;
    assert!(exists(&redis, BITS) && exists(&redis, READY));

    assert_rejected(&sc, &origin, "acme", &[5001, 5002, 99_999, 1001, 1050]).await;
    assert_served(&sc, &origin, "acme", &[1, 25, 50]).await;

    // The other tenant has its own filter, built on its first request.
    assert_eq!(get(&sc, "zeta", 1).await, (200, "MISS".to_owned()));
    eventually("zeta filter ready", WITHIN, || async {
        bloom_state(&sc, "zeta").await == Some(1.0)
    })
    .await;
    // acme's ids are absent in zeta, zeta's present.
    assert_rejected(&sc, &origin, "zeta", &[2, 3, 49, 50, 5003]).await;
    assert_served(&sc, &origin, "zeta", &[1001, 1025, 1050]).await;

    let text = sc.metrics().await;
    assert!(
        text.contains("sidecache_bloom_builds_total{outcome=\"activated\",route=\"app\"} 2"),
        "{text}"
    );
    assert_eq!(
        sc.metric("sidecache_requests_total{result=\"BLOOM\",route=\"app\"}")
            .await,
        Some(10.0)
    );
}

/// Growth (docs/bloom.md#growth): a new id committed with its `create` outbox
/// row is never answered BLOOM once the row is applied — also when the row is
/// applied while a rebuild runs whose source snapshot predates the insert
/// (the id reaches the candidate only through the running build's delta).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_ids_pass_once_applied_also_during_a_rebuild() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    catalogue(&pg).await;
    let sc = builder(&origin, &redis, &pg, GATED_SOURCE).start().await;

    let resp = rebuild(&sc, "acme").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["members"], 50);
    assert_rejected(&sc, &origin, "acme", &[100, 777, 778]).await;

    // Outside a build: the active filter grows.
    create(&pg, "acme", 100).await;
    outbox_drained(&pg).await;
    assert_served(&sc, &origin, "acme", &[100]).await;

    // During a rebuild: its query has run (snapshot without 777/778) and
    // waits at the gate, holding the build lock and a candidate.
    pg.execute("INSERT INTO build_gate VALUES (true)").await;
    let admin = sc.admin_url("/admin/bloom/app/rebuild?scope=acme");
    let running = tokio::spawn(async move { client::post(&admin, "").await });
    build_waiting_at_gate(&pg).await;
    let owner = lock_owner(&redis).expect("build lock held during the build");
    let candidate = format!("sc:b:{{app:acme}}:build:{owner}");
    assert!(exists(&redis, &candidate), "candidate {candidate} missing");

    create(&pg, "acme", 777).await;
    create(&pg, "acme", 778).await;
    outbox_drained(&pg).await;
    // Applied: the active filter already lets 777 through.
    assert_served(&sc, &origin, "acme", &[777]).await;

    pg.execute("DELETE FROM build_gate").await;
    let resp = tokio::time::timeout(WITHIN, running)
        .await
        .expect("rebuild answered")
        .expect("rebuild task");
    assert_eq!(resp.status, 200, "{}", resp.text());
    // The snapshot predates 777 and 778: 51 members (1..=50 and 100)...
    assert_eq!(resp.json()["members"], 51, "{}", resp.text());
    assert!(!exists(&redis, &candidate), "candidate renamed over bits");
    // ...yet 778, first requested now, passes the new filter (from the
    // delta). 777 is cached by now, so 778 is the one that shows it.
    assert_served(&sc, &origin, "acme", &[778]).await;
    assert_rejected(&sc, &origin, "acme", &[779, 5000]).await;

    let text = sc.metrics().await;
    assert!(
        text.contains("sidecache_bloom_adds_total{outcome=\"applied\",route=\"app\"} 3"),
        "{text}"
    );
}

/// A crashed build (docs/bloom.md#builds): SIGKILL while a rebuild is in
/// progress. The old filter keeps serving (a second instance on the same Redis
/// answers BLOOM), the dead build's lock and candidate expire on their own
/// (TTLs set and bounded), and once the lock's lease is over the next build
/// activates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_killed_midway_keeps_the_old_filter_and_the_next_build_activates() {
    use sidecache::bloom::{CANDIDATE_TTL, LOCK_TTL};
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    catalogue(&pg).await;
    let builder = builder(&origin, &redis, &pg, GATED_SOURCE);
    let mut first = builder.clone().start().await;

    let resp = rebuild(&first, "acme").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_rejected(&first, &origin, "acme", &[5001]).await;

    // A rebuild in progress: lock held, candidate allocated, source waiting.
    pg.execute("INSERT INTO build_gate VALUES (true)").await;
    let admin = first.admin_url("/admin/bloom/app/rebuild?scope=acme");
    let running = tokio::spawn(async move { client::post(&admin, "").await });
    build_waiting_at_gate(&pg).await;
    let owner = lock_owner(&redis).expect("build lock held during the build");
    let candidate = format!("sc:b:{{app:acme}}:build:{owner}");
    assert_eq!(candidates(&redis), vec![candidate.clone()]);

    first.kill();
    running.abort();

    // Nothing of the dead build is permanent.
    let lock_ttl = pttl(&redis, LOCK);
    assert!(
        lock_ttl > 0 && lock_ttl <= LOCK_TTL.as_millis() as i64,
        "lock PTTL {lock_ttl}"
    );
    let candidate_ttl = pttl(&redis, &candidate);
    assert!(
        candidate_ttl > 0 && candidate_ttl <= CANDIDATE_TTL.as_millis() as i64,
        "candidate PTTL {candidate_ttl}"
    );
    // The active filter is untouched and persistent.
    assert_eq!(pttl(&redis, BITS), -1);
    assert_eq!(pttl(&redis, READY), -1);

    // Another instance (or the restarted one) keeps using the old filter.
    pg.execute("DELETE FROM build_gate").await;
    let second = builder.start().await;
    assert_rejected(&second, &origin, "acme", &[5002, 5003, 5004]).await;
    assert_served(&second, &origin, "acme", &[1, 50]).await;

    // Until the dead build's lease runs out, a build finds the lock taken.
    let resp = rebuild(&second, "acme").await;
    assert_eq!(resp.status, 409, "{}", resp.text());
    assert_eq!(resp.json()["outcome"], "busy");
    // The lease (LOCK_TTL; a dead builder no longer renews it) running out, without waiting for it:
    // the remaining TTL is cut short, exactly what time would do.
    redis.cli(&["PEXPIRE", LOCK, "1"]).expect("PEXPIRE");
    eventually("dead build lock expired", WITHIN, || async {
        !exists(&redis, LOCK)
    })
    .await;
    let resp = rebuild(&second, "acme").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["members"], 50);
    assert!(!exists(&redis, LOCK), "lock released after the build");
    // Only the dead candidate is left, still on its way out.
    assert_eq!(candidates(&redis), vec![candidate.clone()]);
    let candidate_ttl = pttl(&redis, &candidate);
    assert!(candidate_ttl > 0, "candidate PTTL {candidate_ttl}");
    assert_rejected(&second, &origin, "acme", &[5005, 5006]).await;
    assert_served(&second, &origin, "acme", &[2, 49]).await;
}

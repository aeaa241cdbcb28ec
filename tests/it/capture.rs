//! Change capture with the service unchanged: the example upstream with
//! `--no-outbox` writes only `app_config`, and changes made by a separate
//! `psql` process (not through the service, not through sidecache) reach
//! the cache through the capture triggers (`mode: triggers`) or the logical
//! replication slot (`mode: logical`). The real binary, a private Postgres
//! and redis-server from the harness.

use crate::support::client::{self, Resp};
use crate::support::postgres::PostgresServer;
use crate::support::redis::RedisServer;
use crate::support::sidecache::{capture_ddl, Sidecache};
use crate::support::upstream::{build_example, Upstream};
use crate::support::{eventually, SidecacheBuilder};
use std::process::Command;
use std::time::Duration;

/// Bound on "a committed change has reached the cache" in these tests
/// (correctness, not speed: the history checker measures the delay).
const FRESH_WITHIN: Duration = Duration::from_secs(10);

fn x_cache(r: &Resp) -> String {
    r.header("x-cache").unwrap_or_default()
}

/// The capture section for `mode` over `app_config`, plus `more` tables.
fn capture_yaml(mode: &str, pg: &PostgresServer, more: &str) -> String {
    format!(
        r#"invalidation:
  capture:
    mode: {mode}
    url: "{url}"
    tables:
      - table: public.app_config
        route: app
        params: {{ tenant: "{{tenant}}", id: "{{id}}" }}
        on_insert: create
{more}"#,
        url = pg.url()
    )
}

/// A table whose rows may name no object: a NULL key, a key that fails
/// the route's pattern, a tag that is not a tag (poison rows).
const LOOSE_TABLE: &str = "CREATE TABLE loose (tenant text, id bigint)";
const LOOSE_MAPPING: &str = r#"      - table: loose
        route: app
        params: { tenant: "{tenant}", id: "{id}" }
        tags: ["t:{tenant}"]
"#;

/// Runs SQL with the `psql` program, as an operator or a batch job would:
/// a separate process, not the service.
fn psql(pg: &PostgresServer, sql: &str) {
    let out = Command::new("psql")
        .args([pg.url().as_str(), "-v", "ON_ERROR_STOP=1", "-q", "-c", sql])
        .output()
        .expect("run psql (installed with the Postgres server packages)");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls GET through sidecache until `done(response)`; returns that response.
async fn until(url: &str, what: &str, done: impl Fn(&Resp) -> bool) -> Resp {
    client::get_until(url, FRESH_WITHIN, what, done).await
}

/// Cached: a fill, then a hit.
async fn cached(url: &str) -> Resp {
    let first = client::get(url).await;
    let second = client::get(url).await;
    assert!(
        matches!(x_cache(&second).as_str(), "HIT" | "NEGATIVE"),
        "{url} is cached: {} then {}",
        x_cache(&first),
        x_cache(&second)
    );
    second
}

async fn slots_created(sc: &Sidecache) -> f64 {
    sc.metric_sum("sidecache_capture_slot_created_total", &[])
        .await
}

/// Whether `sc` streams the slot (after creating it and purging the
/// mapped routes, on a first start).
async fn holder(sc: &Sidecache) -> bool {
    sc.metric("sidecache_capture_streaming").await == Some(1.0)
}

struct Setup {
    pg: PostgresServer,
    _redis: RedisServer,
    _upstream: Upstream,
    builder: SidecacheBuilder,
}

async fn setup(mode: &str) -> Setup {
    let binary = tokio::task::spawn_blocking(build_example)
        .await
        .expect("build task");
    let pg = match mode {
        "logical" => PostgresServer::start_with(&["wal_level=logical"]),
        _ => PostgresServer::start(),
    };
    let redis = RedisServer::start();
    let upstream = Upstream::start(&binary, &pg.url(), &["--apps", "5", "--no-outbox"]).await;
    pg.execute(LOOSE_TABLE).await;
    let builder = SidecacheBuilder::new(upstream.url(""))
        .store(&redis.store_yaml())
        .extra(&capture_yaml(mode, &pg, LOOSE_MAPPING));
    pg.execute(&capture_ddl(&builder)).await;
    Setup {
        pg,
        _redis: redis,
        _upstream: upstream,
        builder,
    }
}

/// What both modes must do with writes the service never hears of.
async fn writes_behind_the_service_reach_the_cache(s: &Setup, sc: &Sidecache) {
    // UPDATE by psql: the cached answer is replaced.
    let one = sc.url("/api/tenants/acme/apps/1");
    assert_eq!(cached(&one).await.json()["version"], 1);
    psql(
        &s.pg,
        "UPDATE app_config SET config = '{\"theme\":\"dark\"}', version = version + 1 \
         WHERE tenant = 'acme' AND id = 1",
    );
    let fresh = until(&one, "psql's UPDATE reaches the cache", |r| {
        r.json()["version"] == 2
    })
    .await;
    assert_eq!(fresh.json()["config"]["theme"], "dark");

    // An UPDATE that moves a row to another key: both objects change.
    let two = sc.url("/api/tenants/acme/apps/2");
    let twenty = sc.url("/api/tenants/acme/apps/20");
    assert_eq!(cached(&two).await.status, 200);
    assert_eq!(cached(&twenty).await.status, 404);
    psql(
        &s.pg,
        "UPDATE app_config SET id = 20 WHERE tenant = 'acme' AND id = 2",
    );
    until(&two, "the old key is invalidated", |r| r.status == 404).await;
    until(&twenty, "the new key is invalidated", |r| r.status == 200).await;

    // DELETE and INSERT (a cached 404 is replaced).
    let three = sc.url("/api/tenants/acme/apps/3");
    assert_eq!(cached(&three).await.status, 200);
    psql(
        &s.pg,
        "DELETE FROM app_config WHERE tenant = 'acme' AND id = 3",
    );
    until(&three, "the DELETE reaches the cache", |r| r.status == 404).await;
    let nine = sc.url("/api/tenants/globex/apps/9");
    assert_eq!(cached(&nine).await.status, 404);
    psql(
        &s.pg,
        "INSERT INTO app_config (tenant, id, name, config) VALUES ('globex', 9, 'new', '{}')",
    );
    until(&nine, "the INSERT reaches the cache", |r| r.status == 200).await;

    // A NULL key, a key that fails its pattern and a malformed tag name no
    // object: dead-lettered, and the rest of the same statement applies
    // (its row invalidates acme/4: the next read fills).
    let four = sc.url("/api/tenants/acme/apps/4");
    assert_eq!(cached(&four).await.status, 200);
    psql(
        &s.pg,
        "INSERT INTO loose VALUES (NULL, 7), ('bad tenant!', 8), ('acme', 4)",
    );
    until(&four, "the valid row of the statement applies", |r| {
        x_cache(r) == "MISS"
    })
    .await;

    // TRUNCATE: every object of the route, at once.
    let five = sc.url("/api/tenants/globex/apps/5");
    assert_eq!(cached(&five).await.status, 200);
    assert_eq!(cached(&one).await.status, 200);
    psql(&s.pg, "TRUNCATE app_config");
    until(&five, "TRUNCATE purges the route", |r| r.status == 404).await;
    until(&one, "TRUNCATE purges the route", |r| r.status == 404).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_capture_writes_the_service_never_sees() {
    let s = setup("triggers").await;
    let sc = s.builder.clone().start().await;
    writes_behind_the_service_reach_the_cache(&s, &sc).await;
    // The poison rows are dead-lettered in the outbox, with their reasons.
    let db = s.pg.client().await;
    let reasons: Vec<String> = db
        .query(
            "SELECT last_error FROM sidecache_outbox WHERE dead_at IS NOT NULL",
            &[],
        )
        .await
        .expect("dead rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(reasons.len(), 4, "four dead-lettered rows: {reasons:?}");
    for says in ["tenant", "pattern", "tags"] {
        assert!(
            reasons.iter().any(|r| r.contains(says)),
            "a reason names {says}: {reasons:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_capture_writes_the_service_never_sees() {
    let s = setup("logical").await;
    let sc = s.builder.clone().start().await;
    eventually("the consumer streams", FRESH_WITHIN, || holder(&sc)).await;
    writes_behind_the_service_reach_the_cache(&s, &sc).await;
    let outbox =
        s.pg.client()
            .await
            .query_opt(
                "SELECT 1 FROM pg_class WHERE relname = 'sidecache_outbox'",
                &[],
            )
            .await
            .expect("query");
    assert!(
        outbox.is_none(),
        "logical mode writes nothing on the service's side"
    );
    for (reason, n) in [("null_value", 2.0), ("bad_param", 1.0), ("bad_tags", 1.0)] {
        assert_eq!(
            sc.metric_sum(
                "sidecache_capture_dead_letters_total",
                &[("reason", reason)]
            )
            .await,
            n,
            "dead-lettered with reason {reason}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_slot_is_recreated_and_every_mapped_route_purged() {
    let s = setup("logical").await;
    let sc = s.builder.clone().start().await;
    eventually(
        "the slot is created at the first start",
        FRESH_WITHIN,
        || async { slots_created(&sc).await == 1.0 },
    )
    .await;
    let one = sc.url("/api/tenants/acme/apps/1");
    assert_eq!(cached(&one).await.status, 200);
    // The slot goes (as an operator's mistake or an invalidated slot
    // would): changes made meanwhile were never streamed.
    psql(
        &s.pg,
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'sidecache'",
    );
    eventually("the slot is inactive", FRESH_WITHIN, || async {
        let db = s.pg.client().await;
        db.query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'sidecache' AND active",
            &[],
        )
        .await
        .map(|r| r.get::<_, i64>(0) == 0)
        .unwrap_or(false)
    })
    .await;
    let db = s.pg.client().await;
    // Dropped and a change made before the consumer can create it again.
    db.batch_execute(
        "SELECT pg_drop_replication_slot('sidecache'); \
         UPDATE app_config SET version = version + 1 WHERE tenant = 'acme' AND id = 1;",
    )
    .await
    .unwrap_or_else(|e| panic!("drop the slot: {e}"));
    until(&one, "the missed change is served after the purge", |r| {
        r.json()["version"] == 2
    })
    .await;
    assert_eq!(slots_created(&sc).await, 2.0, "recreated");
    assert!(
        sc.metric_sum("sidecache_capture_route_purges_total", &[])
            .await
            >= 2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_the_slot_over_from_a_stopped_holder() {
    let s = setup("logical").await;
    let a = s.builder.clone().start().await;
    let b = s.builder.clone().start().await;
    eventually("one instance streams", FRESH_WITHIN, || async {
        holder(&a).await || holder(&b).await
    })
    .await;
    let (stopped, standby) = match holder(&a).await {
        true => (&a, &b),
        false => (&b, &a),
    };
    let one = standby.url("/api/tenants/acme/apps/1");
    assert_eq!(cached(&one).await.json()["version"], 1);
    stopped.signal("STOP");
    let stopped_at = tokio::time::Instant::now();
    psql(
        &s.pg,
        "UPDATE app_config SET version = version + 1 WHERE tenant = 'acme' AND id = 1",
    );
    until(&one, "the standby streams the change", |r| {
        r.json()["version"] == 2
    })
    .await;
    let took = stopped_at.elapsed();
    stopped.signal("CONT");
    println!("capture takeover after SIGSTOP: change served fresh after {took:?}");
    assert!(holder(standby).await, "the standby holds the slot now");
}

//! The example upstream (`examples/upstream.rs`) in Postgres mode behind the
//! real sidecache binary with the Redis store and the outbox worker: changes
//! made directly on the upstream, behind sidecache's back, reach the cache
//! only through the outbox rows the upstream writes in each change's
//! transaction.
//!
//! Private Postgres and redis-server from the harness (never the shared
//! instances); the example is built and run by `support::upstream`.

use crate::support::client::{self, Resp};
use crate::support::postgres::PostgresServer;
use crate::support::redis::RedisServer;
use crate::support::upstream::{build_example, Upstream};
use crate::support::{eventually, SidecacheBuilder};
use std::time::Duration;

/// Bound on "the outbox row has reached the cache".
const FRESH_WITHIN: Duration = Duration::from_secs(5);

fn x_cache(r: &Resp) -> String {
    r.header("x-cache").unwrap_or_default()
}

async fn scalar(pg: &tokio_postgres::Client, sql: &str) -> i64 {
    pg.query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// Polls GET through sidecache until `done(response)`; returns that response.
async fn until(url: &str, what: &str, done: impl Fn(&Resp) -> bool) -> Resp {
    client::get_until(url, FRESH_WITHIN, what, done).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_on_the_postgres_upstream_reach_the_cache_through_the_outbox() {
    // Build first: a compile error should fail fast, before servers start.
    let binary = tokio::task::spawn_blocking(build_example)
        .await
        .expect("build task");
    let pg = PostgresServer::start();
    let redis = RedisServer::start();
    // The upstream creates app_config and the outbox table at start.
    let upstream = Upstream::start(&binary, &pg.url(), &["--apps", "3"]).await;
    let db = pg.client().await;
    assert_eq!(scalar(&db, "SELECT count(*) FROM app_config").await, 6);

    // Audit every outbox row as it is inserted (sidecache deletes them once
    // applied), to check which changes wrote an event.
    db.batch_execute(
        r#"CREATE TABLE outbox_audit AS SELECT route, params, kind, revision FROM sidecache_outbox LIMIT 0;
           CREATE FUNCTION audit_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             INSERT INTO outbox_audit VALUES (NEW.route, NEW.params, NEW.kind, NEW.revision);
             RETURN NULL;
           END $$;
           CREATE TRIGGER audit AFTER INSERT ON sidecache_outbox
             FOR EACH ROW EXECUTE FUNCTION audit_outbox();"#,
    )
    .await
    .expect("install the audit trigger");

    let sc = SidecacheBuilder::new(upstream.url(""))
        .store(&format!("store:\n  redis:\n    url: \"{}\"\n", redis.url()))
        .extra(&format!(
            "invalidation:\n  outbox:\n    url: \"{}\"\n    poll_interval: 1s\n",
            pg.url()
        ))
        .start()
        .await;

    // Cached v1.
    let app = sc.url("/api/tenants/acme/apps/1");
    let first = client::get(&app).await;
    assert_eq!(first.status, 200);
    assert_eq!(x_cache(&first), "MISS");
    assert_eq!(first.json()["version"], 1);
    let hit = client::get(&app).await;
    assert_eq!(hit.status, 200);
    assert_eq!(x_cache(&hit), "HIT");

    // PUT directly on the upstream: sidecache sees no request, only the
    // outbox row committed with the update.
    let put = client::put(
        &upstream.url("/api/tenants/acme/apps/1"),
        r#"{"feature_x":true,"theme":"dark"}"#,
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.text());
    assert_eq!(put.json()["version"], 2);
    let fresh = until(&app, "the GET through sidecache returns version 2", |r| {
        r.json()["version"] == 2
    })
    .await;
    assert_eq!(x_cache(&fresh), "MISS", "the first fresh answer is a fill");
    assert_eq!(fresh.json()["config"]["theme"], "dark");
    let hit = client::get(&app).await;
    assert_eq!(x_cache(&hit), "HIT");
    assert_eq!(hit.json()["version"], 2);
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM outbox_audit WHERE route = 'app' AND kind = 'invalidate' \
             AND revision = 2 AND params = '{\"tenant\": \"acme\", \"id\": 1}'"
        )
        .await,
        1
    );

    // A failed PUT (unknown app) rolls back: no change, no outbox row.
    let missing = client::put(&upstream.url("/api/tenants/acme/apps/99"), "{}").await;
    assert_eq!(missing.status, 404);
    assert_eq!(scalar(&db, "SELECT count(*) FROM outbox_audit").await, 1);

    // create: a 404 sidecache cached for the next id is replaced.
    let new_app = sc.url("/api/tenants/acme/apps/4");
    assert_eq!(client::get(&new_app).await.status, 404);
    let negative = client::get(&new_app).await;
    assert_eq!(negative.status, 404);
    assert_eq!(x_cache(&negative), "NEGATIVE", "the 404 is cached");
    let post = client::post(&upstream.url("/api/tenants/acme/apps"), r#"{"plan":"pro"}"#).await;
    assert_eq!(post.status, 201, "{}", post.text());
    assert_eq!(
        post.header("location").as_deref(),
        Some("/api/tenants/acme/apps/4")
    );
    let created = until(&new_app, "the created app is served", |r| r.status == 200).await;
    assert_eq!(created.json()["config"]["plan"], "pro");

    // delete: the cached copy stops being served.
    let del = client::request("DELETE", &upstream.url("/api/tenants/acme/apps/1"), &[], "").await;
    assert_eq!(del.status, 204);
    until(&app, "the deleted app is gone", |r| r.status == 404).await;

    let kinds: Vec<String> = db
        .query("SELECT kind FROM outbox_audit ORDER BY kind", &[])
        .await
        .expect("audit kinds")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(kinds, ["create", "delete", "invalidate"]);
    // Every row applied and deleted by the worker; none dead-lettered.
    eventually("the outbox is empty", FRESH_WITHIN, || async {
        scalar(&db, "SELECT count(*) FROM sidecache_outbox").await == 0
    })
    .await;
}

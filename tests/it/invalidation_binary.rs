//! Invalidation through the real binary: a sidecache process with the
//! outbox worker and stream consumer wired in, a private Postgres and
//! redis-server, and the test origin. Covers the crash the in-process tests
//! can only simulate (SIGKILL after applying to Redis, before the commit),
//! the stale-backfill guarantee with invalidations arriving from the outbox
//! and the stream, and the `outbox-ddl` command.

use crate::support::postgres::PostgresServer;
use crate::support::redis::RedisServer;
use crate::support::{client, eventually, get_held, Origin, SidecacheBuilder};
use std::time::Duration;

const PATH: &str = "/api/tenants/acme/apps/7";
const GEN_KEY: &str = "sc:o:{app:acme:7}:g";

fn builder(origin: &Origin, redis: &RedisServer, invalidation: &str) -> SidecacheBuilder {
    SidecacheBuilder::new(origin.url())
        .store(&format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n  breaker:\n    cooldown: 500ms\n",
            redis.url()
        ))
        .extra(invalidation)
}

fn generation(redis: &RedisServer) -> Option<Vec<u8>> {
    generation_of(redis, GEN_KEY)
}

fn generation_of(redis: &RedisServer, key: &str) -> Option<Vec<u8>> {
    match redis.cli(&["GET", key]) {
        Ok(redis::Value::BulkString(b)) => Some(b),
        _ => None,
    }
}

async fn count(pg: &tokio_postgres::Client, filter: &str) -> i64 {
    pg.query_one(
        &format!("SELECT count(*) FROM sidecache_outbox WHERE {filter}"),
        &[],
    )
    .await
    .expect("count")
    .get(0)
}

async fn insert_row(pg: &tokio_postgres::Client) {
    pg.execute(
        "INSERT INTO sidecache_outbox (route, params) VALUES ('app', '{\"tenant\": \"acme\", \"id\": 7}')",
        &[],
    )
    .await
    .expect("insert outbox row");
}

pub(crate) fn ddl() -> String {
    let out = std::process::Command::new(crate::support::sidecache::binary())
        .arg("outbox-ddl")
        .output()
        .expect("run sidecache outbox-ddl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 SQL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_ddl_command_rejects_bad_names() {
    let out = std::process::Command::new(crate::support::sidecache::binary())
        .args(["outbox-ddl", "--table", "x; drop table y"])
        .output()
        .expect("run sidecache outbox-ddl");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("identifier"));
}

/// SIGKILL after the apply and before the commit: the row stays and the
/// restarted process applies it again. A BEFORE DELETE trigger holds the
/// worker's DELETE (which runs after the apply) until the test lifts a gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_between_apply_and_commit_reapplies_after_restart() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    pg.execute(&ddl()).await;
    pg.execute(
        r#"CREATE TABLE crash_gate (on_ boolean);
           INSERT INTO crash_gate VALUES (true);
           CREATE FUNCTION hold_delete() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             WHILE EXISTS (SELECT 1 FROM crash_gate) LOOP PERFORM pg_sleep(0.05); END LOOP;
             RETURN OLD;
           END $$;
           CREATE TRIGGER hold BEFORE DELETE ON sidecache_outbox
             FOR EACH ROW EXECUTE FUNCTION hold_delete();"#,
    )
    .await;
    let invalidation = format!(
        "invalidation:\n  outbox:\n    url: \"{}\"\n    poll_interval: 200ms\n",
        pg.url()
    );
    let mut sc = builder(&origin, &redis, &invalidation).start().await;

    // Cached v1.
    assert_eq!(
        client::get(&sc.url(PATH))
            .await
            .header("x-cache")
            .as_deref(),
        Some("MISS")
    );
    let hit = client::get(&sc.url(PATH)).await;
    assert_eq!(hit.header("x-cache").as_deref(), Some("HIT"));
    let cached_generation = generation(&redis);

    // The service changes the object and writes its outbox row.
    origin.bump(PATH);
    let db = pg.client().await;
    insert_row(&db).await;
    eventually("applied to Redis", Duration::from_secs(10), || async {
        generation(&redis) != cached_generation
    })
    .await;
    let applied_once = generation(&redis);
    assert_eq!(
        count(&db, "true").await,
        1,
        "the DELETE is held: not committed"
    );

    sc.kill(); // SIGKILL while the transaction is open
    eventually(
        "the dead worker's claim is rolled back",
        Duration::from_secs(10),
        || async {
            db.query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sidecache-outbox'",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get::<_, i64>(0)
                == 0
        },
    )
    .await;
    assert_eq!(
        count(&db, "attempts = 0 AND dead_at IS NULL").await,
        1,
        "row not lost"
    );

    db.batch_execute("DELETE FROM crash_gate")
        .await
        .expect("lift the gate");
    let sc = builder(&origin, &redis, &invalidation).start().await;
    eventually(
        "re-applied and deleted",
        Duration::from_secs(15),
        || async { count(&db, "true").await == 0 },
    )
    .await;
    // Applied a second time, at no cost: the generation carries this row's
    // mark already, so the repeat leaves it (lua/invalidate_marked.lua).
    assert_eq!(
        generation(&redis),
        applied_once,
        "a repeat must not replace the generation again"
    );
    let fresh = client::get(&sc.url(PATH)).await;
    assert_eq!(fresh.header("x-cache").as_deref(), Some("MISS"));
    assert_eq!(fresh.text(), origin.default_body(PATH));
    assert_eq!(
        sc.metric_sum(
            "sidecache_invalidations_total",
            &[("source", "outbox"), ("outcome", "applied")]
        )
        .await,
        1.0
    );
}

/// The stale-backfill race (docs/architecture.md#no-stale-backfill) with the
/// invalidation arriving from each feed: a fill reads v1 upstream and is held;
/// the service writes v2 and its event is applied; the held v1 must not be
/// published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_backfill_is_refused_when_invalidated_by_outbox_or_stream() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    pg.execute(&ddl()).await;
    let invalidation = format!(
        "invalidation:\n  outbox:\n    url: \"{}\"\n    poll_interval: 200ms\n  redis_stream:\n    stream: \"inv\"\n    start: earliest\n",
        pg.url()
    );
    let sc = builder(&origin, &redis, &invalidation).start().await;
    let db = pg.client().await;

    for (feed, id) in [("outbox", 7), ("stream", 8)] {
        let path = format!("/api/tenants/acme/apps/{id}");
        let key = format!("sc:o:{{app:acme:{id}}}:g");
        // The fill took its ticket and read the old version.
        let (gate, reader) = get_held(&origin, &path, sc.url(&path)).await;
        let ticket = generation_of(&redis, &key);
        assert!(ticket.is_some(), "the ticket creates the generation");
        origin.bump(&path);
        let params = format!(r#"{{"tenant":"acme","id":"{id}"}}"#);
        match feed {
            "outbox" => {
                db.execute(
                    "INSERT INTO sidecache_outbox (route, params) VALUES ('app', $1::text::jsonb)",
                    &[&params],
                )
                .await
                .expect("insert outbox row");
            }
            _ => {
                redis
                    .cli(&["XADD", "inv", "*", "route", "app", "params", &params])
                    .expect("XADD");
            }
        }
        eventually(
            &format!("{feed} event applied"),
            Duration::from_secs(10),
            || async { generation_of(&redis, &key) != ticket },
        )
        .await;
        gate.release();
        let stale = reader.await.expect("reader");
        assert_eq!(stale.status, 200);
        let next = client::get(&sc.url(&path)).await;
        assert_eq!(
            next.text(),
            origin.default_body(&path),
            "{feed}: the held (stale) fill was published"
        );
        assert_eq!(next.header("x-cache").as_deref(), Some("MISS"), "{feed}");
    }
}

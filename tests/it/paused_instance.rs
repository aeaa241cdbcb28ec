//! No feed waits for a stopped consumer (issue 19, point 2): with one
//! instance SIGSTOPped while it holds events (a stream entry the consumer
//! group delivered to it, outbox rows it claimed), the other instances apply
//! every event within a bound far below `claim_idle` (30 s), on the real
//! binary. Each event is for an object of its own, so its generation key
//! appearing in Redis is the moment the event was applied; the figures
//! (commit → applied) are printed.

use crate::support::postgres::PostgresServer;
use crate::support::redis::RedisServer;
use crate::support::{eventually, Origin, Sidecache, SidecacheBuilder};
use redis::aio::MultiplexedConnection;
use redis::Value;
use std::time::{Duration, Instant};

/// Far below `claim_idle` (30 s) and the pauses of issue 19 (4 s); loose
/// enough for a loaded test machine. The printed figures are the result.
const BOUND: Duration = Duration::from_millis(500);
const STREAM: &str = "inv";
const GROUP: &str = "sidecache";

fn gen_key(id: u64) -> String {
    format!("sc:o:{{app:acme:{id}}}:g")
}

fn instance(origin: &Origin, redis: &RedisServer, timeout: &str, feed: &str) -> SidecacheBuilder {
    SidecacheBuilder::new(origin.url())
        .store(&format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: {timeout}\n  breaker:\n    cooldown: 500ms\n",
            redis.url()
        ))
        .extra(feed)
}

async fn conn(redis: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(redis.url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection")
}

/// Polls (1 ms) until object `id`'s generation exists; the time it took.
async fn applied_within(conn: &mut MultiplexedConnection, id: u64, since: Instant) -> Duration {
    loop {
        let g: Option<Vec<u8>> = redis::cmd("GET")
            .arg(gen_key(id))
            .query_async(conn)
            .await
            .expect("GET");
        if g.is_some() {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < BOUND,
            "event for object {id} not applied within {BOUND:?}: a stopped instance holds it"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn generation(conn: &mut MultiplexedConnection, id: u64) -> Option<String> {
    redis::cmd("GET")
        .arg(gen_key(id))
        .query_async(conn)
        .await
        .expect("GET")
}

fn report(feed: &str, latencies: &[Duration]) {
    let mut ms: Vec<f64> = latencies.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    println!(
        "{feed}, one instance stopped: commit -> applied ms p50 {:.1} max {:.1} (n={}) {ms:.1?}",
        ms[ms.len() / 2],
        ms[ms.len() - 1],
        ms.len()
    );
}

/// `XINFO CONSUMERS`: (name, pending, idle ms) per consumer.
fn consumers(redis: &RedisServer) -> Vec<(String, i64, i64)> {
    let Ok(Value::Array(list)) = redis.cli(&["XINFO", "CONSUMERS", STREAM, GROUP]) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|c| match c {
            Value::Array(fields) => {
                let mut name = String::new();
                let (mut pending, mut idle) = (0, i64::MAX);
                for pair in fields.chunks(2) {
                    match pair {
                        [Value::BulkString(k), Value::BulkString(v)] if k == b"name" => {
                            name = String::from_utf8_lossy(v).into_owned();
                        }
                        [Value::BulkString(k), Value::Int(n)] if k == b"pending" => pending = *n,
                        [Value::BulkString(k), Value::Int(n)] if k == b"idle" => idle = *n,
                        _ => {}
                    }
                }
                Some((name, pending, idle))
            }
            _ => None,
        })
        .collect()
}

fn consumer_of(redis: &RedisServer, sc: &Sidecache) -> Option<(String, i64, i64)> {
    let pid = format!("-{}-", sc.pid());
    consumers(redis).into_iter().find(|c| c.0.contains(&pid))
}

fn xadd(redis: &RedisServer, id: u64) {
    let params = format!(r#"{{"tenant":"acme","id":{id}}}"#);
    redis
        .cli(&["XADD", STREAM, "*", "route", "app", "params", &params])
        .expect("XADD");
}

/// Three instances on one stream. Instance W is stopped right after it
/// blocked in `XREADGROUP`, so Redis hands the next new entry to it (the
/// longest-blocked consumer of the group) and W holds it, unacknowledged,
/// until it resumes. Entries are added one at a time until W holds one and
/// nine more came after it: each is applied by the others within `BOUND`.
/// When W resumes, its late applications change nothing (marks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_entries_are_applied_while_one_instance_is_stopped() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let feed = format!(
        "invalidation:\n  redis_stream:\n    stream: \"{STREAM}\"\n    group: {GROUP}\n    claim_idle: 30s\n"
    );
    let w = instance(&origin, &redis, "300ms", &feed).start().await;
    let _h1 = instance(&origin, &redis, "300ms", &feed).start().await;
    let _h2 = instance(&origin, &redis, "300ms", &feed).start().await;
    eventually(
        "three consumers in the group",
        Duration::from_secs(10),
        || async { consumers(&redis).len() == 3 },
    )
    .await;
    // Its `XREADGROUP ... BLOCK 5000` is then under 0.3 s old: it stays
    // registered (and first in line) for seconds after the stop.
    eventually(
        "W just blocked in XREADGROUP",
        Duration::from_secs(15),
        || async { consumer_of(&redis, &w).is_some_and(|c| c.2 < 300) },
    )
    .await;
    w.signal("STOP");

    let mut conn = conn(&redis).await;
    let mut latencies = Vec::new();
    let (mut id, mut after_w) = (0, 0);
    while after_w < 10 {
        id += 1;
        assert!(id <= 20, "no entry reached the stopped instance");
        xadd(&redis, id);
        let at = Instant::now();
        latencies.push(applied_within(&mut conn, id, at).await);
        if consumer_of(&redis, &w).is_some_and(|c| c.1 >= 1) {
            after_w += 1;
        }
    }
    report("stream", &latencies);
    let held = consumer_of(&redis, &w).map(|c| c.1);
    assert_eq!(held, Some(1), "the stopped instance holds one entry");

    // Resumed, W applies its entry and its fan-out backlog: all covered.
    let mut before = Vec::new();
    for i in 1..=id {
        before.push(generation(&mut conn, i).await);
    }
    w.signal("CONT");
    eventually(
        "the resumed instance acks and catches up",
        Duration::from_secs(10),
        || async {
            consumer_of(&redis, &w).is_some_and(|c| c.1 == 0)
                && w.metric_sum(
                    "sidecache_invalidations_total",
                    &[("source", "stream_fanout"), ("outcome", "applied")],
                )
                .await
                    >= id as f64
        },
    )
    .await;
    for i in 1..=id {
        assert_eq!(
            generation(&mut conn, i).await,
            before[(i - 1) as usize],
            "object {i}: a late application replaced the generation again"
        );
    }
}

/// Outbox: instance W claims a row and is stopped before it commits (its
/// store stalls its apply first: writes paused on W's own Redis, so the
/// moment is certain). Its claim locks the row, which `SKIP LOCKED` hides
/// from every other worker's claim. Two instances started then (on another
/// Redis, so what they apply is theirs alone) apply that row and every row
/// after it within `BOUND`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_rows_are_applied_while_one_instance_is_stopped() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let stalled = RedisServer::start();
    let pg = PostgresServer::start();
    pg.execute(&crate::invalidation_binary::ddl()).await;
    let feed = format!(
        "invalidation:\n  outbox:\n    url: \"{}\"\n    poll_interval: 1s\n",
        pg.url()
    );
    let db = pg.client().await;
    let insert = |id: i64| {
        let db = &db;
        async move {
            db.execute(
                "INSERT INTO sidecache_outbox (route, params) VALUES ('app', jsonb_build_object('tenant', 'acme', 'id', $1::bigint))",
                &[&id],
            )
            .await
            .expect("insert outbox row");
        }
    };

    // W's store calls may take 10 s: it stays inside its apply.
    let w = instance(&origin, &stalled, "10s", &feed).start().await;
    stalled
        .cli(&["CLIENT", "PAUSE", "60000", "WRITE"])
        .expect("pause writes");
    insert(1).await;
    eventually(
        "W's apply of row 1 waits at its store",
        Duration::from_secs(10),
        || async {
            match stalled.cli(&["INFO", "clients"]) {
                Ok(Value::BulkString(b)) => String::from_utf8_lossy(&b)
                    .lines()
                    .any(|l| l.starts_with("blocked_clients:") && l != "blocked_clients:0"),
                _ => false,
            }
        },
    )
    .await;
    w.signal("STOP");

    let mut conn = conn(&redis).await;
    let _h1 = instance(&origin, &redis, "300ms", &feed).start().await;
    let _h2 = instance(&origin, &redis, "300ms", &feed).start().await;
    // Row 1 is theirs to apply at start (the first poll after connecting).
    applied_within(&mut conn, 1, Instant::now()).await;
    let mut latencies = Vec::new();
    for id in 2..=11 {
        insert(id).await;
        let at = Instant::now();
        latencies.push(applied_within(&mut conn, id as u64, at).await);
    }
    report("outbox", &latencies);
    stalled.cli(&["CLIENT", "UNPAUSE"]).expect("unpause");
    w.signal("CONT");
}

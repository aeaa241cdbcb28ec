//! No feed waits for one instance
//! (docs/invalidation.md#no-feed-waits-for-one-instance): with one instance
//! SIGSTOPped while it holds events (a stream entry the consumer group
//! delivered to it, outbox rows it claimed), or with one instance's Redis
//! connections reset before every event (`CLIENT KILL`, a network blip on one
//! host), the other instances apply every event within a bound, on the real
//! binary. Each event is for an object of its own, so its generation key
//! appearing in Redis is the moment the event was applied; the figures (commit
//! (commit → applied) are printed.

use crate::support::postgres::PostgresServer;
use crate::support::redis::RedisServer;
use crate::support::{eventually, Origin, Sidecache, SidecacheBuilder};
use redis::aio::MultiplexedConnection;
use redis::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Far below `claim_idle` (30 s) and the pauses the feeds were first measured
/// with (4 s; docs/invalidation.md#no-feed-waits-for-one-instance); loose
/// enough for a loaded test machine. The printed figures are the result.
pub(crate) const BOUND: Duration = Duration::from_millis(500);
pub(crate) const STREAM: &str = "inv";
pub(crate) const GROUP: &str = "sidecache";

pub(crate) fn gen_key(id: u64) -> String {
    format!("sc:o:{{app:acme:{id}}}:g")
}

pub(crate) fn instance(
    origin: &Origin,
    redis: &RedisServer,
    timeout: &str,
    feed: &str,
) -> SidecacheBuilder {
    instance_at(origin, &redis.url(), timeout, feed)
}

fn instance_at(origin: &Origin, url: &str, timeout: &str, feed: &str) -> SidecacheBuilder {
    SidecacheBuilder::new(origin.url())
        .store(&format!(
            "store:\n  redis:\n    url: \"{url}\"\n    command_timeout: {timeout}\n  breaker:\n    cooldown: 500ms\n"
        ))
        .extra(feed)
}

pub(crate) async fn conn(redis: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(redis.url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection")
}

/// Polls (1 ms) until object `id`'s generation exists; the time it took.
pub(crate) async fn applied_within(
    conn: &mut MultiplexedConnection,
    id: u64,
    since: Instant,
) -> Duration {
    applied_within_bound(conn, id, since, BOUND).await
}

async fn applied_within_bound(
    conn: &mut MultiplexedConnection,
    id: u64,
    since: Instant,
    bound: Duration,
) -> Duration {
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
            since.elapsed() < bound,
            "event for object {id} not applied within {bound:?}: one instance holds it"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

pub(crate) async fn generation(conn: &mut MultiplexedConnection, id: u64) -> Option<String> {
    redis::cmd("GET")
        .arg(gen_key(id))
        .query_async(conn)
        .await
        .expect("GET")
}

pub(crate) fn report(feed: &str, latencies: &[Duration]) {
    let mut ms: Vec<f64> = latencies.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    println!(
        "{feed}: ms p50 {:.1} max {:.1} (n={}) {ms:.1?}",
        ms[ms.len() / 2],
        ms[ms.len() - 1],
        ms.len()
    );
}

/// `XINFO CONSUMERS`: (name, pending, idle ms) per consumer.
pub(crate) fn consumers(redis: &RedisServer) -> Vec<(String, i64, i64)> {
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

pub(crate) fn consumer_of(redis: &RedisServer, sc: &Sidecache) -> Option<(String, i64, i64)> {
    let pid = format!("-{}-", sc.pid());
    consumers(redis).into_iter().find(|c| c.0.contains(&pid))
}

pub(crate) fn xadd(redis: &RedisServer, id: u64) {
    let params = format!(r#"{{"tenant":"acme","id":{id}}}"#);
    redis
        .cli(&["XADD", STREAM, "*", "route", "app", "params", &params])
        .expect("XADD");
}

/// Waits until `w` has just blocked in `XREADGROUP ... BLOCK 5000`: it then
/// stays registered (and soon first in line) for seconds after a stop.
/// Redis 7.0's consumer idle time restarts on a delivery, not on a new
/// blocking read, so entries (objects 2000 on) are added until one was
/// delivered to `w` under 0.3 s ago, `w` acknowledged it, and every group
/// connection is blocked again (`CLIENT LIST`: `w`'s among them).
pub(crate) async fn just_blocked(redis: &RedisServer, w: &Sidecache) {
    let mut warm = 2000;
    eventually(
        "W just blocked in XREADGROUP",
        Duration::from_secs(15),
        || {
            warm += 1;
            xadd(redis, warm);
            async {
                tokio::time::sleep(Duration::from_millis(30)).await;
                consumer_of(redis, w).is_some_and(|c| c.1 == 0 && c.2 < 300)
                    && blocked_group_reads(redis) == consumers(redis).len()
            }
        },
    )
    .await;
}

/// Connections blocked in `XREADGROUP` now.
fn blocked_group_reads(redis: &RedisServer) -> usize {
    let list = match redis.cli(&["CLIENT", "LIST"]) {
        Ok(Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(Value::VerbatimString { text, .. }) => text,
        _ => return 0,
    };
    list.lines()
        .filter(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            fields.contains(&"cmd=xreadgroup")
                && fields
                    .iter()
                    .any(|f| f.strip_prefix("flags=").is_some_and(|v| v.contains('b')))
        })
        .count()
}

/// Three instances on one stream. Instance W is stopped right after it
/// blocked in `XREADGROUP`, so Redis hands the next new entry to it (the
/// longest-blocked consumer of the group) and W holds it, unacknowledged,
/// until it resumes. Entries are added one at a time until W holds one and
/// nine more came after it: each is applied by the others within `BOUND`.
/// When W resumes, its late applications change nothing (marks). W may be
/// one of the two witnesses or not (`tests/it/witness.rs` stops a witness
/// on purpose): either way another instance applies what W holds.
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
    just_blocked(&redis, &w).await;
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
    report(
        "stream, one instance stopped: commit -> applied",
        &latencies,
    );
    let held = consumer_of(&redis, &w).map(|c| c.1);
    assert_eq!(held, Some(1), "the stopped instance holds one entry");

    // Resumed, W applies its entry (and, a witness, its fan-out backlog):
    // all covered.
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
                    &[("source", "stream"), ("outcome", "applied")],
                )
                .await
                    >= 1.0
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
    report(
        "outbox, one instance stopped: commit -> applied",
        &latencies,
    );
    stalled.cli(&["CLIENT", "UNPAUSE"]).expect("unpause");
    w.signal("CONT");
}

/// The bound for the instances whose store works
/// (docs/invalidation.md#an-instance-whose-store-fails-takes-no-events).
const BLIP_BOUND: Duration = Duration::from_millis(50);
const BLIP_EVENTS: u64 = 20;
/// The warm-up event's object (the others are 1..=BLIP_EVENTS).
const WARM: u64 = 1000;

/// Three instances; B connects to Redis as ACL user `blip`, so `CLIENT
/// KILL USER blip` resets all of B's connections (store, near cache,
/// stream) and nobody else's.
async fn blip_fleet(origin: &Origin, redis: &RedisServer, feed: &str) -> [Sidecache; 3] {
    redis
        .cli(&["ACL", "SETUSER", "blip", "on", ">pw", "~*", "&*", "+@all"])
        .expect("ACL SETUSER");
    let blip_url = format!("redis://blip:pw@127.0.0.1:{}/0", redis.port());
    [
        instance_at(origin, &blip_url, "300ms", feed).start().await,
        instance(origin, redis, "300ms", feed).start().await,
        instance(origin, redis, "300ms", feed).start().await,
    ]
}

/// Resets B's connections every `BLIP_EVERY` until dropped, so B's store
/// calls keep failing while events arrive; counts the connections reset.
struct Blipper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

const BLIP_EVERY: Duration = Duration::from_millis(10);

impl Blipper {
    fn start(redis: &RedisServer) -> Blipper {
        let stop = Arc::new(AtomicBool::new(false));
        let client = redis::Client::open(redis.url()).expect("redis url");
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut conn = client.get_connection().expect("blipper connection");
            let mut reset = 0;
            while !stopped.load(Ordering::Relaxed) {
                let n: u64 = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("USER")
                    .arg("blip")
                    .query(&mut conn)
                    .expect("CLIENT KILL USER");
                reset += n;
                std::thread::sleep(BLIP_EVERY);
            }
            reset
        });
        Blipper {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops; the connections reset, which must be some or the test proved
    /// nothing. Prints B's failed invalidations.
    async fn finish(mut self, b: &Sidecache) {
        self.stop.store(true, Ordering::Relaxed);
        let reset = self
            .thread
            .take()
            .map(|t| t.join().expect("blipper thread"))
            .unwrap_or(0);
        let failed = b
            .metric_sum("sidecache_invalidations_total", &[("outcome", "failed")])
            .await;
        println!("blipping instance: {reset} connections reset, {failed} invalidations failed");
        assert!(
            reset >= 1,
            "no connection of the blipping instance was reset"
        );
    }
}

impl Drop for Blipper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Outbox: B's connections are reset right before each commit. Every event
/// is applied by the healthy instances within `BLIP_BOUND`, and every row
/// is deleted soon after: B, whose store fails, takes no rows (without
/// that, B's claims pushed rows at least 500 ms into backoff).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_events_are_applied_while_one_instance_blips() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    pg.execute(&crate::invalidation_binary::ddl()).await;
    let feed = format!(
        "invalidation:\n  outbox:\n    url: \"{}\"\n    poll_interval: 1s\n",
        pg.url()
    );
    let fleet = blip_fleet(&origin, &redis, &feed).await;
    let db = pg.client().await;
    let insert = |id: u64| {
        let db = &db;
        async move {
            db.execute(
                "INSERT INTO sidecache_outbox (route, params) VALUES ('app', jsonb_build_object('tenant', 'acme', 'id', $1::bigint))",
                &[&(id as i64)],
            )
            .await
            .expect("insert outbox row");
        }
    };
    let mut conn = conn(&redis).await;
    insert(WARM).await;
    eventually("the workers are running", Duration::from_secs(15), || {
        let mut conn = conn.clone();
        async move { generation(&mut conn, WARM).await.is_some() }
    })
    .await;

    let (mut latencies, mut deleted) = (Vec::new(), Vec::new());
    let blipper = Blipper::start(&redis);
    for id in 1..=BLIP_EVENTS {
        tokio::time::sleep(BLIP_EVERY * 3).await;
        insert(id).await;
        let at = Instant::now();
        latencies.push(applied_within_bound(&mut conn, id, at, BLIP_BOUND).await);
        loop {
            let left: i64 = db
                .query_one("SELECT count(*) FROM sidecache_outbox", &[])
                .await
                .expect("count")
                .get(0);
            if left == 0 {
                deleted.push(at.elapsed());
                break;
            }
            assert!(
                at.elapsed() < BOUND,
                "row {id} not deleted within {BOUND:?}: a worker that failed it holds it in backoff"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    report(
        "outbox, one instance blipping: commit -> applied",
        &latencies,
    );
    report("outbox, one instance blipping: commit -> deleted", &deleted);
    blipper.finish(&fleet[0]).await;
}

/// Stream: the same with the stream feed; every entry applied by the
/// healthy instances within `BLIP_BOUND`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_entries_are_applied_while_one_instance_blips() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let feed = format!(
        "invalidation:\n  redis_stream:\n    stream: \"{STREAM}\"\n    group: {GROUP}\n    claim_idle: 30s\n"
    );
    let fleet = blip_fleet(&origin, &redis, &feed).await;
    let mut conn = conn(&redis).await;
    eventually(
        "both witnesses' fan-out is reading",
        Duration::from_secs(10),
        || async {
            xadd(&redis, WARM);
            let mut reading = 0;
            for sc in &fleet {
                let fanout = sc
                    .metric_sum(
                        "sidecache_invalidations_total",
                        &[("source", "stream_fanout")],
                    )
                    .await;
                reading += usize::from(fanout >= 1.0);
            }
            reading == 2
        },
    )
    .await;

    let mut latencies = Vec::new();
    let blipper = Blipper::start(&redis);
    for id in 1..=BLIP_EVENTS {
        tokio::time::sleep(BLIP_EVERY * 3).await;
        xadd(&redis, id);
        let at = Instant::now();
        latencies.push(applied_within_bound(&mut conn, id, at, BLIP_BOUND).await);
    }
    report(
        "stream, one instance blipping: commit -> applied",
        &latencies,
    );
    blipper.finish(&fleet[0]).await;
}

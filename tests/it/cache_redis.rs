//! Read-pipeline guarantees that need a real, shared Redis: several
//! sidecache instances (stampede, lease expiry, wait budget, shared negative
//! cache), direct tampering with keys (ABA, corrupt entries), and Redis
//! failures (paused, killed and restarted, writes blocked).

use crate::support::client::x_cache;
use crate::support::redis::RedisServer;
use crate::support::{
    app_routes, client, eventually, get_held, Origin, Reply, Sidecache, SidecacheBuilder,
};
use redis::Value;
use std::time::{Duration, Instant};

const P: &str = "/api/tenants/acme/apps/1";
const OBJECT: &str = "sc:o:{app:acme:1}";

/// An instance on `redis` with the `app` route (`negative_ttl: 2s`) and
/// `route_keys` (e.g. `"lease: 5s\nwait: 5s"`) added to it.
fn builder(redis: &RedisServer, origin: &Origin, route_keys: &str) -> SidecacheBuilder {
    SidecacheBuilder::new(origin.url())
        .routes(&app_routes(&format!("negative_ttl: 2s\n{route_keys}")))
        .store(&format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n  breaker:\n    cooldown: 500ms\n",
            redis.url()
        ))
}

fn keys(redis: &RedisServer, pattern: &str) -> Vec<String> {
    match redis.cli(&["KEYS", pattern]).expect("KEYS") {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|v| match v {
                Value::BulkString(b) => String::from_utf8(b).ok(),
                _ => None,
            })
            .collect(),
        other => panic!("KEYS answered {other:?}"),
    }
}

fn get_raw(redis: &RedisServer, key: &str) -> Option<Vec<u8>> {
    match redis.cli(&["GET", key]).expect("GET") {
        Value::BulkString(b) => Some(b),
        Value::Nil => None,
        other => panic!("GET answered {other:?}"),
    }
}

fn only_key(redis: &RedisServer, pattern: &str) -> String {
    let found = keys(redis, pattern);
    assert_eq!(
        found.len(),
        1,
        "expected one key for {pattern}, found {found:?}"
    );
    found[0].clone()
}

/// Polls until `P` is a HIT again (a GET to refill, then one to check):
/// the store is back and usable.
async fn hits_return(sc: &Sidecache, what: &str) {
    eventually(what, Duration::from_secs(10), || async {
        client::get(&sc.url(P)).await;
        x_cache(&client::get(&sc.url(P)).await) == "HIT"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stampede_across_three_instances_calls_origin_once() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    // The origin answer takes a while so the requests really overlap; the
    // assertion holds for any timing (later arrivals read the published hit).
    origin.reply(
        P,
        Reply::ok("the one answer").delay(Duration::from_millis(300)),
    );
    let extra = "lease: 5s\nwait: 5s";
    let instances = [
        builder(&redis, &origin, extra).start().await,
        builder(&redis, &origin, extra).start().await,
        builder(&redis, &origin, extra).start().await,
    ];
    let mut tasks = Vec::new();
    for i in 0..200 {
        let url = instances[i % 3].url(P);
        tasks.push(tokio::spawn(async move { client::get(&url).await }));
    }
    for t in tasks {
        let r = t.await.expect("request task");
        assert_eq!(
            (r.status.as_u16(), r.text()),
            (200, "the one answer".into())
        );
    }
    assert_eq!(
        origin.hits(P),
        1,
        "200 cold requests over 3 instances -> one origin call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_give_up_after_wait_budget_without_calling_origin() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let extra = "lease: 10s\nwait: 400ms";
    let a = builder(&redis, &origin, extra).start().await;
    let b = builder(&redis, &origin, extra).start().await;
    let (gate, filler) = get_held(&origin, P, a.url(P)).await;
    let started = Instant::now();
    // Five requests on one key: one flight in b, which waits on a's lease.
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let url = b.url(P);
            tokio::spawn(async move { client::get(&url).await })
        })
        .collect();
    for w in waiters {
        let r = w.await.expect("waiter");
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.header("retry-after").as_deref(), Some("1"));
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(400),
        "gave up early: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(3),
        "waited too long: {waited:?}"
    );
    assert_eq!(origin.hits(P), 1, "waiters never call the origin");
    gate.release();
    assert_eq!(filler.await.expect("filler").status, 200);
    assert_eq!(x_cache(&client::get(&b.url(P)).await), "HIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_lets_a_second_filler_in_and_the_first_cannot_harm_it() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let extra = "lease: 2s\nwait: 600ms";
    let a = builder(&redis, &origin, extra).start().await;
    let b = builder(&redis, &origin, extra).start().await;

    let (first_gate, first) = get_held(&origin, P, a.url(P)).await;
    // The lease itself, not the record of what its fill depends on
    // (`l:<variant>:d`).
    let lease_pattern = format!("{OBJECT}:l:{}", "?".repeat(32));
    // A running fill renews its lease, so it cannot simply run out here;
    // lose it the way a failover or an eviction would.
    let first_lease = only_key(&redis, &lease_pattern);
    redis.cli(&["DEL", &first_lease]).expect("DEL");

    let (second_gate, second) = get_held(&origin, P, b.url(P)).await;
    let lease_key = only_key(&redis, &lease_pattern);
    let second_owner = get_raw(&redis, &lease_key).expect("second filler's lease");

    // The first filler's answer arrives late: its publish must be refused
    // and its unlock must leave the second filler's lease alone.
    first_gate.release();
    let r = first.await.expect("first");
    assert_eq!((r.status.as_u16(), x_cache(&r)), (200, "MISS".into()));
    assert_eq!(
        a.metric_sum("sidecache_publish_total", &[("outcome", "lease_lost")])
            .await,
        1.0
    );
    assert_eq!(
        get_raw(&redis, &lease_key),
        Some(second_owner),
        "second lease survives"
    );
    assert!(
        keys(&redis, &format!("{OBJECT}:e:*")).is_empty(),
        "nothing published yet"
    );

    second_gate.release();
    assert_eq!(second.await.expect("second").status, 200);
    assert_eq!(
        b.metric_sum("sidecache_publish_total", &[("outcome", "published")])
            .await,
        1.0
    );
    assert_eq!(x_cache(&client::get(&a.url(P)).await), "HIT");
    assert_eq!(origin.hits(P), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_entries_are_shared_across_instances() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let missing = "/api/tenants/acme/apps/404";
    origin.reply(missing, Reply::status(404));
    let a = builder(&redis, &origin, "").start().await;
    let b = builder(&redis, &origin, "").start().await;
    assert_eq!(x_cache(&client::get(&a.url(missing)).await), "MISS");
    for sc in [&a, &b, &a, &b] {
        let r = client::get(&sc.url(missing)).await;
        assert_eq!((r.status.as_u16(), x_cache(&r)), (404, "NEGATIVE".into()));
    }
    assert_eq!(origin.hits(missing), 1);
    // negative_ttl is 2s: once it passes, exactly one more origin call.
    eventually(
        "the negative entry to expire",
        Duration::from_secs(6),
        || async { x_cache(&client::get(&b.url(missing)).await) == "MISS" },
    )
    .await;
    assert_eq!(origin.hits(missing), 2);
    assert_eq!(x_cache(&client::get(&a.url(missing)).await), "NEGATIVE");
}

/// A `store:` section with the near cache on, `max_age` far beyond any test.
fn near_store(redis: &RedisServer) -> String {
    format!(
        "store:\n  redis:\n    url: \"{}\"\n    near_cache: {{ max_age: 60s }}\n",
        redis.url()
    )
}

/// Two instances with their near caches (max_age far beyond the test): hits
/// on A come from A's memory, and an invalidation made through B reaches A
/// through Redis's push, not through A's entry growing old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_cache_serves_hits_and_follows_another_instances_invalidation() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let store = near_store(&redis);
    let a = builder(&redis, &origin, "").store(&store).start().await;
    let b = builder(&redis, &origin, "").store(&store).start().await;
    // The tracked connection comes up beside the first; until then reads
    // go to Redis and are not kept in memory.
    eventually("A's tracked connection", Duration::from_secs(5), || async {
        a.metric_sum("sidecache_near_cache_tracking", &[]).await == 1.0
    })
    .await;
    assert_eq!(x_cache(&client::get(&a.url(P)).await), "MISS");
    let near_hits = || async {
        a.metric_sum("sidecache_near_cache_total", &[("outcome", "hit")])
            .await
    };
    // The fill's own writes come back as pushes that drop the key; a read
    // that began before the last of them arrived is not kept. So the entry
    // is in memory once a hit came from there, and then every hit does.
    eventually(
        "a first hit from memory",
        Duration::from_secs(5),
        || async {
            let r = client::get(&a.url(P)).await;
            assert_eq!(x_cache(&r), "HIT");
            near_hits().await >= 1.0
        },
    )
    .await;
    let before = near_hits().await;
    for _ in 0..3 {
        let r = client::get(&a.url(P)).await;
        assert_eq!(x_cache(&r), "HIT");
        assert_eq!(r.text(), origin.default_body(P));
    }
    assert_eq!(near_hits().await - before, 3.0, "hits from memory");
    assert_eq!(origin.hits(P), 1);

    origin.reply(P, Reply::ok("version 2"));
    let r = client::request(
        "POST",
        &b.admin_url("/admin/invalidate"),
        &[("content-type", "application/json")],
        r#"{"route":"app","params":{"tenant":"acme","id":"1"}}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    eventually(
        "A to answer the new version",
        Duration::from_secs(2),
        || async { client::get(&a.url(P)).await.text() == "version 2" },
    )
    .await;
    assert_eq!(origin.hits(P), 2);
}

/// An object stays in the near cache past `max_age` for as long as its
/// tracked connection answers heartbeats (each proves no push is missing),
/// and is no longer served from memory once they stop (Redis stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_cache_objects_outlive_max_age_while_heartbeats_are_answered() {
    const MAX_AGE: Duration = Duration::from_secs(1);
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let store = format!(
        "store:\n  redis:\n    url: \"{}\"\n    near_cache: {{ max_age: 1s }}\n",
        redis.url()
    );
    let a = builder(&redis, &origin, "").store(&store).start().await;
    eventually("A's tracked connection", Duration::from_secs(5), || async {
        a.metric_sum("sidecache_near_cache_tracking", &[]).await == 1.0
    })
    .await;
    let near = |outcome: &'static str| {
        let a = &a;
        async move {
            a.metric_sum("sidecache_near_cache_total", &[("outcome", outcome)])
                .await
        }
    };
    assert_eq!(x_cache(&client::get(&a.url(P)).await), "MISS");
    eventually(
        "a first hit from memory",
        Duration::from_secs(5),
        || async {
            assert_eq!(x_cache(&client::get(&a.url(P)).await), "HIT");
            near("hit").await >= 1.0
        },
    )
    .await;
    // Well past max_age since the object was read: still from memory.
    tokio::time::sleep(MAX_AGE * 5 / 2).await;
    let (hits, misses) = (near("hit").await, near("miss").await);
    for _ in 0..3 {
        assert_eq!(x_cache(&client::get(&a.url(P)).await), "HIT");
    }
    assert_eq!(near("hit").await - hits, 3.0, "hits from memory");
    assert_eq!(near("miss").await, misses, "no read went to Redis");

    // Redis stops answering: nothing confirms the object any more.
    redis.stop();
    tokio::time::sleep(MAX_AGE + Duration::from_millis(300)).await;
    let hits = near("hit").await;
    let r = client::get(&a.url(P)).await;
    redis.resume();
    assert_ne!(
        x_cache(&r),
        "HIT",
        "served from memory after max_age unconfirmed"
    );
    assert_eq!(near("hit").await, hits);
    assert_eq!(origin.hits(P), 2, "the degraded read went to the origin");
}

/// Near cache lag (docs/operations.md#near-cache): how long after another
/// writer replaced the generation does an instance still answer from its near
/// cache (the push is in flight)? Eight readers hammer one object on A; 100
/// times, the origin's body changes and the generation is replaced directly in
/// Redis (`lua/invalidate.lua`, as any other instance would). Per trial, the
/// lag is from the script's reply to the start of the last request that still
/// got the old body (0 if none). The figures are printed
/// (docs/operations.md#near-cache); the bound only catches a near cache that
/// stopped following pushes (it would answer the old body until `max_age`, 60 s
/// here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_cache_lag_after_another_writer_invalidates() {
    const TRIALS: usize = 100;
    const READERS: usize = 8;
    const BOUND: Duration = Duration::from_millis(100);
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let store = near_store(&redis);
    let a = builder(&redis, &origin, "").store(&store).start().await;
    eventually("A's tracked connection", Duration::from_secs(5), || async {
        a.metric_sum("sidecache_near_cache_tracking", &[]).await == 1.0
    })
    .await;
    origin.reply(P, Reply::ok("v0"));
    let answers = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(Instant, String)>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let (answers, stop, url) = (answers.clone(), stop.clone(), a.url(P));
        readers.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let start = Instant::now();
                let body = client::get(&url).await.text();
                answers.lock().expect("answers").push((start, body));
            }
        }));
    }
    let script = redis::Script::new(include_str!("../../lua/invalidate.lua"));
    let mut conn = redis::Client::open(redis.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let latest = |version: String| {
        let answers = answers.clone();
        move || {
            let version = version.clone();
            let answers = answers.clone();
            async move {
                answers
                    .lock()
                    .expect("answers")
                    .iter()
                    .rev()
                    .take(READERS)
                    .any(|(_, b)| *b == version)
            }
        }
    };
    eventually("A answers v0", Duration::from_secs(5), latest("v0".into())).await;
    let (mut lags, mut stale) = (Vec::new(), 0);
    for trial in 1..=TRIALS {
        let (old, new) = (format!("v{}", trial - 1), format!("v{trial}"));
        origin.reply(P, Reply::ok(new.clone()));
        answers.lock().expect("answers").clear();
        let _: String = script
            .key(format!("{OBJECT}:g"))
            .arg(format!("lag{trial}"))
            .arg(600_000)
            .invoke_async(&mut conn)
            .await
            .expect("invalidate");
        let replaced = Instant::now();
        eventually(
            "A answers the new body",
            Duration::from_secs(5),
            latest(new),
        )
        .await;
        let after: Vec<Duration> = answers
            .lock()
            .expect("answers")
            .iter()
            .filter(|(start, body)| *start > replaced && *body == old)
            .map(|(start, _)| *start - replaced)
            .collect();
        stale += after.len();
        lags.push(after.into_iter().max().unwrap_or_default());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.await.expect("reader");
    }
    let mut ms: Vec<f64> = lags.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    println!(
        "near cache lag, {READERS} readers: replaced -> last old answer ms p50 {:.2} p99 {:.2} max {:.2}; {stale} old answers in {TRIALS} trials",
        ms[TRIALS / 2],
        ms[TRIALS * 99 / 100],
        ms[TRIALS - 1]
    );
    assert!(
        lags.iter().all(|l| *l < BOUND),
        "an old answer more than {BOUND:?} after the generation was replaced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_generation_between_ticket_and_publish_is_rejected() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = builder(&redis, &origin, "").start().await;
    let (gate, reader) = get_held(&origin, P, sc.url(P)).await;
    let gen_key = format!("{OBJECT}:g");
    assert!(
        get_raw(&redis, &gen_key).is_some(),
        "the ticket created the generation"
    );
    redis.cli(&["DEL", &gen_key]).expect("DEL");
    gate.release();
    assert_eq!(reader.await.expect("reader").status, 200);
    assert_eq!(
        sc.metric_sum(
            "sidecache_publish_total",
            &[("outcome", "publish_rejected")]
        )
        .await,
        1.0
    );
    // ABA: a new ticket recreates the key with a fresh value, never the old one.
    let (gate, reader) = get_held(&origin, P, sc.url(P)).await;
    let ticket = get_raw(&redis, &gen_key).expect("fresh ticket");
    redis.cli(&["DEL", &gen_key]).expect("DEL");
    // Someone else's ticket recreates the key before our publish.
    redis
        .cli(&["SET", &gen_key, "1.2-someone-else"])
        .expect("SET");
    gate.release();
    assert_eq!(reader.await.expect("reader").status, 200);
    assert_eq!(
        sc.metric_sum(
            "sidecache_publish_total",
            &[("outcome", "publish_rejected")]
        )
        .await,
        2.0
    );
    assert_ne!(ticket, b"1.2-someone-else".to_vec());
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "MISS");
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_and_misplaced_entries_are_removed_and_refetched() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = builder(&redis, &origin, "").start().await;
    let other = "/api/tenants/acme/apps/2";
    client::get(&sc.url(P)).await;
    client::get(&sc.url(other)).await;
    let entry = only_key(&redis, &format!("{OBJECT}:e:v3:*"));
    let other_entry = only_key(&redis, "sc:o:{app:acme:2}:e:v3:*");

    redis.cli(&["SET", &entry, "garbage"]).expect("SET");
    let r = client::get(&sc.url(P)).await;
    assert_eq!(
        (x_cache(&r), r.text()),
        ("MISS".into(), origin.default_body(P))
    );
    assert_eq!(
        sc.metric_sum("sidecache_corrupt_entries_total", &[]).await,
        1.0
    );
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");

    // An entry copied under another object's key (its identity does not
    // match) is never served as that object.
    let bytes = get_raw(&redis, &entry).expect("entry");
    redis
        .cli(&[
            "SET",
            &other_entry,
            std::str::from_utf8(&bytes).unwrap_or("x"),
        ])
        .expect("SET");
    let r = client::get(&sc.url(other)).await;
    assert_eq!(
        (x_cache(&r), r.text()),
        ("MISS".into(), origin.default_body(other))
    );
    assert_eq!(
        sc.metric_sum("sidecache_corrupt_entries_total", &[]).await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_publish_returns_the_answer_without_a_second_upstream_call() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = builder(&redis, &origin, "").start().await;
    let (gate, reader) = get_held(&origin, P, sc.url(P)).await;
    // Scripts (publish, unlock) block while writes are paused.
    redis
        .cli(&["CLIENT", "PAUSE", "2000", "WRITE"])
        .expect("CLIENT PAUSE");
    let released = Instant::now();
    gate.release();
    let r = reader.await.expect("reader");
    assert_eq!((r.status.as_u16(), r.text()), (200, origin.default_body(P)));
    assert!(
        released.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        released.elapsed()
    );
    assert_eq!(
        sc.metric_sum("sidecache_publish_total", &[("outcome", "write_failure")])
            .await,
        1.0
    );
    assert_eq!(origin.hits(P), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_bounds_upstream_concurrency_and_recovers() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let paths: Vec<String> = (1..=48)
        .map(|i| format!("/api/tenants/acme/apps/{i}"))
        .collect();
    for p in &paths {
        origin.reply(
            p,
            Reply::ok(format!("app {p}")).delay(Duration::from_millis(300)),
        );
    }
    let sc = builder(&redis, &origin, "")
        .fill("fill:\n  max_concurrency: 8\n")
        .start()
        .await;
    // Warm the connection and the script cache.
    assert_eq!(
        client::get(&sc.url("/api/tenants/acme/apps/999"))
            .await
            .status,
        200
    );
    origin.reset_counts();

    redis
        .cli(&["CLIENT", "PAUSE", "3000", "ALL"])
        .expect("CLIENT PAUSE");
    let mut tasks = Vec::new();
    for p in &paths {
        let url = sc.url(p);
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let r = client::get(&url).await;
            (r.status.as_u16(), x_cache(&r), t.elapsed())
        }));
    }
    let mut ok = 0;
    let mut busy = 0;
    for t in tasks {
        let (status, cache, took) = t.await.expect("task");
        // command_timeout (300ms) + origin (300ms) + scheduling slack.
        assert!(
            took < Duration::from_millis(1500),
            "a request took {took:?}"
        );
        match status {
            200 => {
                assert_eq!(cache, "DEGRADED");
                ok += 1;
            }
            503 => busy += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(
        origin.max_concurrency() <= 8,
        "origin saw {} at once",
        origin.max_concurrency()
    );
    assert!(ok >= 1 && ok + busy == 48, "ok {ok}, busy {busy}");
    assert_eq!(sc.metric_sum("sidecache_breaker_open", &[]).await, 1.0);

    // After the pause the breaker's probe closes it and hits come back.
    hits_return(&sc, "HITs to return after the pause").await;
    assert_eq!(sc.metric_sum("sidecache_breaker_open", &[]).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_degrades_then_recovers_with_scripts_reloaded() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = builder(&redis, &origin, "").start().await;
    client::get(&sc.url(P)).await;
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");

    redis.kill();
    // Until sidecache notices the closed connection, the near cache may
    // still answer (nothing can change in a dead Redis); noticing takes
    // one event-loop turn, not a timeout.
    eventually(
        "the near cache to drop its connection",
        Duration::from_secs(1),
        || async { sc.metric_sum("sidecache_near_cache_tracking", &[]).await == 0.0 },
    )
    .await;
    for _ in 0..3 {
        let t = Instant::now();
        let r = client::get(&sc.url(P)).await;
        assert_eq!((r.status.as_u16(), x_cache(&r)), (200, "DEGRADED".into()));
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "degraded answer took {:?}",
            t.elapsed()
        );
    }

    // A restarted server has an empty script cache: EVALSHA gets NOSCRIPT
    // and the scripts are loaded again, transparently.
    redis.restart();
    hits_return(&sc, "MISS then HIT after the restart").await;
}

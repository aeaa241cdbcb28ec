//! The Bloom filter (docs/architecture.md#bloom-filter): builds, growth and the
//! three answers, in process against both stores (the builder with a
//! controllable id source), and over HTTP against the real binary sharing a
//! real Redis with an in-process builder (stage 4: `X-Cache: BLOOM`, no origin
//! call).
//!
//! The membership database is replaced by `IdSource` implementations here;
//! the Postgres source, growth through the outbox and a build killed
//! mid-way run against a private Postgres in `bloom_postgres`.

use crate::support::redis::RedisServer;
use crate::support::{app_routes, client, eventually, Origin, Sidecache, SidecacheBuilder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sidecache::bloom::{
    Blooms, BoxFuture, BuildOutcome, IdSource, IdStream, SourceError, StaticSource,
};
use sidecache::config::{Config, RedisConfig, RedisTarget, Route};
use sidecache::metrics::Metrics;
use sidecache::store::{BloomAnswer, GuardedStore, MemoryStore, RedisStore, Store};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn routes(capacity: u64, fp_rate: f64) -> String {
    app_routes(&format!(
        r#"bloom:
  scope: "{{tenant}}"
  source: "SELECT id::text FROM apps WHERE tenant = $1"
  capacity: {capacity}
  fp_rate: {fp_rate}
  rebuild_every: 10m"#
    ))
}

fn config(capacity: u64, fp_rate: f64) -> Arc<Config> {
    let text = format!(
        "version: 1\nlisten: 127.0.0.1:1\nadmin:\n  listen: 127.0.0.1:2\nupstream:\n  url: http://127.0.0.1:3\n{}",
        routes(capacity, fp_rate)
    );
    Arc::new(Config::parse(&text, &|_| None).expect("valid config"))
}

fn route(cfg: &Config) -> Arc<Route> {
    cfg.routes.find("app").expect("route app").clone()
}

fn memory_store() -> Arc<GuardedStore> {
    guarded(Arc::new(MemoryStore::new()), None)
}

fn redis_store(server: &RedisServer) -> Arc<GuardedStore> {
    let cfg = RedisConfig {
        target: RedisTarget::Single(server.url()),
        command_timeout: Duration::from_secs(2),
        near_cache: None,
        tls: None,
        replicas_ack: None,
    };
    let store =
        RedisStore::connect(&cfg, Duration::from_secs(1), &Metrics::new()).expect("redis store");
    guarded(Arc::new(store), Some(Duration::from_secs(2)))
}

fn guarded(store: Arc<dyn Store>, timeout: Option<Duration>) -> Arc<GuardedStore> {
    Arc::new(GuardedStore::new(
        store,
        timeout,
        Duration::from_millis(200),
        &Metrics::new(),
    ))
}

async fn answer(blooms: &Arc<Blooms>, cfg: &Arc<Config>, tenant: &str, id: &str) -> BloomAnswer {
    let route = route(cfg);
    let bloom = route.bloom.clone().expect("bloom");
    blooms
        .check(cfg, &route, &bloom, &[tenant.to_owned(), id.to_owned()])
        .await
        .expect("check")
}

fn ids(range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| i.to_string()).collect()
}

// ---------------------------------------------------------------------------
// In process.
// ---------------------------------------------------------------------------

/// 10 000 members at fp_rate 0.01; 10 000 absent ids: the measured false-
/// positive rate is within 1.5x of the target, and every member answers
/// maybe. Run on both stores (same bitmaps, same answers).
async fn fp_rate_within_target(store: Arc<GuardedStore>) -> f64 {
    let cfg = config(10_000, 0.01);
    let source = StaticSource::new();
    source.set("acme", ids(1..10_001));
    let blooms = Blooms::new(store, Some(source), &prometheus::Registry::new());
    let outcome = blooms.rebuild(&cfg, &route(&cfg), "acme").await.unwrap();
    assert_eq!(outcome, BuildOutcome::Activated { members: 10_000 });
    for id in ids(1..10_001) {
        assert_eq!(answer(&blooms, &cfg, "acme", &id).await, BloomAnswer::Maybe);
    }
    let mut passed = 0;
    for id in ids(1_000_000..1_010_000) {
        match answer(&blooms, &cfg, "acme", &id).await {
            BloomAnswer::Maybe => passed += 1,
            BloomAnswer::Absent => {}
            BloomAnswer::Unknown => panic!("unknown after activation"),
        }
    }
    let rate = passed as f64 / 10_000.0;
    eprintln!("measured false-positive rate: {rate:.4} (target 0.01)");
    assert!(rate <= 0.015, "false-positive rate {rate}");
    rate
}

#[tokio::test]
async fn memory_false_positive_rate_within_target() {
    fp_rate_within_target(memory_store()).await;
}

#[tokio::test]
async fn redis_false_positive_rate_within_target() {
    let server = RedisServer::start();
    fp_rate_within_target(redis_store(&server)).await;
}

#[tokio::test]
async fn capacity_exceeded_makes_the_filter_unknown_and_counts() {
    let cfg = config(10, 0.01);
    let source = StaticSource::new();
    source.set("acme", ids(1..11));
    let registry = prometheus::Registry::new();
    let blooms = Blooms::new(memory_store(), Some(source.clone()), &registry);
    let r = route(&cfg);
    assert_eq!(
        blooms.rebuild(&cfg, &r, "acme").await.unwrap(),
        BuildOutcome::Activated { members: 10 }
    );
    assert_eq!(
        answer(&blooms, &cfg, "acme", "99").await,
        BloomAnswer::Absent
    );
    source.push("acme", "11");
    assert_eq!(
        blooms.rebuild(&cfg, &r, "acme").await.unwrap(),
        BuildOutcome::CapacityExceeded { members: 11 }
    );
    // Unknown, never absent: the request takes the normal path.
    assert_eq!(
        answer(&blooms, &cfg, "acme", "99").await,
        BloomAnswer::Unknown
    );
    assert_eq!(
        answer(&blooms, &cfg, "acme", "11").await,
        BloomAnswer::Unknown
    );
    let m = blooms.metrics();
    assert_eq!(
        m.builds
            .with_label_values(&["app", "capacity_exceeded"])
            .get(),
        1
    );
    assert_eq!(m.state.with_label_values(&["app", "acme"]).get(), 0);
}

#[tokio::test]
async fn signature_change_answers_unknown_until_rebuilt() {
    let cfg = config(100, 0.01);
    let source = StaticSource::new();
    source.set("acme", ids(1..50));
    let blooms = Blooms::new(memory_store(), Some(source), &prometheus::Registry::new());
    blooms.rebuild(&cfg, &route(&cfg), "acme").await.unwrap();
    assert_eq!(
        answer(&blooms, &cfg, "acme", "999").await,
        BloomAnswer::Absent
    );
    // Capacity changed in the config: other m, other signature.
    let bigger = config(1000, 0.01);
    assert_eq!(
        answer(&blooms, &bigger, "acme", "999").await,
        BloomAnswer::Unknown
    );
    blooms
        .rebuild(&bigger, &route(&bigger), "acme")
        .await
        .unwrap();
    assert_eq!(
        answer(&blooms, &bigger, "acme", "999").await,
        BloomAnswer::Absent
    );
    assert_eq!(
        answer(&blooms, &bigger, "acme", "7").await,
        BloomAnswer::Maybe
    );
}

#[tokio::test]
async fn missing_source_fails_the_build_and_leaves_unknown() {
    let cfg = config(100, 0.01);
    let blooms = Blooms::new(memory_store(), None, &prometheus::Registry::new());
    assert!(blooms.rebuild(&cfg, &route(&cfg), "acme").await.is_err());
    assert_eq!(
        answer(&blooms, &cfg, "acme", "1").await,
        BloomAnswer::Unknown
    );
}

/// The unknown answer for an unbuilt scope starts a build in the
/// background; the filter becomes ready without any explicit rebuild.
#[tokio::test]
async fn first_unknown_check_builds_the_scope_lazily() {
    let cfg = config(100, 0.01);
    let source = StaticSource::new();
    source.set("lazy", ids(1..10));
    let blooms = Blooms::new(memory_store(), Some(source), &prometheus::Registry::new());
    assert_eq!(
        answer(&blooms, &cfg, "lazy", "5").await,
        BloomAnswer::Unknown
    );
    let b = blooms.clone();
    let c = cfg.clone();
    eventually("lazy build activates", Duration::from_secs(5), move || {
        let (b, c) = (b.clone(), c.clone());
        async move { answer(&b, &c, "lazy", "500").await == BloomAnswer::Absent }
    })
    .await;
    assert_eq!(answer(&blooms, &cfg, "lazy", "5").await, BloomAnswer::Maybe);
}

/// A catalogue whose queries are counted and held at a gate until the test
/// releases them: a build in progress for as long as the test wants.
struct GatedCatalogue {
    ids: Vec<String>,
    queries: std::sync::atomic::AtomicUsize,
    gate: tokio::sync::Semaphore,
}

impl IdSource for GatedCatalogue {
    fn ids<'a>(
        &'a self,
        _sql: &'a str,
        _scope: &'a str,
    ) -> BoxFuture<'a, Result<IdStream, SourceError>> {
        self.queries
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            use futures_util::StreamExt;
            let _pass = self.gate.acquire().await;
            let ids = self.ids.clone();
            Ok(futures_util::stream::iter(ids.into_iter().map(Ok)).boxed())
        })
    }
}

/// Three instances (their own `Blooms` and Redis connections, one Redis)
/// over one catalogue (ids 1..10) whose gate starts with `permits`.
fn gated_fleet(server: &RedisServer, permits: usize) -> (Arc<GatedCatalogue>, Vec<Arc<Blooms>>) {
    let catalogue = Arc::new(GatedCatalogue {
        ids: ids(1..10),
        queries: Default::default(),
        gate: tokio::sync::Semaphore::new(permits),
    });
    let fleet = (0..3)
        .map(|_| {
            let source: Arc<dyn IdSource> = catalogue.clone();
            Blooms::new(
                redis_store(server),
                Some(source),
                &prometheus::Registry::new(),
            )
        })
        .collect();
    (catalogue, fleet)
}

/// Redis calls per command since `CONFIG RESETSTAT` (commands run inside
/// scripts count too), without background noise (heartbeat `PING`s) and
/// the test's own `INFO`/`CONFIG`.
fn commands_since_reset(server: &RedisServer) -> Vec<(String, u64)> {
    let Ok(redis::Value::BulkString(info)) = server.cli(&["INFO", "commandstats"]) else {
        panic!("INFO commandstats");
    };
    let mut calls: Vec<(String, u64)> = String::from_utf8_lossy(&info)
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(":calls=")?;
            let n = rest.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), n))
        })
        .filter(|(name, _)| {
            !matches!(name.as_str(), "ping" | "info") && !name.starts_with("config")
        })
        .collect();
    calls.sort();
    calls
}

/// Fleet-wide builds (docs/bloom.md#fleet-wide-rebuilds): three instances
/// (their own `Blooms` and Redis connections, one Redis) see a scope for the
/// first time, as after a restart. Exactly one runs the source query; the
/// others lose the build race (`busy`), and a loser's attempt costs one Redis
/// command and no source query. Until the winner activates, every instance
/// answers unknown (the request goes on to the origin, never a 404), then
/// absent and maybe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_race_losers_cost_one_redis_command_and_no_source_query() {
    let server = RedisServer::start();
    let cfg = config(100, 0.01);
    let route = route(&cfg);
    let (catalogue, fleet) = gated_fleet(&server, 0);
    let busy = |fleet: &[Arc<Blooms>]| -> u64 {
        fleet
            .iter()
            .map(|b| b.metrics().builds.with_label_values(&["app", "busy"]).get())
            .sum()
    };
    for blooms in &fleet {
        assert_eq!(
            answer(blooms, &cfg, "fresh", "5").await,
            BloomAnswer::Unknown
        );
    }
    eventually(
        "one build runs its query, two lost the race",
        Duration::from_secs(5),
        || async { busy(&fleet) == 2 },
    )
    .await;
    let queries = || catalogue.queries.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(queries(), 1, "only the winner queries the source");

    // A loser's attempt, alone on the wire while the winner is held.
    server
        .cli(&["CONFIG", "RESETSTAT"])
        .expect("CONFIG RESETSTAT");
    for loser in &fleet {
        let outcome = loser.rebuild(&cfg, &route, "fresh").await;
        if matches!(outcome, Ok(BuildOutcome::Busy)) {
            continue;
        }
        panic!("a second build while the first holds the lock: {outcome:?}");
    }
    // One EVALSHA of `bloom_begin.lua` per losing instance (its refused
    // `SET NX` counted inside it); the instance that is building knows it
    // and answers busy without a command.
    assert_eq!(
        commands_since_reset(&server),
        [("evalsha".to_owned(), 2), ("set".to_owned(), 2)],
        "one command per losing attempt"
    );
    assert_eq!(queries(), 1, "losers never query the source");
    for blooms in &fleet {
        for id in ["5", "500"] {
            assert_eq!(
                answer(blooms, &cfg, "fresh", id).await,
                BloomAnswer::Unknown,
                "unknown while the first build runs"
            );
        }
    }

    catalogue.gate.add_permits(10);
    for blooms in &fleet {
        let (b, c) = (blooms.clone(), cfg.clone());
        eventually(
            "the filter answers for everyone",
            Duration::from_secs(5),
            move || {
                let (b, c) = (b.clone(), c.clone());
                async move { answer(&b, &c, "fresh", "500").await == BloomAnswer::Absent }
            },
        )
        .await;
        assert_eq!(answer(blooms, &cfg, "fresh", "5").await, BloomAnswer::Maybe);
    }
    assert_eq!(queries(), 1, "one source query for the scope, fleet-wide");
}

/// Fleet-wide rebuilds (docs/bloom.md#fleet-wide-rebuilds): scheduled rebuilds
/// come due on every instance that tracks the scope, once per `rebuild_every`;
/// the first to claim the interval builds, the others take `busy` for one Redis
/// command (`SET NX`) and no source query. A claim whose build failed is given
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_rebuilds_run_once_per_interval_fleet_wide() {
    let server = RedisServer::start();
    let cfg = config(100, 0.01);
    let route = route(&cfg);
    let (catalogue, fleet) = gated_fleet(&server, 100);
    let queries = || catalogue.queries.load(std::sync::atomic::Ordering::SeqCst);
    let due = |b: &Arc<Blooms>| {
        let (b, cfg, route) = (b.clone(), cfg.clone(), route.clone());
        async move { b.rebuild_due(&cfg, &route, "acme").await.expect("build") }
    };
    assert!(matches!(
        due(&fleet[0]).await,
        BuildOutcome::Activated { .. }
    ));
    server
        .cli(&["CONFIG", "RESETSTAT"])
        .expect("CONFIG RESETSTAT");
    assert_eq!(due(&fleet[1]).await, BuildOutcome::Busy);
    assert_eq!(due(&fleet[2]).await, BuildOutcome::Busy);
    assert_eq!(
        commands_since_reset(&server),
        [("set".to_owned(), 2)],
        "one SET NX per instance that found the interval claimed"
    );
    assert_eq!(queries(), 1, "one source query per interval");

    // The interval passes: the next instance due builds.
    server
        .cli(&["DEL", "sc:b:{app:acme}:built"])
        .expect("DEL the interval claim");
    assert!(matches!(
        due(&fleet[1]).await,
        BuildOutcome::Activated { .. }
    ));
    assert_eq!(due(&fleet[2]).await, BuildOutcome::Busy);
    assert_eq!(queries(), 2);
}

/// A catalogue in "the database": creates commit here first, then their
/// event is applied (`add_member`), as with an outbox. Reads are snapshots
/// streamed slowly, so creates land in the middle of builds.
struct SlowCatalogue {
    ids: Mutex<Vec<String>>,
}

impl IdSource for SlowCatalogue {
    fn ids<'a>(
        &'a self,
        _sql: &'a str,
        _scope: &'a str,
    ) -> BoxFuture<'a, Result<IdStream, SourceError>> {
        let snapshot = self.ids.lock().unwrap().clone();
        Box::pin(async move {
            use futures_util::StreamExt;
            let s = futures_util::stream::iter(snapshot.into_iter().enumerate()).then(
                |(i, id)| async move {
                    if i % 64 == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Ok(id)
                },
            );
            Ok(s.boxed())
        })
    }
}

/// Property: random catalogues, random creates applied concurrently with
/// repeated rebuilds; every id whose create was applied answers maybe at
/// every moment (no false negatives), before, during and after builds.
async fn no_false_negatives_under_concurrent_creates(store: Arc<GuardedStore>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let cfg = config(5_000, 0.01);
    let r = route(&cfg);
    let initial: Vec<String> = (0..rng.random_range(100..2_000))
        .map(|_| rng.random_range(1..1_000_000_000u64).to_string())
        .collect();
    let catalogue = Arc::new(SlowCatalogue {
        ids: Mutex::new(initial.clone()),
    });
    let blooms = Blooms::new(store, Some(catalogue.clone()), &prometheus::Registry::new());
    assert!(matches!(
        blooms.rebuild(&cfg, &r, "t").await.unwrap(),
        BuildOutcome::Activated { .. }
    ));
    let applied = Arc::new(Mutex::new(initial));

    let creator = {
        let (blooms, cfg, r, catalogue, applied) = (
            blooms.clone(),
            cfg.clone(),
            r.clone(),
            catalogue.clone(),
            applied.clone(),
        );
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        tokio::spawn(async move {
            for _ in 0..300 {
                let id = rng.random_range(1..1_000_000_000u64).to_string();
                catalogue.ids.lock().unwrap().push(id.clone()); // commit
                blooms.add_member(&cfg, &r, "t", &id).await.unwrap(); // event applied
                applied.lock().unwrap().push(id);
                if rng.random_bool(0.3) {
                    tokio::time::sleep(Duration::from_micros(rng.random_range(0..500))).await;
                }
            }
        })
    };
    let rebuilder = {
        let (blooms, cfg, r) = (blooms.clone(), cfg.clone(), r.clone());
        tokio::spawn(async move {
            let mut activated = 0;
            for _ in 0..8 {
                if let Ok(BuildOutcome::Activated { .. }) = blooms.rebuild(&cfg, &r, "t").await {
                    activated += 1;
                }
            }
            activated
        })
    };
    let mut checks = 0u64;
    while !creator.is_finished() || !rebuilder.is_finished() {
        let sample: Vec<String> = {
            let a = applied.lock().unwrap();
            (0..20)
                .map(|_| a[rng.random_range(0..a.len())].clone())
                .collect()
        };
        for id in sample {
            let got = answer(&blooms, &cfg, "t", &id).await;
            assert_eq!(
                got,
                BloomAnswer::Maybe,
                "false negative for applied id {id}"
            );
            checks += 1;
        }
        tokio::task::yield_now().await;
    }
    creator.await.unwrap();
    assert!(rebuilder.await.unwrap() >= 1);
    let all = applied.lock().unwrap().clone();
    for id in &all {
        assert_eq!(
            answer(&blooms, &cfg, "t", id).await,
            BloomAnswer::Maybe,
            "{id}"
        );
    }
    assert!(checks > 100, "only {checks} checks ran during the race");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_no_false_negatives_under_concurrent_creates() {
    for seed in 1..=3 {
        no_false_negatives_under_concurrent_creates(memory_store(), seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_no_false_negatives_under_concurrent_creates() {
    let server = RedisServer::start();
    for seed in 1..=2 {
        server.cli(&["FLUSHALL"]).unwrap();
        no_false_negatives_under_concurrent_creates(redis_store(&server), seed).await;
    }
}

// ---------------------------------------------------------------------------
// Over HTTP, the real binary: stage 4.
// ---------------------------------------------------------------------------

fn xcache(r: &client::Resp) -> String {
    r.header("x-cache").unwrap_or_default()
}

async fn start(redis: &RedisServer, origin: &Origin, capacity: u64) -> Sidecache {
    SidecacheBuilder::new(origin.url())
        .routes(&routes(capacity, 0.01))
        .store(&format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n  breaker:\n    cooldown: 500ms\n",
            redis.url()
        ))
        .start()
        .await
}

/// The running instance's config and route, and a Bloom manager of the
/// test's own (the binary has no membership source) whose source lists
/// tenant `acme`'s ids 1..100.
fn acme_blooms(redis: &RedisServer, sc: &Sidecache) -> (Arc<Config>, Arc<Route>, Arc<Blooms>) {
    let cfg = Arc::new(Config::parse(&sc.builder().render(), &|_| None).unwrap());
    let r = route(&cfg);
    let source = StaticSource::new();
    source.set("acme", ids(1..100));
    let blooms = Blooms::new(
        redis_store(redis),
        Some(source),
        &prometheus::Registry::new(),
    );
    (cfg, r, blooms)
}

fn path(tenant: &str, id: &str) -> String {
    format!("/api/tenants/{tenant}/apps/{id}")
}

/// Absent ids are answered 404 BLOOM without touching the origin; members,
/// members added after the build, unbuilt scopes, a deleted `ready` and a
/// changed signature all take the normal path (never a 404 from the filter).
#[tokio::test]
async fn http_stage_four_rejects_only_certainly_absent_ids() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = start(&redis, &origin, 1000).await;
    let (cfg, r, blooms) = acme_blooms(&redis, &sc);

    // Not built yet: unknown -> origin (the binary has no source to build).
    let resp = client::get(&sc.url(&path("acme", "5000"))).await;
    assert_eq!(xcache(&resp), "MISS");
    assert_eq!(origin.hits(&path("acme", "5000")), 1);

    assert_eq!(
        blooms.rebuild(&cfg, &r, "acme").await.unwrap(),
        BuildOutcome::Activated { members: 99 }
    );
    // Certainly absent: 404 BLOOM, zero origin calls.
    for id in ["5001", "5002", "5003"] {
        let resp = client::get(&sc.url(&path("acme", id))).await;
        assert_eq!(resp.status, 404, "{id}");
        assert_eq!(xcache(&resp), "BLOOM");
        assert_eq!(resp.text(), "not found\n");
        assert_eq!(origin.hits(&path("acme", id)), 0);
    }
    let resp = client::head(&sc.url(&path("acme", "5004"))).await;
    assert_eq!(
        (resp.status.as_u16(), xcache(&resp).as_str()),
        (404, "BLOOM")
    );
    assert!(resp.body.is_empty());
    // Members pass.
    let resp = client::get(&sc.url(&path("acme", "42"))).await;
    assert_eq!(
        (resp.status.as_u16(), xcache(&resp).as_str()),
        (200, "MISS")
    );
    // Created after the build, event applied: never rejected.
    blooms.add_member(&cfg, &r, "acme", "777").await.unwrap();
    let resp = client::get(&sc.url(&path("acme", "777"))).await;
    assert_eq!(
        (resp.status.as_u16(), xcache(&resp).as_str()),
        (200, "MISS")
    );
    // Another tenant has no filter: unknown.
    let resp = client::get(&sc.url(&path("zeta", "5001"))).await;
    assert_eq!(xcache(&resp), "MISS");

    // ready deleted: unknown -> origin.
    redis.cli(&["DEL", "sc:b:{app:acme}:ready"]).unwrap();
    let resp = client::get(&sc.url(&path("acme", "5005"))).await;
    assert_eq!(xcache(&resp), "MISS");
    assert_eq!(origin.hits(&path("acme", "5005")), 1);
    // Bitmap deleted (ready back): unknown too.
    blooms.rebuild(&cfg, &r, "acme").await.unwrap();
    redis.cli(&["DEL", "sc:b:{app:acme}:bits"]).unwrap();
    let resp = client::get(&sc.url(&path("acme", "5006"))).await;
    assert_eq!(xcache(&resp), "MISS");

    // Signature change by config reload (capacity): unknown -> origin.
    blooms.rebuild(&cfg, &r, "acme").await.unwrap();
    let resp = client::get(&sc.url(&path("acme", "5007"))).await;
    assert_eq!(xcache(&resp), "BLOOM");
    sc.rewrite_config(&sc.builder().routes(&routes(2000, 0.01)).render());
    eventually("reload applied", Duration::from_secs(10), || async {
        sc.metric("sidecache_config_reloads_total{outcome=\"applied\"}")
            .await
            .unwrap_or(0.0)
            >= 1.0
    })
    .await;
    let resp = client::get(&sc.url(&path("acme", "5008"))).await;
    assert_eq!(xcache(&resp), "MISS");

    let rejected = sc
        .metric("sidecache_requests_total{result=\"BLOOM\",route=\"app\"}")
        .await;
    assert_eq!(rejected, Some(5.0));
    let text = sc.metrics().await;
    assert!(
        text.contains("sidecache_bloom_checks_total{result=\"reject\",route=\"app\"} 5"),
        "{text}"
    );
    assert!(
        text.contains("sidecache_bloom_state{route=\"app\",scope=\"acme\"}"),
        "{text}"
    );
}

/// Every `create` event grows the filter (docs/bloom.md#growth), whatever its
/// source; a `create` through `POST /admin/invalidate` too (it goes through the
/// same invalidator as the outbox and the stream), while an `invalidate` event
/// does not add the id.
#[tokio::test]
async fn http_admin_create_event_adds_the_id_to_the_filter() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = start(&redis, &origin, 1000).await;
    let (cfg, r, blooms) = acme_blooms(&redis, &sc);
    blooms.rebuild(&cfg, &r, "acme").await.unwrap();
    let event = |kind: &str, id: &str| {
        format!(r#"{{"route":"app","params":{{"tenant":"acme","id":"{id}"}},"kind":"{kind}"}}"#)
    };

    let resp = client::post(
        &sc.admin_url("/admin/invalidate"),
        event("invalidate", "901"),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let resp = client::get(&sc.url(&path("acme", "901"))).await;
    assert_eq!(xcache(&resp), "BLOOM", "an invalidate event adds nothing");

    let resp = client::post(&sc.admin_url("/admin/invalidate"), event("create", "902")).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let resp = client::get(&sc.url(&path("acme", "902"))).await;
    assert_eq!(
        (resp.status.as_u16(), xcache(&resp).as_str()),
        (200, "MISS")
    );
    assert_eq!(origin.hits(&path("acme", "902")), 1);
    assert_eq!(
        sc.metric("sidecache_bloom_adds_total{outcome=\"applied\",route=\"app\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        sc.metric(
            "sidecache_invalidations_total{kind=\"object\",outcome=\"applied\",source=\"admin\"}"
        )
        .await,
        Some(2.0)
    );
}

/// Redis restarted (empty): every filter is unknown and requests reach the
/// origin; nothing is rejected.
#[tokio::test]
async fn http_redis_restart_makes_filters_unknown_never_rejecting() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = start(&redis, &origin, 1000).await;
    let cfg = Arc::new(Config::parse(&sc.builder().render(), &|_| None).unwrap());
    let source = StaticSource::new();
    source.set("acme", ids(1..10));
    let blooms = Blooms::new(
        redis_store(&redis),
        Some(source),
        &prometheus::Registry::new(),
    );
    blooms.rebuild(&cfg, &route(&cfg), "acme").await.unwrap();
    let resp = client::get(&sc.url(&path("acme", "900"))).await;
    assert_eq!(xcache(&resp), "BLOOM");

    redis.kill();
    redis.restart();
    eventually(
        "requests served again after the restart",
        Duration::from_secs(10),
        || async {
            let resp = client::get(&sc.url(&path("acme", "901"))).await;
            resp.status.as_u16() == 200 && xcache(&resp) == "MISS"
        },
    )
    .await;
    let resp = client::get(&sc.url(&path("acme", "902"))).await;
    assert_eq!(
        (resp.status.as_u16(), xcache(&resp).as_str()),
        (200, "MISS")
    );
}

/// `POST /admin/bloom/{route}/rebuild`: input checks, and without a
/// membership source (no `invalidation.outbox`) the build fails with 503
/// and leaves the filter unknown.
#[tokio::test]
async fn admin_rebuild_endpoint() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = start(&redis, &origin, 1000).await;
    let post = |p: &str| {
        let url = sc.admin_url(p);
        async move { client::post(&url, "").await }
    };
    assert_eq!(post("/admin/bloom/nope/rebuild?scope=a").await.status, 404);
    assert_eq!(post("/admin/bloom/app/rebuild").await.status, 400);
    let resp = post("/admin/bloom/app/rebuild?scope=acme").await;
    assert_eq!(resp.status, 503);
    assert!(
        resp.text().contains("no membership source"),
        "{}",
        resp.text()
    );
    let resp = client::get(&sc.url(&path("acme", "1"))).await;
    assert_eq!(xcache(&resp), "MISS");
}

//! Serving stale safely (docs/caching.md#serving-stale): `grace`
//! (stale-while-revalidate) and `stale_if_error`, on a real Redis, with
//! `ttl: 1s` and no jitter. Expiry is awaited by polling for the answer that
//! shows it (`STALE`), never by a sleep. The rule under test everywhere: an
//! expired entry may answer only while it carries the object's current
//! generation.

use crate::cache::invalidate;
use crate::support::client::{self, x_cache};
use crate::support::redis::RedisServer;
use crate::support::{app_routes, eventually, Origin, Reply, Sidecache, SidecacheBuilder};
use std::time::Duration;

const P: &str = "/api/tenants/acme/apps/1";
const OBJECT: &str = "sc:o:{app:acme:1}";
const PARAMS: &str = r#"{"tenant":"acme","id":"1"}"#;

/// An instance on `redis` with the `app` route at `ttl: 1s` plus `route_keys`.
fn builder(redis: &RedisServer, origin: &Origin, route_keys: &str) -> SidecacheBuilder {
    SidecacheBuilder::new(origin.url())
        .routes(&app_routes(route_keys).replace("ttl: 60s", "ttl: 1s"))
        .store(&format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n  breaker:\n    cooldown: 500ms\n",
            redis.url()
        ))
}

/// Fills `P` and checks it is a HIT with `body`.
async fn fill(sc: &Sidecache, body: &str) {
    let r = client::get(&sc.url(P)).await;
    assert_eq!((x_cache(&r), r.text()), ("MISS".into(), body.to_owned()));
    let r = client::get(&sc.url(P)).await;
    assert_eq!((x_cache(&r), r.text()), ("HIT".into(), body.to_owned()));
}

/// One instance on its own Redis with `route_keys` on the route, and `P`
/// filled (MISS, then HIT) with the origin's current body, which it returns.
async fn started_and_filled(route_keys: &str) -> (RedisServer, Origin, Sidecache, String) {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = builder(&redis, &origin, route_keys).start().await;
    let old = origin.default_body(P);
    fill(&sc, &old).await;
    (redis, origin, sc, old)
}

/// Polls until a read of `P` answers STALE (the entry expired), and
/// checks that answer: 200, the old body, an `Age`.
async fn until_stale(sc: &Sidecache, body: &str) {
    eventually(
        "the entry expires and is served STALE",
        Duration::from_secs(10),
        || async {
            let r = client::get(&sc.url(P)).await;
            if x_cache(&r) != "STALE" {
                return false;
            }
            assert_eq!((r.status.as_u16(), r.text()), (200, body.to_owned()));
            assert!(r.header("age").is_some(), "a STALE answer carries Age");
            true
        },
    )
    .await;
}

async fn stale_served(sc: &Sidecache, reason: &str) -> f64 {
    sc.metric_sum("sidecache_stale_served_total", &[("reason", reason)])
        .await
}

/// Asserts a read of `P` is not answered from the cache in any form.
async fn never_the_old_body(sc: &Sidecache, old: &str, status: u16, what: &str) {
    let r = client::get(&sc.url(P)).await;
    assert_ne!(r.text(), old, "{what}: the old body was served");
    assert_ne!(x_cache(&r), "STALE", "{what}");
    assert_ne!(x_cache(&r), "HIT", "{what}");
    assert_eq!(r.status, status, "{what}: {}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidated_or_unprovable_entries_are_never_served_stale() {
    let (redis, origin, sc, old) = started_and_filled("grace: 30s\nstale_if_error: 30s").await;
    // Refreshes fail from now on, so the expired entry stays and is served.
    origin.reply(P, Reply::status(500));
    until_stale(&sc, &old).await;

    let inv = invalidate(&sc, "app", PARAMS).await;
    assert_eq!(inv.status, 200, "{}", inv.text());
    never_the_old_body(&sc, &old, 500, "invalidated, origin 500").await;
    origin.down();
    never_the_old_body(&sc, &old, 502, "invalidated, origin refused").await;

    // Same with the generation key lost instead of replaced: the entry
    // cannot be proven current, so it is not served either. Without grace
    // no background refresh can recreate the key behind the test's back, so
    // the first read after the DEL really finds it missing.
    let origin = Origin::start().await;
    let sc = builder(&redis, &origin, "stale_if_error: 30s")
        .start()
        .await;
    redis.cli(&["FLUSHALL"]).expect("FLUSHALL");
    let old = origin.default_body(P);
    fill(&sc, &old).await;
    origin.reply(P, Reply::status(500));
    until_stale(&sc, &old).await;
    redis
        .cli(&["DEL", &format!("{OBJECT}:g")])
        .expect("DEL generation");
    never_the_old_body(&sc, &old, 500, "generation lost, origin 500").await;
    origin.down();
    never_the_old_body(&sc, &old, 502, "generation lost, origin refused").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grace_answers_at_once_with_one_refresh_across_two_instances() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let keys = "grace: 30s\nlease: 5s\nwait: 5s";
    let a = builder(&redis, &origin, keys).start().await;
    let b = builder(&redis, &origin, keys).start().await;
    let old = origin.default_body(P);
    fill(&a, &old).await;
    origin.bump(P);
    let new = origin.default_body(P);
    // The refresh that the first STALE answer starts waits at the origin.
    let gate = origin.hold(P);
    until_stale(&a, &old).await;
    gate.arrived(1).await;

    let readers: Vec<_> = (0..50)
        .map(|i| {
            let url = if i % 2 == 0 { a.url(P) } else { b.url(P) };
            tokio::spawn(async move { client::get(&url).await })
        })
        .collect();
    // Every reader is answered while the refresh is still held: none waits.
    let answered = tokio::time::timeout(Duration::from_secs(5), async {
        let mut out = Vec::new();
        for r in readers {
            out.push(r.await.expect("reader task"));
        }
        out
    })
    .await
    .expect("grace readers must not wait for the refresh");
    for r in &answered {
        assert_eq!(
            (r.status.as_u16(), x_cache(r), r.text()),
            (200, "STALE".into(), old.clone())
        );
    }
    assert_eq!(origin.hits(P), 2, "the fill and exactly one refresh");

    gate.release();
    eventually("the refresh publishes", Duration::from_secs(10), || async {
        a.metric_sum(
            "sidecache_background_refresh_total",
            &[("outcome", "fetched")],
        )
        .await
            == 1.0
    })
    .await;
    let r = client::get(&a.url(P)).await;
    assert_eq!((x_cache(&r), r.text()), ("HIT".into(), new.clone()));
    eventually(
        "the other instance sees the refresh",
        Duration::from_secs(5),
        || async {
            let r = client::get(&b.url(P)).await;
            (x_cache(&r), r.text()) == ("HIT".into(), new.clone())
        },
    )
    .await;
    assert_eq!(origin.hits(P), 2, "no further origin request");
    assert!(
        stale_served(&a, "revalidating").await + stale_served(&b, "revalidating").await >= 51.0
    );
    assert_eq!(
        a.metric_sum("sidecache_requests_total", &[("result", "STALE")])
            .await
            + b.metric_sum("sidecache_requests_total", &[("result", "STALE")])
                .await,
        stale_served(&a, "revalidating").await + stale_served(&b, "revalidating").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_refresh_keeps_the_stale_entry_and_publishes_nothing() {
    let (_redis, origin, sc, old) = started_and_filled("grace: 30s\nstale_if_error: 30s").await;
    origin.reply(P, Reply::status(500).body("origin broke"));
    until_stale(&sc, &old).await;
    eventually("the refresh fails", Duration::from_secs(10), || async {
        sc.metric_sum(
            "sidecache_background_refresh_total",
            &[("outcome", "failed")],
        )
        .await
            >= 1.0
    })
    .await;
    // Still the old entry, still STALE: the 500 was not stored.
    until_stale(&sc, &old).await;
    assert_eq!(
        sc.metric_sum("sidecache_publish_total", &[("outcome", "published")])
            .await,
        1.0,
        "only the first fill published"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_answers_for_a_failed_refill_until_its_window_ends() {
    let (_redis, origin, sc, old) = started_and_filled("stale_if_error: 2s").await;

    // Origin answers 500: the refill fails, the expired entry answers.
    origin.reply(P, Reply::status(500));
    until_stale(&sc, &old).await;
    assert!(stale_served(&sc, "upstream_error").await >= 1.0);

    // Origin down (connection refused): the same.
    origin.down();
    let r = client::get(&sc.url(P)).await;
    if x_cache(&r) == "STALE" {
        assert_eq!((r.status.as_u16(), r.text()), (200, old.clone()));
    }
    // Past the window: the error as without stale_if_error.
    eventually(
        "the window ends and the error shows",
        Duration::from_secs(10),
        || async {
            let r = client::get(&sc.url(P)).await;
            if x_cache(&r) == "STALE" {
                assert_eq!((r.status.as_u16(), r.text()), (200, old.clone()));
                return false;
            }
            assert_eq!(r.status, 502, "{}", r.text());
            true
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_covers_a_refused_connection() {
    let (_redis, origin, sc, old) = started_and_filled("stale_if_error: 30s").await;
    origin.down();
    until_stale(&sc, &old).await;
    assert!(stale_served(&sc, "upstream_error").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_answers_instead_of_the_503s() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    // One fill permit, a short lease wait: both 503 cases are easy to reach.
    let keys = "stale_if_error: 30s\nlease: 5s\nwait: 200ms";
    let a = builder(&redis, &origin, keys)
        .fill("fill:\n  max_concurrency: 1\n")
        .start()
        .await;
    let b = builder(&redis, &origin, keys).start().await;
    let old = origin.default_body(P);
    fill(&a, &old).await;
    // A slow fill of another object takes instance a's only permit.
    let other = "/api/tenants/acme/apps/2";
    let (gate, slow) = crate::support::get_held(&origin, other, a.url(other)).await;
    until_stale(&a, &old).await;
    assert!(stale_served(&a, "permits").await >= 1.0);
    gate.release();
    assert_eq!(slow.await.expect("slow fill").status.as_u16(), 200);

    // A refill held at the origin keeps the lease: instance b's reader
    // spends its wait budget and gets the expired entry, not a 503.
    let gate = origin.hold(P);
    let url = a.url(P);
    let holder = tokio::spawn(async move { client::get(&url).await });
    gate.arrived(1).await;
    let r = client::get(&b.url(P)).await;
    assert_eq!(
        (r.status.as_u16(), x_cache(&r), r.text()),
        (200, "STALE".into(), old.clone())
    );
    assert_eq!(stale_served(&b, "lease_wait").await, 1.0);
    gate.release();
    let r = holder.await.expect("holder");
    assert_eq!((x_cache(&r), r.text()), ("MISS".into(), old.clone()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_origin_can_turn_stale_serving_off_and_negatives_follow_the_rules() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = builder(
        &redis,
        &origin,
        "negative_ttl: 1s\ngrace: 30s\nstale_if_error: 30s",
    )
    .start()
    .await;
    // must-revalidate: once expired, never served; the 500 goes through.
    origin.reply(
        P,
        Reply::ok("strict").header("cache-control", "max-age=1, must-revalidate"),
    );
    fill(&sc, "strict").await;
    origin.reply(P, Reply::status(500));
    eventually(
        "the strict entry expires",
        Duration::from_secs(10),
        || async {
            let r = client::get(&sc.url(P)).await;
            assert_ne!(x_cache(&r), "STALE", "must-revalidate was ignored");
            r.status.as_u16() == 500
        },
    )
    .await;

    // A negative entry has its own TTL and the same windows.
    let gone = "/api/tenants/acme/apps/3";
    origin.reply(gone, Reply::status(404).body("no such app"));
    assert_eq!(x_cache(&client::get(&sc.url(gone)).await), "MISS");
    assert_eq!(x_cache(&client::get(&sc.url(gone)).await), "NEGATIVE");
    origin.reply(gone, Reply::status(500));
    eventually(
        "the negative entry is served STALE",
        Duration::from_secs(10),
        || async {
            let r = client::get(&sc.url(gone)).await;
            if x_cache(&r) != "STALE" {
                assert_eq!(x_cache(&r), "NEGATIVE");
                return false;
            }
            assert_eq!((r.status.as_u16(), r.text()), (404, "no such app".into()));
            true
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_that_started_before_an_invalidation_cannot_publish() {
    let (_redis, origin, sc, old) = started_and_filled("grace: 30s").await;
    // The refresh takes its ticket and waits at the origin with the old body.
    let gate = origin.hold(P);
    until_stale(&sc, &old).await;
    gate.arrived(1).await;
    origin.bump(P);
    let inv = invalidate(&sc, "app", PARAMS).await;
    assert_eq!(inv.status, 200, "{}", inv.text());
    gate.release();
    eventually("the refresh ends", Duration::from_secs(10), || async {
        sc.metric_sum("sidecache_background_refresh_total", &[])
            .await
            >= 1.0
    })
    .await;
    assert_eq!(
        sc.metric_sum(
            "sidecache_publish_total",
            &[("outcome", "publish_rejected")]
        )
        .await,
        1.0,
        "the late publish must be refused"
    );
    let r = client::get(&sc.url(P)).await;
    assert_eq!(
        (x_cache(&r), r.text()),
        ("MISS".into(), origin.default_body(P))
    );
}

/// A grace refresh of v1 holds the lease at the origin when the
/// object changes. A reader after the invalidation finds no current entry
/// (nothing stale to serve) and must not wait for that refresh: its fill
/// supersedes the refresh's lease and fetches v2 at once
/// (docs/architecture.md#no-older-answer-after-an-invalidation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_of_an_invalidated_entry_is_not_waited_for() {
    let (_redis, origin, sc, old) = started_and_filled("grace: 30s\nlease: 5s\nwait: 5s").await;
    let gate = origin.hold(P);
    until_stale(&sc, &old).await;
    gate.arrived(1).await;
    origin.bump(P);
    let inv = invalidate(&sc, "app", PARAMS).await;
    assert_eq!(inv.status, 200, "{}", inv.text());

    let url = sc.url(P);
    let reader = tokio::spawn(async move { client::get(&url).await });
    gate.arrived(2).await;
    gate.release();
    let r = reader.await.expect("reader");
    assert_eq!(
        (x_cache(&r), r.text()),
        ("MISS".into(), origin.default_body(P))
    );
    assert_eq!(
        sc.metric_sum("sidecache_lease_superseded_total", &[]).await,
        1.0
    );
    eventually("the refresh ends", Duration::from_secs(10), || async {
        sc.metric_sum("sidecache_background_refresh_total", &[])
            .await
            >= 1.0
    })
    .await;
    let r = client::get(&sc.url(P)).await;
    assert_eq!(
        (x_cache(&r), r.text()),
        ("HIT".into(), origin.default_body(P))
    );
}

/// Stale-if-error judges the entry as it is when the refill fails, not as the
/// request read it before: a refill held at the origin, an invalidation
/// meanwhile, then a 500. The invalidated entry must not answer; the 500 does
/// (docs/architecture.md#the-serving-rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_never_answers_with_an_entry_invalidated_during_the_refill() {
    let (_redis, origin, sc, old) = started_and_filled("stale_if_error: 30s").await;
    origin.reply(P, Reply::status(500));
    let gate = origin.hold(P);
    // Read until the entry has expired: that read's refill is held.
    let reader = loop {
        let url = sc.url(P);
        let task = tokio::spawn(async move { client::get(&url).await });
        eventually(
            "a HIT, or a refill held at the origin",
            Duration::from_secs(10),
            || async { task.is_finished() || gate.count() >= 1 },
        )
        .await;
        if gate.count() >= 1 {
            break task;
        }
        let r = task.await.expect("reader");
        assert_eq!((x_cache(&r), r.text()), ("HIT".into(), old.clone()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let inv = invalidate(&sc, "app", PARAMS).await;
    assert_eq!(inv.status, 200, "{}", inv.text());
    gate.release();
    let r = reader.await.expect("reader");
    assert_eq!(
        (r.status.as_u16(), x_cache(&r)),
        (500, "MISS".into()),
        "{}",
        r.text()
    );
    assert_eq!(stale_served(&sc, "upstream_error").await, 0.0);
}

#[test]
fn stale_windows_are_validated_with_the_yaml_path() {
    use crate::support::sidecache::{binary, free_addr};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sidecache.yaml");
    let base = SidecacheBuilder::new("http://127.0.0.1:9")
        .routes(&app_routes("grace: 30s"))
        .addrs(free_addr(), free_addr())
        .render();
    std::fs::write(&path, &base).expect("write config");
    let ok = std::process::Command::new(binary())
        .arg("check")
        .arg("--config")
        .arg(&path)
        .env_remove("SIDECACHE_CONFIG")
        .output()
        .expect("run check");
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    for (from, to, named) in [
        ("grace: 30s", "grace: -1s", "routes[0].grace"),
        (
            "grace: 30s",
            "stale_if_error: 800h",
            "routes[0].stale_if_error",
        ),
        ("grace: 30s", "grace: 721h", "routes[0].grace"),
        ("ttl: 60s", "ttl: 0s", "routes[0].ttl"),
    ] {
        std::fs::write(&path, base.replace(from, to)).expect("write config");
        let out = std::process::Command::new(binary())
            .arg("check")
            .arg("--config")
            .arg(&path)
            .env_remove("SIDECACHE_CONFIG")
            .output()
            .expect("run check");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{to}: {stderr}");
        assert!(stderr.contains(named), "{to}: expected {named} in {stderr}");
    }
}

/// `ttl: origin`: the answer's own `stale-while-revalidate` opens the
/// grace window (RFC 5861), capped by `max_grace` (default 1m); the expired
/// entry answers STALE at once while one refresh fetches the new body, and
/// an invalidated entry never does. A route that turns it off
/// (`max_grace: 0s`) refetches the same answer on expiry (MISS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_origins_stale_while_revalidate_opens_grace_up_to_max_grace() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let routes = app_routes(
        "max_ttl: 1m\njitter: 0s\nkeep: 0s\nnegative_ttl: 1s",
    )
    .replace("ttl: 60s", "ttl: origin")
    + "  - name: plain\n    path: /plain/{id}\n    params: { id: \"[0-9]+\" }\n    ttl: origin\n    max_ttl: 60s\n    max_grace: 0s\n    keep: 0s\n";
    let sc = builder(&redis, &origin, "").routes(&routes).start().await;
    let swr = |body: &'static str| {
        Reply::ok(body).header("cache-control", "max-age=1, stale-while-revalidate=30")
    };
    origin.reply(P, swr("v1"));
    fill(&sc, "v1").await;
    origin.reply(P, swr("v2"));
    until_stale(&sc, "v1").await;
    assert_eq!(stale_served(&sc, "revalidating").await, 1.0);
    eventually(
        "the refresh publishes v2",
        Duration::from_secs(10),
        || async {
            let r = client::get(&sc.url(P)).await;
            x_cache(&r) == "HIT" && r.text() == "v2"
        },
    )
    .await;
    // Expired or not, an invalidated entry is never served STALE.
    origin.reply(P, swr("v3"));
    assert_eq!(invalidate(&sc, "app", PARAMS).await.status.as_u16(), 200);
    let r = client::get(&sc.url(P)).await;
    assert_eq!((x_cache(&r), r.text()), ("MISS".into(), "v3".into()));

    // The route with `max_grace: 0s`: the directive opens nothing.
    let plain = "/plain/1";
    origin.reply(plain, swr("p1"));
    assert_eq!(x_cache(&client::get(&sc.url(plain)).await), "MISS");
    origin.reply(plain, swr("p2"));
    eventually(
        "the plain entry expires",
        Duration::from_secs(10),
        || async {
            let r = client::get(&sc.url(plain)).await;
            assert_ne!(x_cache(&r), "STALE", "no grace with max_grace: 0s");
            x_cache(&r) == "MISS" && r.text() == "p2"
        },
    )
    .await;
}

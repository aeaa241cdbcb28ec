//! `ttl: origin` (docs/caching.md#ttl-from-origin), on the embedded store and
//! on a real Redis: an entry is fresh for what the answer says (`s-maxage`,
//! else `max-age`, else `Expires` minus `Date`), at most `max_ttl`, else
//! `default_ttl`; without one it is not stored. Expiry is awaited by polling
//! polling for the MISS that shows it (bounded), and checked from both
//! sides: never before the lifetime (measured from before the fill, so
//! exact), and well before the route's cap. On Redis the entry's store
//! TTL is read as well.

use crate::support::client::{self, x_cache};
use crate::support::redis::RedisServer;
use crate::support::{eventually, Origin, Reply, Sidecache, SidecacheBuilder};
use std::time::{Duration, Instant};

/// `o` trusts the origin up to a minute (1 s without a lifetime), `capped`
/// at most 1 s, `strict` stores only answers that give a lifetime, `cdn`
/// as `strict` but reads `CDN-Cache-Control` first. Hit-for-pass is off on
/// the last two: these tests look at every fill of an answer not stored.
const ROUTES: &str = r#"routes:
  - name: o
    path: /o/{id}
    params: { id: "[a-z0-9]+" }
    ttl: origin
    max_ttl: 60s
    default_ttl: 1s
  - name: capped
    path: /capped/{id}
    params: { id: "[a-z0-9]+" }
    ttl: origin
    max_ttl: 1s
  - name: strict
    path: /strict/{id}
    params: { id: "[a-z0-9]+" }
    ttl: origin
    max_ttl: 60s
    hit_for_pass: 0s
  - name: cdn
    path: /cdn/{id}
    params: { id: "[a-z0-9]+" }
    ttl: origin
    max_ttl: 60s
    cdn_cache_control: true
    hit_for_pass: 0s
"#;

/// The entry key of an object without query or vary headers.
fn entry_key(route: &str, id: &str) -> String {
    format!("sc:o:{{{route}:{id}}}:e:v3:e3b0c44298fc1c149afbf4c8996fb924")
}

/// Fills `path` (MISS, then HIT) and polls until a read is a MISS again:
/// the entry expired. Asserts it lived at least `at_least` (the fill
/// started after `t0`, so it cannot have expired sooner) and expired
/// within `at_least + 4 s`.
async fn expires_after(sc: &Sidecache, path: &str, at_least: Duration) {
    let t0 = Instant::now();
    let first = client::get(&sc.url(path)).await;
    assert_eq!(
        (first.status.as_u16(), x_cache(&first)),
        (200, "MISS".into()),
        "{path}"
    );
    assert_eq!(x_cache(&client::get(&sc.url(path)).await), "HIT", "{path}");
    eventually(
        &format!("{path} expires"),
        at_least + Duration::from_secs(4),
        || async { x_cache(&client::get(&sc.url(path)).await) == "MISS" },
    )
    .await;
    let lived = t0.elapsed();
    assert!(
        lived >= at_least,
        "{path} expired after {lived:?}, before {at_least:?}"
    );
}

async fn start(redis: Option<&RedisServer>, origin: &Origin) -> Sidecache {
    SidecacheBuilder::new(origin.url())
        .routes(ROUTES)
        .store_on(redis)
        .start()
        .await
}

async fn lifetimes_come_from_the_origin(redis: Option<RedisServer>) {
    let origin = Origin::start().await;
    let sc = start(redis.as_ref(), &origin).await;
    let cc = |v: &str| Reply::ok("x").header("cache-control", v);
    origin.reply("/o/maxage", cc("max-age=2"));
    origin.reply("/o/smaxage", cc("max-age=60, s-maxage=1"));
    // Expires minus Date: 2 s, although both are decades in the past.
    origin.reply(
        "/o/expires",
        Reply::ok("x")
            .header("date", "Sun, 06 Nov 1994 08:49:37 GMT")
            .header("expires", "Sun, 06 Nov 1994 08:49:39 GMT"),
    );
    origin.reply("/o/none", Reply::ok("x"));
    origin.reply("/capped/long", cc("max-age=3600"));
    let s = Duration::from_secs;
    tokio::join!(
        expires_after(&sc, "/o/maxage", s(2)),
        expires_after(&sc, "/o/smaxage", s(1)),
        expires_after(&sc, "/o/expires", s(2)),
        expires_after(&sc, "/o/none", s(1)),
        expires_after(&sc, "/capped/long", s(1)),
    );

    // The store keeps the entry for its own lifetime, not the route's cap.
    if let Some(redis) = &redis {
        assert_eq!(x_cache(&client::get(&sc.url("/o/maxage")).await), "HIT");
        let pttl = match redis.cli(&["PTTL", &entry_key("o", "maxage")]) {
            Ok(redis::Value::Int(ms)) => ms,
            other => panic!("PTTL: {other:?}"),
        };
        assert!(pttl > 0 && pttl <= 2_000, "store TTL {pttl} ms");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifetimes_come_from_the_origin_embedded() {
    lifetimes_come_from_the_origin(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifetimes_come_from_the_origin_redis() {
    lifetimes_come_from_the_origin(Some(RedisServer::start())).await;
}

/// What is not stored: no lifetime without `default_ttl`, a zero or spent
/// one, and `no-store` / `private` whatever the lifetime.
async fn without_a_lifetime_nothing_is_stored(redis: Option<RedisServer>) {
    let origin = Origin::start().await;
    let sc = start(redis.as_ref(), &origin).await;
    let cases = [
        ("/strict/none", Reply::ok("x"), "no_lifetime"),
        (
            "/strict/zero",
            Reply::ok("x").header("cache-control", "max-age=0"),
            "max_age_0",
        ),
        (
            "/strict/aged",
            Reply::ok("x")
                .header("cache-control", "max-age=60")
                .header("age", "60"),
            "expired",
        ),
        (
            "/strict/past",
            Reply::ok("x").header("expires", "Sun, 06 Nov 1994 08:49:37 GMT"),
            "expired",
        ),
        (
            "/strict/nostore",
            Reply::ok("x").header("cache-control", "max-age=60, no-store"),
            "no_store",
        ),
        (
            "/strict/private",
            Reply::ok("x").header("cache-control", "max-age=60, private"),
            "private",
        ),
    ];
    for (path, reply, reason) in cases {
        origin.reply(path, reply);
        for _ in 0..2 {
            let r = client::get(&sc.url(path)).await;
            assert_eq!(
                (r.status.as_u16(), x_cache(&r)),
                (200, "MISS".into()),
                "{path}"
            );
        }
        assert_eq!(origin.hits(path), 2, "{path} was stored");
        let counted = sc
            .metric_sum(
                "sidecache_uncacheable_total",
                &[("route", "strict"), ("reason", reason)],
            )
            .await;
        assert!(counted >= 2.0, "{path}: reason {reason} counted {counted}");
    }
    // And one that gives a lifetime is stored on the same route.
    origin.reply(
        "/strict/ok",
        Reply::ok("x").header("cache-control", "max-age=60"),
    );
    client::get(&sc.url("/strict/ok")).await;
    assert_eq!(x_cache(&client::get(&sc.url("/strict/ok")).await), "HIT");
}

/// Without a `cache_status` of its own a `ttl: origin` route stores what a
/// shared cache may: a heuristically cacheable status (301, 410) or any
/// other (302, 500) when the answer gives explicit freshness; without
/// freshness, none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_answers_of_other_statuses_are_reused() {
    let origin = Origin::start().await;
    let sc = start(None, &origin).await;
    let fresh = |code: u16| Reply::status(code).header("cache-control", "max-age=60");
    for (path, reply, stored) in [
        ("/strict/moved", fresh(301).header("location", "/x"), true),
        ("/strict/gone", fresh(410), true),
        ("/strict/found", fresh(302).header("location", "/x"), true),
        ("/strict/broken", fresh(500), true),
        (
            "/strict/plain302",
            Reply::status(302).header("location", "/x"),
            false,
        ),
    ] {
        origin.reply(path, reply);
        client::get(&sc.url(path)).await;
        let second = x_cache(&client::get(&sc.url(path)).await);
        let expected = if stored { "HIT" } else { "MISS" };
        assert_eq!(second, expected, "{path}");
        assert_eq!(origin.hits(path), if stored { 1 } else { 2 }, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_lifetime_nothing_is_stored_embedded() {
    without_a_lifetime_nothing_is_stored(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_lifetime_nothing_is_stored_redis() {
    without_a_lifetime_nothing_is_stored(Some(RedisServer::start())).await;
}

/// `cdn_cache_control: true`: a valid `CDN-Cache-Control` decides instead
/// of `Cache-Control` (RFC 9213), an invalid one is ignored; routes without
/// the setting never read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdn_cache_control_decides_where_the_route_reads_it() {
    let origin = Origin::start().await;
    let sc = start(None, &origin).await;
    let reply = |cc: &str, cdn: &str| {
        Reply::ok("x")
            .header("cache-control", cc)
            .header("cdn-cache-control", cdn)
    };
    let cases = [
        ("/cdn/fresh", reply("no-store", "max-age=60"), "HIT"),
        ("/cdn/nostore", reply("max-age=60", "no-store"), "MISS"),
        ("/cdn/private", reply("max-age=60", "private"), "MISS"),
        ("/cdn/short", reply("max-age=60", "max-age=0"), "MISS"),
        ("/cdn/invalid", reply("no-store", "max-age=\"60\""), "MISS"),
        ("/strict/cdn", reply("no-store", "max-age=60"), "MISS"),
    ];
    for (path, reply, second) in cases {
        origin.reply(path, reply);
        assert_eq!(x_cache(&client::get(&sc.url(path)).await), "MISS", "{path}");
        assert_eq!(x_cache(&client::get(&sc.url(path)).await), second, "{path}");
    }
}

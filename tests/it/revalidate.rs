//! Conditional fills (docs/caching.md#revalidation): an expired entry of the
//! current generation with validators is revalidated with the validators it
//! stored, and a `304` refreshes it; an invalidated entry is never revalidated
//! (docs/architecture.md#the-serving-rule), and a revalidation racing an
//! invalidation never publishes. On the embedded store and on a real
//! Redis. Expiry is awaited by polling for the first read that is not a
//! HIT; `no-cache` answers are stored already expired, so every use
//! revalidates without any waiting.

use crate::cache::invalidate;
use crate::support::client::{self, x_cache};
use crate::support::redis::RedisServer;
use crate::support::{Origin, Reply, Sidecache, SidecacheBuilder};
use std::time::{Duration, Instant};

const P: &str = "/api/tenants/acme/apps/1";
const PARAMS: &str = r#"{"tenant":"acme","id":"1"}"#;
const LM: &str = "Wed, 01 Jan 2020 00:00:00 GMT";

const ROUTES: &str = r#"routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params: { tenant: "[a-z]+", id: "[0-9]+" }
    ttl: origin
    max_ttl: 60s
"#;

async fn start(redis: Option<&RedisServer>, origin: &Origin) -> Sidecache {
    SidecacheBuilder::new(origin.url())
        .routes(ROUTES)
        .store_on(redis)
        .start()
        .await
}

/// What the origin's last request for `P` carried as `name`.
fn sent(origin: &Origin, name: &str) -> Option<String> {
    let last = origin
        .last_request(P)
        .expect("a request reached the origin");
    last.headers
        .get(name)
        .map(|v| v.to_str().expect("ascii").to_owned())
}

async fn revalidations(sc: &Sidecache, outcome: &str) -> f64 {
    sc.metric_sum("sidecache_revalidations_total", &[("outcome", outcome)])
        .await
}

/// The entry expires (max-age=1); the next read sends the entry's own
/// validators (not the client's), the origin's `304` updates the stored
/// headers and freshness, and the body stays.
async fn a_304_refreshes_the_entry(redis: Option<RedisServer>) {
    let origin = Origin::start().await;
    let sc = start(redis.as_ref(), &origin).await;
    origin.reply(
        P,
        Reply::ok("v1")
            .header("cache-control", "max-age=1")
            .header("etag", "\"v1\"")
            .header("last-modified", LM)
            .header("x-version", "a"),
    );
    let r = client::get(&sc.url(P)).await;
    assert_eq!((x_cache(&r), r.text()), ("MISS".into(), "v1".into()));
    assert_eq!(sent(&origin, "if-none-match"), None, "a cold fill is plain");
    origin.reply(
        P,
        Reply::status(304)
            .header("cache-control", "max-age=60")
            .header("etag", "\"v1\"")
            .header("x-version", "b"),
    );
    // The first read that is not a HIT is the revalidation; the client's
    // own validator never reaches the origin.
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = client::request("GET", &sc.url(P), &[("if-none-match", "\"client\"")], "").await;
        if x_cache(&r) != "HIT" {
            break r;
        }
        assert!(Instant::now() < deadline, "the entry never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        (r.status.as_u16(), x_cache(&r), r.text()),
        (200, "MISS".into(), "v1".into())
    );
    assert_eq!(r.header("x-version").as_deref(), Some("b"), "304 headers");
    assert_eq!(sent(&origin, "if-none-match").as_deref(), Some("\"v1\""));
    assert_eq!(sent(&origin, "if-modified-since").as_deref(), Some(LM));
    assert_eq!(origin.hits(P), 2);
    // Fresh again for the 304's max-age=60, with the updated headers.
    let r = client::get(&sc.url(P)).await;
    assert_eq!((x_cache(&r), r.text()), ("HIT".into(), "v1".into()));
    assert_eq!(r.header("x-version").as_deref(), Some("b"));
    assert_eq!(r.header("cache-control").as_deref(), Some("max-age=60"));
    assert_eq!(revalidations(&sc, "not_modified").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_refreshes_the_entry_embedded() {
    a_304_refreshes_the_entry(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_refreshes_the_entry_redis() {
    a_304_refreshes_the_entry(Some(RedisServer::start())).await;
}

/// The `no-cache` answer with an `ETag` that `origin` gives on `P`.
fn no_cache(body: &'static str) -> Reply {
    Reply::ok(body)
        .header("cache-control", "no-cache")
        .header("etag", &format!("\"{body}\""))
}

/// A `no-cache` answer is stored and revalidated on every use; after an
/// invalidation, the expired entry is not revalidated: the fill is a full
/// `GET` and the old body never comes back.
async fn invalidated_entries_are_fetched_not_revalidated(redis: Option<RedisServer>) {
    let origin = Origin::start().await;
    let sc = start(redis.as_ref(), &origin).await;
    origin.reply(P, no_cache("v1"));
    assert_eq!(client::get(&sc.url(P)).await.text(), "v1");
    origin.reply(P, Reply::status(304).header("etag", "\"v1\""));
    let r = client::get(&sc.url(P)).await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "v1".into()));
    assert_eq!(sent(&origin, "if-none-match").as_deref(), Some("\"v1\""));

    let inv = invalidate(&sc, "app", PARAMS).await;
    assert_eq!(inv.status, 200, "{}", inv.text());
    origin.reply(P, no_cache("v2"));
    let r = client::get(&sc.url(P)).await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "v2".into()));
    assert_eq!(sent(&origin, "if-none-match"), None, "a full GET");
    assert_eq!(revalidations(&sc, "not_modified").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidated_entries_are_fetched_not_revalidated_embedded() {
    invalidated_entries_are_fetched_not_revalidated(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidated_entries_are_fetched_not_revalidated_redis() {
    invalidated_entries_are_fetched_not_revalidated(Some(RedisServer::start())).await;
}

/// A revalidation held at the origin while the object is invalidated: its
/// `304` answers the request that started it (which came before the
/// invalidation), but the refreshed entry is not published, and the next
/// read fetches in full.
async fn a_revalidation_racing_an_invalidation_never_publishes(redis: Option<RedisServer>) {
    let origin = Origin::start().await;
    let sc = start(redis.as_ref(), &origin).await;
    origin.reply(P, no_cache("v1"));
    assert_eq!(client::get(&sc.url(P)).await.text(), "v1");
    // A published refresh would be a HIT for a minute.
    origin.reply(
        P,
        Reply::status(304)
            .header("etag", "\"v1\"")
            .header("cache-control", "max-age=60"),
    );
    let (gate, reader) = crate::support::get_held(&origin, P, sc.url(P)).await;
    let inv = invalidate(&sc, "app", PARAMS).await;
    assert_eq!(inv.status, 200, "{}", inv.text());
    gate.release();
    let r = reader.await.expect("reader");
    assert_eq!((r.status.as_u16(), r.text()), (200, "v1".into()));
    assert_eq!(sent(&origin, "if-none-match").as_deref(), Some("\"v1\""));
    let rejected = sc
        .metric_sum(
            "sidecache_publish_total",
            &[("outcome", "publish_rejected")],
        )
        .await;
    assert_eq!(rejected, 1.0, "the refresh was refused");

    origin.reply(P, no_cache("v2"));
    let r = client::get(&sc.url(P)).await;
    assert_eq!(
        (r.status.as_u16(), x_cache(&r), r.text()),
        (200, "MISS".into(), "v2".into())
    );
    assert_eq!(sent(&origin, "if-none-match"), None, "a full GET");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revalidation_racing_an_invalidation_never_publishes_embedded() {
    a_revalidation_racing_an_invalidation_never_publishes(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revalidation_racing_an_invalidation_never_publishes_redis() {
    a_revalidation_racing_an_invalidation_never_publishes(Some(RedisServer::start())).await;
}

//! Join only what is current
//! (docs/architecture.md#no-older-answer-after-an-invalidation): a request that
//! read the object's generation after an invalidation never gets the answer of
//! a fill that started before it, neither by joining that fill in-process nor
//! by waiting for another instance's lease. The old fill is held at the origin
//! (the exact interleaving), its publish stays refused, and there is still
//! one origin request per object and generation.

use crate::cache::invalidate;
use crate::support::client::{self, x_cache};
use crate::support::origin::Gate;
use crate::support::redis::RedisServer;
use crate::support::{app_routes, eventually, get_held, Origin, Sidecache, SidecacheBuilder};
use std::time::Duration;

const P: &str = "/api/tenants/acme/apps/1";
const PARAMS: &str = r#"{"tenant":"acme","id":"1"}"#;

fn builder(redis: &RedisServer, origin: &Origin, route_keys: &str) -> SidecacheBuilder {
    SidecacheBuilder::new(origin.url())
        .routes(&app_routes(route_keys))
        .store(&format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n  breaker:\n    cooldown: 500ms\n",
            redis.url()
        ))
}

/// The interleaving every test here starts from: a read through `filler`
/// whose fill of v1 is held at the origin; then the object changes to v2
/// and is invalidated through `invalidator`. Returns the gate, the held
/// read, v1 and v2.
async fn fill_held_then_invalidated(
    origin: &Origin,
    filler: &Sidecache,
    invalidator: &Sidecache,
) -> (Gate, tokio::task::JoinHandle<client::Resp>, String, String) {
    let v1 = origin.default_body(P);
    let (gate, before) = get_held(origin, P, filler.url(P)).await;
    origin.bump(P);
    let v2 = origin.default_body(P);
    let inv = invalidate(invalidator, "app", PARAMS).await;
    assert_eq!(inv.status, 200, "{}", inv.text());
    (gate, before, v1, v2)
}

async fn publishes(sc: &Sidecache, outcome: &str) -> f64 {
    sc.metric_sum("sidecache_publish_total", &[("outcome", outcome)])
        .await
}

fn spawn_get(url: String) -> tokio::task::JoinHandle<client::Resp> {
    tokio::spawn(async move { client::get(&url).await })
}

/// One instance: the fill of v1 is held at the origin, the object changes
/// and is invalidated; readers after that get v2 from a fill of their own
/// (one, shared between them), never the held v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_after_an_invalidation_never_joins_the_older_fill() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = builder(&redis, &origin, "lease: 5s\nwait: 5s")
        .start()
        .await;
    let (gate, before, v1, v2) = fill_held_then_invalidated(&origin, &sc, &sc).await;

    // The first reader after the invalidation starts a fill of its own: it
    // reaches the origin while the old fill is still held there.
    let after = spawn_get(sc.url(P));
    gate.arrived(2).await;
    // The second joins that new fill in-process: no third origin request.
    let joined = spawn_get(sc.url(P));
    eventually(
        "the second reader joins the new fill",
        Duration::from_secs(10),
        || async {
            sc.metric_sum("sidecache_coalesced_total", &[("route", "app")])
                .await
                >= 1.0
        },
    )
    .await;
    gate.release();

    let r = before.await.expect("reader before the invalidation");
    assert_eq!((x_cache(&r), r.text()), ("MISS".into(), v1));
    for (what, task) in [("after", after), ("joined", joined)] {
        let r = task.await.expect(what);
        assert_eq!(
            (r.status.as_u16(), x_cache(&r), r.text()),
            (200, "MISS".into(), v2.clone()),
            "{what}: a reader after the invalidation got another answer"
        );
    }
    assert_eq!(origin.hits(P), 2, "one origin request per generation");
    assert_eq!(
        sc.metric_sum("sidecache_lease_superseded_total", &[]).await,
        1.0
    );
    assert_eq!(publishes(&sc, "publish_rejected").await, 1.0);
    assert_eq!(publishes(&sc, "published").await, 1.0);
    let r = client::get(&sc.url(P)).await;
    assert_eq!((x_cache(&r), r.text()), ("HIT".into(), v2));
}

/// Two instances on one Redis: instance A's fill of v1 holds the lease at
/// the origin. After the invalidation, instance B does not wait for that
/// lease: it supersedes it and fetches v2. A reader on A after that waits
/// for B's fill (the current generation's), it does not fetch a third time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_instances_older_lease_is_superseded_not_waited_for() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    // A short `wait`: a reader that waits for a lease says so with a 503
    // while the fills are still held, instead of after their release.
    let keys = "lease: 5s\nwait: 300ms";
    let a = builder(&redis, &origin, keys).start().await;
    let b = builder(&redis, &origin, keys).start().await;
    let (gate, before, v1, v2) = fill_held_then_invalidated(&origin, &a, &b).await;

    let at_b = spawn_get(b.url(P));
    gate.arrived(2).await;
    assert_eq!(
        b.metric_sum("sidecache_lease_superseded_total", &[]).await,
        1.0
    );
    // B's fill is of the current generation: A's new reader waits for it
    // (and, the fills being held, spends its short wait budget).
    let r = client::get(&a.url(P)).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(gate.count(), 2, "the current fill was not waited for");
    gate.release();

    let r = before.await.expect("reader before the invalidation");
    assert_eq!((x_cache(&r), r.text()), ("MISS".into(), v1));
    let r = at_b.await.expect("reader on b");
    assert_eq!((x_cache(&r), r.text()), ("MISS".into(), v2.clone()));
    assert_eq!(origin.hits(P), 2, "one origin request per generation");
    assert_eq!(publishes(&a, "publish_rejected").await, 1.0);
    assert_eq!(publishes(&b, "published").await, 1.0);
    let r = client::get(&a.url(P)).await;
    assert_eq!((x_cache(&r), r.text()), ("HIT".into(), v2));
}

/// A reader that finds no generation key (lost: eviction, restart, `DEL`)
/// cannot compare it with anything: it takes a ticket first, so it never
/// joins a fill that started before an invalidation and a loss. Here the
/// first fill started on a cold object (no key either), the object changed,
/// was invalidated, and the key was deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_finds_no_generation_joins_no_older_fill() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = builder(&redis, &origin, "lease: 5s\nwait: 5s")
        .start()
        .await;
    let (gate, before, v1, v2) = fill_held_then_invalidated(&origin, &sc, &sc).await;
    redis
        .cli(&["DEL", "sc:o:{app:acme:1}:g"])
        .expect("DEL generation");

    let after = spawn_get(sc.url(P));
    gate.arrived(2).await;
    gate.release();
    let r = before.await.expect("reader before the invalidation");
    assert_eq!(r.text(), v1);
    let r = after.await.expect("reader after");
    assert_eq!((x_cache(&r), r.text()), ("MISS".into(), v2));
    assert_eq!(origin.hits(P), 2);
}

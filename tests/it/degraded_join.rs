//! Degraded answers are never older than the window
//! (docs/architecture.md#degraded-answers-are-never-older-than-the-window):
//! with Redis killed, a miss joins the object's running degraded fetch only
//! if that fetch started less than the route's `degraded_join_window` ago;
//! later, it fetches its own and gets what its own call returned. The
//! first fetch is held at the origin, so every interleaving here is exact:
//! the only wait is one longer than the window while that fetch is held.

use crate::support::client::{self, x_cache};
use crate::support::redis::RedisServer;
use crate::support::{app_routes, eventually, get_held, Origin, Sidecache, SidecacheBuilder};
use std::time::Duration;

const P: &str = "/api/tenants/acme/apps/1";

/// An instance on `redis` whose route joins degraded fetches younger than
/// `window`. The long breaker cooldown keeps probes (which may wait for a
/// store timeout) out of the interleavings.
async fn start(redis: &RedisServer, origin: &Origin, window: &str) -> Sidecache {
    SidecacheBuilder::new(origin.url())
        .routes(&app_routes(&format!("degraded_join_window: {window}")))
        .store(&format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n  breaker:\n    cooldown: 60s\n",
            redis.url()
        ))
        .start()
        .await
}

fn spawn_get(url: String) -> tokio::task::JoinHandle<client::Resp> {
    tokio::spawn(async move { client::get(&url).await })
}

async fn joins(sc: &Sidecache) -> f64 {
    sc.metric_sum("sidecache_coalesced_total", &[("route", "app")])
        .await
}

async fn refused(sc: &Sidecache) -> f64 {
    sc.metric_sum("sidecache_degraded_join_refused_total", &[("route", "app")])
        .await
}

/// Asserts a `200 DEGRADED` answer with `body`.
async fn degraded(what: &str, task: tokio::task::JoinHandle<client::Resp>, body: &str) {
    let r = task.await.expect(what);
    assert_eq!(
        (r.status.as_u16(), x_cache(&r), r.text()),
        (200, "DEGRADED".into(), body.to_owned()),
        "{what}"
    );
}

/// A request within the window joins the held fetch: one origin call, one
/// answer for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_miss_within_the_window_joins_the_running_fetch() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    // Long enough that the second request arrives within it on any machine.
    let sc = start(&redis, &origin, "1s").await;
    redis.kill();
    let v1 = origin.default_body(P);
    let (gate, first) = get_held(&origin, P, sc.url(P)).await;

    let second = spawn_get(sc.url(P));
    eventually(
        "the second request joins the held fetch",
        Duration::from_secs(10),
        || async { joins(&sc).await >= 1.0 },
    )
    .await;
    gate.release();

    degraded("first", first, &v1).await;
    degraded("second", second, &v1).await;
    assert_eq!(origin.hits(P), 1, "one origin call for both");
    assert_eq!(refused(&sc).await, 0.0);
}

/// The held fetch read v1; then the object changed to v2. A request that
/// arrives once the fetch is older than the window makes its own call,
/// which reads v2, and gets v2, not the held v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_miss_after_the_window_fetches_its_own() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = start(&redis, &origin, "100ms").await;
    redis.kill();
    let v1 = origin.default_body(P);
    let (gate, first) = get_held(&origin, P, sc.url(P)).await;
    origin.bump(P);
    let v2 = origin.default_body(P);

    // The held fetch started before it reached the origin: once this wait
    // is over it is older than the window, and it cannot finish meanwhile.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let later = spawn_get(sc.url(P));
    gate.arrived(2).await;
    gate.release();

    degraded("first", first, &v1).await;
    degraded("later", later, &v2).await;
    assert_eq!(origin.hits(P), 2, "the later request made its own call");
    assert_eq!(refused(&sc).await, 1.0);
    assert_eq!(joins(&sc).await, 0.0);
}

/// `0s`: a degraded fetch is never joined, however soon the next request
/// comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_window_never_joins_a_degraded_fetch() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = start(&redis, &origin, "0s").await;
    redis.kill();
    let v1 = origin.default_body(P);
    let (gate, first) = get_held(&origin, P, sc.url(P)).await;
    origin.bump(P);
    let v2 = origin.default_body(P);

    let second = spawn_get(sc.url(P));
    gate.arrived(2).await;
    gate.release();

    degraded("first", first, &v1).await;
    degraded("second", second, &v2).await;
    assert_eq!(origin.hits(P), 2);
    assert_eq!(refused(&sc).await, 1.0);
    assert_eq!(joins(&sc).await, 0.0);
}

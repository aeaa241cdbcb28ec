//! Hit-for-pass (docs/caching.md#hit-for-pass) through the real binary, on
//! the embedded store: an object variant whose answer cannot be stored for a
//! reason of its own is forwarded afterwards like plain forwarding (no lease,
//! no coalescing, no fill permit, no fill queue), `X-Cache: PASS`, until the
//! marker expires or the object is invalidated. Interleavings are forced
//! with origin holds.

use crate::support::client::{self, x_cache, Resp};
use crate::support::{eventually, Origin, Reply, Sidecache, SidecacheBuilder};
use std::time::Duration;

/// One fill permit and almost no queue: without hit-for-pass, concurrent
/// misses of an uncacheable object would be refused with 503.
const FILL: &str = "fill:\n  max_concurrency: 1\n  max_queued: 1\n  queue_timeout: 50ms\n";

fn routes(hit_for_pass: &str) -> String {
    format!(
        "routes:\n  - name: item\n    path: /item/{{id}}\n    params: {{ id: \"[0-9]+\" }}\n    \
         ttl: 60s\n    hit_for_pass: {hit_for_pass}\n"
    )
}

async fn start(origin: &Origin, hit_for_pass: &str) -> Sidecache {
    SidecacheBuilder::new(origin.url())
        .routes(&routes(hit_for_pass))
        .fill(FILL)
        .start()
        .await
}

fn spawn_gets(url: &str, n: usize) -> Vec<tokio::task::JoinHandle<Resp>> {
    (0..n)
        .map(|_| {
            let url = url.to_owned();
            tokio::spawn(async move { client::get(&url).await })
        })
        .collect()
}

async fn answers(tasks: Vec<tokio::task::JoinHandle<Resp>>) -> Vec<(u16, String)> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        let r = t.await.expect("client task");
        out.push((r.status.as_u16(), x_cache(&r)));
    }
    out
}

/// 8 concurrent clients on a slow `no-store` object, then 200 more at once:
/// every answer is 200 from its own origin call, none is a 503, and the 200
/// all wait at the origin together (no fill permit holds them back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncacheable_objects_are_passed_without_fill_permits() {
    let origin = Origin::start().await;
    let sc = start(&origin, "60s").await;
    let path = "/item/1";
    origin.reply(
        path,
        Reply::ok("private data").header("cache-control", "no-store"),
    );
    let url = sc.url(path);

    // The first fill waits at the origin; 7 more requests join it.
    let gate = origin.hold(path);
    let first = spawn_gets(&url, 1);
    gate.arrived(1).await;
    let joiners = spawn_gets(&url, 7);
    eventually(
        "7 requests joined the fill",
        Duration::from_secs(10),
        || async {
            sc.metric_sum("sidecache_coalesced_total", &[("route", "item")])
                .await
                >= 7.0
        },
    )
    .await;
    gate.release();
    assert_eq!(answers(first).await, vec![(200, "MISS".to_owned())]);
    // The joiners fetch on their own, forwarded: no fill queue to wait in.
    assert_eq!(answers(joiners).await, vec![(200, "PASS".to_owned()); 7]);
    assert_eq!(origin.hits(path), 8);

    // 200 at once: all of them reach the origin together.
    let gate = origin.hold(path);
    let later = spawn_gets(&url, 200);
    gate.arrived(200).await;
    gate.release();
    assert_eq!(answers(later).await, vec![(200, "PASS".to_owned()); 200]);
    assert_eq!(origin.hits(path), 208, "each from its own origin call");
    let busy = sc.metric_sum("sidecache_overloaded_total", &[]).await;
    assert_eq!(busy, 0.0, "no 503 from the fill queue");
    let passed = sc
        .metric_sum(
            "sidecache_requests_total",
            &[("route", "item"), ("result", "PASS")],
        )
        .await;
    assert_eq!(passed, 207.0);
}

/// An invalidation of the object ends its marker: the next request fills
/// again (and, now cacheable, is stored). `hit_for_pass: 0s`: no marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_ends_the_pass_and_zero_turns_it_off() {
    let origin = Origin::start().await;
    let sc = start(&origin, "60s").await;
    let path = "/item/2";
    origin.reply(path, Reply::ok("v1").header("set-cookie", "s=1"));
    assert_eq!(x_cache(&client::get(&sc.url(path)).await), "MISS");
    origin.reply(path, Reply::ok("v2"));
    // Cacheable now, but the marker still passes it.
    let r = client::get(&sc.url(path)).await;
    assert_eq!((x_cache(&r), r.text()), ("PASS".into(), "v2".into()));
    let body = r#"{"route": "item", "params": {"id": "2"}}"#;
    let inv = client::post(&sc.admin_url("/admin/invalidate"), body.to_owned()).await;
    assert_eq!(inv.status.as_u16(), 200);
    assert_eq!(x_cache(&client::get(&sc.url(path)).await), "MISS");
    assert_eq!(x_cache(&client::get(&sc.url(path)).await), "HIT");

    let origin = Origin::start().await;
    let sc = start(&origin, "0s").await;
    origin.reply(path, Reply::ok("v1").header("cache-control", "private"));
    for _ in 0..2 {
        assert_eq!(x_cache(&client::get(&sc.url(path)).await), "MISS");
    }
}

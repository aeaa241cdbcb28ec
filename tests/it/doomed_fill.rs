//! Waiters take over doomed fills
//! (docs/architecture.md#no-older-answer-after-an-invalidation): instance A's
//! fill of a tagged object holds the lease at the origin (the exact
//! interleaving: the origin holds its answer); one of the tags it took a
//! ticket for is invalidated (or its route purged), which leaves the
//! object's generation alone. A request on instance B does not wait for
//! that fill, whose publish will be refused: it takes the lease over and
//! answers the fresh data, where it used to spend its `wait` budget and
//! answer 503.

use crate::support::redis::RedisServer;
use crate::support::{client, get_held, Origin, Reply, Sidecache, SidecacheBuilder};

/// `wait` is short: a reader that waits for the doomed fill says so with a
/// 503 while that fill is still held, instead of after its release.
const ROUTES: &str = r#"routes:
  - name: tagged
    path: /api/tagged/{id}
    params: { id: "[1-9][0-9]*" }
    ttl: 60s
    lease: 5s
    wait: 300ms
    tags_from: Surrogate-Key
"#;

fn builder(origin: &Origin, redis: &RedisServer) -> SidecacheBuilder {
    SidecacheBuilder::new(origin.url())
        .routes(ROUTES)
        .store(&format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n",
            redis.url()
        ))
}

async fn admin(sc: &Sidecache, body: &str) {
    let r = client::post(&sc.admin_url("/admin/invalidate"), body.to_owned()).await;
    assert_eq!(r.status, 200, "{body}: {}", r.text());
}

async fn metric(sc: &Sidecache, name: &str, labels: &[(&str, &str)]) -> f64 {
    sc.metric_sum(name, labels).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_takes_over_a_fill_its_tag_or_route_event_doomed() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let a = builder(&origin, &redis).start().await;
    let b = builder(&origin, &redis).start().await;
    for (round, (id, event, reason)) in [
        ("1", r#"{"tags": ["shared"]}"#, "tag"),
        ("2", r#"{"route": "tagged"}"#, "route"),
    ]
    .into_iter()
    .enumerate()
    {
        let path = format!("/api/tagged/{id}");
        let tags = format!("item:{id} shared");
        // The first fill publishes and remembers the object's tags, so the
        // next one takes their tickets before its upstream call.
        origin.reply(&path, Reply::ok("v1").header("surrogate-key", &tags));
        let r = client::get(&a.url(&path)).await;
        assert_eq!((r.status.as_u16(), r.text()), (200, "v1".into()));
        admin(&a, event).await;
        origin.reply(&path, Reply::ok("old").header("surrogate-key", &tags));
        let (gate, held) = get_held(&origin, &path, a.url(&path)).await;
        // The held fill's tickets go stale; the data changes.
        admin(&b, event).await;
        origin.reply(&path, Reply::ok("new").header("surrogate-key", &tags));

        let url = b.url(&path);
        let at_b = tokio::spawn(async move { client::get(&url).await });
        // B's request reaches the origin while A's fill is still held
        // there: it did not wait for the doomed fill.
        gate.arrived(2).await;
        let superseded = [("route", "tagged"), ("reason", reason)];
        assert_eq!(
            metric(&b, "sidecache_lease_superseded_total", &superseded).await,
            1.0,
            "{reason}"
        );
        gate.release();
        let r = held.await.expect("held read");
        assert_eq!(
            r.text(),
            "old",
            "{reason}: the held fill answers its own request"
        );
        let r = at_b.await.expect("read on b");
        assert_eq!(
            (r.status.as_u16(), r.header("x-cache"), r.text()),
            (200, Some("MISS".into()), "new".into()),
            "{reason}: the waiter got another answer"
        );
        // The doomed fill learned why it was refused (a tag moved), not
        // that its lease was lost; the taker's fill is stored.
        let rejected = [("route", "tagged"), ("outcome", "publish_rejected")];
        let rounds = (round + 1) as f64;
        assert_eq!(
            metric(&a, "sidecache_publish_total", &rejected).await,
            rounds
        );
        let lost = [("route", "tagged"), ("outcome", "lease_lost")];
        assert_eq!(metric(&a, "sidecache_publish_total", &lost).await, 0.0);
        let r = client::get(&a.url(&path)).await;
        assert_eq!(
            (r.header("x-cache"), r.text()),
            (Some("HIT".into()), "new".into()),
            "{reason}"
        );
    }
    assert_eq!(
        origin.hits("/api/tagged/1"),
        3,
        "one origin request per fill"
    );
}

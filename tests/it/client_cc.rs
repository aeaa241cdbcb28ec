//! `client_cache_control` (docs/caching.md#client-cache-control), on the
//! embedded store and on a real Redis: `pass` keeps the origin's header, a
//! literal replaces it, `remaining` gives clients no more freshness than the
//! entry has left (counting the `Age` they subtract), `max-age=0` once it is
//! served STALE; a 304 carries the same. Only answers from stored entries are
//! rewritten.

use crate::support::client::{self, x_cache, Resp};
use crate::support::redis::RedisServer;
use crate::support::{eventually, Origin, Reply, Sidecache, SidecacheBuilder};
use std::time::Duration;

const ROUTES: &str = r#"routes:
  - name: pass
    path: /pass/{id}
    params: { id: "[0-9]+" }
    ttl: 60s
  - name: lit
    path: /lit/{id}
    params: { id: "[0-9]+" }
    ttl: 60s
    client_cache_control: "private, max-age=0"
  - name: rem
    path: /rem/{id}
    params: { id: "[0-9]+" }
    ttl: 3s
    grace: 60s
    client_cache_control: remaining
"#;

const ORIGIN_CC: &str = "public, s-maxage=600, max-age=600, no-transform";

async fn start(redis: Option<&RedisServer>, origin: &Origin) -> Sidecache {
    SidecacheBuilder::new(origin.url())
        .routes(ROUTES)
        .store_on(redis)
        .start()
        .await
}

fn origin_reply() -> Reply {
    Reply::ok("x")
        .header("etag", "\"v1\"")
        .header("cache-control", ORIGIN_CC)
        .header("expires", "Thu, 01 Jan 2099 00:00:00 GMT")
}

async fn get(sc: &Sidecache, path: &str) -> Resp {
    let r = client::get(&sc.url(path)).await;
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r
}

/// (`max-age` of a `remaining` answer, its `Age` or 0), checking the rest
/// of the header: the origin's directives without its lifetimes.
fn remaining(r: &Resp) -> (u64, u64) {
    let cc = r.header("cache-control").expect("Cache-Control");
    let max_age = cc
        .strip_prefix("public, no-transform, max-age=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected Cache-Control {cc:?}"));
    assert!(r.header("expires").is_none(), "Expires dropped");
    let age = r
        .header("age")
        .map_or(0, |a| a.parse().expect("numeric Age"));
    (max_age, age)
}

async fn each_mode(redis: Option<RedisServer>) {
    let origin = Origin::start().await;
    let sc = start(redis.as_ref(), &origin).await;
    for p in ["/pass/1", "/lit/1", "/rem/1"] {
        origin.reply(p, origin_reply());
    }

    // pass: the origin's header as stored, on MISS and HIT.
    for want in ["MISS", "HIT"] {
        let r = get(&sc, "/pass/1").await;
        assert_eq!(x_cache(&r), want);
        assert_eq!(r.header("cache-control").as_deref(), Some(ORIGIN_CC));
        assert!(r.header("expires").is_some());
    }

    // A literal: instead of the origin's, on MISS and HIT.
    for want in ["MISS", "HIT"] {
        let r = get(&sc, "/lit/1").await;
        assert_eq!(x_cache(&r), want);
        assert_eq!(
            r.headers
                .get_all("cache-control")
                .iter()
                .collect::<Vec<_>>(),
            ["private, max-age=0"]
        );
        assert!(r.header("expires").is_none(), "Expires dropped");
    }
    // A 304 to a revalidating client says the same (RFC 9110 §15.4.5).
    let r = client::request("GET", &sc.url("/lit/1"), &[("if-none-match", "\"v1\"")], "").await;
    assert_eq!((r.status.as_u16(), x_cache(&r)), (304, "HIT".into()));
    assert_eq!(
        r.header("cache-control").as_deref(),
        Some("private, max-age=0")
    );
    // What is not stored keeps the origin's word (it may be stricter).
    origin.reply("/lit/2", Reply::ok("x").header("cache-control", "no-store"));
    let r = get(&sc, "/lit/2").await;
    assert_eq!(
        (x_cache(&r), r.header("cache-control").as_deref()),
        ("MISS".into(), Some("no-store"))
    );

    // remaining: what the client keeps (max-age - Age) never exceeds what
    // is left of the 3 s here, and shrinks as the entry ages.
    let r = get(&sc, "/rem/1").await;
    assert_eq!(x_cache(&r), "MISS");
    let (max_age, age) = remaining(&r);
    assert_eq!(age, 0);
    assert!(
        (2..=3).contains(&max_age),
        "max-age {max_age} on a fresh 3 s entry"
    );
    let left = &std::cell::Cell::new(max_age);
    // Until the entry expires: HITs, then (grace) STALE with max-age=0.
    origin.reply("/rem/1", Reply::status(500));
    let sc = &sc;
    eventually(
        "the entry is served STALE",
        Duration::from_secs(10),
        || async move {
            let r = get(sc, "/rem/1").await;
            let (max_age, age) = remaining(&r);
            match x_cache(&r).as_str() {
                "HIT" => {
                    assert!(max_age <= 3, "max-age {max_age} beyond the ttl");
                    // Less than a second left: max-age=0, whatever the Age.
                    assert!(
                        max_age == 0 || max_age >= age,
                        "max-age {max_age} below Age {age}"
                    );
                    let client_keeps = max_age.saturating_sub(age);
                    assert!(client_keeps <= left.get(), "client freshness grew");
                    left.set(client_keeps);
                    false
                }
                "STALE" => {
                    assert_eq!(max_age, 0, "a STALE answer is stale for the client");
                    true
                }
                other => panic!("unexpected X-Cache {other}"),
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_mode_embedded() {
    each_mode(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_mode_redis() {
    each_mode(Some(RedisServer::start())).await;
}

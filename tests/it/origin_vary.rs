//! Origin-driven variants (`vary_from_origin`,
//! docs/caching.md#vary-from-origin): the names an object's answers give in
//! `Vary` are learned per object, fills carry exactly those headers, and each
//! variant is stored and served by their values; a client can neither change
//! another variant's answer nor pick it, and nothing outside the learned names
//! reaches a fill. The origin here echoes the request it received as the body,
//! so every assertion on a body is an assertion on what the fill sent.

use crate::cache::invalidate;
use crate::support::client::{self, x_cache, Resp};
use crate::support::redis::RedisServer;
use crate::support::{Origin, Reply, Sidecache, SidecacheBuilder};
use std::time::{Duration, Instant};

const P: &str = "/api/tenants/acme/apps/1";
const PARAMS: &str = r#"{"tenant":"acme","id":"1"}"#;

fn routes(extra: &str) -> String {
    format!(
        r#"routes:
  - name: app
    path: /api/tenants/{{tenant}}/apps/{{id}}
    params: {{ tenant: "[a-z]+", id: "[0-9]+" }}
    ttl: origin
    max_ttl: 60s
    vary_from_origin: true
    hit_for_pass: 0s
{extra}"#
    )
}

async fn start(redis: Option<&RedisServer>, origin: &Origin, extra: &str) -> Sidecache {
    SidecacheBuilder::new(origin.url())
        .routes(&routes(extra))
        .store_on(redis)
        .start()
        .await
}

/// An origin answer that varies on `Abc` (and says so) and echoes the
/// request it received.
fn varies_on_abc() -> Reply {
    Reply::echo()
        .header("cache-control", "max-age=60")
        .header("vary", "Abc")
}

async fn get(sc: &Sidecache, headers: &[(&str, &str)]) -> Resp {
    client::request("GET", &sc.url(P), headers, "").await
}

/// The values of `name` the fill that produced `r` carried (echo body).
fn fill_sent(r: &Resp, name: &str) -> Vec<String> {
    let body = r.json();
    body["headers"][name]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

async fn variants_follow_the_learned_names(redis: Option<RedisServer>) {
    let origin = Origin::start().await;
    let sc = start(redis.as_ref(), &origin, "").await;
    origin.reply(P, varies_on_abc());

    // Names not learned yet: the fill carries no Abc, the answer says it
    // varies on Abc, so it is the no-Abc variant's (stored as that) and
    // this client is keyed again and gets its own.
    let r = get(&sc, &[("abc", "1")]).await;
    assert_eq!(x_cache(&r), "MISS");
    assert_eq!(fill_sent(&r, "abc"), ["1"], "the client's own variant");
    assert_eq!(origin.hits(P), 2, "one refetch with the learned name");
    assert_eq!(
        sc.metric_sum("sidecache_vary_relearned_total", &[]).await,
        1.0
    );
    // Each variant is served by its own value; absent is a variant too,
    // and it is the first fill's answer (nothing refetched).
    let r = get(&sc, &[("abc", "1")]).await;
    assert_eq!(
        (x_cache(&r), fill_sent(&r, "abc")),
        ("HIT".into(), vec!["1".into()])
    );
    let r = get(&sc, &[]).await;
    assert_eq!((x_cache(&r), fill_sent(&r, "abc")), ("HIT".into(), vec![]));
    let r = get(&sc, &[("abc", "2")]).await;
    assert_eq!(
        (x_cache(&r), fill_sent(&r, "abc")),
        ("MISS".into(), vec!["2".into()])
    );
    assert_eq!(origin.hits(P), 3, "a known name: one fill, no refetch");
    let r = get(&sc, &[("abc", "2")]).await;
    assert_eq!(
        (x_cache(&r), fill_sent(&r, "abc")),
        ("HIT".into(), vec!["2".into()])
    );
    let r = get(&sc, &[("abc", "1")]).await;
    assert_eq!(
        (x_cache(&r), fill_sent(&r, "abc")),
        ("HIT".into(), vec!["1".into()])
    );

    // The operator sees the learned names and the variant they select.
    let lookup = client::get(&sc.admin_url(&format!("/admin/lookup?url={P}&abc=2"))).await;
    let j = lookup.json();
    assert_eq!(j["learned_vary"], serde_json::json!(["abc"]), "{j}");
    assert_eq!(j["vary"]["abc"], serde_json::json!(["2"]), "{j}");
    assert_eq!(j["verdict"], "HIT", "{j}");

    // One invalidation ends every variant (they share the generation).
    assert_eq!(invalidate(&sc, "app", PARAMS).await.status.as_u16(), 200);
    for h in [&[("abc", "1")][..], &[("abc", "2")], &[]] {
        assert_eq!(x_cache(&get(&sc, h).await), "MISS", "{h:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variants_follow_the_learned_names_embedded() {
    variants_follow_the_learned_names(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variants_follow_the_learned_names_redis() {
    variants_follow_the_learned_names(Some(RedisServer::start())).await;
}

/// Hostile clients: headers outside the learned names never reach a fill
/// (the origin here also uses them without declaring them, as a poisoning
/// target would), a client with one value is never served another value's
/// answer, and an overlong value is not cached at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_change_or_pick_another_variant() {
    let origin = Origin::start().await;
    let sc = start(None, &origin, "    max_vary_value: 16\n").await;
    origin.reply(P, varies_on_abc());
    let hostile = [
        ("abc", "evil"),
        ("x-forwarded-host", "evil.example"),
        ("user-agent", "evil"),
        ("accept-language", "evil"),
    ];
    let r = get(&sc, &hostile).await;
    assert_eq!(fill_sent(&r, "abc"), ["evil"]);
    for (name, _) in &hostile[1..] {
        assert!(fill_sent(&r, name).is_empty(), "{name} reached the fill");
    }
    // Clients with another value, or none, get their own answers.
    let r = get(&sc, &[("abc", "good")]).await;
    assert_eq!(
        (x_cache(&r), fill_sent(&r, "abc")),
        ("MISS".into(), vec!["good".into()])
    );
    let r = get(&sc, &[]).await;
    assert_eq!((x_cache(&r), fill_sent(&r, "abc")), ("HIT".into(), vec![]));
    assert!(!r.text().contains("evil"), "{}", r.text());
    // The hostile client's own variant holds only what its key carried.
    let r = get(&sc, &[("abc", "evil")]).await;
    assert_eq!(x_cache(&r), "HIT");
    assert!(!r.text().contains("evil.example"), "{}", r.text());
    // A value past max_vary_value is forwarded uncached: no variant per
    // hostile value of any length.
    let long = "x".repeat(17);
    let before = origin.hits(P);
    for _ in 0..2 {
        assert_eq!(x_cache(&get(&sc, &[("abc", &long)]).await), "BYPASS");
    }
    assert_eq!(origin.hits(P), before + 2);
}

/// `Vary: *` is never stored, and neither is an answer naming more headers
/// than `max_vary_headers` (nor are their names learned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn star_and_too_many_names_are_not_stored() {
    let origin = Origin::start().await;
    let sc = start(None, &origin, "    max_vary_headers: 2\n").await;
    for vary in ["*", "a, b, c"] {
        origin.reply(
            P,
            Reply::ok("x")
                .header("cache-control", "max-age=60")
                .header("vary", vary),
        );
        origin.reset_counts();
        for _ in 0..2 {
            assert_eq!(x_cache(&get(&sc, &[("a", "1")]).await), "MISS", "{vary}");
        }
        assert_eq!(origin.hits(P), 2, "{vary}");
        let j = client::get(&sc.admin_url(&format!("/admin/lookup?url={P}")))
            .await
            .json();
        assert_eq!(j["learned_vary"], serde_json::json!([]), "{vary}: {j}");
    }
    let star = sc
        .metric_sum("sidecache_uncacheable_total", &[("reason", "vary_star")])
        .await;
    assert_eq!(star, 2.0);
}

/// A change of the origin's `Vary` is learned from the next fill: the
/// object keyed on `Abc` and then on `Def` serves each by its own names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_vary_is_learned_again() {
    let origin = Origin::start().await;
    let sc = start(None, &origin, "").await;
    origin.reply(P, varies_on_abc());
    let r = get(&sc, &[("abc", "1"), ("def", "1")]).await;
    assert_eq!(
        (fill_sent(&r, "abc"), fill_sent(&r, "def")),
        (vec!["1".into()], vec![])
    );
    origin.reply(
        P,
        Reply::echo()
            .header("cache-control", "max-age=60")
            .header("vary", "Def"),
    );
    assert_eq!(invalidate(&sc, "app", PARAMS).await.status.as_u16(), 200);
    // Keyed on Abc, the fill answers "Def": keyed again, now on Def only.
    let r = get(&sc, &[("abc", "1"), ("def", "2")]).await;
    assert_eq!(
        (fill_sent(&r, "abc"), fill_sent(&r, "def")),
        (vec![], vec!["2".into()])
    );
    let r = get(&sc, &[("abc", "9"), ("def", "2")]).await;
    assert_eq!(x_cache(&r), "HIT", "Abc no longer splits the object");
    let j = client::get(&sc.admin_url(&format!("/admin/lookup?url={P}")))
        .await
        .json();
    assert_eq!(j["learned_vary"], serde_json::json!(["def"]), "{j}");
}

/// Revalidating an expired variant sends that variant's learned headers
/// with its validators (RFC 9111 §4.3.1), and the 304 refreshes it.
async fn revalidation_carries_the_variant(redis: Option<RedisServer>) {
    let origin = Origin::start().await;
    let sc = start(redis.as_ref(), &origin, "").await;
    origin.reply(
        P,
        Reply::ok("v1")
            .header("cache-control", "max-age=1")
            .header("etag", "\"v1\"")
            .header("vary", "Abc"),
    );
    // Learn the name first (one refetch), then the variant of Abc: 123.
    assert_eq!(x_cache(&get(&sc, &[("abc", "123")]).await), "MISS");
    origin.reply(
        P,
        Reply::status(304)
            .header("cache-control", "max-age=60")
            .header("etag", "\"v1\"")
            .header("vary", "Abc"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = get(&sc, &[("abc", "123")]).await;
        if x_cache(&r) != "HIT" {
            break r;
        }
        assert!(Instant::now() < deadline, "the entry never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((r.status.as_u16(), r.text()), (200, "v1".into()));
    let sent = origin.last_request(P).expect("a revalidation");
    assert_eq!(sent.headers["if-none-match"], "\"v1\"");
    assert_eq!(sent.headers["abc"], "123");
    let r = get(&sc, &[("abc", "123")]).await;
    assert_eq!((x_cache(&r), r.text()), ("HIT".into(), "v1".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revalidation_carries_the_variant_embedded() {
    revalidation_carries_the_variant(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revalidation_carries_the_variant_redis() {
    revalidation_carries_the_variant(Some(RedisServer::start())).await;
}

//! The read pipeline's behaviour over HTTP, run once on the embedded store
//! and once on a real redis-server: hits and misses, HEAD, invalidation,
//! negative caching, bypass, what is never cached, vary and query variants,
//! the stale-backfill race (held origin response), fill permits.

use crate::support::client::x_cache;
use crate::support::redis::RedisServer;
use crate::support::{
    app_routes, client, eventually, get_held, Origin, Reply, Sidecache, SidecacheBuilder,
};
use std::time::Duration;

const P: &str = "/api/tenants/acme/apps/1";

/// The `app` route (with jitter and a negative TTL) and four routes for
/// vary, the query modes and ignored (tracking) parameters. Hit-for-pass is
/// off: these tests look at every fill of an answer that is not stored
/// (hit_for_pass.rs covers the pass).
fn routes() -> String {
    app_routes("jitter: 5s\nnegative_ttl: 60s\nhit_for_pass: 0s") + MORE_ROUTES
}

const MORE_ROUTES: &str = r#"  - name: varied
    path: /varied/{id}
    params: { id: "[0-9]+" }
    vary: [Accept, Authorization]
    ttl: 60s
  - name: ignoreq
    path: /ignoreq/{id}
    params: { id: "[0-9]+" }
    query: ignore
    ttl: 60s
  - name: allowq
    path: /allowq/{id}
    params: { id: "[0-9]+" }
    query: [a]
    query_ignore: ["utm_*", fbclid]
    ttl: 60s
  - name: trackq
    path: /trackq/{id}
    params: { id: "[0-9]+" }
    query_ignore: ["utm_*", fbclid, gclid]
    ttl: 60s
"#;

/// Which store a test runs on; the Redis server lives as long as the test.
pub enum Backend {
    Embedded,
    Redis(RedisServer),
}

impl Backend {
    fn redis() -> Backend {
        Backend::Redis(RedisServer::start())
    }

    fn builder(&self, origin: &Origin) -> SidecacheBuilder {
        let b = SidecacheBuilder::new(origin.url()).routes(&routes());
        match self {
            Backend::Embedded => b,
            Backend::Redis(r) => b.store(&format!(
                "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n  breaker:\n    cooldown: 500ms\n",
                r.url()
            )),
        }
    }

    async fn start(&self, origin: &Origin) -> Sidecache {
        self.builder(origin).start().await
    }
}

pub async fn invalidate(sc: &Sidecache, route: &str, params: &str) -> client::Resp {
    client::request(
        "POST",
        &sc.admin_url("/admin/invalidate"),
        &[("content-type", "application/json")],
        format!(r#"{{"route":"{route}","params":{params}}}"#),
    )
    .await
}

async fn miss_then_hit(b: Backend) {
    let origin = Origin::start().await;
    let sc = b.start(&origin).await;
    let r = client::get(&sc.url(P)).await;
    assert_eq!((r.status.as_u16(), x_cache(&r)), (200, "MISS".into()));
    assert_eq!(r.text(), origin.default_body(P));
    assert!(r.header("age").is_none(), "a miss has no Age");

    let r = client::get(&sc.url(P)).await;
    assert_eq!((r.status.as_u16(), x_cache(&r)), (200, "HIT".into()));
    assert_eq!(r.text(), origin.default_body(P));
    let age: u64 = r
        .header("age")
        .expect("Age on a hit")
        .parse()
        .expect("numeric Age");
    assert!(age < 60, "age {age}");
    assert!(
        r.header("x-origin-version").is_some(),
        "upstream headers are replayed"
    );

    let h = client::head(&sc.url(P)).await;
    assert_eq!((h.status.as_u16(), x_cache(&h)), (200, "HIT".into()));
    assert!(h.body.is_empty());
    assert_eq!(
        h.header("content-length"),
        Some(origin.default_body(P).len().to_string())
    );
    assert_eq!(
        origin.hits(P),
        1,
        "one upstream call for miss, hit and HEAD"
    );
    assert_eq!(
        sc.metric_sum(
            "sidecache_requests_total",
            &[("route", "app"), ("result", "HIT")]
        )
        .await,
        2.0
    );
}

async fn head_first_fills_from_get(b: Backend) {
    let origin = Origin::start().await;
    let sc = b.start(&origin).await;
    let h = client::head(&sc.url(P)).await;
    assert_eq!((h.status.as_u16(), x_cache(&h)), (200, "MISS".into()));
    assert!(h.body.is_empty());
    let r = client::get(&sc.url(P)).await;
    assert_eq!(
        (x_cache(&r), r.text()),
        ("HIT".into(), origin.default_body(P))
    );
    let seen = origin.last_request(P).expect("origin saw the fill");
    assert_eq!(seen.method, "GET", "fills are GETs even for HEAD");
}

async fn invalidate_makes_next_read_miss(b: Backend) {
    let origin = Origin::start().await;
    let sc = b.start(&origin).await;
    client::get(&sc.url(P)).await;
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");
    origin.bump(P);
    let inv = invalidate(&sc, "app", r#"{"tenant":"acme","id":"1"}"#).await;
    assert_eq!(inv.status, 200, "{}", inv.text());
    let r = client::get(&sc.url(P)).await;
    assert_eq!(
        (x_cache(&r), r.text()),
        ("MISS".into(), origin.default_body(P))
    );
    let r = client::get(&sc.url(P)).await;
    assert_eq!(
        (x_cache(&r), r.text()),
        ("HIT".into(), origin.default_body(P))
    );
    // Invalidations are idempotent and other objects are untouched.
    let other = "/api/tenants/acme/apps/2";
    client::get(&sc.url(other)).await;
    for _ in 0..2 {
        invalidate(&sc, "app", r#"{"tenant":"acme","id":"1"}"#).await;
    }
    assert_eq!(x_cache(&client::get(&sc.url(other)).await), "HIT");
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "MISS");
    // Bad invalidations are refused with a reason.
    let bad = invalidate(&sc, "nope", r#"{"id":"1"}"#).await;
    assert_eq!(bad.status, 400);
    let bad = invalidate(&sc, "app", r#"{"tenant":"acme","id":"x"}"#).await;
    assert_eq!(bad.status, 400);
}

async fn stale_backfill_is_rejected(b: Backend) {
    let origin = Origin::start().await;
    let sc = b.start(&origin).await;
    let old = origin.default_body(P);
    // The reader holds its ticket and waits for the origin's (old) answer.
    let (gate, reader) = get_held(&origin, P, sc.url(P)).await;
    origin.bump(P);
    let inv = invalidate(&sc, "app", r#"{"tenant":"acme","id":"1"}"#).await;
    assert_eq!(inv.status, 200, "{}", inv.text());
    gate.release();
    let r = reader.await.expect("reader task");
    assert_eq!(
        (x_cache(&r), r.text()),
        ("MISS".into(), old),
        "the reader still gets its answer"
    );
    assert_eq!(
        sc.metric_sum(
            "sidecache_publish_total",
            &[("route", "app"), ("outcome", "publish_rejected")]
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
    let r = client::get(&sc.url(P)).await;
    assert_eq!(
        (x_cache(&r), r.text()),
        ("HIT".into(), origin.default_body(P))
    );
}

async fn negative_answers_are_cached(b: Backend) {
    let origin = Origin::start().await;
    let missing = "/api/tenants/acme/apps/404";
    origin.reply(missing, Reply::status(404).body("no such app"));
    let sc = b.start(&origin).await;
    let r = client::get(&sc.url(missing)).await;
    assert_eq!((r.status.as_u16(), x_cache(&r)), (404, "MISS".into()));
    for _ in 0..3 {
        let r = client::get(&sc.url(missing)).await;
        assert_eq!(
            (r.status.as_u16(), x_cache(&r), r.text()),
            (404, "NEGATIVE".into(), "no such app".into())
        );
    }
    assert_eq!(origin.hits(missing), 1);
    // Other statuses are not cached at all.
    let broken = "/api/tenants/acme/apps/500";
    origin.reply(broken, Reply::status(500));
    for _ in 0..2 {
        assert_eq!(client::get(&sc.url(broken)).await.status, 500);
    }
    assert_eq!(origin.hits(broken), 2);
}

async fn credentials_bypass_unless_varied(b: Backend) {
    let origin = Origin::start().await;
    let sc = b.start(&origin).await;
    for h in [("authorization", "Bearer a"), ("cookie", "s=1")] {
        for _ in 0..2 {
            let r = client::request("GET", &sc.url(P), &[h], "").await;
            assert_eq!((r.status.as_u16(), x_cache(&r)), (200, "BYPASS".into()));
        }
    }
    assert_eq!(origin.hits(P), 4);
    let last = origin.last_request(P).expect("forwarded");
    assert_eq!(
        last.headers.get("cookie").map(|v| v.as_bytes()),
        Some(&b"s=1"[..])
    );

    // `varied` lists Authorization in `vary`: cached per credential.
    let v = "/varied/1";
    let get = |tok: &'static str| {
        let url = sc.url(v);
        async move { client::request("GET", &url, &[("authorization", tok)], "").await }
    };
    assert_eq!(x_cache(&get("Bearer a").await), "MISS");
    assert_eq!(x_cache(&get("Bearer a").await), "HIT");
    assert_eq!(x_cache(&get("Bearer b").await), "MISS");
    assert_eq!(origin.hits(v), 2);
}

async fn private_and_no_store_are_never_cached(b: Backend) {
    let origin = Origin::start().await;
    let cookie = "/api/tenants/acme/apps/11";
    let private = "/api/tenants/acme/apps/12";
    let nostore = "/api/tenants/acme/apps/13";
    origin.reply(
        cookie,
        Reply::ok("mine").header("set-cookie", "session=secret"),
    );
    origin.reply(
        private,
        Reply::ok("mine").header("cache-control", "private, max-age=60"),
    );
    origin.reply(
        nostore,
        Reply::ok("fresh").header("cache-control", "no-store"),
    );
    let sc = b.start(&origin).await;
    for path in [cookie, private, nostore] {
        for _ in 0..2 {
            let r = client::get(&sc.url(path)).await;
            assert_eq!(
                (r.status.as_u16(), x_cache(&r)),
                (200, "MISS".into()),
                "{path}"
            );
        }
        assert_eq!(origin.hits(path), 2, "{path} must not be cached");
    }
    let r = client::get(&sc.url(cookie)).await;
    assert_eq!(
        r.header("set-cookie").as_deref(),
        Some("session=secret"),
        "the client still gets its cookie"
    );
}

async fn vary_headers_make_isolated_variants(b: Backend) {
    let origin = Origin::start().await;
    let v = "/varied/7";
    origin.reply(v, Reply::echo());
    let sc = b.start(&origin).await;
    let get = |accept: &'static str| {
        let url = sc.url(v);
        async move { client::request("GET", &url, &[("accept", accept)], "").await }
    };
    let accept_of = |r: &client::Resp| {
        r.json()["headers"]["accept"][0]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    let a = get("application/json").await;
    let t = get("text/plain").await;
    assert_eq!((x_cache(&a), x_cache(&t)), ("MISS".into(), "MISS".into()));
    let a2 = get("application/json").await;
    let t2 = get("text/plain").await;
    assert_eq!(
        (x_cache(&a2), accept_of(&a2)),
        ("HIT".into(), "application/json".into())
    );
    assert_eq!(
        (x_cache(&t2), accept_of(&t2)),
        ("HIT".into(), "text/plain".into())
    );
    assert_eq!(origin.hits(v), 2);
}

async fn query_modes_shape_key_and_fill(b: Backend) {
    let origin = Origin::start().await;
    for p in ["/ignoreq/1", "/allowq/1", P] {
        origin.reply(p, Reply::echo());
    }
    let sc = b.start(&origin).await;
    let q = |path: &str, query: &str| format!("{}?{query}", sc.url(path));

    assert_eq!(x_cache(&client::get(&q(P, "b=2&a=1")).await), "MISS");
    assert_eq!(
        origin.last_request(P).and_then(|r| r.query).as_deref(),
        Some("a=1&b=2")
    );
    assert_eq!(x_cache(&client::get(&q(P, "a=1&b=2")).await), "HIT");
    assert_eq!(x_cache(&client::get(&q(P, "a=1")).await), "MISS");

    assert_eq!(x_cache(&client::get(&q("/ignoreq/1", "x=1")).await), "MISS");
    assert_eq!(
        origin.last_request("/ignoreq/1").and_then(|r| r.query),
        None
    );
    assert_eq!(x_cache(&client::get(&q("/ignoreq/1", "x=2")).await), "HIT");

    // A parameter outside the allow-list: forwarded as is, not cached.
    assert_eq!(
        x_cache(&client::get(&q("/allowq/1", "z=9&a=1")).await),
        "BYPASS"
    );
    assert_eq!(
        origin
            .last_request("/allowq/1")
            .and_then(|r| r.query)
            .as_deref(),
        Some("z=9&a=1")
    );
    assert_eq!(x_cache(&client::get(&q("/allowq/1", "a=1")).await), "MISS");
    assert_eq!(x_cache(&client::get(&q("/allowq/1", "a=1")).await), "HIT");
}

async fn ignored_query_params_leave_key_and_fill(b: Backend) {
    let origin = Origin::start().await;
    for p in ["/trackq/1", "/trackq/2", "/allowq/2"] {
        origin.reply(p, Reply::echo());
    }
    let sc = b.start(&origin).await;
    let q = |path: &str, query: &str| format!("{}?{query}", sc.url(path));
    let origin_query = |path: &str| origin.last_request(path).and_then(|r| r.query);

    // The plain object, then a campaign click: a HIT of the same entry.
    assert_eq!(x_cache(&client::get(&q("/trackq/1", "a=1")).await), "MISS");
    let r = client::get(&q("/trackq/1", "utm_source=news&a=1&fbclid=x&utm_medium")).await;
    assert_eq!((r.status.as_u16(), x_cache(&r)), (200, "HIT".into()));
    assert_eq!(origin.hits("/trackq/1"), 1);
    // A cold object filled by a tracked request: the origin never sees the
    // tracking parameters, and the plain request hits what it stored.
    let r = client::get(&q("/trackq/2", "gclid=9&b=2&utm_campaign=spring")).await;
    assert_eq!(x_cache(&r), "MISS");
    assert_eq!(origin_query("/trackq/2").as_deref(), Some("b=2"));
    let r = client::get(&q("/trackq/2", "b=2")).await;
    assert_eq!(x_cache(&r), "HIT");
    // Only tracking parameters: the fill carries no query at all.
    assert_eq!(
        x_cache(&client::get(&q("/trackq/2", "utm_source=x")).await),
        "MISS"
    );
    assert_eq!(origin_query("/trackq/2"), None);
    assert_eq!(x_cache(&client::get(&sc.url("/trackq/2")).await), "HIT");
    // Other parameters still make variants of their own.
    assert_eq!(
        x_cache(&client::get(&q("/trackq/1", "a=2&fbclid=x")).await),
        "MISS"
    );
    assert_eq!(origin_query("/trackq/1").as_deref(), Some("a=2"));

    // With an allow-list, an ignored parameter is not a reason to bypass;
    // any other unlisted one still is.
    assert_eq!(
        x_cache(&client::get(&q("/allowq/2", "a=1&utm_source=x")).await),
        "MISS"
    );
    assert_eq!(origin_query("/allowq/2").as_deref(), Some("a=1"));
    assert_eq!(
        x_cache(&client::get(&q("/allowq/2", "fbclid=y&a=1")).await),
        "HIT"
    );
    assert_eq!(
        x_cache(&client::get(&q("/allowq/2", "a=1&z=9&utm_source=x")).await),
        "BYPASS"
    );
    assert_eq!(origin.hits("/allowq/2"), 2);
}

/// `Cache-Status` (RFC 9211) beside `X-Cache`: a fill that stores, a
/// request that joined it, a hit, a bypass; under the configured name.
async fn cache_status_says_what_happened(b: Backend) {
    let origin = Origin::start().await;
    let sc = b
        .builder(&origin)
        .extra("cache_name: edge-1\n")
        .start()
        .await;
    let status = |r: &client::Resp| r.header("cache-status").unwrap_or_default();
    // `ttl=<n>` with n within the route's ttl (60s, + jitter 5s).
    let ttl = |v: &str| -> i64 {
        let n = v
            .split(';')
            .find_map(|p| p.strip_prefix("ttl="))
            .unwrap_or_else(|| panic!("no ttl in {v:?}"));
        n.parse().unwrap_or_else(|_| panic!("ttl {n:?} in {v:?}"))
    };
    // One fill held at the origin, a second request joined to it.
    let (gate, starter) = get_held(&origin, P, sc.url(P)).await;
    let url = sc.url(P);
    let joiner = tokio::spawn(async move { client::get(&url).await });
    let joined = || async {
        let labels = [("route", "app")];
        sc.metric_sum("sidecache_coalesced_total", &labels).await >= 1.0
    };
    eventually(
        "the second request joins the fill",
        Duration::from_secs(5),
        joined,
    )
    .await;
    gate.release();
    let starter = starter.await.expect("starter");
    let joiner = joiner.await.expect("joiner");
    assert_eq!(
        (x_cache(&starter), x_cache(&joiner)),
        ("MISS".into(), "MISS".into())
    );
    let (s, j) = (status(&starter), status(&joiner));
    assert!(
        s.starts_with("edge-1;fwd=uri-miss;fwd-status=200;ttl=") && s.ends_with(";stored"),
        "{s}"
    );
    assert!((55..=65).contains(&ttl(&s)), "{s}");
    assert!(
        j.starts_with("edge-1;fwd=uri-miss;fwd-status=200;ttl="),
        "{j}"
    );
    assert!(j.ends_with(";stored;collapsed"), "{j}");
    assert_eq!(origin.hits(P), 1);

    let hit = client::get(&sc.url(P)).await;
    let h = status(&hit);
    assert_eq!(x_cache(&hit), "HIT");
    assert!(
        h.starts_with("edge-1;hit;ttl=") && (55..=65).contains(&ttl(&h)),
        "{h}"
    );
    assert_eq!(
        h.matches(';').count(),
        2,
        "nothing else on a plain hit: {h}"
    );

    // Credentials outside the key: forwarded, and the service's status.
    let r = client::request("GET", &sc.url(P), &[("authorization", "Bearer x")], "").await;
    assert_eq!(x_cache(&r), "BYPASS");
    assert_eq!(status(&r), "edge-1;fwd=bypass;fwd-status=200");
}

async fn fills_drop_poisoning_headers(b: Backend) {
    let origin = Origin::start().await;
    origin.reply(P, Reply::echo());
    let sc = b.start(&origin).await;
    let r = client::request(
        "GET",
        &sc.url(P),
        &[
            ("x-forwarded-host", "evil.example"),
            ("x-http-method-override", "DELETE"),
            ("forwarded", "host=evil"),
            ("if-none-match", "\"abc\""),
            ("accept-encoding", "gzip"),
            ("user-agent", "dropped/1"),
            ("x-request-id", "kept-1"),
        ],
        "",
    )
    .await;
    assert_eq!(x_cache(&r), "MISS");
    let seen = origin.last_request(P).expect("fill seen");
    for h in [
        "x-forwarded-host",
        "x-http-method-override",
        "forwarded",
        "if-none-match",
        "accept-encoding",
    ] {
        assert!(
            seen.headers.get(h).is_none(),
            "{h} reached the origin on a fill"
        );
    }
    // Fills carry only keyed and allow-listed headers (tests/it/fill_hardening.rs).
    assert!(seen.headers.get("user-agent").is_none());
    assert!(seen.headers.get("x-forwarded-for").is_none());
    assert_eq!(
        seen.headers.get("x-request-id").map(|v| v.as_bytes()),
        Some(&b"kept-1"[..])
    );
}

async fn large_bodies_stream_through_uncached(b: Backend) {
    let origin = Origin::start().await;
    let big = "/api/tenants/acme/apps/77";
    let body = "x".repeat(4096);
    origin.reply(big, Reply::ok(body.clone()));
    let sc = b
        .builder(&origin)
        .fill("fill:\n  max_body: 1KiB\n")
        .start()
        .await;
    for _ in 0..2 {
        let r = client::get(&sc.url(big)).await;
        assert_eq!((r.status.as_u16(), x_cache(&r)), (200, "MISS".into()));
        assert_eq!(r.text(), body);
    }
    assert_eq!(origin.hits(big), 2);
    assert_eq!(
        sc.metric_sum(
            "sidecache_publish_total",
            &[("route", "app"), ("outcome", "too_large")]
        )
        .await,
        2.0
    );
}

/// The origin's `Age` is kept (RFC 9111 §4.2.3, §5.1): the MISS answer
/// carries it, and a HIT adds the time the entry has been stored to it, so
/// a downstream cache never thinks the object younger than it is.
async fn origin_age_is_kept_and_grows(b: Backend) {
    let origin = Origin::start().await;
    origin.reply(P, Reply::ok("aged").header("age", "30"));
    let sc = b.start(&origin).await;
    let age =
        |r: &client::Resp| -> u64 { r.header("age").expect("Age").parse().expect("numeric Age") };
    let r = client::get(&sc.url(P)).await;
    assert_eq!(x_cache(&r), "MISS");
    assert_eq!(age(&r), 30, "the origin's Age on the miss");
    let r = client::get(&sc.url(P)).await;
    assert_eq!(x_cache(&r), "HIT");
    let a = age(&r);
    assert!(
        (30..90).contains(&a),
        "origin's 30 s plus resident time: {a}"
    );
    // An Age that is not a number is ignored, not passed on.
    let other = "/api/tenants/acme/apps/2";
    origin.reply(other, Reply::ok("odd").header("age", "-7200"));
    let r = client::get(&sc.url(other)).await;
    assert!(r.header("age").is_none(), "an invalid Age is dropped");
    let r = client::get(&sc.url(other)).await;
    assert!(age(&r) < 30, "and counts as zero");
}

/// An instance with `fill` as its `fill:` section and one fill permit,
/// taken by a fill of `P` held at the origin.
async fn one_permit_held(
    b: &Backend,
    fill: &str,
) -> (
    Origin,
    Sidecache,
    crate::support::Gate,
    tokio::task::JoinHandle<client::Resp>,
) {
    let origin = Origin::start().await;
    let sc = b
        .builder(&origin)
        .fill(&format!("fill:\n  max_concurrency: 1\n{fill}"))
        .start()
        .await;
    let (gate, first) = get_held(&origin, P, sc.url(P)).await;
    (origin, sc, gate, first)
}

/// With the queue off (`queue_timeout: 0s`), a full pool answers 503 at once.
async fn full_fill_permits_answer_503_at_once(b: Backend) {
    let (origin, sc, gate, first) = one_permit_held(&b, "  queue_timeout: 0s\n").await;
    let other = "/api/tenants/acme/apps/2";
    let started = std::time::Instant::now();
    let r = client::get(&sc.url(other)).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "503 must not wait"
    );
    assert_eq!(origin.hits(other), 0);
    gate.release();
    assert_eq!(first.await.expect("first").status, 200);
    // The permit came back.
    assert_eq!(client::get(&sc.url(other)).await.status, 200);
}

/// A burst of distinct cold keys beyond `fill.max_concurrency` waits in the
/// fill queue and is served when a permit returns
/// (docs/caching.md#hostile-traffic-and-slow-fills), instead of getting 503.
/// The queue's length is bounded: one more than `max_queued` answers 503 at
/// once; a wait longer than `queue_timeout` ends in 503.
async fn fill_queue_serves_bursts_and_stays_bounded(b: Backend) {
    let (origin, sc, gate, first) =
        one_permit_held(&b, "  queue_timeout: 10s\n  max_queued: 1\n").await;
    let queued_path = "/api/tenants/acme/apps/2";
    let url = sc.url(queued_path);
    let queued = tokio::spawn(async move { client::get(&url).await });
    eventually("one fill queued", Duration::from_secs(5), || async {
        sc.metric_sum("sidecache_fill_queued", &[]).await == 1.0
    })
    .await;
    // The queue is full: the next distinct key is refused at once.
    let refused = client::get(&sc.url("/api/tenants/acme/apps/3")).await;
    assert_eq!(refused.status, 503);
    assert_eq!(
        sc.metric_sum("sidecache_fill_queue_rejected_total", &[])
            .await,
        1.0
    );
    assert_eq!(origin.hits(queued_path), 0, "still waiting for the permit");
    gate.release();
    assert_eq!(first.await.expect("first").status, 200);
    let r = queued.await.expect("queued");
    assert_eq!(
        r.status, 200,
        "the queued fill ran once the permit came back"
    );
    assert_eq!(x_cache(&r), "MISS");
    assert_eq!(origin.hits(queued_path), 1);
    assert_eq!(sc.metric_sum("sidecache_fill_queued", &[]).await, 0.0);
    assert_eq!(
        sc.metric_sum(
            "sidecache_fill_queue_wait_seconds_count",
            &[("outcome", "acquired")]
        )
        .await,
        1.0
    );
}

/// A queued fill whose permit does not come back within `queue_timeout`
/// answers 503, and the queue is empty again.
async fn fill_queue_wait_is_bounded(b: Backend) {
    let (origin, sc, gate, first) = one_permit_held(&b, "  queue_timeout: 200ms\n").await;
    let other = "/api/tenants/acme/apps/2";
    let started = std::time::Instant::now();
    let r = client::get(&sc.url(other)).await;
    assert_eq!(r.status, 503);
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "the fill waited its queue_timeout first"
    );
    assert_eq!(origin.hits(other), 0);
    assert_eq!(
        sc.metric_sum(
            "sidecache_fill_queue_wait_seconds_count",
            &[("outcome", "timeout")]
        )
        .await,
        1.0
    );
    assert_eq!(sc.metric_sum("sidecache_fill_queued", &[]).await, 0.0);
    gate.release();
    assert_eq!(first.await.expect("first").status, 200);
}

/// Stage 5 inside one instance: 50 concurrent misses join one flight and
/// share one upstream call. The cross-instance lease alone would also give
/// one upstream call, so the test pins what only joining gives: the joiners
/// never take part in the lease. They are not held to its `wait` budget (the
/// origin holds the one fill for four times that budget and every request
/// still gets the answer; a request left to poll the lease would answer 503),
/// and on Redis the server sees exactly one fill take the lease
/// (`lua/lease.lua`) for the key.
async fn coalesces_concurrent_misses_in_one_instance(b: Backend) {
    const WAIT: Duration = Duration::from_millis(200);
    let origin = Origin::start().await;
    let sc = b
        .builder(&origin)
        .routes(&app_routes("lease: 30s\nwait: 200ms"))
        .start()
        .await;
    if let Backend::Redis(redis) = &b {
        record_every_command(redis);
    }
    let gate = origin.hold(P);
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let url = sc.url(P);
        tasks.push(tokio::spawn(async move { client::get(&url).await }));
    }
    gate.arrived(1).await;
    // The thing under test is a duration: joiners outlast the lease's wait
    // budget. Nothing can have answered meanwhile.
    tokio::time::sleep(4 * WAIT).await;
    let answered = tasks.iter().filter(|t| t.is_finished()).count();
    assert_eq!(
        answered, 0,
        "requests answered while the one fill was held (lease wait budget spent?)"
    );
    gate.release();
    for t in tasks {
        let r = t.await.expect("task");
        assert_eq!((r.status.as_u16(), r.text()), (200, origin.default_body(P)));
    }
    assert_eq!(
        origin.hits(P),
        1,
        "50 concurrent misses share one upstream call"
    );
    if let Backend::Redis(redis) = &b {
        assert_eq!(
            lease_attempts(redis, "sc:o:{app:acme:1}:l:"),
            1,
            "one lease attempt for the key: the other 49 joined the flight"
        );
    }
}

/// Makes `redis` log every command with its arguments in the slow log (the
/// commands a script runs are not logged, only the script call).
fn record_every_command(redis: &RedisServer) {
    for args in [
        &["CONFIG", "SET", "slowlog-max-len", "100000"][..],
        &["CONFIG", "SET", "slowlog-log-slower-than", "0"],
        &["SLOWLOG", "RESET"],
    ] {
        redis.cli(args).expect("slow log setup");
    }
}

/// Fills that tried the lease of a key starting with `lease_prefix` since
/// [`record_every_command`]: distinct owner tokens in `lua/lease.lua` calls
/// (`EVALSHA sha 2 <lease> <gen> <owner> …`; one token per fill, and a
/// `NOSCRIPT` retry repeats it).
fn lease_attempts(redis: &RedisServer, lease_prefix: &str) -> usize {
    use ::redis::Value;
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => String::new(),
    };
    let Ok(Value::Array(entries)) = redis.cli(&["SLOWLOG", "GET", "100000"]) else {
        panic!("SLOWLOG GET did not answer an array");
    };
    entries
        .iter()
        .filter_map(|entry| match entry {
            Value::Array(fields) => match fields.get(3) {
                Some(Value::Array(args)) => Some(args.iter().map(text).collect::<Vec<_>>()),
                _ => None,
            },
            _ => None,
        })
        .filter(|args| {
            // Only lease.lua has these two keys (publish has three,
            // renew and unlock one).
            args.len() > 5
                && args[0].eq_ignore_ascii_case("EVALSHA")
                && args[2] == "2"
                && args[3].starts_with(lease_prefix)
        })
        .map(|args| args[5].clone())
        .collect::<std::collections::HashSet<_>>()
        .len()
}

async fn successful_writes_invalidate_the_object(b: Backend) {
    let origin = Origin::start().await;
    let sc = b.start(&origin).await;
    client::get(&sc.url(P)).await;
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");
    origin.bump(P);
    let w = client::put(&sc.url(P), "{\"name\":\"new\"}").await;
    assert_eq!(w.status, 200);
    let r = client::get(&sc.url(P)).await;
    assert_eq!(
        (x_cache(&r), r.text()),
        ("MISS".into(), origin.default_body(P)),
        "fresh right after the write"
    );
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");
    assert_eq!(
        sc.metric_sum(
            "sidecache_invalidations_total",
            &[("source", "write_through"), ("outcome", "applied")]
        )
        .await,
        1.0
    );
    // A method whose safety is unknown counts as unsafe (RFC 9111 §4.4);
    // a safe one invalidates nothing.
    let w = client::request("M-SEARCH", &sc.url(P), &[], "").await;
    assert_eq!(w.status, 200);
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "MISS");
    assert_eq!(
        client::request("OPTIONS", &sc.url(P), &[], "").await.status,
        200
    );
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");
    // A failed write invalidates nothing.
    origin.reply(P, Reply::status(500));
    assert_eq!(client::put(&sc.url(P), "x").await.status, 500);
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");
}

async fn private_answers_are_never_shared_with_coalesced_requests(b: Backend) {
    let origin = Origin::start().await;
    let personal = "/api/tenants/acme/apps/21";
    origin.reply(personal, Reply::echo().header("set-cookie", "session=x"));
    let sc = b.start(&origin).await;
    // The first fill is held so later requests can join its flight.
    let gate = origin.hold(personal);
    let mut tasks = Vec::new();
    for n in 0..3 {
        let url = sc.url(personal);
        let me = format!("client-{n}");
        tasks.push(tokio::spawn(async move {
            // x-request-id: a fill carries it (default `fill_headers`).
            let r = client::request("GET", &url, &[("x-request-id", me.as_str())], "").await;
            (me, r)
        }));
    }
    gate.arrived(1).await;
    gate.release();
    for t in tasks {
        let (me, r) = t.await.expect("task");
        assert_eq!((r.status.as_u16(), x_cache(&r)), (200, "MISS".into()));
        // Each client gets the answer its own request caused, never another's.
        let seen = r.json()["headers"]["x-request-id"][0]
            .as_str()
            .unwrap_or("")
            .to_owned();
        assert_eq!(seen, me);
    }
    assert_eq!(origin.hits(personal), 3, "one upstream call per client");
}

/// `POST /admin/invalidate` for every object of `route` (no params).
async fn purge(sc: &Sidecache, route: &str) -> client::Resp {
    client::request(
        "POST",
        &sc.admin_url("/admin/invalidate"),
        &[("content-type", "application/json")],
        format!(r#"{{"route":"{route}"}}"#),
    )
    .await
}

/// A route-wide purge (`{"route":"app"}`): every object and variant of the
/// route misses, other routes keep their entries.
async fn a_route_purge_misses_every_object_of_the_route(b: Backend) {
    let origin = Origin::start().await;
    let sc = b.start(&origin).await;
    let objects = [
        "/api/tenants/acme/apps/1",
        "/api/tenants/globex/apps/2",
        "/ignoreq/7",
    ];
    for p in objects {
        client::get(&sc.url(p)).await;
        assert_eq!(x_cache(&client::get(&sc.url(p)).await), "HIT", "{p}");
    }
    let r = purge(&sc, "app").await;
    assert_eq!(r.status, 200, "{}", r.text());
    for p in &objects[..2] {
        assert_eq!(
            x_cache(&client::get(&sc.url(p)).await),
            "MISS",
            "{p} after the purge"
        );
        assert_eq!(
            x_cache(&client::get(&sc.url(p)).await),
            "HIT",
            "{p} refilled"
        );
    }
    assert_eq!(
        x_cache(&client::get(&sc.url(objects[2])).await),
        "HIT",
        "another route"
    );
    assert_eq!(
        sc.metric_sum(
            "sidecache_invalidations_total",
            &[("source", "admin"), ("kind", "route")]
        )
        .await,
        1.0
    );
    // Partial params name no route-wide scope: refused (cache tags do that).
    let partial = invalidate(&sc, "app", r#"{"tenant":"acme"}"#).await;
    assert_eq!(partial.status, 400);
}

/// A fill that began before a route-wide purge is never served after it:
/// its reader gets the answer, the publish is refused, the next read fills.
async fn a_fill_that_began_before_a_route_purge_is_not_stored(b: Backend) {
    let origin = Origin::start().await;
    let sc = b.start(&origin).await;
    let old = origin.default_body(P);
    let (gate, reader) = get_held(&origin, P, sc.url(P)).await;
    origin.bump(P);
    assert_eq!(purge(&sc, "app").await.status, 200);
    gate.release();
    let r = reader.await.expect("reader task");
    assert_eq!((x_cache(&r), r.text()), ("MISS".into(), old));
    let r = client::get(&sc.url(P)).await;
    assert_eq!(
        (x_cache(&r), r.text()),
        ("MISS".into(), origin.default_body(P)),
        "the answer fetched before the purge was not stored"
    );
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Embedded).await
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::redis()).await
                }
            )*
        }
    };
}

on_both_stores!(
    miss_then_hit,
    head_first_fills_from_get,
    invalidate_makes_next_read_miss,
    stale_backfill_is_rejected,
    negative_answers_are_cached,
    credentials_bypass_unless_varied,
    private_and_no_store_are_never_cached,
    vary_headers_make_isolated_variants,
    query_modes_shape_key_and_fill,
    ignored_query_params_leave_key_and_fill,
    cache_status_says_what_happened,
    fills_drop_poisoning_headers,
    large_bodies_stream_through_uncached,
    full_fill_permits_answer_503_at_once,
    origin_age_is_kept_and_grows,
    fill_queue_serves_bursts_and_stays_bounded,
    fill_queue_wait_is_bounded,
    coalesces_concurrent_misses_in_one_instance,
    successful_writes_invalidate_the_object,
    private_answers_are_never_shared_with_coalesced_requests,
    a_route_purge_misses_every_object_of_the_route,
    a_fill_that_began_before_a_route_purge_is_not_stored,
);

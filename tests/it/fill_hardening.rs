//! Hardening of the read pipeline against hostile clients
//! (docs/caching.md#what-a-fill-sends), run against the real binary and an
//! origin that echoes each request it receives into its body:
//!
//! - fills are built from the cache key, so no client header outside `vary`
//!   and `fill_headers` can shape a cached answer (HTTP/1 and h2), and two
//!   requests with the same key send byte-identical fills;
//! - the origin's refusals (`no-store`, `no-cache`, `private`, zero
//!   `max-age`/`s-maxage`, `Vary` beyond the key) keep an answer out of the
//!   cache and away from coalesced requests, unless the route says
//!   `origin_cache_control: ignore`;
//! - a query parameter outside the route's allow-list is BYPASS, and one
//!   route's fills cannot take every fill permit (cache-busting);
//! - a fill slower than its lease renews it and still publishes.
//!
//! Interleavings are forced with origin holds; nothing sleeps and hopes.

use crate::support::client::{self, x_cache, Resp};
use crate::support::{eventually, Origin, Reply, Sidecache, SidecacheBuilder};
use std::time::Duration;

/// Every attacker value contains this, so one `contains` finds any leak.
const EVIL: &str = "evil-7d1f";

/// Hit-for-pass is off: these tests look at every fill of a refused answer
/// (hit_for_pass.rs covers the pass that would follow).
const ROUTES: &str = r#"routes:
  - name: echo
    path: /echo/{id}
    params: { id: "[0-9]+" }
    vary: [Accept]
    ttl: 60s
    negative_ttl: 60s
    hit_for_pass: 0s
  - name: personal
    path: /echo/personal/{id}
    params: { id: "[0-9]+" }
    fill_headers: [x-user]
    ttl: 60s
    hit_for_pass: 0s
  - name: trusting
    path: /echo/trusting/{id}
    params: { id: "[0-9]+" }
    fill_headers: [x-user]
    origin_cache_control: ignore
    ttl: 60s
    hit_for_pass: 0s
  - name: paged
    path: /echo/paged/{id}
    params: { id: "[0-9]+" }
    query: [page]
    ttl: 60s
"#;

async fn start(origin: &Origin) -> Sidecache {
    SidecacheBuilder::new(origin.url())
        .routes(ROUTES)
        .start()
        .await
}

fn status_and_cache(r: &Resp) -> (u16, String) {
    (r.status.as_u16(), x_cache(r))
}

/// Sends the attacker's request on `url`: HTTP/1 or h2, extra headers.
async fn attack(h2: bool, url: &str, headers: &[(&str, &str)]) -> Resp {
    if h2 {
        client::request_h2("GET", url, headers, "").await
    } else {
        client::request("GET", url, headers, "").await
    }
}

/// The headers of row 1 that a fill used to copy from the client.
fn poisoning_headers() -> Vec<(&'static str, String)> {
    vec![
        ("host", format!("{EVIL}.test")),
        ("x-host", format!("{EVIL}.test")),
        ("x-forwarded-scheme", EVIL.to_owned()),
        ("x-forwarded-port", EVIL.to_owned()),
        ("x-forwarded-prefix", format!("/{EVIL}")),
        ("x-forwarded-for", format!("203.0.113.7, {EVIL}")),
        ("origin", format!("https://{EVIL}.test")),
        ("user-agent", format!("{EVIL}/1.0")),
        ("accept-language", EVIL.to_owned()),
    ]
}

/// After an attack filled `path`, a plain client is served from the cache
/// and finds nothing of the attacker in the body; the fill the origin saw
/// has nothing of it either and names the upstream as `Host`.
async fn assert_clean(sc: &Sidecache, origin: &Origin, path: &str, what: &str, want: &str) {
    let r = client::get(&sc.url(path)).await;
    assert_eq!(x_cache(&r), want, "{what}: {}", r.text());
    assert!(
        !r.text().contains(EVIL),
        "{what}: cached body carries the attacker's value: {}",
        r.text()
    );
    let fill = origin.last_request(path).expect("the origin saw the fill");
    for (name, value) in &fill.headers {
        assert!(
            !String::from_utf8_lossy(value.as_bytes()).contains(EVIL),
            "{what}: fill carried {name}: {value:?}"
        );
    }
    assert_eq!(
        fill.headers.get("host").map(|v| v.as_bytes()),
        Some(origin.addr().to_string().as_bytes()),
        "{what}: the fill's Host is the upstream's authority"
    );
}

#[tokio::test]
async fn client_headers_outside_the_key_never_reach_a_cached_answer() {
    let origin = Origin::start().await;
    let sc = start(&origin).await;
    let mut id = 0;
    for h2 in [false, true] {
        for (name, value) in poisoning_headers() {
            id += 1;
            let path = format!("/echo/{id}");
            let what = format!("{name} over {}", if h2 { "h2" } else { "HTTP/1" });
            let r = attack(h2, &sc.url(&path), &[(name, &value)]).await;
            if h2 && name == "host" {
                // A Host that differs from :authority is refused first.
                assert_eq!(r.status, 400, "{what}");
                assert!(origin.last_request(&path).is_none(), "{what}");
                continue;
            }
            // The attack is a real fill (a MISS), not a BYPASS.
            assert_eq!(status_and_cache(&r), (200, "MISS".into()), "{what}");
            assert!(!r.text().contains(EVIL), "{what}: {}", r.text());
            assert_clean(&sc, &origin, &path, &what, "HIT").await;
        }
    }

    // Raw HTTP/1 shapes a client library will not send.
    let addr = sc.addr();
    let raws = [
        (
            "duplicate Host",
            format!("GET /echo/{{id}} HTTP/1.1\r\nHost: {addr}\r\nHost: {EVIL}.test\r\nConnection: close\r\n\r\n"),
        ),
        (
            "absolute-form URI",
            format!("GET http://{EVIL}.test/echo/{{id}} HTTP/1.1\r\nHost: {EVIL}.test\r\nConnection: close\r\n\r\n"),
        ),
    ];
    for (what, raw) in raws {
        id += 1;
        let path = format!("/echo/{id}");
        let answer = client::raw(addr, raw.replace("{id}", &id.to_string()).as_bytes()).await;
        assert!(!answer.contains(EVIL), "{what}: {answer}");
        // hyper may refuse the request (400) rather than fill; either way
        // what ends up cached is clean.
        let cached = if answer.starts_with("HTTP/1.1 200") {
            "HIT"
        } else {
            "MISS"
        };
        assert_clean(&sc, &origin, &path, what, cached).await;
    }

    // Row 2: a negative answer is cached for everyone just the same.
    let missing = "/echo/404";
    let mut not_found = Reply::echo();
    not_found.status = 404;
    origin.reply(missing, not_found);
    let all: Vec<(&str, String)> = poisoning_headers();
    let refs: Vec<(&str, &str)> = all.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = attack(false, &sc.url(missing), &refs).await;
    assert_eq!(status_and_cache(&r), (404, "MISS".into()));
    assert_clean(&sc, &origin, missing, "404", "NEGATIVE").await;
}

#[tokio::test]
async fn two_requests_with_one_key_send_byte_identical_fills() {
    let origin = Origin::start().await;
    let sc = start(&origin).await;
    let path = "/echo/20";
    let first = client::request(
        "GET",
        &format!("{}?b=2&a=1", sc.url(path)),
        &[
            ("accept", "application/json"),
            ("host", "one.example"),
            ("user-agent", "curl/8"),
            ("x-forwarded-for", "198.51.100.1"),
            ("x-forwarded-proto", "https"),
            ("origin", "https://one.example"),
            ("accept-encoding", "gzip, br"),
            ("if-none-match", "\"v1\""),
            ("range", "bytes=0-3"),
            ("cache-control", "no-cache"),
            ("x-custom", "one"),
        ],
        "",
    )
    .await;
    // The fill fetched the whole object; the client's own range is then
    // answered from it (docs/caching.md#conditional-requests-and-ranges).
    assert_eq!(status_and_cache(&first), (206, "MISS".into()));
    let inv = client::request(
        "POST",
        &sc.admin_url("/admin/invalidate"),
        &[("content-type", "application/json")],
        r#"{"route":"echo","params":{"id":"20"}}"#,
    )
    .await;
    assert_eq!(inv.status, 200, "{}", inv.text());
    let second = client::request_h2(
        "GET",
        &format!("{}?a=1&b=2", sc.url(path)),
        &[
            ("accept", "application/json"),
            ("user-agent", "Mozilla/5.0"),
            ("accept-language", "de-CH"),
            ("forwarded", "for=192.0.2.60;proto=https;host=two.example"),
            ("x-forwarded-host", "two.example"),
            ("x-original-url", "/admin"),
            ("x-custom", "two"),
        ],
        "",
    )
    .await;
    assert_eq!(status_and_cache(&second), (200, "MISS".into()));

    let fills: Vec<_> = origin
        .requests()
        .into_iter()
        .filter(|r| r.path == path)
        .collect();
    assert_eq!(fills.len(), 2, "one fill per client");
    let wire = |r: &crate::support::origin::Recorded| {
        let headers: Vec<(String, Vec<u8>)> = r
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        (
            r.method.clone(),
            r.path.clone(),
            r.query.clone(),
            headers,
            r.body.len(),
        )
    };
    assert_eq!(wire(&fills[0]), wire(&fills[1]), "fills differ");
    // What a fill sends: GET, path, normalized query, Host, the vary header.
    let (method, _, query, headers, body_len) = wire(&fills[0]);
    assert_eq!(
        (method.as_str(), query.as_deref()),
        ("GET", Some("a=1&b=2"))
    );
    let names: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["accept", "host"], "{headers:?}");
    assert_eq!(body_len, 0);
}

/// One refusal case: the origin's reply headers on `path`.
struct Refusal {
    what: &'static str,
    headers: &'static [(&'static str, &'static str)],
    reason: &'static str,
}

const REFUSALS: &[Refusal] = &[
    Refusal {
        what: "no-store",
        headers: &[("cache-control", "no-store")],
        reason: "no_store",
    },
    Refusal {
        what: "no-cache",
        headers: &[("cache-control", "no-cache")],
        reason: "no_cache",
    },
    Refusal {
        what: "no-cache, qualified, on a second line",
        headers: &[
            ("cache-control", "public, max-age=60"),
            ("cache-control", "No-Cache=\"Set-Cookie, X-A\""),
        ],
        reason: "no_cache",
    },
    Refusal {
        what: "private",
        headers: &[("cache-control", "private, max-age=60")],
        reason: "private",
    },
    Refusal {
        what: "max-age=0",
        headers: &[("cache-control", "max-age=0")],
        reason: "max_age_0",
    },
    Refusal {
        what: "s-maxage=0 beats max-age",
        headers: &[("cache-control", "max-age=600, S-MAXAGE=0")],
        reason: "s_maxage_0",
    },
    Refusal {
        what: "Vary: *",
        headers: &[("vary", "*")],
        reason: "vary_star",
    },
    Refusal {
        what: "Vary beyond the key",
        headers: &[("vary", "Accept, X-User")],
        reason: "vary_unkeyed",
    },
];

#[tokio::test]
async fn origin_refusals_are_not_cached_nor_shared_with_coalesced_requests() {
    let origin = Origin::start().await;
    let sc = start(&origin).await;
    let coalesced = r#"sidecache_coalesced_total{route="echo"}"#;
    for (i, case) in REFUSALS.iter().enumerate() {
        let what = case.what;
        let path = format!("/echo/{}", 100 + i);
        let mut reply = Reply::echo();
        for (k, v) in case.headers {
            reply = reply.header(k, v);
        }
        origin.reply(&path, reply);
        let before = sc.metric(coalesced).await.unwrap_or(0.0);

        // The starter's fill waits at the origin; two more requests for the
        // same key join its flight.
        let gate = origin.hold(&path);
        let url = sc.url(&path);
        let starter = tokio::spawn({
            let url = url.clone();
            async move { client::get(&url).await }
        });
        gate.arrived(1).await;
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { client::get(&url).await })
            })
            .collect();
        eventually(
            &format!("{what}: two requests coalesced"),
            Duration::from_secs(10),
            || async { sc.metric(coalesced).await.unwrap_or(0.0) >= before + 2.0 },
        )
        .await;
        gate.release();
        let r = starter.await.expect("starter");
        assert_eq!(status_and_cache(&r), (200, "MISS".into()), "{what}");
        for w in waiters {
            let r = w.await.expect("waiter");
            assert_eq!(status_and_cache(&r), (200, "MISS".into()), "{what}");
        }
        assert_eq!(
            origin.hits(&path),
            3,
            "{what}: each coalesced request fetched its own answer"
        );
        let r = client::get(&url).await;
        assert_eq!(x_cache(&r), "MISS", "{what}: must not be cached");
        assert_eq!(origin.hits(&path), 4, "{what}");
        let counted = sc
            .metric_sum(
                "sidecache_uncacheable_total",
                &[("route", "echo"), ("reason", case.reason)],
            )
            .await;
        assert!(
            counted >= 2.0,
            "{what}: reason {} counted {counted}",
            case.reason
        );
    }
    assert!(
        sc.metric_sum(
            "sidecache_publish_total",
            &[("route", "echo"), ("outcome", "uncacheable")]
        )
        .await
            >= 2.0 * REFUSALS.len() as f64
    );
}

#[tokio::test]
async fn vary_on_an_unkeyed_header_keeps_alices_answer_from_bob() {
    let origin = Origin::start().await;
    // The route lets X-User through to fills but does not key on it; the
    // service says its answer varies on it.
    let path = "/echo/personal/1";
    origin.reply(path, Reply::echo().header("vary", "X-User"));
    let sc = start(&origin).await;
    let user = |r: &Resp| r.json()["headers"]["x-user"][0].as_str().map(str::to_owned);
    let alice = client::request("GET", &sc.url(path), &[("x-user", "alice")], "").await;
    assert_eq!(status_and_cache(&alice), (200, "MISS".into()));
    assert_eq!(user(&alice).as_deref(), Some("alice"));
    let bob = client::request("GET", &sc.url(path), &[("x-user", "bob")], "").await;
    assert_eq!(
        status_and_cache(&bob),
        (200, "MISS".into()),
        "{}",
        bob.text()
    );
    assert_eq!(user(&bob).as_deref(), Some("bob"));
}

#[tokio::test]
async fn origin_cache_control_ignore_caches_what_the_origin_refuses() {
    let origin = Origin::start().await;
    let path = "/echo/trusting/1";
    origin.reply(
        path,
        Reply::echo()
            .header("cache-control", "no-cache, max-age=0, s-maxage=0")
            .header("vary", "X-User"),
    );
    let sc = start(&origin).await;
    let first = client::get(&sc.url(path)).await;
    assert_eq!(status_and_cache(&first), (200, "MISS".into()));
    let second = client::get(&sc.url(path)).await;
    assert_eq!(status_and_cache(&second), (200, "HIT".into()));
    assert_eq!(origin.hits(path), 1);
    // Privacy refusals stay in force even so.
    let secret = "/echo/trusting/2";
    origin.reply(secret, Reply::echo().header("cache-control", "no-store"));
    for _ in 0..2 {
        assert_eq!(x_cache(&client::get(&sc.url(secret)).await), "MISS");
    }
}

#[tokio::test]
async fn query_params_outside_the_allow_list_bypass_the_cache() {
    let origin = Origin::start().await;
    let sc = start(&origin).await;
    let path = "/echo/paged/1";
    let url = |q: &str| format!("{}?{q}", sc.url(path));
    let busted = client::get(&url("page=2&bust=81")).await;
    assert_eq!(status_and_cache(&busted), (200, "BYPASS".into()));
    assert_eq!(
        origin.last_request(path).and_then(|r| r.query).as_deref(),
        Some("page=2&bust=81"),
        "forwarded as sent"
    );
    assert_eq!(
        x_cache(&client::get(&url("page=2&bust=82")).await),
        "BYPASS"
    );
    assert_eq!(x_cache(&client::get(&url("page=2")).await), "MISS");
    assert_eq!(x_cache(&client::get(&url("page=2")).await), "HIT");
    assert_eq!(
        sc.metric_sum("sidecache_publish_total", &[("route", "paged")])
            .await,
        1.0,
        "only the listed query filled"
    );
}

#[tokio::test]
async fn cache_busting_one_route_does_not_starve_the_others() {
    let origin = Origin::start().await;
    let sc = SidecacheBuilder::new(origin.url())
        .fill("fill:\n  max_concurrency: 4\n")
        .routes(
            r#"routes:
  - { name: a, path: "/echo/a/{id}", params: { id: "[0-9]+" }, ttl: 60s }
  - { name: b, path: "/echo/b/{id}", params: { id: "[0-9]+" }, ttl: 60s }
  - { name: c, path: "/echo/c/{id}", params: { id: "[0-9]+" }, query: [page], ttl: 60s }
"#,
        )
        .start()
        .await;

    // The attacker busts route a: every request a new key, each fill held
    // at the origin. Route a gets half the permits (2 of 4); the rest of
    // the flood is refused at once.
    let gate_a = origin.hold("/echo/a/1");
    let flood: Vec<_> = (0..8)
        .map(|i| {
            let url = format!("{}?bust={i}", sc.url("/echo/a/1"));
            tokio::spawn(async move { client::get(&url).await })
        })
        .collect();
    gate_a.arrived(2).await;
    eventually(
        "the flood beyond route a's budget answered",
        Duration::from_secs(10),
        || async {
            sc.metric_sum(
                "sidecache_requests_total",
                &[("route", "a"), ("result", "MISS")],
            )
            .await
                >= 6.0
        },
    )
    .await;
    assert_eq!(gate_a.count(), 2, "route a holds at most its budget");

    // Busting route c's allow-listed query forwards uncached: no permits.
    let gate_c = origin.hold("/echo/c/1");
    let bypassed: Vec<_> = (0..8)
        .map(|i| {
            let url = format!("{}?page=1&bust={i}", sc.url("/echo/c/1"));
            tokio::spawn(async move { client::get(&url).await })
        })
        .collect();
    gate_c.arrived(8).await;

    // Legitimate cold misses of other routes and of route c's real objects.
    for id in 1..=5 {
        let r = client::get(&sc.url(&format!("/echo/b/{id}"))).await;
        assert_eq!(status_and_cache(&r), (200, "MISS".into()), "b/{id}");
    }
    for id in 2..=4 {
        let r = client::get(&format!("{}?page=1", sc.url(&format!("/echo/c/{id}")))).await;
        assert_eq!(status_and_cache(&r), (200, "MISS".into()), "c/{id}");
    }

    gate_a.release();
    gate_c.release();
    let mut refused = 0;
    for f in flood {
        match f.await.expect("attacker").status.as_u16() {
            200 => {}
            503 => refused += 1,
            other => panic!("attacker got {other}"),
        }
    }
    assert_eq!(refused, 6);
    for b in bypassed {
        assert_eq!(x_cache(&b.await.expect("attacker")), "BYPASS");
    }
}

#[tokio::test]
async fn a_fill_slower_than_its_lease_renews_it_and_publishes() {
    let origin = Origin::start().await;
    let sc = SidecacheBuilder::new(origin.url())
        .upstream_timeout("5s")
        .routes(
            r#"routes:
  - { name: slow, path: "/echo/slow/{id}", params: { id: "[0-9]+" }, ttl: 60s, lease: 300ms, wait: 100ms }
"#,
        )
        .start()
        .await;
    assert!(
        sc.stderr_text().contains("routes[0].lease"),
        "lease < upstream.timeout is warned about: {}",
        sc.stderr_text()
    );
    let path = "/echo/slow/1";
    let gate = origin.hold(path);
    let url = sc.url(path);
    let filler = tokio::spawn(async move { client::get(&url).await });
    gate.arrived(1).await;
    // The scenario itself: the origin answers after more than two leases.
    tokio::time::sleep(Duration::from_millis(800)).await;
    gate.release();
    let r = filler.await.expect("filler");
    assert_eq!(status_and_cache(&r), (200, "MISS".into()));
    let r = client::get(&sc.url(path)).await;
    assert_eq!(status_and_cache(&r), (200, "HIT".into()));
    assert_eq!(origin.hits(path), 1);
    assert_eq!(
        sc.metric_sum("sidecache_publish_total", &[("outcome", "published")])
            .await,
        1.0
    );
    assert_eq!(
        sc.metric_sum("sidecache_publish_total", &[("outcome", "lease_lost")])
            .await,
        0.0
    );
}

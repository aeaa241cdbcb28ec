//! Answers a client expects from a cache
//! (docs/caching.md#conditional-requests-and-ranges), against the real binary
//! on the embedded store and on a real redis-server: `If-None-Match` /
//! `If-Modified-Since` / `If-Match` answered from the entry (304, 412),
//! `etag: auto`, byte ranges from a cached 200 (206, 416, `If-Range`),
//! `If-Range`), and what the DEGRADED and BYPASS paths do with them. Every
//! test also checks that fills never carry the client's conditionals or
//! range (the origin records what it received).

use crate::cache::invalidate;
use crate::support::client::{self, x_cache, Resp};
use crate::support::redis::RedisServer;
use crate::support::{app_routes, eventually, Origin, Reply, Sidecache, SidecacheBuilder};
use std::time::Duration;

const P: &str = "/api/tenants/acme/apps/1";
const PARAMS: &str = r#"{"tenant":"acme","id":"1"}"#;
const LM: &str = "Tue, 15 Nov 1994 12:45:26 GMT";
const BEFORE_LM: &str = "Mon, 14 Nov 1994 12:45:26 GMT";
const MIB: usize = 1024 * 1024;

/// The store a test runs on; the Redis server lives as long as the test.
enum Backend {
    Embedded,
    Redis(RedisServer),
}

impl Backend {
    fn both() -> [Backend; 2] {
        [Backend::Embedded, Backend::redis()]
    }

    fn redis() -> Backend {
        Backend::Redis(RedisServer::start())
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Embedded => "embedded",
            Backend::Redis(_) => "redis",
        }
    }

    /// The `app` route with `route_keys` added, hit-for-pass off (these
    /// tests look at every fill of an answer that is not stored).
    fn builder(&self, origin: &Origin, route_keys: &str) -> SidecacheBuilder {
        let keys = format!("{route_keys}\nhit_for_pass: 0s");
        let b = SidecacheBuilder::new(origin.url()).routes(&app_routes(&keys));
        match self {
            Backend::Embedded => b,
            Backend::Redis(r) => b.store(&format!(
                "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n  breaker:\n    cooldown: 30s\n",
                r.url()
            )),
        }
    }

    async fn start(&self, origin: &Origin, route_keys: &str) -> Sidecache {
        self.builder(origin, route_keys).start().await
    }
}

async fn get(sc: &Sidecache, headers: &[(&str, &str)]) -> Resp {
    client::request("GET", &sc.url(P), headers, "").await
}

/// Status, X-Cache and body of a response, for one-line assertions.
fn seen(r: &Resp) -> (u16, String, usize) {
    (r.status.as_u16(), x_cache(r), r.body.len())
}

/// Panics if the origin's last request for `P` carried a conditional or a
/// range header: fills fetch the whole object, unconditionally.
fn fill_was_unconditional(origin: &Origin, what: &str) {
    let req = origin.last_request(P).expect("the origin saw a fill");
    for h in [
        "if-none-match",
        "if-match",
        "if-modified-since",
        "if-unmodified-since",
        "range",
        "if-range",
    ] {
        assert!(
            req.headers.get(h).is_none(),
            "{what}: the fill carried {h}: {:?}",
            req.headers
        );
    }
}

async fn answers(sc: &Sidecache, answer: &str) -> f64 {
    sc.metric_sum("sidecache_client_answers_total", &[("answer", answer)])
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_requests_are_answered_from_the_entry() {
    for backend in Backend::both() {
        let b = backend.name();
        let origin = Origin::start().await;
        let body = "the document v2";
        origin.reply(
            P,
            Reply::ok(body)
                .header("etag", "\"v2\"")
                .header("last-modified", LM)
                .header("content-type", "text/plain")
                .header("cache-control", "public, max-age=60"),
        );
        let sc = backend.start(&origin, "").await;

        // A miss fills the whole object, stores it, then answers the
        // client's condition itself.
        let r = get(&sc, &[("if-none-match", "\"v2\"")]).await;
        assert_eq!(seen(&r), (304, "MISS".into(), 0), "{b}");
        fill_was_unconditional(&origin, b);
        let r = get(&sc, &[]).await;
        assert_eq!(
            (seen(&r), r.text()),
            ((200, "HIT".into(), body.len()), body.into()),
            "{b}"
        );

        // The issue's case: a list holding the current tag.
        let r = get(&sc, &[("if-none-match", "\"v0\", \"v1\", \"v2\"")]).await;
        assert_eq!(seen(&r), (304, "HIT".into(), 0), "{b}");
        assert_eq!(r.header("etag").as_deref(), Some("\"v2\""), "{b}");
        assert_eq!(
            r.header("cache-control").as_deref(),
            Some("public, max-age=60"),
            "{b}"
        );
        assert_eq!(r.header("last-modified").as_deref(), Some(LM), "{b}");
        assert!(
            r.header("age").is_some(),
            "{b}: a 304 from the cache carries Age"
        );
        assert!(r.header("content-type").is_none(), "{b}: {:?}", r.headers);
        // Weak comparison, `*`, several lines, HEAD.
        assert_eq!(
            seen(&get(&sc, &[("if-none-match", "W/\"v2\"")]).await).0,
            304,
            "{b}"
        );
        assert_eq!(
            seen(&get(&sc, &[("if-none-match", "*")]).await).0,
            304,
            "{b}"
        );
        let r = client::request(
            "GET",
            &sc.url(P),
            &[("if-none-match", "\"v1\""), ("if-none-match", "\"v2\"")],
            "",
        )
        .await;
        assert_eq!(seen(&r).0, 304, "{b}: two lines are one list");
        let r = client::request("HEAD", &sc.url(P), &[("if-none-match", "\"v2\"")], "").await;
        assert_eq!(seen(&r), (304, "HIT".into(), 0), "{b}");

        // A stale tag: the full answer.
        let r = get(&sc, &[("if-none-match", "\"v1\"")]).await;
        assert_eq!(
            (seen(&r), r.text()),
            ((200, "HIT".into(), body.len()), body.into()),
            "{b}"
        );
        // If-Modified-Since, only without If-None-Match.
        assert_eq!(
            seen(&get(&sc, &[("if-modified-since", LM)]).await).0,
            304,
            "{b}"
        );
        assert_eq!(
            seen(&get(&sc, &[("if-modified-since", BEFORE_LM)]).await).0,
            200,
            "{b}"
        );
        let r = get(
            &sc,
            &[("if-none-match", "\"v1\""), ("if-modified-since", LM)],
        )
        .await;
        assert_eq!(seen(&r).0, 200, "{b}: If-None-Match decides");
        // If-Match: 412 on a tag that is not current.
        let r = get(&sc, &[("if-match", "\"v1\"")]).await;
        assert_eq!(seen(&r), (412, "HIT".into(), 0), "{b}");
        assert_eq!(
            seen(&get(&sc, &[("if-match", "\"v2\"")]).await).0,
            200,
            "{b}"
        );
        assert_eq!(
            origin.hits(P),
            1,
            "{b}: everything above came from one fill"
        );
        assert_eq!(answers(&sc, "not_modified").await, 7.0, "{b}");
        assert_eq!(answers(&sc, "precondition_failed").await, 1.0, "{b}");

        // An invalidated entry never answers 304
        // (docs/architecture.md#the-serving-rule): the client's current-looking
        // tag gets the origin's new version.
        origin.reply(P, Reply::ok("the document v3").header("etag", "\"v3\""));
        assert_eq!(invalidate(&sc, "app", PARAMS).await.status, 200, "{b}");
        let r = get(&sc, &[("if-none-match", "\"v2\"")]).await;
        assert_eq!(
            (seen(&r).0, x_cache(&r), r.text()),
            (200, "MISS".into(), "the document v3".into()),
            "{b}"
        );
        assert_eq!(r.header("etag").as_deref(), Some("\"v3\""), "{b}");
        fill_was_unconditional(&origin, b);
        assert_eq!(
            seen(&get(&sc, &[("if-none-match", "\"v3\"")]).await),
            (304, "HIT".into(), 0),
            "{b}"
        );
        assert_eq!(origin.hits(P), 2, "{b}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etag_auto_derives_a_strong_tag_once_at_publish() {
    for backend in Backend::both() {
        let b = backend.name();
        let origin = Origin::start().await;
        origin.reply(P, Reply::ok("no tag from me"));
        let sc = backend.start(&origin, "etag: auto").await;
        let miss = get(&sc, &[]).await;
        let tag = miss
            .header("etag")
            .unwrap_or_else(|| panic!("{b}: no ETag: {:?}", miss.headers));
        // Strong, quoted, 32 hex digits (128 bits of SHA-256).
        assert_eq!(tag.len(), 34, "{b}: {tag}");
        assert!(tag.starts_with('"') && tag.ends_with('"'), "{b}: {tag}");
        assert!(
            tag[1..33].bytes().all(|c| c.is_ascii_hexdigit()),
            "{b}: {tag}"
        );
        let hit = get(&sc, &[]).await;
        assert_eq!(
            (x_cache(&hit), hit.header("etag")),
            ("HIT".into(), Some(tag.clone())),
            "{b}"
        );
        let r = get(&sc, &[("if-none-match", &tag)]).await;
        assert_eq!(seen(&r), (304, "HIT".into(), 0), "{b}");
        // Strong: usable for If-Range.
        let r = get(&sc, &[("range", "bytes=0-1"), ("if-range", &tag)]).await;
        assert_eq!((seen(&r).0, r.text()), (206, "no".into()), "{b}");

        // A new body gets a new tag; the old one no longer matches.
        origin.reply(P, Reply::ok("a new body"));
        assert_eq!(invalidate(&sc, "app", PARAMS).await.status, 200, "{b}");
        let r = get(&sc, &[("if-none-match", &tag)]).await;
        assert_eq!(
            (seen(&r).0, x_cache(&r), r.text()),
            (200, "MISS".into(), "a new body".into()),
            "{b}"
        );
        let new_tag = r.header("etag").expect("ETag");
        assert_ne!(new_tag, tag, "{b}");

        // The origin's own tag is kept as it is.
        origin.reply(P, Reply::ok("tagged").header("etag", "W/\"origin-7\""));
        assert_eq!(invalidate(&sc, "app", PARAMS).await.status, 200, "{b}");
        assert_eq!(
            get(&sc, &[]).await.header("etag").as_deref(),
            Some("W/\"origin-7\""),
            "{b}"
        );

        // Without `etag: auto` (the default `origin`), no tag is made up.
        let plain = backend.builder(&origin, "").start().await;
        origin.reply(P, Reply::ok("no tag from me"));
        assert_eq!(invalidate(&plain, "app", PARAMS).await.status, 200, "{b}");
        let r = client::get(&plain.url(P)).await;
        assert_eq!(
            (x_cache(&r), r.header("etag")),
            ("MISS".into(), None),
            "{b}"
        );
    }
}

/// 1 MiB whose bytes differ from their neighbours, so a wrong offset shows.
fn mib_body() -> Vec<u8> {
    (0..MIB).map(|i| (i % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_are_cut_from_the_cached_200() {
    let body = mib_body();
    for backend in Backend::both() {
        let b = backend.name();
        let origin = Origin::start().await;
        origin.reply(
            P,
            Reply::ok(body.clone())
                .header("etag", "\"r1\"")
                .header("last-modified", LM)
                .header("content-type", "application/octet-stream"),
        );
        let sc = backend.start(&origin, "").await;

        // A range request that misses fills the whole object, then answers
        // the range.
        let r = get(&sc, &[("range", "bytes=-10")]).await;
        assert_eq!(
            (r.status.as_u16(), x_cache(&r)),
            (206, "MISS".into()),
            "{b}"
        );
        assert_eq!(&r.body[..], &body[MIB - 10..], "{b}");
        fill_was_unconditional(&origin, b);
        let r = get(&sc, &[]).await;
        assert_eq!(
            (seen(&r), r.header("accept-ranges")),
            ((200, "HIT".into(), MIB), Some("bytes".into())),
            "{b}"
        );
        assert!(r.body == body, "{b}: the full body was stored");

        // The issue's cases on the HIT.
        let r = get(&sc, &[("range", "bytes=-10")]).await;
        assert_eq!(seen(&r), (206, "HIT".into(), 10), "{b}");
        assert_eq!(&r.body[..], &body[MIB - 10..], "{b}");
        assert_eq!(
            r.header("content-range").as_deref(),
            Some("bytes 1048566-1048575/1048576"),
            "{b}"
        );
        assert_eq!(r.header("content-length").as_deref(), Some("10"), "{b}");
        let r = get(&sc, &[("range", "bytes=5-2")]).await;
        assert_eq!(seen(&r), (416, "HIT".into(), 0), "{b}");
        assert_eq!(
            r.header("content-range").as_deref(),
            Some("bytes */1048576"),
            "{b}"
        );
        let r = get(&sc, &[("range", "bytes=1048576-")]).await;
        assert_eq!(seen(&r).0, 416, "{b}: past the end");
        let r = get(&sc, &[("range", "bytes=4096-8191")]).await;
        assert_eq!(seen(&r), (206, "HIT".into(), 4096), "{b}");
        assert_eq!(&r.body[..], &body[4096..8192], "{b}");
        // Several ranges: the full 200 (documented).
        let r = get(&sc, &[("range", "bytes=0-1, 10-11")]).await;
        assert_eq!(seen(&r), (200, "HIT".into(), MIB), "{b}");
        // If-Range: the current strong tag or the exact date cuts; an old
        // tag gets the full 200.
        let r = get(&sc, &[("range", "bytes=0-9"), ("if-range", "\"r1\"")]).await;
        assert_eq!(
            (seen(&r), &r.body[..]),
            ((206, "HIT".into(), 10), &body[..10]),
            "{b}"
        );
        let r = get(&sc, &[("range", "bytes=0-9"), ("if-range", LM)]).await;
        assert_eq!(seen(&r).0, 206, "{b}");
        let r = get(&sc, &[("range", "bytes=0-9"), ("if-range", "\"r0\"")]).await;
        assert_eq!(seen(&r), (200, "HIT".into(), MIB), "{b}");
        assert!(r.body == body, "{b}");
        // Preconditions first: a matching If-None-Match wins over Range.
        let r = get(&sc, &[("range", "bytes=0-9"), ("if-none-match", "\"r1\"")]).await;
        assert_eq!(seen(&r).0, 304, "{b}");
        assert_eq!(
            origin.hits(P),
            1,
            "{b}: everything above came from one fill"
        );
        assert_eq!(answers(&sc, "partial").await, 5.0, "{b}");
        assert_eq!(answers(&sc, "range_unsatisfiable").await, 2.0, "{b}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_206_from_the_origin_is_never_stored() {
    for backend in Backend::both() {
        let b = backend.name();
        let origin = Origin::start().await;
        // An origin that answers a range nobody asked for.
        origin.reply(
            P,
            Reply::status(206)
                .body("0123")
                .header("content-range", "bytes 0-3/100"),
        );
        let sc = backend.start(&origin, "").await;
        for _ in 0..2 {
            let r = get(&sc, &[("range", "bytes=0-1")]).await;
            assert_eq!(
                (seen(&r), r.text()),
                ((206, "MISS".into(), 4), "0123".into()),
                "{b}"
            );
            assert_eq!(
                r.header("content-range").as_deref(),
                Some("bytes 0-3/100"),
                "{b}"
            );
        }
        assert_eq!(origin.hits(P), 2, "{b}: nothing was stored");
        fill_was_unconditional(&origin, b);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_answers_are_shaped_like_hits() {
    for backend in Backend::both() {
        let b = backend.name();
        let origin = Origin::start().await;
        origin.reply(P, Reply::ok("0123456789").header("etag", "\"s1\""));
        let sc = backend
            .builder(&origin, "")
            .routes(&app_routes("grace: 30s").replace("ttl: 60s", "ttl: 1s"))
            .start()
            .await;
        assert_eq!(x_cache(&get(&sc, &[]).await), "MISS", "{b}");
        // Refreshes fail from now on, so the expired entry stays the one served.
        origin.reply(P, Reply::status(500));
        eventually(
            "the entry expires and answers STALE",
            Duration::from_secs(10),
            || async {
                let r = get(&sc, &[("if-none-match", "\"s1\"")]).await;
                if x_cache(&r) != "STALE" {
                    assert_eq!(seen(&r), (304, "HIT".into(), 0), "{b}");
                    return false;
                }
                assert_eq!(seen(&r), (304, "STALE".into(), 0), "{b}");
                true
            },
        )
        .await;
        let r = get(&sc, &[("range", "bytes=2-4")]).await;
        assert_eq!(
            (seen(&r).0, x_cache(&r), r.text()),
            (206, "STALE".into(), "234".into()),
            "{b}"
        );
    }
}

/// DEGRADED (store unavailable): the fill's answer is shaped like any
/// other, so the client still gets its 304 or range, and the origin still
/// sees an unconditional full fetch. BYPASS: the request is forwarded as
/// the client sent it, conditionals and range included, and whatever the
/// origin answers goes back untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degraded_answers_are_shaped_and_bypass_is_untouched() {
    let origin = Origin::start().await;
    origin.reply(P, Reply::ok("0123456789").header("etag", "\"d1\""));
    let backend = Backend::redis();
    let sc = backend.start(&origin, "").await;
    if let Backend::Redis(redis) = &backend {
        redis.kill();
    }
    let r = get(&sc, &[("if-none-match", "\"d1\"")]).await;
    assert_eq!(seen(&r), (304, "DEGRADED".into(), 0));
    fill_was_unconditional(&origin, "degraded");
    let r = get(&sc, &[("range", "bytes=2-4")]).await;
    assert_eq!(
        (seen(&r).0, x_cache(&r), r.text()),
        (206, "DEGRADED".into(), "234".into())
    );
    fill_was_unconditional(&origin, "degraded");
    assert_eq!(origin.hits(P), 2, "nothing is stored while degraded");

    let r = get(
        &sc,
        &[
            ("authorization", "Bearer t"),
            ("if-none-match", "\"d1\""),
            ("range", "bytes=2-4"),
        ],
    )
    .await;
    // The test origin evaluates neither header: its full 200 goes back as is.
    assert_eq!(
        (seen(&r).0, x_cache(&r), r.text()),
        (200, "BYPASS".into(), "0123456789".into())
    );
    let seen_by_origin = origin.last_request(P).expect("forwarded");
    assert_eq!(
        seen_by_origin
            .headers
            .get("if-none-match")
            .map(|v| v.as_bytes()),
        Some(&b"\"d1\""[..])
    );
    assert_eq!(
        seen_by_origin.headers.get("range").map(|v| v.as_bytes()),
        Some(&b"bytes=2-4"[..])
    );
}

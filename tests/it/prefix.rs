//! Prefix params (`/static/{path...}`) and path normalisation
//! (docs/configuration.md#route-templates), on the embedded store and on a real
//! Redis: every spelling of an object reads and fills that one object; `..`,
//! `%2e%2e` and friends never make a prefix route match a path outside it (they
//! are resolved first, then matched); paths whose resolution origins disagree
//! on are forwarded byte for byte; every invalidation source addresses prefix
//! objects.

use crate::cache::invalidate;
use crate::support::client::{self, x_cache};
use crate::support::redis::RedisServer;
use crate::support::{Origin, Sidecache, SidecacheBuilder};

/// `files` with a deliberately lax pattern (anything, any depth), and a
/// second route whose paths the attempts below try to reach through it.
const ROUTES: &str = r#"routes:
  - name: files
    path: /static/{path...}
    params: { path: ".+" }
    ttl: 60s
  - name: admin
    path: /admin/{page}
    params: { page: "[a-z]+" }
    ttl: 60s
"#;

async fn start(redis: Option<&RedisServer>, origin: &Origin) -> Sidecache {
    let b = SidecacheBuilder::new(origin.url()).routes(ROUTES);
    match redis {
        Some(r) => b.store(&r.store_yaml()),
        None => b,
    }
    .start()
    .await
}

async fn reads(sc: &Sidecache, route: &str) -> f64 {
    sc.metric_sum("sidecache_requests_total", &[("route", route)])
        .await
}

/// GET `path`: (X-Cache, body).
async fn get(sc: &Sidecache, path: &str) -> (String, String) {
    let r = client::get(&sc.url(path)).await;
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    (x_cache(&r), r.text())
}

async fn escapes_never_match_the_prefix_route(redis: Option<RedisServer>) {
    let origin = Origin::start().await;
    let sc = start(redis.as_ref(), &origin).await;
    let css = "/static/css/site.css";
    let body = origin.default_body(css);

    // One object, whatever the spelling; the fill asks for the normal form.
    assert_eq!(get(&sc, css).await, ("MISS".into(), body.clone()));
    for spelling in [
        css,
        "/static/css/./site.css",
        "/static//css///site.css",
        "/static/img/../css/site.css",
        "/static/%63ss/site%2Ecss",
    ] {
        assert_eq!(
            get(&sc, spelling).await,
            ("HIT".into(), body.clone()),
            "{spelling}"
        );
    }
    assert_eq!(origin.total(), 1, "one fill for every spelling");
    assert_eq!(reads(&sc, "files").await, 6.0);

    // Climbing out of /static/ is resolved first: the path is /admin/users,
    // which the admin route answers (filled with the normal path); the
    // files route never sees it, so no `files` object can hold it.
    let users = "/admin/users";
    let users_body = origin.default_body(users);
    assert_eq!(
        get(&sc, "/static/../admin/users").await,
        ("MISS".into(), users_body.clone())
    );
    for attempt in [
        "/static/%2e%2e/admin/users",
        "/static/%2E%2e/admin/users",
        "/static/.%2e/admin/users",
        "/static/css/../../admin/users",
        "/static/x/%2e%2e/%2e%2e/admin/users",
    ] {
        assert_eq!(
            get(&sc, attempt).await,
            ("HIT".into(), users_body.clone()),
            "{attempt}"
        );
    }
    assert_eq!(origin.hits(users), 1);
    assert_eq!(reads(&sc, "files").await, 6.0, "none went to `files`");
    assert_eq!(reads(&sc, "admin").await, 6.0);

    // Spellings origins resolve differently (encoded separators, `..;`,
    // NUL, a broken escape) are not ours: forwarded untouched, uncached.
    for raw in [
        "/static/..%2fadmin/users",
        "/static/..%2F..%2Fadmin/users",
        "/static/..%5cadmin/users",
        "/static/..;/admin/users",
        "/static/a%00.css",
        "/static/100%",
    ] {
        let r = client::get(&sc.url(raw)).await;
        assert_eq!(x_cache(&r), "", "{raw} was not forwarded");
        assert_eq!(origin.hits(raw), 1, "{raw} reached the origin as sent");
        assert_eq!(
            r.text(),
            origin.default_body(raw),
            "the origin answered the path as sent"
        );
    }
    assert_eq!(reads(&sc, "files").await, 6.0);
    assert_eq!(reads(&sc, "admin").await, 6.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_never_match_the_prefix_route_embedded() {
    escapes_never_match_the_prefix_route(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_never_match_the_prefix_route_redis() {
    escapes_never_match_the_prefix_route(Some(RedisServer::start())).await;
}

/// Admin events (the path every source takes: outbox and stream events go
/// through the same validation) with the value in normal form and not,
/// write-through on another spelling, and poison values.
async fn prefix_objects_are_invalidated(redis: Option<RedisServer>) {
    let origin = Origin::start().await;
    let sc = start(redis.as_ref(), &origin).await;
    let css = "/static/css/site.css";
    let fill = |v: u64| format!("{css} v{v}");
    assert_eq!(get(&sc, css).await, ("MISS".into(), fill(1)));
    assert_eq!(get(&sc, css).await, ("HIT".into(), fill(1)));

    for (n, value) in [
        (2, "css/site.css"),
        (3, "css/./site.css"),
        (4, "/css//site.css"),
    ] {
        origin.bump(css);
        let r = invalidate(&sc, "files", &format!(r#"{{"path":"{value}"}}"#)).await;
        assert_eq!(r.status, 200, "{value}: {}", r.text());
        assert_eq!(get(&sc, css).await, ("MISS".into(), fill(n)), "{value}");
        assert_eq!(get(&sc, css).await, ("HIT".into(), fill(n)), "{value}");
    }

    // Write-through: a 2xx PUT on any spelling of the path.
    origin.bump(css);
    let put = client::put(&sc.url("/static/css/./site.css"), "x").await;
    assert_eq!(put.status, 200);
    assert_eq!(get(&sc, css).await, ("MISS".into(), fill(5)));

    // Values no read of the route could carry are poison.
    for bad in ["../css/site.css", "", "css%2Fsite.css"] {
        let r = invalidate(&sc, "files", &format!(r#"{{"path":"{bad}"}}"#)).await;
        assert_eq!(r.status, 400, "{bad:?}: {}", r.text());
        assert!(
            r.text().contains("request path could carry"),
            "{bad:?}: {}",
            r.text()
        );
    }
    assert_eq!(get(&sc, css).await, ("HIT".into(), fill(5)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_objects_are_invalidated_embedded() {
    prefix_objects_are_invalidated(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_objects_are_invalidated_redis() {
    prefix_objects_are_invalidated(Some(RedisServer::start())).await;
}

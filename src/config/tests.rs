//! Unit tests of parsing, validation and route classification.

use super::*;
use http::Method;
use std::time::Duration;

const BASE: &str = r#"
version: 1
listen: 127.0.0.1:8080
admin: { listen: 127.0.0.1:9090 }
upstream: { url: "http://127.0.0.1:8000" }
"#;

fn parse(routes: &str) -> Result<Config, ConfigError> {
    Config::parse(&format!("{BASE}{routes}"), &|k| {
        (k == "HOST").then(|| "127.0.0.1".to_owned())
    })
}

fn err(routes: &str) -> String {
    match parse(routes) {
        Ok(_) => panic!("config should be rejected:\n{routes}"),
        Err(e) => e.to_string(),
    }
}

const APP: &str = r#"
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params: { tenant: "[a-z]+", id: "[1-9][0-9]*" }
    ttl: 60s
"#;

#[test]
fn classifies_requests() {
    let cfg = parse(APP).expect("valid");
    let t = &cfg.routes;
    let read = t.classify(&Method::GET, "/api/tenants/acme/apps/42");
    assert!(matches!(&read, RouteMatch::Read(r, p) if r.name == "app" && p == &["acme", "42"]));
    assert!(matches!(
        t.classify(&Method::HEAD, "/api/tenants/acme/apps/42"),
        RouteMatch::Read(..)
    ));
    assert!(matches!(
        t.classify(&Method::GET, "/api/tenants/acme/apps/0x1"),
        RouteMatch::BadParam(_, ref p) if p == "id"
    ));
    assert!(matches!(
        t.classify(&Method::PUT, "/api/tenants/acme/apps/42"),
        RouteMatch::Write(..)
    ));
    // A write with a bad param, other shapes and other methods: forwarded.
    assert!(matches!(
        t.classify(&Method::PUT, "/api/tenants/acme/apps/x"),
        RouteMatch::Forward
    ));
    assert!(matches!(
        t.classify(&Method::GET, "/api/tenants/acme/apps"),
        RouteMatch::Forward
    ));
    assert!(matches!(
        t.classify(&Method::GET, "/api/tenants/acme/apps/42/x"),
        RouteMatch::Forward
    ));
    assert!(matches!(
        t.classify(&Method::OPTIONS, "/api/tenants/acme/apps/42"),
        RouteMatch::Forward
    ));
    // Patterns are anchored.
    assert!(matches!(
        t.classify(&Method::GET, "/api/tenants/acme1/apps/42"),
        RouteMatch::BadParam(..)
    ));
}

#[test]
fn defaults_and_gen_ttl() {
    let cfg = parse(APP).expect("valid");
    let r = &cfg.routes.routes[0];
    assert_eq!(r.methods, vec![Method::GET, Method::HEAD]);
    assert_eq!(r.lease, std::time::Duration::from_secs(3));
    assert!(r.invalidate_on_write);
    assert!(cfg.store.redis.is_none());
    // 60 s ttl + 0 jitter + 60 s keep + 3 s lease + 10 s upstream.timeout + 60 s.
    assert_eq!(r.keep, std::time::Duration::from_secs(60));
    assert_eq!(cfg.gen_ttl, std::time::Duration::from_secs(193));
}

#[test]
fn fill_settings_defaults_limits_and_warnings() {
    let cfg = parse(APP).expect("valid");
    let r = &cfg.routes.routes[0];
    let names: Vec<&str> = r.fill_headers.iter().map(|h| h.as_str()).collect();
    assert_eq!(names, ["traceparent", "tracestate", "x-request-id"]);
    assert_eq!(r.host, None);
    assert_eq!(r.origin_cache_control, OriginCacheControl::Honor);
    assert_eq!(r.etag, EtagMode::Origin);
    assert_eq!(r.fill_budget, 8, "a lone route may use every permit");
    // Default lease 3 s < upstream.timeout 10 s: a warning, not an error.
    assert_eq!(cfg.warnings.len(), 1);
    assert_eq!(cfg.warnings[0].path, "routes[0].lease");

    let two = r#"
fill: { max_concurrency: 5 }
routes:
  - { name: a, path: "/a/{id}", params: { id: "[0-9]+" }, ttl: 1s, lease: 20s,
      host: "svc.internal:8080", fill_headers: [], origin_cache_control: ignore, etag: auto }
  - { name: b, path: "/b/{id}", params: { id: "[0-9]+" }, ttl: 1s, max_concurrency: 5 }
"#;
    let cfg = parse(two).expect("valid");
    let (a, b) = (&cfg.routes.routes[0], &cfg.routes.routes[1]);
    assert_eq!(a.fill_budget, 3, "half of 5, rounded up");
    assert_eq!(b.fill_budget, 5);
    assert_eq!(
        a.host.as_ref().map(|h| h.as_bytes()),
        Some(&b"svc.internal:8080"[..])
    );
    assert!(a.fill_headers.is_empty());
    assert_eq!(a.origin_cache_control, OriginCacheControl::Ignore);
    assert_eq!(a.etag, EtagMode::Auto);
    let paths: Vec<&str> = cfg.warnings.iter().map(|w| w.path.as_str()).collect();
    assert_eq!(paths, ["routes[1].lease"]);

    let route = |extra: &str| {
        format!("routes:\n  - {{ name: a, path: \"/a/{{id}}\", params: {{ id: \"[0-9]+\" }}, ttl: 1s, {extra} }}\n")
    };
    for (extra, path, words) in [
        ("fill_headers: [Host]", "routes[0].fill_headers[0]", "host"),
        (
            "fill_headers: [x-a, cookie]",
            "routes[0].fill_headers[1]",
            "vary",
        ),
        (
            "fill_headers: [accept-encoding]",
            "routes[0].fill_headers[0]",
            "vary",
        ),
        (
            "fill_headers: [range]",
            "routes[0].fill_headers[0]",
            "whole object",
        ),
        (
            "fill_headers: [connection]",
            "routes[0].fill_headers[0]",
            "hop-by-hop",
        ),
        (
            "fill_headers: [\"bad name\"]",
            "routes[0].fill_headers[0]",
            "header name",
        ),
        ("host: \"a b\"", "routes[0].host", "host"),
        ("host: \"http://x/\"", "routes[0].host", "host"),
        ("host: x, vary: [host]", "routes[0].host", "vary"),
        (
            "max_concurrency: 0",
            "routes[0].max_concurrency",
            "between 1",
        ),
        (
            "max_concurrency: 9",
            "routes[0].max_concurrency",
            "between 1",
        ),
        (
            "origin_cache_control: maybe",
            "routes[0].origin_cache_control",
            "variant",
        ),
        ("etag: strong", "routes[0].etag", "variant"),
        (
            "cache_status: [200, 206]",
            "routes[0].cache_status[1]",
            "206 cannot be cached",
        ),
        (
            "negative_status: [304]",
            "routes[0].negative_status[0]",
            "304 cannot be cached",
        ),
        ("max_grace: 5s", "routes[0].max_grace", "ttl: origin"),
        (
            "max_vary_headers: 2",
            "routes[0].max_vary_headers",
            "vary_from_origin",
        ),
        (
            "vary_from_origin: true, max_vary_headers: 17",
            "routes[0].max_vary_headers",
            "between 1 and 16",
        ),
        (
            "vary_from_origin: true, max_vary_value: 0",
            "routes[0].max_vary_value",
            "between 1 and 8192",
        ),
        (
            "vary_from_origin: true, origin_cache_control: ignore",
            "routes[0].vary_from_origin",
            "honor",
        ),
    ] {
        let e = err(&route(extra));
        assert!(e.contains(path), "{extra}: {e}");
        assert!(e.to_lowercase().contains(words), "{extra}: {e}");
    }
}

#[test]
fn errors_name_the_yaml_path() {
    let cases = [
        (APP.replace("ttl: 60s", "ttl: 60s\n    tll: 5s"), "routes[0]"),
        (APP.replace("ttl: 60s", "ttl: sixty"), "routes[0].ttl"),
        (APP.replace("[a-z]+", "[a-z"), "routes[0].params.tenant"),
        (APP.replace("tenant: \"[a-z]+\", ", ""), "routes[0].params.tenant"),
        (format!("{APP}  - name: app\n    path: /other/{{id}}\n    params: {{ id: \"[0-9]+\" }}\n    ttl: 1s\n"), "routes[1].name"),
        (format!("{APP}  - name: app2\n    path: /api/tenants/{{t}}/apps/{{n}}\n    params: {{ t: \".+\", n: \".+\" }}\n    ttl: 1s\n"), "routes[1].path"),
        (APP.replace("name: app", "name: App"), "routes[0].name"),
        (APP.replace("ttl: 60s", "ttl: 60s\n    methods: [GET, POST]"), "routes[0].methods[1]"),
    ];
    for (yaml, path) in cases {
        let e = err(&yaml);
        assert!(e.contains(path), "expected {path} in: {e}");
    }
    let e = Config::parse(
        &BASE.replace("listen: 127.0.0.1:8080", "listen: nowhere"),
        &|_| None,
    )
    .map(|_| ())
    .expect_err("bad listen");
    assert!(e.to_string().contains("listen"), "{e}");
    let e = Config::parse(&format!("{BASE}color: blue\n"), &|_| None)
        .map(|_| ())
        .expect_err("unknown key");
    assert!(e.to_string().contains("color"), "{e}");
}

#[test]
fn interpolates_env() {
    let cfg = Config::parse(
        &BASE.replace("http://127.0.0.1:8000", "http://${HOST}:${PORT:-8001}"),
        &|k| (k == "HOST").then(|| "127.0.0.9".to_owned()),
    )
    .expect("valid");
    assert_eq!(cfg.upstream.authority.as_str(), "127.0.0.9:8001");
}

#[test]
fn restart_only_changes_are_named() {
    let a = parse(APP).expect("valid");
    let b = Config::parse(
        &format!("{BASE}{APP}").replace("127.0.0.1:8080", "127.0.0.1:8081"),
        &|_| None,
    )
    .expect("valid");
    assert_eq!(a.restart_only_changes(&b), vec!["listen"]);
    assert!(a
        .restart_only_changes(&parse(APP).expect("valid"))
        .is_empty());
}

#[test]
fn server_layout_is_typed_validated_and_restart_only() {
    use super::RuntimeLayout;
    let default = parse(APP).expect("valid");
    assert_eq!(default.server.runtime, RuntimeLayout::MultiThread);
    assert_eq!(default.server.workers, None);
    let per_core = parse(&format!(
        "server:\n  runtime: per_core\n  workers: 3\n{APP}"
    ))
    .expect("valid");
    assert_eq!(per_core.server.runtime, RuntimeLayout::PerCore);
    assert_eq!(per_core.server.workers, Some(3));
    assert_eq!(default.restart_only_changes(&per_core), vec!["server"]);
    for (yaml, path) in [
        ("server:\n  workers: 0\n", "server.workers"),
        ("server:\n  workers: 257\n", "server.workers"),
        ("server:\n  runtime: threads\n", "server.runtime"),
        ("server:\n  cores: 2\n", "server"),
    ] {
        let e = parse(&format!("{yaml}{APP}")).expect_err(yaml);
        assert!(e.to_string().contains(path), "{yaml:?}: {e}");
    }
}

#[test]
fn invalidation_sources_are_typed_and_validated() {
    let cfg = parse(&format!(
        r#"
store: {{ redis: {{ url: "redis://127.0.0.1:6379/0" }} }}
invalidation:
  outbox: {{ url: "postgres://u@127.0.0.1/db", batch: 50, poll_interval: 250ms }}
  redis_stream: {{ start: earliest, claim_idle: 10s }}
{APP}"#
    ))
    .expect("valid");
    let outbox = cfg.invalidation.outbox.as_ref().expect("outbox");
    assert_eq!(outbox.table, "sidecache_outbox");
    assert_eq!(outbox.notify_channel, "sidecache_outbox");
    assert_eq!(outbox.batch, 50);
    assert_eq!(outbox.poll_interval, std::time::Duration::from_millis(250));
    assert_eq!(
        outbox.idle_poll_interval,
        std::time::Duration::from_secs(30)
    );
    let stream = cfg.invalidation.stream.as_ref().expect("stream");
    assert_eq!(stream.stream, "sidecache:invalidations");
    assert_eq!(stream.group, "sidecache");
    assert_eq!(stream.start, StreamStart::Earliest);
    assert_eq!(stream.claim_idle, std::time::Duration::from_secs(10));
    assert_eq!(cfg.invalidation.witnesses, 2, "the default");

    let cases = [
        (
            "invalidation: { witnesses: 0 }",
            "invalidation.witnesses",
        ),
        (
            "invalidation: { witnesses: 17 }",
            "invalidation.witnesses",
        ),
        (
            "invalidation: { outbox: { url: 'postgres://h/d', table: 'x; drop' } }",
            "invalidation.outbox.table",
        ),
        (
            "invalidation: { outbox: { url: 'postgres://h/d', notify_channel: 'A' } }",
            "invalidation.outbox.notify_channel",
        ),
        (
            "invalidation: { outbox: { url: 'postgres://h/d', poll_interval: 5s, idle_poll_interval: 2s } }",
            "invalidation.outbox.idle_poll_interval",
        ),
        (
            "invalidation: { outbox: { url: 'postgres://h/d', batch: 0 } }",
            "invalidation.outbox.batch",
        ),
        (
            "invalidation: { outbox: { url: '' } }",
            "invalidation.outbox.url",
        ),
        (
            "invalidation: { outbox: { url: 'postgres://h/d', tabel: x } }",
            "invalidation.outbox",
        ),
        (
            "invalidation: { redis_stream: {} }",
            "invalidation.redis_stream",
        ),
    ];
    for (yaml, path) in cases {
        let e = err(&format!("{yaml}\n{APP}"));
        assert!(e.contains(path), "{yaml}: {e}");
    }
}

#[test]
fn invalidation_changes_need_a_restart() {
    let a = parse(&format!(
        "invalidation: {{ outbox: {{ url: 'postgres://h/d' }} }}\n{APP}"
    ))
    .unwrap();
    let b = parse(&format!(
        "invalidation: {{ outbox: {{ url: 'postgres://h/d', batch: 7 }} }}\n{APP}"
    ))
    .unwrap();
    assert_eq!(a.restart_only_changes(&b), vec!["invalidation.outbox"]);
}

#[test]
fn near_cache_defaults_and_limits() {
    let single =
        |near: &str| format!("store:\n  redis:\n    url: redis://127.0.0.1:6379\n{near}{APP}");
    let cfg = parse(&single("")).expect("valid");
    let redis = cfg.store.redis.as_ref().expect("redis");
    assert_eq!(
        redis.near_cache,
        Some(NearCacheConfig {
            max_bytes: 64 << 20,
            max_age: Duration::from_secs(1),
        }),
        "on by default for a single node"
    );
    let cfg = parse(&single(
        "    near_cache: { max_bytes: 8MiB, max_age: 250ms }\n",
    ))
    .expect("valid");
    assert_eq!(
        cfg.store.redis.as_ref().and_then(|r| r.near_cache),
        Some(NearCacheConfig {
            max_bytes: 8 << 20,
            max_age: Duration::from_millis(250),
        })
    );
    let off = parse(&single("    near_cache: { enabled: false }\n")).expect("valid");
    assert_eq!(off.store.redis.as_ref().and_then(|r| r.near_cache), None);
    assert!(err(&single("    near_cache: { max_bytes: 1KiB }\n"))
        .contains("store.redis.near_cache.max_bytes"));
    assert!(err(&single("    near_cache: { max_age: 0s }\n"))
        .contains("store.redis.near_cache.max_age"));

    let cluster = "store:\n  redis:\n    cluster: [redis://127.0.0.1:7000]\n";
    let cfg = parse(&format!("{cluster}{APP}")).expect("valid");
    assert_eq!(
        cfg.store.redis.as_ref().and_then(|r| r.near_cache),
        None,
        "off by default for a cluster"
    );
    let on = parse(&format!(
        "{cluster}    near_cache: {{ enabled: true }}\n{APP}"
    ))
    .expect("opt-in on a cluster");
    assert_eq!(
        on.store.redis.as_ref().and_then(|r| r.near_cache),
        Some(NearCacheConfig {
            max_bytes: 64 << 20,
            max_age: Duration::from_secs(1),
        })
    );
    assert!(err(&format!(
        "{cluster}    near_cache: {{ enabled: true, max_age: 0s }}\n{APP}"
    ))
    .contains("store.redis.near_cache.max_age"));
}

#[test]
fn outbox_tls_keys_join_the_url_and_conflicts_name_the_key() {
    let outbox = |body: &str| format!("invalidation: {{ outbox: {{ {body} }} }}\n{APP}");
    let cfg = parse(&outbox("url: 'postgres://h/d', sslmode: require")).expect("valid");
    let url = &cfg.invalidation.outbox.as_ref().expect("outbox").url;
    assert_eq!(url, "postgres://h/d?sslmode=require");
    let e = err(&outbox(
        "url: 'postgres://h/d?sslmode=disable', sslmode: require",
    ));
    assert!(e.contains("invalidation.outbox.sslmode"), "{e}");
    assert!(e.contains("conflicts"), "{e}");
    let e = err(&outbox(
        "url: 'host=h sslrootcert=/a.pem', sslrootcert: /b.pem",
    ));
    assert!(e.contains("invalidation.outbox.sslrootcert"), "{e}");
    let e = err(&outbox("url: 'host=h', sslmode: allow"));
    assert!(e.contains("invalidation.outbox.sslmode"), "{e}");
    let e = err(&outbox(
        "url: 'host=h', sslmode: verify-ca, sslrootcert: /nonexistent/ca.pem",
    ));
    assert!(e.contains("invalidation.outbox.sslrootcert"), "{e}");
}

#[test]
fn a_stream_on_a_cluster_needs_a_hash_tag() {
    let cluster = "store:\n  redis:\n    cluster: [redis://127.0.0.1:7000]\n";
    let stream = |name: &str| {
        format!("{cluster}invalidation: {{ redis_stream: {{ stream: \"{name}\" }} }}\n{APP}")
    };
    let e = err(&stream("sidecache:invalidations"));
    assert!(e.contains("invalidation.redis_stream.stream"), "{e}");
    assert!(e.contains("hash tag"), "{e}");
    assert!(err(&stream("{}:inv")).contains("hash tag"), "empty tag");
    let cfg = parse(&stream("{sidecache}:invalidations")).expect("valid");
    assert!(cfg.invalidation.stream.is_some());
    let sentinel =
        "store:\n  redis:\n    sentinel: { master: m, nodes: [redis://127.0.0.1:26379] }\n";
    // No slots with Sentinel: no hash tag needed.
    let cfg = parse(&format!(
        "{sentinel}invalidation: {{ redis_stream: {{ stream: \"s:i\" }} }}\n{APP}"
    ))
    .expect("a stream on Sentinel");
    assert!(cfg.invalidation.stream.is_some());
}

#[test]
fn admin_on_a_public_address_needs_a_token_or_an_explicit_opt_out() {
    let public = BASE.replace(
        "admin: { listen: 127.0.0.1:9090 }",
        "admin: { listen: 0.0.0.0:9090 }",
    );
    let e = Config::parse(&format!("{public}{APP}"), &|_| None)
        .map(|_| ())
        .expect_err("public admin without a token");
    assert!(e.to_string().contains("admin.token"), "{e}");
    for admin in [
        "admin: { listen: 0.0.0.0:9090, token: t }",
        "admin: { listen: 0.0.0.0:9090, allow_unauthenticated: true }",
        "admin: { listen: \"[::1]:9090\" }",
    ] {
        let yaml = BASE.replace("admin: { listen: 127.0.0.1:9090 }", admin);
        assert!(
            Config::parse(&format!("{yaml}{APP}"), &|_| None).is_ok(),
            "{admin}"
        );
    }
}

#[test]
fn limits_defaults_errors_and_reload() {
    let cfg = parse(APP).expect("valid");
    let l = cfg.limits;
    assert_eq!(l.header_timeout, Duration::from_secs(10));
    assert_eq!(l.max_header_bytes, 64 * 1024);
    assert_eq!(l.idle_timeout, Duration::from_secs(60));
    assert_eq!(l.send_timeout, Duration::from_secs(30));
    assert_eq!(l.h2_max_concurrent_streams, 100);
    assert!((1..=10_000).contains(&l.max_connections));

    let set = parse(&format!(
        "limits: {{ max_connections: 7, header_timeout: 2s, max_header_bytes: 16KiB, \
         idle_timeout: 500ms, send_timeout: 3s }}\nh2: {{ max_concurrent_streams: 9 }}\n{APP}"
    ))
    .expect("valid");
    assert_eq!(set.limits.max_connections, 7);
    assert_eq!(set.limits.max_header_bytes, 16 * 1024);
    assert_eq!(set.limits.h2_max_concurrent_streams, 9);
    // Nothing in `limits` or `h2` needs a restart.
    assert!(cfg.restart_only_changes(&set).is_empty());

    for (yaml, path) in [
        ("limits: { max_connections: 0 }", "limits.max_connections"),
        ("limits: { header_timeout: 10ms }", "limits.header_timeout"),
        (
            "limits: { max_header_bytes: 1KiB }",
            "limits.max_header_bytes",
        ),
        ("limits: { send_timeout: 0s }", "limits.send_timeout"),
        ("limits: { idle: 1s }", "limits"),
        (
            "h2: { max_concurrent_streams: 0 }",
            "h2.max_concurrent_streams",
        ),
    ] {
        let e = err(&format!("{yaml}\n{APP}"));
        assert!(e.contains(path), "{yaml}: {e}");
    }
}

#[test]
fn stale_windows_validated_and_kept_in_gen_ttl() {
    let cfg = parse(&APP.replace(
        "ttl: 60s",
        "ttl: 60s\n    grace: 30s\n    stale_if_error: 10m",
    ))
    .expect("valid");
    let r = &cfg.routes.routes[0];
    assert_eq!(r.grace, Duration::from_secs(30));
    assert_eq!(r.stale_if_error, Duration::from_secs(600));
    assert_eq!(r.stale_keep(), Duration::from_secs(600));
    // The generation must outlive the kept entry, or a stale answer could
    // never be proven current: 60 s + 600 s + 3 s + 10 s + 60 s.
    assert_eq!(cfg.gen_ttl, Duration::from_secs(733));
    let defaults = parse(APP).expect("valid");
    assert_eq!(
        defaults.routes.routes[0].stale_keep(),
        Duration::from_secs(60),
        "keep"
    );
    let no_keep = parse(&APP.replace("ttl: 60s", "ttl: 60s\n    keep: 0s")).expect("valid");
    assert_eq!(no_keep.routes.routes[0].stale_keep(), Duration::ZERO);
    for (extra, path) in [
        ("ttl: 60s\n    grace: -5s", "routes[0].grace"),
        (
            "ttl: 60s\n    stale_if_error: -1s",
            "routes[0].stale_if_error",
        ),
        // grace without a TTL: ttl is required and must not be zero.
        ("ttl: 0s\n    grace: 1h", "routes[0].ttl"),
        ("grace: 1h", "routes[0]"),
        ("ttl: 60s\n    grace: 800h", "routes[0].grace"),
        (
            "ttl: 60s\n    stale_if_error: 720h",
            "routes[0].stale_if_error",
        ),
        ("ttl: 60s\n    keep: 720h", "routes[0].keep"),
        ("ttl: 60s\n    keep: -1s", "routes[0].keep"),
    ] {
        let e = err(&APP.replace("ttl: 60s", extra));
        assert!(e.contains(path), "{extra}: expected {path} in: {e}");
    }
}

const STATIC: &str = r#"
routes:
  - name: files
    path: /static/{path...}
    params: { path: "[A-Za-z0-9._/-]+" }
    ttl: 60s
  - name: admin
    path: /admin/{page}
    params: { page: "[a-z]+" }
    ttl: 60s
"#;

#[test]
fn prefix_params_take_the_rest_of_the_normal_path() {
    let cfg = parse(STATIC).expect("valid");
    let t = &cfg.routes;
    let read = |p: &str| match t.classify(&Method::GET, p) {
        RouteMatch::Read(r, v) => Some((r.name.clone(), v)),
        _ => None,
    };
    let files = |v: &str| Some(("files".to_owned(), vec![v.to_owned()]));
    assert_eq!(read("/static/a.css"), files("a.css"));
    assert_eq!(read("/static/css/site.css"), files("css/site.css"));
    assert_eq!(read("/static/css/"), files("css/"));
    // Every spelling of one object is that object.
    assert_eq!(read("/static/css/./site.css"), files("css/site.css"));
    assert_eq!(read("/static//css///site.css"), files("css/site.css"));
    assert_eq!(read("/static/x/../css/site.css"), files("css/site.css"));
    assert_eq!(read("/static/%63ss/site.css"), files("css/site.css"));
    // One or more segments.
    assert_eq!(read("/static/"), None);
    assert_eq!(read("/static"), None);
    // Escaping the prefix never matches it: resolved first, then matched
    // (here the other route), or forwarded when ambiguous.
    let admin = Some(("admin".to_owned(), vec!["users".to_owned()]));
    for p in [
        "/static/../admin/users",
        "/static/%2e%2e/admin/users",
        "/static/%2E%2E/%2e%2E/admin/users",
        "/static/css/../../admin/users",
    ] {
        assert_eq!(read(p), admin, "{p}");
    }
    for p in [
        "/static/..%2fadmin/users",
        "/static/..%5Cadmin/users",
        "/static/..\\admin/users",
        "/static/..;/admin/users",
        "/static/a%00.css",
        "/static/100%",
    ] {
        assert!(
            matches!(t.classify(&Method::GET, p), RouteMatch::Forward),
            "{p}"
        );
    }
    // A bad param is checked on the whole rest.
    assert!(matches!(
        t.classify(&Method::GET, "/static/a b"),
        RouteMatch::BadParam(_, ref p) if p == "path"
    ));
    // Writes are classified on the normal form too (write-through).
    assert!(matches!(
        t.classify(&Method::PUT, "/static/./css//a.css"),
        RouteMatch::Write(_, ref v) if v == &["css/a.css"]
    ));
    // The fill asks for the normal form.
    let r = t.find("files").expect("route");
    assert_eq!(r.fill_path(&["css/site.css"]), "/static/css/site.css");
    assert!(r.is_prefix(0));
}

#[test]
fn prefix_templates_are_validated() {
    for (path, words) in [
        ("/a/{rest...}/b", "last segment"),
        ("/a/{x...}/{y...}", "two prefix params"),
        ("/a/{...}", "param name"),
        ("/a//{id}", "normal form"),
        ("/a/./{id}", "normal form"),
        ("/%7euser/{id}", "normal form"),
        ("/a/%2f/{id}", "normal form"),
    ] {
        let yaml = format!(
            "routes:\n  - name: r\n    path: \"{path}\"\n    params: {{ id: \"x\", rest: \"x\", x: \"x\", y: \"x\" }}\n    ttl: 1s\n"
        );
        let e = err(&yaml);
        assert!(e.contains("routes[0].path"), "{path}: {e}");
        assert!(e.contains(words), "{path}: {e}");
    }
    // The trailing slash and the root stay valid templates.
    parse(
        "routes:\n  - { name: r, path: /docs/, ttl: 1s }\n  - { name: root, path: /, ttl: 1s }\n",
    )
    .expect("valid");
}

#[test]
fn prefix_routes_conflict_only_when_a_path_could_match_both() {
    // Route a is `/s/{p...}`; route b is `b` with the params it names.
    let two = |b: &str| {
        let mut params = Vec::new();
        if b.contains("{q...}") {
            params.push("q: \"[a-z]+\"");
        }
        if b.contains("{w}") {
            params.push("w: \"[0-9]+\"");
        }
        format!(
            "routes:\n  - name: a\n    path: \"/s/{{p...}}\"\n    params: {{ p: \"[a-z]+(/[a-z]+)*\" }}\n    ttl: 1s\n  - name: b\n    path: \"{b}\"\n    params: {{ {} }}\n    ttl: 1s\n",
            params.join(", ")
        )
    };
    // A literal tail the prefix pattern refuses: no conflict.
    parse(&two("/s/x1")).expect("digits are outside [a-z]");
    parse(&two("/s")).expect("the prefix needs a segment");
    parse(&two("/s/")).expect("nor an empty one");
    parse(&two("/t/{q...}")).expect("another literal");
    for b in ["/s/x", "/s/x/y", "/s/{q...}", "/s/x/{q...}", "/s/{w}"] {
        let e = err(&two(b));
        assert!(
            e.contains("routes[1].path") && e.contains("conflicts"),
            "{b}: {e}"
        );
    }
}

#[test]
fn ttl_origin_needs_a_cap_and_a_consistent_route() {
    let cfg = parse(&APP.replace(
        "ttl: 60s",
        "ttl: origin\n    max_ttl: 1h\n    default_ttl: 30s\n    grace: 10s",
    ))
    .expect("valid");
    let r = &cfg.routes.routes[0];
    assert_eq!(
        r.ttl,
        Ttl::Origin {
            max: Duration::from_secs(3600),
            default: Duration::from_secs(30)
        }
    );
    // The generation outlives the longest entry: 3600 + 60 (keep) + 3 + 10 + 60.
    assert_eq!(cfg.gen_ttl, Duration::from_secs(3733));
    let no_default =
        parse(&APP.replace("ttl: 60s", "ttl: origin\n    max_ttl: 5s")).expect("valid");
    assert_eq!(
        no_default.routes.routes[0].ttl.origin_caps(),
        Some((Duration::from_secs(5), Duration::ZERO))
    );
    for (keys, path, words) in [
        ("ttl: origin", "routes[0].max_ttl", "required"),
        (
            "ttl: origin\n    max_ttl: 0s",
            "routes[0].max_ttl",
            "greater than zero",
        ),
        (
            "ttl: origin\n    max_ttl: 5s\n    default_ttl: 6s",
            "routes[0].default_ttl",
            "exceeds max_ttl",
        ),
        (
            "ttl: 60s\n    max_ttl: 5s",
            "routes[0].max_ttl",
            "ttl: origin",
        ),
        (
            "ttl: 60s\n    default_ttl: 5s",
            "routes[0].default_ttl",
            "ttl: origin",
        ),
        (
            "ttl: origin\n    max_ttl: 5s\n    origin_cache_control: ignore",
            "routes[0].origin_cache_control",
            "contradicts",
        ),
        ("ttl: originn", "routes[0].ttl", "origin"),
        (
            "ttl: origin\n    max_ttl: 800h",
            "routes[0].keep",
            "at most",
        ),
    ] {
        let e = err(&APP.replace("ttl: 60s", keys));
        assert!(e.contains(path), "{keys}: expected {path} in: {e}");
        assert!(e.contains(words), "{keys}: expected {words:?} in: {e}");
    }
}

#[test]
fn client_cache_control_modes_and_literals() {
    let mode = |v: &str| {
        parse(&APP.replace(
            "ttl: 60s",
            &format!("ttl: 60s\n    client_cache_control: {v}"),
        ))
        .map(|c| c.routes.routes[0].client_cache_control.clone())
    };
    assert_eq!(
        parse(APP).expect("valid").routes.routes[0].client_cache_control,
        ClientCacheControl::Pass
    );
    assert_eq!(mode("pass").expect("valid"), ClientCacheControl::Pass);
    assert_eq!(
        mode("remaining").expect("valid"),
        ClientCacheControl::Remaining
    );
    assert_eq!(
        mode("\"private, max-age=0\"").expect("valid"),
        ClientCacheControl::Literal(http::HeaderValue::from_static("private, max-age=0"))
    );
    mode("\"no-cache=\\\"Set-Cookie, X-A\\\", Public\"").expect("quoted commas are one directive");
    for (v, words) in [
        ("\"\"", "empty"),
        ("\" , \"", "empty"),
        ("Remaining", "spelled"),
        ("\"privat, max-age=0\"", "privat"),
        ("\"max-age=0\\u0001\"", "header value"),
    ] {
        let e = mode(v).map(|_| ()).expect_err(v);
        let e = e.to_string();
        assert!(e.contains("routes[0].client_cache_control"), "{v}: {e}");
        assert!(e.contains(words), "{v}: {e}");
    }
}

#[test]
fn access_log_defaults_errors_and_reload() {
    let cfg = parse(APP).expect("valid");
    let a = cfg.access_log;
    assert!(!a.enabled && !a.query);
    assert_eq!(a.format, file::FileLogFormat::Text);
    assert_eq!(a.sample, 1.0);
    assert_eq!(a.request_id, file::FileRequestId::Pass);
    assert_eq!(a.buffer, 4096);

    let set = parse(&format!(
        "access_log: {{ enabled: true, format: json, sample: 0.25, query: true, \
         request_id: generate }}\n{APP}"
    ))
    .expect("valid");
    let a = set.access_log;
    assert!(a.enabled && a.query);
    assert_eq!(a.format, file::FileLogFormat::Json);
    assert_eq!(a.sample, 0.25);
    assert_eq!(a.request_id, file::FileRequestId::Generate);
    // All of it applies on reload, but the buffer's size.
    assert!(cfg.restart_only_changes(&set).is_empty());
    let bigger = parse(&format!("access_log: {{ buffer: 100 }}\n{APP}")).expect("valid");
    assert_eq!(cfg.restart_only_changes(&bigger), ["access_log.buffer"]);

    for (yaml, path) in [
        ("access_log: { sample: 0 }", "access_log.sample"),
        ("access_log: { sample: 1.5 }", "access_log.sample"),
        ("access_log: { sample: -1 }", "access_log.sample"),
        ("access_log: { format: xml }", "access_log.format"),
        ("access_log: { request_id: make }", "access_log.request_id"),
        ("access_log: { enable: true }", "access_log"),
        ("access_log: { buffer: 0 }", "access_log.buffer"),
    ] {
        let e = err(&format!("{yaml}\n{APP}"));
        assert!(e.contains(path), "{yaml}: {e}");
    }
}

#[test]
fn fill_queue_defaults_and_bounds() {
    let cfg = parse(APP).expect("valid");
    assert_eq!(cfg.fill.queue_timeout, Duration::from_millis(250));
    assert_eq!(cfg.fill.max_queued, 256);
    let cfg = parse(&format!(
        "fill: {{ queue_timeout: 0s, max_queued: 3 }}\n{APP}"
    ))
    .expect("valid");
    assert_eq!(cfg.fill.queue_timeout, Duration::ZERO);
    assert_eq!(cfg.fill.max_queued, 3);
    let e = err(&format!("fill: {{ queue_timeout: 11s }}\n{APP}"));
    assert!(e.contains("fill.queue_timeout"), "{e}");
    let e = err(&format!("fill: {{ queue_timeout: -1s }}\n{APP}"));
    assert!(e.contains("fill.queue_timeout"), "{e}");
}

/// `also_invalidates`, `tags_from`, `version_from` (issue 13): errors name
/// the YAML path.
#[test]
fn relations_are_validated_against_the_route_table() {
    let routes = |relations: &str, list_relations: &str| {
        format!(
            r#"
routes:
  - name: app
    path: /t/{{tenant}}/a/{{id}}
    params: {{ tenant: "[a-z]+", id: "[0-9]+" }}
    ttl: 60s
    also_invalidates: {relations}
  - name: list
    path: /t/{{tenant}}/a
    params: {{ tenant: "[a-z]+" }}
    ttl: 60s
    also_invalidates: {list_relations}
  - name: summary
    path: /t/{{tenant}}/summary
    params: {{ tenant: "[a-z]+" }}
    ttl: 60s
"#
        )
    };
    let ok = parse(&routes(
        r#"[{ route: list, params: { tenant: "{tenant}" } }]"#,
        r#"[{ route: summary, params: { tenant: "{tenant}" } }]"#,
    ))
    .expect("valid");
    let app = cfg_route(&ok, "app");
    assert_eq!(app.also_invalidates.len(), 1);
    assert_eq!(
        app.also_invalidates[0].render(&["acme".into(), "7".into()]),
        ["acme"]
    );
    for (relations, list_relations, path, says) in [
        (
            r#"[{ route: nope }]"#,
            "[]",
            "routes[0].also_invalidates[0].route",
            "unknown route",
        ),
        (
            r#"[{ route: list }]"#,
            "[]",
            "routes[0].also_invalidates[0].params",
            "needs param \"tenant\"",
        ),
        (
            r#"[{ route: list, params: { tenant: "{who}" } }]"#,
            "[]",
            "routes[0].also_invalidates[0].params.tenant",
            "{who} is not a param",
        ),
        (
            r#"[{ route: list, params: { tenant: "{tenant}", id: "{id}" } }]"#,
            "[]",
            "routes[0].also_invalidates[0].params.id",
            "has no param",
        ),
        (
            r#"[{ route: list, params: { tenant: "{tenant}" } }]"#,
            r#"[{ route: app, params: { tenant: "{tenant}", id: "1" } }]"#,
            "routes[1].also_invalidates[0]",
            "cycle: app -> list -> app",
        ),
        (
            r#"[{ route: app, params: { tenant: "{tenant}", id: "{id}" } }]"#,
            "[]",
            "routes[0].also_invalidates[0]",
            "cycle: app -> app",
        ),
    ] {
        let e = err(&routes(relations, list_relations));
        assert!(e.contains(path) && e.contains(says), "{relations}: {e}");
    }
    let e = err(&APP.replace("ttl: 60s", "ttl: 60s\n    tags_from: \"bad header\""));
    assert!(e.contains("routes[0].tags_from"), "{e}");
    let e = err(&APP.replace("ttl: 60s", "ttl: 60s\n    version_from: \"x y\""));
    assert!(e.contains("routes[0].version_from"), "{e}");
}

fn cfg_route<'a>(cfg: &'a Config, name: &str) -> &'a Route {
    cfg.routes.find(name).expect("route")
}

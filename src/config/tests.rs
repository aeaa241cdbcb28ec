//! Unit tests of parsing as a whole (interpolation, unknown keys, the
//! generation TTL, restart-only changes) and of route classification. Each
//! section's validation is tested beside its validator, in `validate/`.

use super::testing::{err, parse, APP, BASE};
use super::*;
use http::Method;

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
    let e = err(&format!("cache_name: \"edge 1\"\n{APP}"));
    assert!(e.contains("cache_name") && e.contains("not a token"), "{e}");
    let cfg = parse(&format!("cache_name: edge-1\n{APP}")).expect("a token");
    assert_eq!(cfg.cache_name, "edge-1");
    assert_eq!(parse(APP).expect("valid").cache_name, "sidecache");
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

//! The admin listener: liveness, readiness, metrics text, the route table,
//! the bearer token, and input validation of `/admin/invalidate`.

use crate::support::client::{self, request};
use crate::support::{get_held, Origin, Sidecache, SidecacheBuilder};
use std::time::Duration;

#[tokio::test]
async fn health_ready_metrics_routes() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;

    let health = client::get(&sc.admin_url("/healthz")).await;
    assert_eq!(health.status, 200);
    let ready = client::get(&sc.admin_url("/readyz")).await;
    assert_eq!(ready.status, 200);

    // Some traffic so labelled series exist.
    client::get(&sc.url("/echo/x")).await;
    let metrics = client::get(&sc.admin_url("/metrics")).await;
    assert_eq!(metrics.status, 200);
    assert!(metrics
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    let text = metrics.text();
    for name in [
        "sidecache_requests_total",
        "sidecache_upstream_requests_total",
        "sidecache_upstream_duration_seconds",
        "sidecache_breaker_open",
    ] {
        assert!(
            text.contains(name),
            "/metrics should contain {name}:\n{text}"
        );
    }
    assert!(
        text.contains(r#"sidecache_requests_total{result="forward",route="-"} 1"#),
        "{text}"
    );

    let routes = client::get(&sc.admin_url("/admin/routes")).await;
    assert_eq!(routes.status, 200);
    let list = routes.json();
    let app = &list.as_array().expect("a JSON array")[0];
    assert_eq!(app["name"], "app");
    assert_eq!(app["path"], "/api/tenants/{tenant}/apps/{id}");
    assert_eq!(app["methods"], serde_json::json!(["GET", "HEAD"]));
    assert_eq!(app["params"]["id"], "[1-9][0-9]{0,17}");
    assert_eq!(app["ttl"], "60s");
    assert_eq!(app["max_ttl"], serde_json::Value::Null);
    assert_eq!(app["client_cache_control"], "pass");

    assert_eq!(client::get(&sc.admin_url("/nope")).await.status, 404);
    assert_eq!(
        client::post(&sc.admin_url("/healthz"), "").await.status,
        405
    );
}

#[tokio::test]
async fn token_guards_admin_endpoints_only() {
    let origin = Origin::start().await;
    let sc = SidecacheBuilder::new(origin.url())
        .token("s3cret")
        .start()
        .await;

    let routes = sc.admin_url("/admin/routes");
    assert_eq!(client::get(&routes).await.status, 401);
    assert_eq!(
        request("GET", &routes, &[("authorization", "Bearer wrong")], "")
            .await
            .status,
        401
    );
    assert_eq!(
        request("GET", &routes, &[("authorization", "Bearer s3cre")], "")
            .await
            .status,
        401
    );
    assert_eq!(
        request("GET", &routes, &[("authorization", "s3cret")], "")
            .await
            .status,
        401
    );
    assert_eq!(
        request("GET", &routes, &[("authorization", "Bearer s3cret")], "")
            .await
            .status,
        200
    );
    // The scheme is case-insensitive (RFC 9110 §11.1).
    for scheme in ["bearer", "BEARER"] {
        let value = format!("{scheme} s3cret");
        let resp = request("GET", &routes, &[("authorization", &value)], "").await;
        assert_eq!(resp.status, 200, "{value}");
    }
    let inv = sc.admin_url("/admin/invalidate");
    assert_eq!(client::post(&inv, r#"{"route":"app"}"#).await.status, 401);

    // Liveness, readiness and metrics stay open for probes and scrapers.
    assert_eq!(client::get(&sc.admin_url("/healthz")).await.status, 200);
    assert_eq!(client::get(&sc.admin_url("/readyz")).await.status, 200);
    assert_eq!(client::get(&sc.admin_url("/metrics")).await.status, 200);
}

#[tokio::test]
async fn invalidate_rejects_bad_input_with_400() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    let inv = sc.admin_url("/admin/invalidate");

    let cases = [
        ("not json", "malformed event"),
        (r#"{"route": 5}"#, "malformed event"),
        (
            r#"{"route":"app","params":{"tenant":"t","id":"1"},"bogus":1}"#,
            "malformed event",
        ),
        (
            r#"{"route":"app","params":{"tenant":"t","id":"1"},"kind":"explode"}"#,
            "malformed event",
        ),
        (r#"{"route":"nope","params":{}}"#, "unknown route"),
        (r#"{"route":"app","params":{"tenant":"t"}}"#, "missing"),
        (
            r#"{"route":"app","params":{"tenant":"t","id":"0"}}"#,
            "pattern",
        ),
        (
            r#"{"route":"app","params":{"tenant":"t","id":"1","x":"y"}}"#,
            "no param",
        ),
    ];
    for (body, why) in cases {
        let resp = client::post(&inv, body).await;
        assert_eq!(resp.status, 400, "{body} -> {}", resp.text());
        assert_eq!(resp.json()["ok"], false);
        assert!(
            resp.json()["error"].as_str().unwrap().contains(why),
            "{body} -> {}",
            resp.text()
        );
    }

    let big = format!(r#"{{"route":"app","pad":"{}"}}"#, "x".repeat(100 * 1024));
    assert_eq!(client::post(&inv, big).await.status, 413);
    assert_eq!(client::get(&inv).await.status, 405);
    // The process survived all of it.
    assert_eq!(client::get(&sc.admin_url("/healthz")).await.status, 200);
    assert_eq!(origin.total(), 0, "admin input never reaches the upstream");
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests() {
    let origin = Origin::start().await;
    let mut sc = Sidecache::start(&origin.url()).await;
    let (gate, pending) = get_held(&origin, "/slow", sc.url("/slow")).await;

    sc.signal("TERM");
    let addr = sc.addr();
    crate::support::eventually(
        "the client listener stops accepting",
        Duration::from_secs(5),
        || async move { tokio::net::TcpStream::connect(addr).await.is_err() },
    )
    .await;
    assert_eq!(
        client::get(&sc.admin_url("/readyz")).await.status,
        503,
        "not ready while draining"
    );

    gate.release();
    let resp = pending.await.unwrap();
    assert_eq!(resp.status, 200, "the in-flight request finished");
    assert_eq!(resp.text(), "/slow v1");
    let status = sc.wait_exit(Duration::from_secs(5)).await;
    assert!(status.success(), "clean exit after draining: {status}");
}

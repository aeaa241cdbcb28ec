//! Hot reload (docs/architecture.md#hot-reload): rename-replace picked up,
//! invalid files and restart-only changes refused with the old config still
//! serving, SIGHUP.

use crate::support::client;
use crate::support::{app_routes, eventually, Origin, Sidecache, SidecacheBuilder};
use std::time::Duration;

/// The default `app` route and a second one, `tenant`.
fn two_routes() -> String {
    app_routes("") + TENANT_ROUTE
}

const TENANT_ROUTE: &str = r#"  - name: tenant
    path: /api/tenants/{tenant}
    params:
      tenant: "[a-z]{1,8}"
    ttl: 30s
"#;

async fn route_names(sc: &Sidecache) -> Vec<String> {
    let resp = client::get(&sc.admin_url("/admin/routes")).await;
    resp.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

async fn reloads(sc: &Sidecache, outcome: &str) -> f64 {
    sc.metric(&format!(
        "sidecache_config_reloads_total{{outcome=\"{outcome}\"}}"
    ))
    .await
    .unwrap_or(0.0)
}

#[tokio::test]
async fn rename_replace_adds_a_route_within_2s() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    assert_eq!(route_names(&sc).await, ["app"]);

    sc.rewrite_config(&sc.builder().routes(&two_routes()).render());
    eventually(
        "route `tenant` visible in /admin/routes",
        Duration::from_secs(2),
        || async { route_names(&sc).await == ["app", "tenant"] },
    )
    .await;
    // The new route is live for requests: a bad param is now refused.
    let resp = client::get(&sc.url("/api/tenants/NOT_LOWER")).await;
    assert_eq!(resp.status, 400);
    assert_eq!(origin.total(), 0);
    assert_eq!(reloads(&sc, "applied").await, 1.0);
}

#[tokio::test]
async fn invalid_file_keeps_the_old_config() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;

    let broken = sc
        .builder()
        .routes(&two_routes().replace("ttl: 30s", "ttl: thirty"))
        .render();
    sc.rewrite_config(&broken);
    eventually(
        "a rejected reload counted",
        Duration::from_secs(5),
        || async { reloads(&sc, "rejected").await >= 1.0 },
    )
    .await;
    assert_eq!(route_names(&sc).await, ["app"]);
    assert!(
        sc.stderr_text().contains("routes[1].ttl"),
        "the reason is logged"
    );
    // Still serving.
    let resp = client::get(&sc.url("/echo/still-here")).await;
    assert_eq!(resp.status, 200);
    assert_eq!(reloads(&sc, "applied").await, 0.0);
}

/// A rejected file is warned about once, however many events the
/// directory sees afterwards (a log file written next to the config would
/// otherwise turn each warning into the next event).
#[tokio::test]
async fn a_rejected_file_is_warned_about_once() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    let broken = sc
        .builder()
        .routes(&two_routes().replace("ttl: 30s", "ttl: thirty"))
        .render();
    sc.rewrite_config(&broken);
    eventually("the rejection", Duration::from_secs(5), || async {
        reloads(&sc, "rejected").await >= 1.0
    })
    .await;
    for i in 0..5 {
        let before = reloads(&sc, "unchanged").await;
        std::fs::write(sc.config_dir().join("sidecache.log"), format!("line {i}\n"))
            .expect("write a file next to the config");
        eventually("the event is looked at", Duration::from_secs(5), || async {
            reloads(&sc, "unchanged").await > before
        })
        .await;
    }
    assert_eq!(reloads(&sc, "rejected").await, 1.0);
    let log = sc.stderr_text();
    assert_eq!(
        log.matches("config reload rejected").count(),
        1,
        "warned once:\n{log}"
    );
}

#[tokio::test]
async fn listen_change_is_refused() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;

    let moved = sc
        .builder()
        .addrs(crate::support::sidecache::free_addr(), sc.admin_addr())
        .routes(&two_routes())
        .render();
    sc.rewrite_config(&moved);
    eventually(
        "a rejected reload counted",
        Duration::from_secs(5),
        || async { reloads(&sc, "rejected").await >= 1.0 },
    )
    .await;
    assert_eq!(
        route_names(&sc).await,
        ["app"],
        "nothing of the refused file applies"
    );
    assert!(
        sc.stderr_text().contains("listen"),
        "the field needing a restart is named"
    );
    assert_eq!(client::get(&sc.url("/echo/x")).await.status, 200);
}

#[tokio::test]
async fn sighup_reloads() {
    let origin = Origin::start().await;
    let sc = SidecacheBuilder::new(origin.url())
        .env("SIDECACHE_LOG", "sidecache=debug")
        .start()
        .await;

    // Written in place (no rename) and announced with SIGHUP.
    std::fs::write(
        sc.config_path(),
        sc.builder().routes(&two_routes()).render(),
    )
    .unwrap();
    sc.sighup();
    eventually(
        "route `tenant` after SIGHUP",
        Duration::from_secs(2),
        || async { route_names(&sc).await == ["app", "tenant"] },
    )
    .await;
    // The file watcher may have seen the write too; the log tells which
    // trigger ran. SIGHUP must have run a reload of its own.
    eventually(
        "a reload triggered by SIGHUP",
        Duration::from_secs(2),
        || async { sc.stderr_text().contains(r#"trigger="sighup""#) },
    )
    .await;
    assert_eq!(
        reloads(&sc, "applied").await,
        1.0,
        "the same content applies once"
    );
    // The process is alive: SIGHUP did not take the default action.
    assert_eq!(client::get(&sc.admin_url("/healthz")).await.status, 200);
}

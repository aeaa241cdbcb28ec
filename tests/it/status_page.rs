//! The status page in a real browser: headless Chromium loads the admin
//! listener's `/` from a sidecache with traffic, runs its script (virtual
//! time: several one-second polls of `/admin/status`), and the test reads
//! the rendered DOM: a row per route with its numbers, the numbers grown
//! after more traffic, the rolling chart, the state cards and a recent dead
//! letter. A screenshot goes to the test's temp dir.

use crate::support::client::{self, request};
use crate::support::redis::RedisServer;
use crate::support::{eventually, Origin, SidecacheBuilder};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Runs headless Chromium on `url` with a fresh profile in `dir`, `extra`
/// deciding what it outputs (`--dump-dom`, `--screenshot=...`).
fn chromium(url: &str, dir: &Path, extra: &[&str]) -> String {
    let profile = tempfile::tempdir_in(dir).expect("profile dir");
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            // Five polls of the page's one-second timer, in virtual time.
            "--virtual-time-budget=5500",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run chromium ({e}); scripts/test installs it (Debian package chromium)")
        });
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text of the first element after `marker` (e.g. `id="breaker"`).
fn text_after(dom: &str, marker: &str) -> String {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not in the DOM:\n{dom}"));
    let rest = &dom[at..];
    let start = rest.find('>').expect("tag end") + 1;
    let end = rest[start..].find('<').expect("next tag") + start;
    rest[start..end].to_owned()
}

/// The cells of the route row `route`, by class.
fn route_cell(dom: &str, route: &str, class: &str) -> String {
    let row_at = dom
        .find(&format!("<tr data-route=\"{route}\">"))
        .unwrap_or_else(|| panic!("no row for route {route}:\n{dom}"));
    let row = &dom[row_at..row_at + dom[row_at..].find("</tr>").expect("row end")];
    text_after(row, &format!("class=\"{class}\""))
}

fn number(s: &str) -> f64 {
    s.trim()
        .trim_end_matches('%')
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {s:?}"))
}

#[tokio::test]
async fn renders_live_numbers_in_a_real_browser() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = SidecacheBuilder::new(origin.url())
        .store(&format!("store:\n  redis:\n    url: \"{}\"\n", redis.url()))
        .extra(
            "invalidation:\n  redis_stream: { stream: \"inv\", group: \"g\", start: earliest }\n",
        )
        .start()
        .await;
    let app = sc.url("/api/tenants/acme/apps/1");
    for _ in 0..5 {
        client::get(&app).await;
    }
    client::get(&sc.url("/echo/a")).await;
    redis
        .cli(&["XADD", "inv", "*", "route", "no-such-route", "params", "{}"])
        .expect("XADD");
    eventually("the dead letter", Duration::from_secs(10), || async {
        sc.metric("sidecache_dead_letters_total{source=\"stream\"}")
            .await
            == Some(1.0)
    })
    .await;

    let page = client::get(&sc.admin_url("/")).await;
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap_or_default()
        .starts_with("text/html"));

    let dir = tempfile::tempdir().expect("temp dir");
    let url = sc.admin_url("/");
    let first = chromium(&url, dir.path(), &["--dump-dom"]);
    // Several polls ran, and each route has its row with numbers.
    assert!(
        number(&text_after(&first, "id=\"updated\"")) >= 3.0,
        "{first}"
    );
    assert_eq!(number(&route_cell(&first, "app", "total")), 5.0);
    assert_eq!(number(&route_cell(&first, "app", "hits")), 4.0);
    assert_eq!(number(&route_cell(&first, "app", "misses")), 1.0);
    let _ = number(&route_cell(&first, "app", "rate"));
    assert_eq!(route_cell(&first, "app", "ratio-total").trim(), "80.0 %");
    // No traffic between the polls: no ratio for the last second.
    assert_eq!(route_cell(&first, "app", "ratio").trim(), "-");
    assert_eq!(number(&route_cell(&first, "-", "total")), 1.0);
    // The rolling chart: one point per second of the last minute.
    let points = text_between(&first, "points=\"", "\"");
    assert_eq!(points.split(' ').count(), 60, "{points}");
    assert_eq!(text_after(&first, "id=\"breaker\""), "closed");
    assert_eq!(text_after(&first, "id=\"near\""), "tracking");
    assert_eq!(text_after(&first, "id=\"config\""), "ok");
    assert_eq!(text_after(&first, "id=\"stream\""), "0 pending");
    assert!(
        first.contains("no-such-route"),
        "the dead letter is listed:\n{first}"
    );

    // More traffic: the numbers move.
    for _ in 0..7 {
        client::get(&app).await;
    }
    let second = chromium(&url, dir.path(), &["--dump-dom"]);
    assert_eq!(number(&route_cell(&second, "app", "total")), 12.0);
    assert_eq!(number(&route_cell(&second, "app", "hits")), 11.0);

    let shot = dir.path().join("status.png");
    chromium(
        &url,
        dir.path(),
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1280,900",
        ],
    );
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
}

#[tokio::test]
async fn the_status_data_follows_the_admin_token() {
    let origin = Origin::start().await;
    let sc = SidecacheBuilder::new(origin.url())
        .token("t0k")
        .start()
        .await;
    // The page holds no data and stays open; its data needs the token.
    assert_eq!(client::get(&sc.admin_url("/")).await.status, 200);
    assert_eq!(
        client::get(&sc.admin_url("/admin/status")).await.status,
        401
    );
    let ok = request(
        "GET",
        &sc.admin_url("/admin/status"),
        &[("authorization", "Bearer t0k")],
        "",
    )
    .await;
    assert_eq!(ok.status, 200);
    let v = ok.json();
    assert_eq!(v["routes"][0]["route"], "-");
    assert_eq!(v["routes"][1]["route"], "app");
    assert_eq!(v["store"]["kind"], "embedded");
    assert_eq!(v["config"]["last_reload_successful"], true);
    assert_eq!(client::post(&sc.admin_url("/"), "").await.status, 405);
}

fn text_between(s: &str, start: &str, end: &str) -> String {
    let a = s.find(start).unwrap_or_else(|| panic!("{start} not found")) + start.len();
    let b = s[a..].find(end).expect("end") + a;
    s[a..b].to_owned()
}

//! Explain one URL: `/admin/lookup` through an object's life (no entry,
//! fill in flight, fresh, in the near cache, invalidated, stale), variants,
//! bypass, bad params and unrouted paths; the token; and `sidecache lookup`
//! printing the same as a table.

use crate::support::client::{self, request};
use crate::support::redis::RedisServer;
use crate::support::sidecache::binary;
use crate::support::{eventually, get_held, Origin, Sidecache, SidecacheBuilder};
use serde_json::Value;
use std::time::Duration;

const ROUTES: &str = r#"routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params:
      tenant: "[A-Za-z0-9_-]{1,64}"
      id: "[1-9][0-9]{0,17}"
    vary: [Accept]
    ttl: 60s
    wait: 5s
  - name: short
    path: /short/{id}
    params: { id: "[0-9]+" }
    ttl: 1s
    grace: 60s
"#;

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn lookup(sc: &Sidecache, url: &str, extra: &str) -> Value {
    let resp =
        client::get(&sc.admin_url(&format!("/admin/lookup?url={}{extra}", encode(url)))).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    resp.json()
}

async fn start(redis: &RedisServer, origin: &Origin) -> Sidecache {
    SidecacheBuilder::new(origin.url())
        .store(&format!("store:\n  redis:\n    url: \"{}\"\n", redis.url()))
        .routes(ROUTES)
        .start()
        .await
}

#[tokio::test]
async fn explains_an_object_through_its_life() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let sc = start(&redis, &origin).await;
    let app = "/api/tenants/acme/apps/1";

    let v = lookup(&sc, app, "").await;
    assert_eq!(v["route"], "app");
    assert_eq!(v["params"]["tenant"], "acme");
    assert_eq!(v["identity"], "app:acme:1");
    assert_eq!(v["keys"]["generation"], "sc:o:{app:acme:1}:g");
    assert_eq!(v["entry"]["exists"], false);
    assert_eq!(v["lease"]["held"], false);
    assert_eq!(v["verdict"], "MISS");
    assert!(v["bloom"].is_null());

    // A fill in flight: the lease is held, by this instance.
    let (gate, pending) = get_held(&origin, app, sc.url(app)).await;
    let v = lookup(&sc, app, "").await;
    assert_eq!(v["lease"]["held"], true, "{v}");
    let by = v["lease"]["by"].as_str().unwrap_or_default().to_owned();
    assert!(by.ends_with(&format!(":{}", sc.pid())), "lease holder {by}");
    assert!(
        v["why"]
            .as_str()
            .unwrap_or_default()
            .contains("holds the lease"),
        "{v}"
    );
    gate.release();
    assert_eq!(client::x_cache(&pending.await.expect("get")), "MISS");

    // Stored and current: a HIT; once read, in this instance's near cache.
    // (The invalidation push of the fill's own publish may arrive after the
    // first HIT and drop the copy it cached: read until one stays.)
    eventually(
        "a HIT is held in the near cache",
        Duration::from_secs(5),
        || async {
            assert_eq!(client::x_cache(&client::get(&sc.url(app)).await), "HIT");
            lookup(&sc, app, "").await["near_cache"]["present"] == true
        },
    )
    .await;
    let v = lookup(&sc, app, "").await;
    assert_eq!(v["verdict"], "HIT", "{v}");
    assert_eq!(v["entry"]["status"], 200);
    assert_eq!(v["entry"]["generation_current"], true);
    assert_eq!(v["entry"]["servable"], true);
    assert!(v["entry"]["ttl_ms"].as_u64().unwrap_or(0) > 50_000, "{v}");
    assert_eq!(v["entry"]["stamped_generation"], v["generation"]["current"]);
    assert_eq!(v["lease"]["held"], false);
    assert_eq!(v["near_cache"]["present"], true, "{v}");
    assert_eq!(v["near_cache"]["agrees_with_store"], true);

    // Another variant (vary: Accept), from a parameter or the admin
    // request's own header: not stored.
    let json = lookup(&sc, app, "&accept=application%2Fjson").await;
    assert_eq!(json["entry"]["exists"], false);
    assert_ne!(json["variant"], v["variant"]);
    let resp = request(
        "GET",
        &sc.admin_url(&format!("/admin/lookup?url={}", encode(app))),
        &[("accept", "application/json")],
        "",
    )
    .await;
    assert_eq!(resp.json()["variant"], json["variant"]);

    // A cookie outside `vary`: forwarded uncached.
    let cookie = lookup(&sc, app, "&cookie=s%3D1").await;
    assert_eq!(cookie["verdict"], "BYPASS");

    // Invalidated: the entry is still there, of an old generation.
    let inv = client::post(
        &sc.admin_url("/admin/invalidate"),
        r#"{"route":"app","params":{"tenant":"acme","id":"1"}}"#,
    )
    .await;
    assert_eq!(inv.status, 200);
    let v = lookup(&sc, app, "").await;
    assert_eq!(v["verdict"], "MISS", "{v}");
    assert_eq!(v["entry"]["exists"], true);
    assert_eq!(v["entry"]["generation_current"], false);
    assert_eq!(v["entry"]["servable"], false);
    assert_ne!(v["entry"]["stamped_generation"], v["generation"]["current"]);
    assert!(
        v["why"]
            .as_str()
            .unwrap_or_default()
            .contains("not current"),
        "{v}"
    );

    // The generation key lost: never servable either.
    let short = "/short/7";
    client::get(&sc.url(short)).await;
    // Expired within grace: STALE (polled, not slept: ttl is 1 s).
    eventually(
        "the short entry to expire",
        Duration::from_secs(10),
        || async { lookup(&sc, short, "").await["verdict"] == "STALE" },
    )
    .await;
    let v = lookup(&sc, short, "").await;
    assert!(v["entry"]["fresh_for_ms"].as_i64().unwrap_or(0) <= 0, "{v}");
    assert_eq!(v["entry"]["servable"], true);
    redis.cli(&["DEL", "sc:o:{short:7}:g"]).expect("DEL");
    let v = lookup(&sc, short, "").await;
    assert_eq!(v["verdict"], "MISS", "{v}");
    assert!(v["generation"]["current"].is_null());
    assert!(
        v["why"]
            .as_str()
            .unwrap_or_default()
            .contains("generation key is gone"),
        "{v}"
    );
    // The lookups fetched nothing.
    assert_eq!(origin.hits(short), 1);
}

#[tokio::test]
async fn says_why_no_route_matches_and_refuses_bad_input() {
    let origin = Origin::start().await;
    let sc = SidecacheBuilder::new(origin.url())
        .routes(ROUTES)
        .start()
        .await;

    let v = lookup(&sc, "/api/tenants/acme/apps/0", "").await;
    assert_eq!(v["verdict"], "400");
    assert!(
        v["why"]
            .as_str()
            .unwrap_or_default()
            .contains("\"id\" = \"0\""),
        "{v}"
    );

    let v = lookup(&sc, "/api/tenants/acme/app/1?x=1", "").await;
    assert_eq!(v["verdict"], "FORWARD");
    assert!(v["route"].is_null());
    assert_eq!(v["routes"][0]["route"], "app");
    assert_eq!(
        v["routes"][0]["why_not"],
        "segment 4 is \"app\", the template has \"apps\""
    );
    assert_eq!(
        v["routes"][1]["why_not"],
        "5 path segments, the template has 2"
    );
    // The embedded store has no near cache.
    let v = lookup(&sc, "/short/1", "").await;
    assert_eq!(v["near_cache"]["enabled"], false);
    assert_eq!(v["store"], "ok");

    for bad in ["", "?url=", "?url=nope", "?url=%2Fa&bad%20name=1"] {
        let resp = client::get(&sc.admin_url(&format!("/admin/lookup{bad}"))).await;
        assert_eq!(resp.status, 400, "{bad}: {}", resp.text());
    }
    assert_eq!(
        client::post(&sc.admin_url("/admin/lookup?url=%2F"), "")
            .await
            .status,
        405
    );
    assert_eq!(origin.total(), 0, "a lookup never reaches the upstream");
}

#[tokio::test]
async fn the_cli_prints_the_same_as_a_table_and_uses_the_token() {
    let origin = Origin::start().await;
    let sc = SidecacheBuilder::new(origin.url())
        .routes(ROUTES)
        .token("t0ken")
        .start()
        .await;
    let app = "/api/tenants/acme/apps/5";
    client::get(&sc.url(app)).await;

    // The admin token rules apply to /admin/lookup.
    let denied = client::get(&sc.admin_url(&format!("/admin/lookup?url={}", encode(app)))).await;
    assert_eq!(denied.status, 401);

    let run = |args: &[&str], config: &std::path::Path| {
        std::process::Command::new(binary())
            .arg("lookup")
            .arg("--config")
            .arg(config)
            .args(args)
            .env_remove("SIDECACHE_CONFIG")
            .output()
            .expect("run sidecache lookup")
    };
    let out = run(&[app, "-H", "Accept: text/html"], &sc.config_path());
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l[name.len()..].trim().to_owned())
    };
    assert_eq!(row("url").as_deref(), Some(app), "{table}");
    assert_eq!(row("route").as_deref(), Some("app"));
    assert_eq!(row("identity").as_deref(), Some("app:acme:5"));
    assert_eq!(
        row("vary.accept").as_deref(),
        Some("[\"text/html\"]"),
        "{table}"
    );
    // Accept: text/html is another variant than the one the GET filled.
    assert_eq!(row("verdict").as_deref(), Some("MISS"), "{table}");
    let out = run(&[app], &sc.config_path());
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("verdict ") && l.ends_with(" HIT")),
        "{table}"
    );

    let out = run(&[app, "--json"], &sc.config_path());
    let cli: Value = serde_json::from_slice(&out.stdout).expect("JSON with --json");
    assert_eq!(cli["verdict"], "HIT");
    assert_eq!(cli["variant"], lookup_with_token(&sc, app).await["variant"]);

    // A config with the wrong token: refused, exit 1, the reason on stderr.
    let wrong = sc.config_dir().join("../wrong.yaml");
    std::fs::write(
        &wrong,
        std::fs::read_to_string(sc.config_path())
            .expect("config")
            .replace("t0ken", "nope"),
    )
    .expect("write");
    let out = run(&[app], &wrong);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
}

async fn lookup_with_token(sc: &Sidecache, url: &str) -> Value {
    let resp = request(
        "GET",
        &sc.admin_url(&format!("/admin/lookup?url={}", encode(url))),
        &[("authorization", "Bearer t0ken")],
        "",
    )
    .await;
    assert_eq!(resp.status, 200);
    resp.json()
}

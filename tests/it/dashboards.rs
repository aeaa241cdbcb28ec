//! The operator's examples match the product: the alert rules pass
//! `promtool check rules` and their unit tests (`promtool test rules`), and
//! every metric name that the Grafana dashboard and the rules use is one
//! that `/metrics` exports after a short run that touches each feature.

use crate::support::client::{self, request};
use crate::support::redis::RedisServer;
use crate::support::{eventually, get_held, Origin, Reply, SidecacheBuilder};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn example(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(path)
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}); scripts/test installs it (Debian package prometheus)"
            )
        });
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_checks_and_unit_tests_the_alert_rules() {
    let rules = example("prometheus/alerts.yaml");
    let tests = example("prometheus/alerts_test.yaml");
    promtool(&["check", "rules", rules.to_str().expect("path")]);
    promtool(&["test", "rules", tests.to_str().expect("path")]);
    // One unit-test case per alert.
    let rules_text = std::fs::read_to_string(&rules).expect("rules");
    let tests_text = std::fs::read_to_string(&tests).expect("tests");
    for line in rules_text.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            assert!(
                tests_text.contains(&format!("alertname: {name}")),
                "alert {name} has no unit test in alerts_test.yaml"
            );
        }
    }
}

/// `sidecache_*` names in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("sidecache_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

#[tokio::test]
async fn every_metric_the_dashboard_and_rules_use_is_exported() {
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    origin.reply("/slow", Reply::ok("late").delay(Duration::from_secs(3)));
    let routes = r#"routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params:
      tenant: "[A-Za-z0-9_-]{1,64}"
      id: "[1-9][0-9]{0,17}"
    ttl: 60s
    bloom:
      scope: "{tenant}"
      source: "SELECT id::text FROM apps WHERE tenant = $1"
      capacity: 1000
      fp_rate: 0.01
"#;
    let sc = SidecacheBuilder::new(origin.url())
        .store(&format!("store:\n  redis:\n    url: \"{}\"\n", redis.url()))
        .fill("fill:\n  max_concurrency: 1\n")
        .upstream_timeout("500ms")
        .routes(routes)
        .extra(
            "invalidation:\n  redis_stream: { stream: \"inv\", group: \"g\", start: earliest }\n\
             access_log: { enabled: true }\n",
        )
        .start()
        .await;
    let app = |id: u32| sc.url(&format!("/api/tenants/acme/apps/{id}"));

    // MISS (a fill: publish, fill in flight, Bloom check), then HIT (near cache).
    assert_eq!(client::x_cache(&client::get(&app(1)).await), "MISS");
    assert_eq!(client::x_cache(&client::get(&app(1)).await), "HIT");
    // Forwarded, and an upstream timeout (504).
    assert_eq!(client::get(&sc.url("/echo/x")).await.status, 200);
    assert_eq!(client::get(&sc.url("/slow")).await.status, 504);
    // One fill permit, held: another miss is refused at once (503).
    let (gate, held) = get_held(&origin, "/api/tenants/acme/apps/2", app(2)).await;
    assert_eq!(client::get(&app(3)).await.status, 503);
    gate.release();
    held.await.expect("held request");
    // An invalidation, and a poison event on the stream.
    let inv = client::post(
        &sc.admin_url("/admin/invalidate"),
        r#"{"route":"app","params":{"tenant":"acme","id":"1"}}"#,
    )
    .await;
    assert_eq!(inv.status, 200);
    redis
        .cli(&["XADD", "inv", "*", "route", "nope", "params", "{}"])
        .expect("XADD");
    // A reload.
    sc.rewrite_config(&format!("{}\n# touched\n", sc.builder().render()));
    eventually(
        "dead letter and reload counted",
        Duration::from_secs(10),
        || async {
            let m = sc.metrics().await;
            m.contains("sidecache_dead_letters_total{source=\"stream\"} 1")
                && m.contains("sidecache_config_reloads_total{outcome=\"applied\"} 1")
        },
    )
    .await;
    let _ = request("GET", &app(1), &[], "").await;

    // Sample names (`..._bucket` of a histogram too) and family names (the
    // histogram itself), as a query or a reader may use either.
    let exported: BTreeSet<String> = sc
        .metrics()
        .await
        .lines()
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(family) => family.split(' ').next(),
            None if l.starts_with('#') || l.is_empty() => None,
            None => l.split(['{', ' ']).next(),
        })
        .map(str::to_owned)
        .collect();
    for file in ["grafana/sidecache.json", "prometheus/alerts.yaml"] {
        let used = metric_names(&std::fs::read_to_string(example(file)).expect("read example"));
        assert!(used.len() >= 8, "{file} uses only {used:?}");
        let missing: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
        assert!(
            missing.is_empty(),
            "{file} uses metrics /metrics does not export: {missing:?}\nexported: {exported:?}"
        );
    }
}

//! `sidecache check`: a valid file prints the route table and exits 0; each
//! kind of invalid file exits 2 with a message that names the YAML path.

use crate::support::sidecache::binary;
use std::process::{Command, Output};

const VALID: &str = r#"version: 1
listen: 127.0.0.1:18080
admin:
  listen: 127.0.0.1:19090
upstream:
  url: http://127.0.0.1:8000
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    methods: [GET, HEAD]
    params:
      tenant: "[A-Za-z0-9_-]{1,64}"
      id: "[1-9][0-9]{0,17}"
    vary: [Accept]
    ttl: 60s
    jitter: 15s
    grace: 45s
    stale_if_error: 2h
  - name: tenant
    path: /api/tenants/{tenant}
    params:
      tenant: "[a-z]{1,8}"
    query: [page]
    ttl: 10m
"#;

fn check(yaml: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sidecache.yaml");
    std::fs::write(&path, yaml).unwrap();
    Command::new(binary())
        .arg("check")
        .arg("--config")
        .arg(&path)
        .env_remove("SIDECACHE_CONFIG")
        .output()
        .expect("run sidecache check")
}

/// Runs `check` on an invalid file: exit 2, stderr names `yaml_path`.
fn rejects(yaml: &str, yaml_path: &str, words: &str) {
    let out = check(yaml);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "want exit 2; stderr: {stderr}");
    assert!(
        stderr.contains(yaml_path),
        "stderr should name {yaml_path:?}: {stderr}"
    );
    assert!(
        stderr.to_lowercase().contains(&words.to_lowercase()),
        "stderr should mention {words:?}: {stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing on stdout for an invalid file"
    );
}

#[test]
fn valid_file_prints_the_route_table() {
    let out = check(VALID);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "NAME",
        "METHODS",
        "PATH",
        "TTL",
        "app",
        "GET,HEAD",
        "/api/tenants/{tenant}/apps/{id}",
        "60s",
        "15s",
        "GRACE",
        "STALE_IF_ERROR",
        "KEEP",
        "45s",
        "7200s",
        "tenant",
        "600s",
        "[page]",
        "accept",
        "2 route(s)",
    ] {
        assert!(
            stdout.contains(want),
            "table should contain {want:?}:\n{stdout}"
        );
    }
}

#[test]
fn unknown_key() {
    rejects(
        &VALID.replace("    ttl: 60s\n", "    ttl: 60s\n    tll: 5s\n"),
        "routes[0]",
        "tll",
    );
}

#[test]
fn degraded_join_window_past_its_limit() {
    rejects(
        &VALID.replace(
            "    ttl: 60s\n",
            "    ttl: 60s\n    degraded_join_window: 2s\n",
        ),
        "routes[0].degraded_join_window",
        "at most 1s",
    );
}

#[test]
fn bad_duration() {
    rejects(
        &VALID.replace("jitter: 15s", "jitter: 15"),
        "routes[0].jitter",
        "",
    );
}

#[test]
fn bad_regex() {
    rejects(
        &VALID.replace("\"[a-z]{1,8}\"", "\"[a-z\""),
        "routes[1].params",
        "",
    );
}

#[test]
fn param_without_pattern() {
    rejects(
        &VALID.replace(
            "      tenant: \"[a-z]{1,8}\"\n",
            "      other: \"[a-z]{1,8}\"\n",
        ),
        "routes[1]",
        "tenant",
    );
}

#[test]
fn duplicate_route_name() {
    rejects(
        &VALID.replace("name: tenant", "name: app"),
        "routes[1].name",
        "app",
    );
}

#[test]
fn public_admin_listener_without_a_token() {
    rejects(
        &VALID.replace("listen: 127.0.0.1:19090", "listen: 0.0.0.0:19090"),
        "admin.token",
        "not a loopback address",
    );
    let opted_out = VALID.replace(
        "listen: 127.0.0.1:19090",
        "listen: 0.0.0.0:19090\n  allow_unauthenticated: true",
    );
    assert_eq!(check(&opted_out).status.code(), Some(0));
}

#[test]
fn unreadable_file_and_missing_flag() {
    let out = Command::new(binary())
        .args(["check", "--config", "/nonexistent/sidecache.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/sidecache.yaml"));

    let out = Command::new(binary())
        .arg("check")
        .env_remove("SIDECACHE_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn config_from_env_and_run_with_bad_config_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, VALID).unwrap();
    let out = Command::new(binary())
        .arg("check")
        .env("SIDECACHE_CONFIG", &path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    std::fs::write(&path, VALID.replace("ttl: 60s", "ttl: soon")).unwrap();
    let out = Command::new(binary())
        .arg("run")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("routes[0].ttl"));
    // `run` is the default subcommand.
    let out = Command::new(binary())
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `VALID` plus a prefix route with `ttl: origin` and `client_cache_control`
/// (`keys` replace its last lines, to break it).
fn with_files_route(keys: &str) -> String {
    format!(
        "{VALID}  - name: files\n    path: /static/{{path...}}\n    params:\n      path: \"[a-z0-9./-]+\"\n{keys}"
    )
}

const FILES_KEYS: &str =
    "    ttl: origin\n    max_ttl: 1h\n    default_ttl: 5m\n    client_cache_control: remaining\n";

#[test]
fn new_route_fields_in_the_table() {
    let out = check(&with_files_route(FILES_KEYS));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in ["MAX_TTL", "DEF_TTL", "CLIENT_CC"] {
        assert!(stdout.contains(want), "header {want:?}:\n{stdout}");
    }
    let files = stdout
        .lines()
        .find(|l| l.starts_with("files "))
        .unwrap_or_else(|| panic!("no files row:\n{stdout}"));
    for want in ["/static/{path...}", "origin", "3600s", "300s", "remaining"] {
        assert!(
            files.contains(want),
            "files row should show {want:?}: {files}"
        );
    }
    let app = stdout
        .lines()
        .find(|l| l.starts_with("app "))
        .expect("app row");
    assert!(
        app.ends_with(" pass"),
        "default client_cache_control: {app}"
    );
    let literal = with_files_route(&FILES_KEYS.replace("remaining", "\"private, max-age=0\""));
    let out = check(&literal);
    assert!(String::from_utf8_lossy(&out.stdout).contains("private, max-age=0"));
}

#[test]
fn new_route_field_errors() {
    let cases: &[(&str, &str, &str)] = &[
        ("    ttl: origin\n", "routes[2].max_ttl", "required"),
        (
            "    ttl: origin\n    max_ttl: 0s\n",
            "routes[2].max_ttl",
            "greater than zero",
        ),
        (
            "    ttl: origin\n    max_ttl: 1m\n    default_ttl: 2m\n",
            "routes[2].default_ttl",
            "exceeds",
        ),
        (
            "    ttl: 1m\n    max_ttl: 1h\n",
            "routes[2].max_ttl",
            "ttl: origin",
        ),
        (
            "    ttl: 1m\n    default_ttl: 1h\n",
            "routes[2].default_ttl",
            "ttl: origin",
        ),
        (
            "    ttl: origin\n    max_ttl: 1h\n    origin_cache_control: ignore\n",
            "routes[2].origin_cache_control",
            "contradicts",
        ),
        ("    ttl: orign\n", "routes[2].ttl", "origin"),
        (
            "    ttl: 1m\n    client_cache_control: \"privte\"\n",
            "routes[2].client_cache_control",
            "privte",
        ),
        (
            "    ttl: 1m\n    client_cache_control: Remaining\n",
            "routes[2].client_cache_control",
            "spelled",
        ),
        (
            "    ttl: 1m\n    client_cache_control: \"\"\n",
            "routes[2].client_cache_control",
            "empty",
        ),
    ];
    for (keys, path, words) in cases {
        rejects(&with_files_route(keys), path, words);
    }
    let template =
        |path: &str| with_files_route("    ttl: 1m\n").replace("/static/{path...}", path);
    for (path, words) in [
        ("/static/{path...}/x", "last segment"),
        ("/static/{path...}/{more...}", "two prefix params"),
        ("/static//{path...}", "normal form"),
        ("/static/../{path...}", "normal form"),
        ("/%73tatic/{path...}", "normal form"),
    ] {
        rejects(&template(path), "routes[2].path", words);
    }
}

#[test]
fn dependent_invalidation_settings_are_listed() {
    let yaml = VALID.replacen(
        "    ttl: 60s\n",
        "    ttl: 60s\n    tags_from: Surrogate-Key\n    version_from: X-Revision\n",
        1,
    );
    let out = check(&yaml);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("tags from surrogate-key; version from x-revision"),
        "{stdout}"
    );
}

/// `VALID` with `section` (a whole top-level section) before `routes:`.
fn with_section(section: &str) -> String {
    VALID.replace("routes:\n", &format!("{section}routes:\n"))
}

#[test]
fn store_tls_settings_that_could_not_connect_are_refused() {
    let certs = crate::support::certs::Certs::generate();
    let ca = certs.cert("ca");
    let store = |url: &str, tls: &str| {
        with_section(&format!(
            "store:\n  redis:\n    url: \"{url}\"\n    tls:\n{tls}"
        ))
    };
    let ok = store(
        "rediss://127.0.0.1:6380/0",
        &format!("      ca_file: \"{}\"\n", ca.display()),
    );
    assert!(
        check(&ok).status.success(),
        "{}",
        String::from_utf8_lossy(&check(&ok).stderr)
    );
    rejects(
        &store(
            "redis://127.0.0.1:6379/0",
            &format!("      ca_file: \"{}\"\n", ca.display()),
        ),
        "store.redis.tls",
        "plain text",
    );
    rejects(
        &store("rediss://h:6380/0", "      ca_file: /nonexistent/ca.pem\n"),
        "store.redis.tls.ca_file",
        "cannot read",
    );
    rejects(
        &store(
            "rediss://h:6380/0",
            &format!("      ca_file: \"{}\"\n", certs.key("ca").display()),
        ),
        "store.redis.tls.ca_file",
        "no certificate",
    );
    rejects(
        &store(
            "rediss://h:6380/0",
            &format!("      cert_file: \"{}\"\n", certs.cert("client").display()),
        ),
        "store.redis.tls.key_file",
        "needed with cert_file",
    );
    // server_name: a name or address (with the near cache, on by default);
    // not with a cluster.
    let named = "store:\n  redis:\n    url: \"rediss://10.0.0.7:6380/0\"\n    tls:\n      server_name: redis.internal\n";
    let out = check(&with_section(named));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rejects(
        &with_section(&named.replace("redis.internal", "\"not a name\"")),
        "store.redis.tls.server_name",
        "not a DNS name",
    );
    rejects(
        &with_section(&named.replace(
            "url: \"rediss://10.0.0.7:6380/0\"",
            "cluster: [\"rediss://10.0.0.7:7000\"]",
        )),
        "store.redis.tls.server_name",
        "cluster",
    );
    rejects(
        &with_section("store:\n  redis:\n    url: \"rediss://h:6380/#insecure\"\n"),
        "store.redis.url",
        "not supported",
    );
    let outbox =
        |url: &str| with_section(&format!("invalidation:\n  outbox:\n    url: \"{url}\"\n"));
    rejects(
        &outbox("postgres://h/db?sslmode=verify-all"),
        "invalidation.outbox.url",
        "sslmode",
    );
    rejects(
        &outbox("host=h sslmode=verify-full sslrootcert=/nonexistent/ca.pem"),
        "invalidation.outbox.url",
        "sslrootcert",
    );
}

#[test]
fn sentinel_settings_are_checked() {
    let sentinel = "store:\n  redis:\n    sentinel:\n      master: mymaster\n      nodes: [\"redis://127.0.0.1:26379\"]\n";
    let out = check(&with_section(sentinel));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rejects(
        &with_section(&sentinel.replace("[\"redis://127.0.0.1:26379\"]", "[]")),
        "store.redis.sentinel.nodes",
        "at least one",
    );
    rejects(
        &with_section(&format!("{sentinel}    url: redis://h:6379\n")),
        "store.redis",
        "not several",
    );
    // The near cache is opt-in with Sentinel; its limits still apply.
    let out = check(&with_section(&format!(
        "{sentinel}    near_cache: {{ enabled: true }}\n"
    )));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rejects(
        &with_section(&format!(
            "{sentinel}    near_cache: {{ enabled: true, max_age: 0s }}\n"
        )),
        "store.redis.near_cache.max_age",
        "between",
    );
    // TLS: the data nodes with `tls`, the sentinels as their URLs say.
    let accepted = |yaml: &str| {
        let out = check(&with_section(yaml));
        assert!(
            out.status.success(),
            "{yaml}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let tls_sentinels = sentinel.replace("redis://", "rediss://");
    accepted(&format!("{sentinel}    tls: {{}}\n    replicas_ack: 1\n"));
    accepted(&format!("{tls_sentinels}    tls: {{}}\n"));
    rejects(
        &with_section(&tls_sentinels),
        "store.redis.tls",
        "rediss:// sentinels",
    );
    let two = |second: &str| {
        sentinel.replace(
            "[\"redis://127.0.0.1:26379\"]",
            &format!("[\"redis://127.0.0.1:26379\", \"{second}\"]"),
        )
    };
    rejects(
        &with_section(&two("rediss://127.0.0.1:26380")),
        "store.redis.sentinel.nodes[1]",
        "same scheme",
    );
    rejects(
        &with_section(&two("redis://:secret@127.0.0.1:26380")),
        "store.redis.sentinel.nodes[1]",
        "same username and password",
    );
    rejects(
        &with_section(&two("http://127.0.0.1:26380")),
        "store.redis.sentinel.nodes[1]",
        "not a redis:// URL",
    );
}

#[test]
fn replicas_ack_is_accepted_on_every_target_with_a_sane_timeout() {
    for target in [
        "url: \"redis://h:6379\"",
        "cluster: [\"redis://h:7000\"]",
        "sentinel: { master: m, nodes: [\"redis://h:26379\"] }",
    ] {
        let redis = format!("store:\n  redis:\n    {target}\n    replicas_ack: 1\n");
        let out = check(&with_section(&redis));
        assert!(
            out.status.success(),
            "{target}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        rejects(
            &with_section(&format!("{redis}    replicas_timeout: 0s\n")),
            "store.redis.replicas_timeout",
            "between",
        );
    }
}

#[test]
fn max_body_is_bounded_by_the_entry_format() {
    let largest = check(&with_section("fill:\n  max_body: 4294967295\n"));
    assert!(
        largest.status.success(),
        "{}",
        String::from_utf8_lossy(&largest.stderr)
    );
    rejects(
        &with_section("fill:\n  max_body: 4GiB\n"),
        "fill.max_body",
        "at most 4294967295 bytes",
    );
}

//! TLS to the stores (issue 15): Redis with `--tls-port` only and Postgres
//! with `ssl=on` and `hostssl` only, certificates made by `openssl` in the
//! test. A certificate the peer cannot prove is an error naming the
//! setting, and the request path degrades; nothing falls back to plain text
//! (the servers have no plain-text listener to fall back to).

use crate::support::certs::Certs;
use crate::support::client::{self, x_cache};
use crate::support::redis::RedisServer;
use crate::support::{app_routes, eventually, Origin, Sidecache, SidecacheBuilder};
use std::time::Duration;

const P: &str = "/api/tenants/acme/apps/1";

/// `store:` on a TLS server, with `tls` (the body of `store.redis.tls`).
fn tls_store(redis: &RedisServer, tls: &str) -> String {
    format!(
        "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 500ms\n    tls:\n{tls}  breaker:\n    cooldown: 300ms\n",
        redis.url()
    )
}

fn ca(certs: &Certs, name: &str) -> String {
    format!("      ca_file: \"{}\"\n", certs.cert(name).display())
}

fn client_cert(certs: &Certs) -> String {
    format!(
        "      cert_file: \"{}\"\n      key_file: \"{}\"\n",
        certs.cert("client").display(),
        certs.key("client").display()
    )
}

async fn start(origin: &Origin, store: &str) -> Sidecache {
    SidecacheBuilder::new(origin.url())
        .routes(&app_routes(""))
        .store(store)
        .start()
        .await
}

/// Every answer comes from the origin and says the store was skipped, and
/// the log names `setting`.
async fn degrades_naming(sc: &Sidecache, origin: &Origin, setting: &str) {
    for _ in 0..3 {
        let resp = client::get(&sc.url(P)).await;
        assert_eq!(resp.status, 200);
        assert_eq!(x_cache(&resp), "DEGRADED", "no cache without a proven peer");
    }
    assert_eq!(origin.hits(P), 3);
    eventually(
        &format!("the log names {setting}"),
        Duration::from_secs(10),
        || async { sc.stderr_text().contains(setting) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_mtls_hits_misses_and_invalidates() {
    let certs = Certs::generate();
    let redis = RedisServer::start_tls(&certs, "server", true);
    let origin = Origin::start().await;
    let tls = format!("{}{}", ca(&certs, "ca"), client_cert(&certs));
    let sc = start(&origin, &tls_store(&redis, &tls)).await;

    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "MISS");
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");
    let event = r#"{"route":"app","params":{"tenant":"acme","id":"1"}}"#;
    let inv = client::post(&sc.admin_url("/admin/invalidate"), event).await;
    assert!(inv.status.is_success(), "invalidate: {}", inv.status);
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "MISS");
    assert_eq!(origin.hits(P), 2);
    // The entries really are in the TLS server.
    assert!(matches!(
        redis.cli(&["DBSIZE"]),
        Ok(redis::Value::Int(n)) if n > 0
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_with_the_wrong_ca_degrades_and_names_ca_file() {
    let certs = Certs::generate();
    let redis = RedisServer::start_tls(&certs, "server", false);
    let origin = Origin::start().await;
    let sc = start(&origin, &tls_store(&redis, &ca(&certs, "other-ca"))).await;
    degrades_naming(&sc, &origin, "store.redis.tls.ca_file").await;
    assert!(
        sc.stderr_text().contains("UnknownIssuer"),
        "{}",
        sc.stderr_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_certificate_for_another_name_is_refused() {
    let certs = Certs::generate();
    let redis = RedisServer::start_tls(&certs, "ip-only", false);
    let origin = Origin::start().await;
    // The certificate names 127.0.0.1; the URL says localhost.
    let store = tls_store(&redis, &ca(&certs, "ca")).replace("127.0.0.1", "localhost");
    let sc = start(&origin, &store).await;
    degrades_naming(&sc, &origin, "certificate's names against the URL's host").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_requiring_client_certificates_refuses_one_without() {
    let certs = Certs::generate();
    let redis = RedisServer::start_tls(&certs, "server", true);
    let origin = Origin::start().await;
    let sc = start(&origin, &tls_store(&redis, &ca(&certs, "ca"))).await;
    degrades_naming(&sc, &origin, "store.redis.tls.cert_file").await;
}

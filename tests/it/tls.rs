//! TLS to the stores (docs/configuration.md#tls): Redis with `--tls-port` only
//! and Postgres with `ssl=on` and `hostssl` only, certificates made by
//! `openssl` in the test. A certificate the peer cannot prove is an error
//! naming the setting, and the request path degrades; nothing falls back to
//! plain text (the servers have no plain-text listener to fall back to).

use crate::support::certs::{Certs, NAMED};
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

/// The near cache's tracked connection comes up over TLS and answers a
/// hit of `P` (cached already).
pub(crate) async fn near_hit_over_tls(sc: &Sidecache) {
    eventually(
        "the near cache tracks over TLS",
        Duration::from_secs(10),
        || async { sc.metric("sidecache_near_cache_tracking").await == Some(1.0) },
    )
    .await;
    let near_hits = || async {
        sc.metric_sum("sidecache_near_cache_total", &[("outcome", "hit")])
            .await
    };
    let before = near_hits().await;
    // The first read after tracking is up fills the near cache, the next
    // is answered from it.
    client::get(&sc.url(P)).await;
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");
    assert!(near_hits().await > before, "a near-cache hit");
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
    near_hit_over_tls(&sc).await;
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
    degrades_naming(&sc, &origin, "or the URL's host").await;
}

/// `store.redis.tls.server_name`: the certificate names only [`NAMED`], the
/// URL says 127.0.0.1. Verified against the URL's host it is refused;
/// against the configured name it works, also after the server restarts;
/// against another name it is refused naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_server_name_is_what_the_certificate_is_checked_against() {
    let certs = Certs::generate();
    let redis = RedisServer::start_tls(&certs, "named", false);
    let origin = Origin::start().await;
    // The near cache is on (the default): its tracked connection is
    // verified against the server name too.
    let store =
        |server_name: &str| tls_store(&redis, &format!("{}{server_name}", ca(&certs, "ca")));

    let sc = start(&origin, &store("")).await;
    degrades_naming(&sc, &origin, "store.redis.tls.server_name").await;
    assert!(
        sc.stderr_text().contains("not valid for name"),
        "{}",
        sc.stderr_text()
    );
    drop(sc);

    let named = format!("      server_name: {NAMED}\n");
    let sc = start(&origin, &store(&named)).await;
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "MISS");
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "HIT");
    near_hit_over_tls(&sc).await;
    let event = r#"{"route":"app","params":{"tenant":"acme","id":"1"}}"#;
    let inv = client::post(&sc.admin_url("/admin/invalidate"), event).await;
    assert!(inv.status.is_success(), "invalidate: {}", inv.status);
    assert_eq!(x_cache(&client::get(&sc.url(P)).await), "MISS");
    // The connection is made again after the server restarts (empty).
    redis.restart();
    eventually("HITs after a restart", Duration::from_secs(10), || async {
        client::get(&sc.url(P)).await;
        x_cache(&client::get(&sc.url(P)).await) == "HIT"
    })
    .await;
    drop(sc);

    let origin = Origin::start().await;
    let other = "      server_name: other.sidecache.test\n";
    let sc = start(&origin, &store(other)).await;
    degrades_naming(&sc, &origin, "store.redis.tls.server_name").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_requiring_client_certificates_refuses_one_without() {
    let certs = Certs::generate();
    let redis = RedisServer::start_tls(&certs, "server", true);
    let origin = Origin::start().await;
    let sc = start(&origin, &tls_store(&redis, &ca(&certs, "ca"))).await;
    degrades_naming(&sc, &origin, "store.redis.tls.cert_file").await;
}

mod postgres {
    use crate::support::certs::Certs;
    use crate::support::postgres::PostgresServer;
    use crate::support::redis::RedisServer;
    use crate::support::{eventually, library_config, Background};
    use futures_util::StreamExt;
    use sidecache::bloom::{IdSource, PgSource};
    use sidecache::invalidation::ddl::outbox_ddl;
    use sidecache::keys;
    use sidecache::{PgConnector, PgError};
    use std::time::Duration;

    fn query(certs: &Certs, mode: &str, ca: &str) -> String {
        format!("sslmode={mode}&sslrootcert={}", certs.cert(ca).display())
    }

    async fn connect(url: &str) -> Result<(), PgError> {
        let connector = PgConnector::parse(url)?;
        let (client, connection) = connector.connect().await?;
        tokio::spawn(connection);
        client
            .simple_query("SELECT 1")
            .await
            .expect("query over TLS");
        Ok(())
    }

    /// The TLS settings as config keys (`invalidation.outbox.sslmode`,
    /// `sslrootcert`) beside a URL without them; the URL form is covered
    /// by the Bloom source and the refusals below.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn outbox_worker_drains_over_verified_tls() {
        let certs = Certs::generate();
        let pg = PostgresServer::start_tls(&certs);
        pg.execute(&outbox_ddl("sidecache_outbox", Some("sidecache_outbox")).unwrap())
            .await;
        let redis = RedisServer::start();
        let url = pg.url_with("127.0.0.1", "connect_timeout=5");
        let ca = certs.cert("ca");
        let cfg = library_config(
            &redis.url(),
            &format!(
                r#"outbox: {{ url: "{url}", sslmode: verify-full, sslrootcert: "{}" }}"#,
                ca.display()
            ),
        );
        let _worker = Background::outbox(cfg).await;
        pg.execute(
            "INSERT INTO sidecache_outbox (route, params) VALUES ('app', '{\"tenant\":\"t\",\"id\":7}')",
        )
        .await;
        let gen = keys::generation_key("sc:", &keys::identity("app", &["t", "7"]));
        let pg_client = pg.client().await;
        eventually(
            "the row is applied and deleted",
            Duration::from_secs(10),
            || async {
                let applied = matches!(redis.cli(&["EXISTS", &gen]), Ok(redis::Value::Int(1)));
                let left: i64 = pg_client
                    .query_one("SELECT count(*) FROM sidecache_outbox", &[])
                    .await
                    .expect("count")
                    .get(0);
                applied && left == 0
            },
        )
        .await;
        // The worker's connection really is encrypted.
        let ssl: i64 = pg_client
            .query_one(
                "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
                 WHERE ssl AND application_name = 'sidecache-outbox'",
                &[],
            )
            .await
            .expect("pg_stat_ssl")
            .get(0);
        assert_eq!(ssl, 1);
    }

    #[tokio::test]
    async fn bloom_source_reads_over_tls() {
        let certs = Certs::generate();
        let pg = PostgresServer::start_tls(&certs);
        let source = PgSource::new(pg.url_with("127.0.0.1", &query(&certs, "verify-ca", "ca")));
        let ids: Vec<_> = source
            .ids("SELECT x::text FROM generate_series(1, 3) x", "")
            .await
            .expect("source over TLS")
            .collect()
            .await;
        let ids: Vec<String> = ids.into_iter().map(|r| r.expect("an id")).collect();
        assert_eq!(ids, ["1", "2", "3"]);
    }

    #[tokio::test]
    async fn unprovable_certificates_and_plain_text_fail_clearly() {
        let certs = Certs::generate();
        let pg = PostgresServer::start_tls(&certs);

        // The right CA and name; verify-ca ignores the name, verify-full not.
        connect(&pg.url_with("127.0.0.1", &query(&certs, "verify-full", "ca")))
            .await
            .expect("verify-full to the certificate's address");
        connect(&pg.url_with("localhost", &query(&certs, "verify-ca", "ca")))
            .await
            .expect("verify-ca to another name");

        let refused = |url: String, why: &'static str, words: [&'static str; 2]| async move {
            let e = connect(&url).await.expect_err(why);
            let text = e.to_string();
            assert!(words.iter().all(|w| text.contains(w)), "{why}: {text}");
            e
        };
        let wrong_name = refused(
            pg.url_with("localhost", &query(&certs, "verify-full", "ca")),
            "verify-full to a name the certificate lacks",
            ["sslmode=verify-full", "not valid for name"],
        )
        .await;
        assert!(matches!(wrong_name, PgError::Certificate { .. }));
        let wrong_ca = refused(
            pg.url_with("127.0.0.1", &query(&certs, "require", "other-ca")),
            "a root file makes require check the chain",
            ["sslrootcert=", "UnknownIssuer"],
        )
        .await;
        assert!(matches!(wrong_ca, PgError::Certificate { .. }));
        let plain = refused(
            pg.url_with("127.0.0.1", "sslmode=disable"),
            "hostssl only: plain text is refused",
            ["sslmode=disable", "no encryption"],
        )
        .await;
        assert!(matches!(plain, PgError::Postgres { .. }));

        // The config keys are applied, not just accepted: a wrong root
        // given as `sslrootcert` refuses what the bare URL would accept.
        let redis_url = "redis://127.0.0.1:1/0";
        let bare = pg.url_with("127.0.0.1", "connect_timeout=5");
        let cfg = library_config(
            redis_url,
            &format!(
                r#"outbox: {{ url: "{bare}", sslmode: verify-full, sslrootcert: "{}" }}"#,
                certs.cert("other-ca").display()
            ),
        );
        let url = cfg.invalidation.outbox.expect("outbox").url;
        let keyed = refused(
            url,
            "sslrootcert from the config",
            ["sslrootcert=", "UnknownIssuer"],
        )
        .await;
        assert!(matches!(keyed, PgError::Certificate { .. }));
    }
}

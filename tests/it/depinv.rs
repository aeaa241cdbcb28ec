//! Dependent invalidation (docs/invalidation.md#dependent-invalidation) through
//! the real binary, a private redis-server (and Postgres for the outbox) and
//! the held-response origin: route relations (`also_invalidates`), cache tags
//! (`tags_from`, tag events) and version floors (`version_from`).

use crate::support::postgres::PostgresServer;
use crate::support::redis::RedisServer;
use crate::support::{client, eventually, get_held, Origin, Reply, Sidecache, SidecacheBuilder};
use std::time::{Duration, Instant};

const APP: &str = "/api/tenants/acme/apps/1";
const LIST: &str = "/api/tenants/acme/apps";

/// `app` relates to `app_list` of its tenant; `tagged` takes tags from
/// `Surrogate-Key`; `app` takes versions from `X-Revision`.
const ROUTES: &str = r#"routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params: { tenant: "[a-z]+", id: "[1-9][0-9]*" }
    ttl: 60s
    version_from: X-Revision
    also_invalidates:
      - { route: app_list, params: { tenant: "{tenant}" } }
  - name: app_list
    path: /api/tenants/{tenant}/apps
    params: { tenant: "[a-z]+" }
    ttl: 60s
  - name: tagged
    path: /api/tagged/{id}
    params: { id: "[1-9][0-9]*" }
    ttl: 60s
    tags_from: Surrogate-Key
"#;

fn builder(origin: &Origin, redis: &RedisServer, extra: &str) -> SidecacheBuilder {
    SidecacheBuilder::new(origin.url())
        .routes(ROUTES)
        .store(&format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n",
            redis.url()
        ))
        .extra(extra)
}

async fn read(sc: &Sidecache, path: &str) -> (String, String) {
    let r = client::get(&sc.url(path)).await;
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    (r.header("x-cache").unwrap_or_default(), r.text())
}

async fn admin(sc: &Sidecache, body: &str) -> u16 {
    client::post(&sc.admin_url("/admin/invalidate"), body.to_owned())
        .await
        .status
        .as_u16()
}

/// Caches the list, changes it at the origin, and returns once the list
/// is a HIT with the old data.
async fn cache_list(sc: &Sidecache, origin: &Origin) {
    read(sc, LIST).await;
    assert_eq!(read(sc, LIST).await.0, "HIT");
    origin.bump(LIST);
}

async fn assert_list_fresh(sc: &Sidecache, origin: &Origin, what: &str) {
    let want = origin.default_body(LIST);
    eventually(what, Duration::from_secs(5), || async {
        client::get(&sc.url(LIST)).await.text() == want
    })
    .await;
}

/// The list route story: a write to one app (through the proxy, the
/// outbox, the stream) makes the next list read a MISS with the new data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_to_one_object_invalidates_its_list_from_every_source() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    pg.execute(&crate::invalidation_binary::ddl()).await;
    let sc = builder(
        &origin,
        &redis,
        &format!(
            "invalidation:\n  outbox:\n    url: \"{}\"\n    poll_interval: 200ms\n  redis_stream:\n    stream: inv\n    group: sc\n",
            pg.url()
        ),
    )
    .start()
    .await;

    // Write-through: PUT one app through the proxy.
    cache_list(&sc, &origin).await;
    assert_eq!(client::put(&sc.url(APP), "x").await.status, 200);
    let (status, body) = read(&sc, LIST).await;
    assert_eq!((status.as_str(), body), ("MISS", origin.default_body(LIST)));

    // An outbox row for the app.
    cache_list(&sc, &origin).await;
    pg.execute("INSERT INTO sidecache_outbox (route, params) VALUES ('app', '{\"tenant\": \"acme\", \"id\": 1}')")
        .await;
    assert_list_fresh(&sc, &origin, "list fresh after an outbox row").await;

    // A stream entry for the app.
    cache_list(&sc, &origin).await;
    redis
        .cli(&[
            "XADD",
            "inv",
            "*",
            "route",
            "app",
            "params",
            r#"{"tenant":"acme","id":1}"#,
        ])
        .expect("XADD");
    assert_list_fresh(&sc, &origin, "list fresh after a stream entry").await;
    assert!(
        sc.metric_sum(
            "sidecache_invalidations_total",
            &[("kind", "related"), ("outcome", "applied")]
        )
        .await
            >= 3.0
    );
}

/// Tag race: a fill of a tagged object is held; its tag is invalidated;
/// on release the entry is not published and the next read is a MISS.
/// Again with the tag's generation key deleted instead of invalidated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_racing_a_tag_invalidation_is_never_served() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let sc = builder(&origin, &redis, "").start().await;
    let path = "/api/tagged/1";
    origin.reply(path, Reply::ok("v1").header("surrogate-key", "t:1 shared"));
    // The first fill publishes (its tags were not invalidated during it)
    // and remembers them, so later fills take their tickets up front.
    assert_eq!(read(&sc, path).await.0, "MISS");
    assert_eq!(read(&sc, path).await.0, "HIT");
    // Explained (`/admin/lookup`) as never served once its tag moved.
    assert_eq!(admin(&sc, r#"{"tags": ["t:1"]}"#).await, 200);
    let url: String = sc
        .url(path)
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let explained = client::get(&sc.admin_url(&format!("/admin/lookup?url={url}")))
        .await
        .json();
    assert_eq!(explained["verdict"], "MISS", "{explained}");
    assert_eq!(explained["entry"]["tags_current"], false, "{explained}");

    for lose_tag in [false, true] {
        // The entry dies with its tag; the next fill is held at the origin
        // after taking its tag tickets.
        assert_eq!(admin(&sc, r#"{"tags": ["shared"]}"#).await, 200);
        origin.reply(path, Reply::ok("old").header("surrogate-key", "t:1 shared"));
        let (gate, held) = get_held(&origin, path, sc.url(path)).await;
        if lose_tag {
            redis.cli(&["DEL", "sc:t:{shared}:g"]).expect("DEL");
        } else {
            assert_eq!(admin(&sc, r#"{"tags": ["shared"]}"#).await, 200);
        }
        origin.reply(path, Reply::ok("new").header("surrogate-key", "t:1 shared"));
        // A request after the invalidation joins the held fill in this
        // instance (flights are per object generation, which a tag leaves
        // alone): it must not be handed the fill's pre-invalidation answer.
        let coalesced = || sc.metric_sum("sidecache_coalesced_total", &[("route", "tagged")]);
        let coalesced_before = coalesced().await;
        let joiner_url = sc.url(path);
        let joiner = tokio::spawn(async move { client::get(&joiner_url).await });
        eventually(
            "the second read joins the held fill",
            Duration::from_secs(10),
            || async { coalesced().await > coalesced_before },
        )
        .await;
        let rejected = || {
            sc.metric_sum(
                "sidecache_publish_total",
                &[("route", "tagged"), ("outcome", "publish_rejected")],
            )
        };
        let rejected_before = rejected().await;
        gate.release();
        assert_eq!(held.await.expect("held read").text(), "old");
        let joined = joiner.await.expect("joiner");
        assert_eq!(
            joined.text(),
            "new",
            "lose_tag={lose_tag}: the joiner got the old fill's answer"
        );
        // Refused by the publish script itself (single node), not only
        // dead at the next hit check.
        assert_eq!(rejected().await, rejected_before + 1.0);
        let (status, body) = read(&sc, path).await;
        assert_eq!(
            (status.as_str(), body.as_str()),
            ("MISS", "new"),
            "lose_tag={lose_tag}"
        );
        assert_eq!(read(&sc, path).await, ("HIT".into(), "new".into()));
    }
}

/// The first fill of an object whose tags no fill has seen yet is stored:
/// 100 cold objects, each with a tag of its own and one they share, cost
/// 100 origin calls, and each is a HIT on its next read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_fills_of_tagged_objects_are_stored() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let sc = builder(&origin, &redis, "").start().await;
    for id in 1..=100 {
        let path = format!("/api/tagged/{id}");
        let tags = format!("item:{id} catalogue");
        origin.reply(
            &path,
            Reply::ok(format!("v{id}")).header("surrogate-key", &tags),
        );
        assert_eq!(read(&sc, &path).await, ("MISS".into(), format!("v{id}")));
    }
    assert_eq!(origin.total(), 100);
    for id in 1..=100 {
        let path = format!("/api/tagged/{id}");
        assert_eq!(read(&sc, &path).await, ("HIT".into(), format!("v{id}")));
    }
    assert_eq!(origin.total(), 100, "one origin call per object");
    let published = sc
        .metric_sum(
            "sidecache_publish_total",
            &[("route", "tagged"), ("outcome", "published")],
        )
        .await;
    assert_eq!(published, 100.0);
    // The tags they were stamped with still work: one tag event kills all.
    assert_eq!(admin(&sc, r#"{"tags": ["catalogue"]}"#).await, 200);
    assert_eq!(read(&sc, "/api/tagged/7").await.0, "MISS");
    assert_eq!(read(&sc, "/api/tagged/8").await.0, "MISS");
}

/// The first fill of a tagged object (no ticket for its tags before the
/// upstream call) whose tag is invalidated while the fill waits for the
/// origin is not published, and a request that joined it after the
/// invalidation fetches its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_fill_racing_its_tags_invalidation_is_never_served() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let sc = builder(&origin, &redis, "").start().await;
    let path = "/api/tagged/5";
    // The tag exists already (another object's fill created it), so only
    // the invalidation during the fill can make it newer than the fill.
    origin.reply(
        "/api/tagged/6",
        Reply::ok("six").header("surrogate-key", "shared"),
    );
    assert_eq!(read(&sc, "/api/tagged/6").await.0, "MISS");
    origin.reply(path, Reply::ok("old").header("surrogate-key", "t:5 shared"));
    let (gate, held) = get_held(&origin, path, sc.url(path)).await;
    assert_eq!(admin(&sc, r#"{"tags": ["shared"]}"#).await, 200);
    origin.reply(path, Reply::ok("new").header("surrogate-key", "t:5 shared"));
    let coalesced = || sc.metric_sum("sidecache_coalesced_total", &[("route", "tagged")]);
    let joiner_url = sc.url(path);
    let joiner = tokio::spawn(async move { client::get(&joiner_url).await });
    eventually(
        "the second read joins the held fill",
        Duration::from_secs(10),
        || async { coalesced().await >= 1.0 },
    )
    .await;
    gate.release();
    assert_eq!(held.await.expect("held read").text(), "old");
    assert_eq!(joiner.await.expect("joiner").text(), "new");
    let rejected = sc
        .metric_sum(
            "sidecache_publish_total",
            &[("route", "tagged"), ("outcome", "publish_rejected")],
        )
        .await;
    assert_eq!(rejected, 1.0, "refused at publish");
    // Nothing old was stored: the next reads see the new answer.
    assert_eq!(read(&sc, path).await.1, "new");
    assert_eq!(read(&sc, path).await, ("HIT".into(), "new".into()));
}

/// Version floor: invalidate with revision 7; a fill answering version 6
/// is served but not published (counted), the next read goes upstream
/// again; version 7 is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_below_the_floor_are_not_published() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let sc = builder(&origin, &redis, "").start().await;
    origin.reply(APP, Reply::ok("v6").header("x-revision", "6"));
    read(&sc, APP).await;
    assert_eq!(read(&sc, APP).await.0, "HIT");
    let event = r#"{"route":"app","params":{"tenant":"acme","id":1},"revision":7}"#;
    assert_eq!(admin(&sc, event).await, 200);
    let before = origin.hits(APP);
    assert_eq!(read(&sc, APP).await, ("MISS".into(), "v6".into()));
    assert_eq!(read(&sc, APP).await, ("MISS".into(), "v6".into()));
    assert_eq!(
        origin.hits(APP),
        before + 2,
        "below the floor: never cached"
    );
    let below = sc
        .metric_sum("sidecache_publish_total", &[("outcome", "below_floor")])
        .await;
    assert_eq!(below, 2.0);
    origin.reply(APP, Reply::ok("v7").header("x-revision", "7"));
    assert_eq!(read(&sc, APP).await, ("MISS".into(), "v7".into()));
    assert_eq!(read(&sc, APP).await, ("HIT".into(), "v7".into()));
}

/// Two instances with near caches: a tag invalidation applied by A stops
/// B serving the tagged entry from its near cache within the push latency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_invalidation_reaches_the_other_instances_near_cache() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let near = format!(
        "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n    near_cache: {{ max_age: 60s }}\n",
        redis.url()
    );
    let a = builder(&origin, &redis, "").store(&near).start().await;
    let b = builder(&origin, &redis, "").store(&near).start().await;
    let path = "/api/tagged/2";
    origin.reply(path, Reply::ok("v1").header("surrogate-key", "t:2"));
    read(&a, path).await;
    read(&a, path).await;
    // B holds the entry and the tag generation in its near cache.
    assert_eq!(read(&b, path).await.0, "HIT");
    assert_eq!(read(&b, path).await.0, "HIT");
    let near_hits = b
        .metric_sum("sidecache_near_cache_total", &[("outcome", "hit")])
        .await;
    assert!(near_hits >= 1.0, "B serves from its near cache");
    origin.reply(path, Reply::ok("v2").header("surrogate-key", "t:2"));
    let sent = Instant::now();
    assert_eq!(admin(&a, r#"{"tags": ["t:2"]}"#).await, 200);
    let applied = sent.elapsed();
    let mut seen = None;
    while sent.elapsed() < Duration::from_secs(2) {
        if client::get(&b.url(path)).await.text() == "v2" {
            seen = Some(sent.elapsed());
            break;
        }
    }
    let seen = seen.expect("B stopped serving the tagged entry within 2 s");
    eprintln!("tag invalidation: applied by A in {applied:?}, B answered new data after {seen:?}");
}

/// Bad tag events are dead-lettered with a reason and the stream keeps
/// moving: tags and a route together, more tags than the bound, a tag
/// with a control character.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tag_events_are_dead_lettered_and_the_queue_moves_on() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let sc = builder(
        &origin,
        &redis,
        "invalidation:\n  redis_stream:\n    stream: inv\n    group: sc\n",
    )
    .start()
    .await;
    let path = "/api/tagged/3";
    origin.reply(path, Reply::ok("v1").header("surrogate-key", "good"));
    read(&sc, path).await;
    read(&sc, path).await;
    assert_eq!(read(&sc, path).await.0, "HIT");
    let many = (0..40)
        .map(|i| format!("t{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    for fields in [
        vec!["route", "app", "tags", "good"],
        vec!["tags", many.as_str()],
        vec!["tags", "[\"bad\\u0007tag\"]"],
        vec!["tags", "good"],
    ] {
        let mut args = vec!["XADD", "inv", "*"];
        args.extend(fields);
        redis.cli(&args).expect("XADD");
    }
    origin.reply(path, Reply::ok("v2").header("surrogate-key", "good"));
    eventually(
        "the good tag event behind the bad ones",
        Duration::from_secs(5),
        || async { client::get(&sc.url(path)).await.text() == "v2" },
    )
    .await;
    fn texts(v: &redis::Value, out: &mut String) {
        match v {
            redis::Value::BulkString(b) => out.push_str(&String::from_utf8_lossy(b)),
            redis::Value::Array(items) => items.iter().for_each(|i| texts(i, out)),
            _ => {}
        }
        out.push('\n');
    }
    let mut dead = String::new();
    texts(
        &redis
            .cli(&["XRANGE", "inv:dead", "-", "+"])
            .expect("XRANGE"),
        &mut dead,
    );
    for reason in ["not both", "more than 32 tags", "control characters"] {
        assert!(
            dead.contains(reason),
            "no dead letter saying {reason:?}: {dead}"
        );
    }
}

/// The outbox before and after `outbox-ddl`'s migration: a table created
/// without the `tags` column keeps working, and after the migration a row
/// naming tags (and no route) invalidates them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_tag_rows_after_the_migration_and_old_tables_keep_working() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    // The table as `outbox-ddl` created it before tags: today's, without
    // the column and with `route` required.
    pg.execute(&crate::invalidation_binary::ddl()).await;
    pg.execute(
        "ALTER TABLE sidecache_outbox DROP COLUMN tags; \
         ALTER TABLE sidecache_outbox ALTER COLUMN route SET NOT NULL",
    )
    .await;
    let sc = builder(
        &origin,
        &redis,
        &format!(
            "invalidation:\n  outbox:\n    url: \"{}\"\n    poll_interval: 100ms\n",
            pg.url()
        ),
    )
    .start()
    .await;
    cache_list(&sc, &origin).await;
    pg.execute("INSERT INTO sidecache_outbox (route, params) VALUES ('app_list', '{\"tenant\": \"acme\"}')")
        .await;
    assert_list_fresh(&sc, &origin, "old table: row applied").await;

    pg.execute(&crate::invalidation_binary::ddl()).await;
    let path = "/api/tagged/4";
    origin.reply(path, Reply::ok("v1").header("surrogate-key", "row-tag"));
    read(&sc, path).await;
    read(&sc, path).await;
    assert_eq!(read(&sc, path).await.0, "HIT");
    origin.reply(path, Reply::ok("v2").header("surrogate-key", "row-tag"));
    pg.execute("INSERT INTO sidecache_outbox (tags) VALUES (ARRAY['row-tag'])")
        .await;
    eventually("tag row applied", Duration::from_secs(5), || async {
        client::get(&sc.url(path)).await.text() == "v2"
    })
    .await;
}

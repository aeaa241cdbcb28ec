//! The Redis Stream consumer against real redis-servers from the harness,
//! running in-process over a `RedisStore`
//! (docs/invalidation.md#what-the-consumer-does: each entry applied once by one
//! consumer of a group, entries of a dead consumer claimed after `claim_idle`,
//! poison entries dead-lettered and acked, store failures leave entries pending
//! until they apply).

use crate::support::redis::RedisServer;
use crate::support::{eventually, Background};
use sidecache::config::Config;
use sidecache::invalidation::Source;
use sidecache::invalidation::StreamConsumer;
use sidecache::invalidation::StreamTarget;
use sidecache::keys;
use std::time::Duration;
use tokio::time::Instant;

const STREAM: &str = "sc:inv";
const GROUP: &str = "sidecache";

/// The store in `store_redis`, the stream in the consumer's `stream_redis`.
fn config(store_redis: &RedisServer, claim_idle: &str) -> Config {
    crate::support::library_config(
        &store_redis.url(),
        &format!(
            r#"redis_stream: {{ stream: "{STREAM}", group: {GROUP}, start: earliest, claim_idle: {claim_idle} }}"#
        ),
    )
}

/// Starts a stream consumer for `cfg` reading from `stream_redis`.
async fn start_consumer(cfg: Config, stream_redis: &RedisServer) -> Background {
    let url = stream_redis.url();
    Background::start(cfg, Source::Stream, move |cfg, invalidator, stopped| {
        let stream = cfg.invalidation.stream.clone().expect("stream configured");
        let target = StreamTarget::Single(url);
        tokio::spawn(StreamConsumer::new(stream, target, None, invalidator).run(stopped))
    })
    .await
}

fn gen_key(tenant: &str, id: u64) -> String {
    let id = id.to_string();
    keys::generation_key("sc:", &keys::identity("app", &[tenant, id.as_str()]))
}

fn has_generation(redis: &RedisServer, tenant: &str, id: u64) -> bool {
    matches!(
        redis.cli(&["GET", &gen_key(tenant, id)]),
        Ok(redis::Value::BulkString(_))
    )
}

fn xadd(redis: &RedisServer, fields: &[(&str, &str)]) {
    let mut args = vec!["XADD", STREAM, "*"];
    for (k, v) in fields {
        args.push(k);
        args.push(v);
    }
    redis.cli(&args).expect("XADD");
}

fn add_event(redis: &RedisServer, tenant: &str, id: u64) {
    let params = format!(r#"{{"tenant":"{tenant}","id":{id}}}"#);
    xadd(redis, &[("route", "app"), ("params", &params)]);
}

fn int(v: redis::RedisResult<redis::Value>) -> i64 {
    match v {
        Ok(redis::Value::Int(n)) => n,
        other => panic!("expected an integer, got {other:?}"),
    }
}

/// `XPENDING` summary count for the group.
fn pending(redis: &RedisServer) -> i64 {
    match redis.cli(&["XPENDING", STREAM, GROUP]) {
        Ok(redis::Value::Array(items)) => match items.first() {
            Some(redis::Value::Int(n)) => *n,
            other => panic!("XPENDING: {other:?}"),
        },
        other => panic!("XPENDING: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_entry_applied_once_by_one_of_several_consumers() {
    let redis = RedisServer::start();
    let mut consumers = Vec::new();
    for _ in 0..3 {
        consumers.push(start_consumer(config(&redis, "30s"), &redis).await);
    }
    const N: u64 = 300;
    for id in 1..=N {
        add_event(&redis, "grp", id);
    }
    eventually(
        "every entry applied and acked",
        Duration::from_secs(15),
        || async { (1..=N).all(|id| has_generation(&redis, "grp", id)) && pending(&redis) == 0 },
    )
    .await;
    let counts: Vec<u64> = consumers.iter().map(Background::applied).collect();
    println!("applied per consumer: {counts:?}");
    assert_eq!(
        counts.iter().sum::<u64>(),
        N,
        "{counts:?}: each entry applied once"
    );
    for c in consumers {
        c.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_left_pending_by_a_dead_consumer_are_claimed_after_claim_idle() {
    let redis = RedisServer::start();
    redis
        .cli(&["XGROUP", "CREATE", STREAM, GROUP, "0", "MKSTREAM"])
        .expect("group");
    for id in 1..=5 {
        add_event(&redis, "claim", id);
    }
    // A consumer takes the entries and dies without acking them.
    redis
        .cli(&[
            "XREADGROUP",
            "GROUP",
            GROUP,
            "dead-one",
            "COUNT",
            "10",
            "STREAMS",
            STREAM,
            ">",
        ])
        .expect("read as the dead consumer");
    let delivered = Instant::now();
    assert_eq!(pending(&redis), 5);

    let survivor = start_consumer(config(&redis, "1s"), &redis).await;
    eventually("claimed and applied", Duration::from_secs(10), || async {
        (1..=5).all(|id| has_generation(&redis, "claim", id)) && pending(&redis) == 0
    })
    .await;
    assert!(
        delivered.elapsed() >= Duration::from_millis(900),
        "claimed before claim_idle: {:?}",
        delivered.elapsed()
    );
    assert_eq!(survivor.applied(), 5);
    survivor.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_entries_are_copied_to_the_dead_stream_and_acked() {
    let redis = RedisServer::start();
    let consumer = start_consumer(config(&redis, "30s"), &redis).await;
    // The group is created by the consumer (earliest): entries added before
    // it is ready are still read.
    add_event(&redis, "poison", 1);
    xadd(
        &redis,
        &[("route", "nope"), ("params", r#"{"tenant":"a","id":"2"}"#)],
    );
    xadd(
        &redis,
        &[("route", "app"), ("params", r#"{"tenant":"a","id":"0x3"}"#)],
    );
    xadd(&redis, &[("route", "app"), ("params", "not json")]);
    xadd(
        &redis,
        &[
            ("route", "app"),
            ("params", r#"{"tenant":"a","id":"5"}"#),
            ("colour", "red"),
        ],
    );
    add_event(&redis, "poison", 6);
    eventually(
        "good entries applied, all acked",
        Duration::from_secs(10),
        || async {
            has_generation(&redis, "poison", 1) && has_generation(&redis, "poison", 6) && {
                let exists = int(redis.cli(&["EXISTS", STREAM]));
                exists == 1
                    && pending(&redis) == 0
                    && int(redis.cli(&["XLEN", &format!("{STREAM}:dead")])) == 4
            }
        },
    )
    .await;
    let dead = redis
        .cli(&["XRANGE", &format!("{STREAM}:dead"), "-", "+"])
        .expect("XRANGE dead");
    let text = format!("{dead:?}");
    for needle in [
        "reason",
        "source_id",
        "unknown route",
        "nope",
        "not json",
        "colour",
    ] {
        assert!(text.contains(needle), "{needle} missing from {text}");
    }
    assert_eq!(
        consumer
            .metrics
            .dead_letters
            .with_label_values(&["stream"])
            .get(),
        4
    );
    consumer.stop().await;
}

/// The store (one Redis) fails while the stream (another Redis) works: the
/// entries stay pending, then apply and are acked once the store is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_failure_leaves_entries_pending_until_they_apply() {
    let store_redis = RedisServer::start();
    let stream_redis = RedisServer::start();
    let consumer = start_consumer(config(&store_redis, "30s"), &stream_redis).await;
    add_event(&stream_redis, "warm", 1);
    eventually("consumer running", Duration::from_secs(10), || async {
        has_generation(&store_redis, "warm", 1)
    })
    .await;

    store_redis.kill();
    for id in 1..=3 {
        add_event(&stream_redis, "later", id);
    }
    eventually(
        "entries delivered but not acked",
        Duration::from_secs(10),
        || async { pending(&stream_redis) == 3 && consumer.count("failed") >= 3 },
    )
    .await;
    eventually("pending gauge", Duration::from_secs(15), || async {
        consumer.metrics.stream_pending.get() == 3
    })
    .await;

    store_redis.restart();
    eventually(
        "retried, applied and acked",
        Duration::from_secs(15),
        || async {
            (1..=3).all(|id| has_generation(&store_redis, "later", id))
                && pending(&stream_redis) == 0
        },
    )
    .await;
    consumer.stop().await;
}

/// A consumer (`start: latest`) running on both paths: an entry applied by
/// each (the fan-out sees only entries appended after it connected, so add
/// until it has one).
async fn running_consumer(redis: &RedisServer) -> Background {
    let cfg = crate::support::library_config(
        &redis.url(),
        &format!(
            r#"redis_stream: {{ stream: "{STREAM}", group: {GROUP}, start: latest, claim_idle: 30s }}"#
        ),
    );
    let consumer = start_consumer(cfg, redis).await;
    eventually("consumer running", Duration::from_secs(10), || async {
        add_event(redis, "warm", 1);
        applied(&consumer, "stream") >= 1 && applied(&consumer, "stream_fanout") >= 1
    })
    .await;
    consumer
}

/// Events `consumer` applied on the path `source`.
fn applied(consumer: &Background, source: &str) -> u64 {
    consumer
        .metrics
        .invalidations
        .with_label_values(&[source, "applied", "object"])
        .get()
}

/// Redis loses its data (a restart without persistence) while
/// consumers run, and entries are appended before any consumer could
/// re-create the group. `FLUSHALL` and the appends run in one `MULTI`, so
/// no consumer gets in between. The group is re-created at `0`, not at `$`
/// (which would skip them all): the group path applies and acks every
/// entry, and the fan-out, whose cursor survives, applies them too
/// (docs/invalidation.md#what-the-consumer-does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_appended_after_redis_lost_its_data_are_all_applied() {
    let redis = RedisServer::start();
    let consumer = running_consumer(&redis).await;
    let applied = |source: &str| applied(&consumer, source);
    let (group_before, fanout_before) = (applied("stream"), applied("stream_fanout"));

    let mut conn = ::redis::Client::open(redis.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let mut lost = ::redis::pipe();
    lost.atomic().cmd("FLUSHALL").ignore();
    for id in 1..=5 {
        let params = format!(r#"{{"tenant":"lost","id":{id}}}"#);
        lost.cmd("XADD")
            .arg(STREAM)
            .arg("*")
            .arg("route")
            .arg("app")
            .arg("params")
            .arg(params)
            .ignore();
    }
    lost.query_async::<()>(&mut conn).await.expect("MULTI");

    eventually(
        "every entry applied by both paths and acked",
        Duration::from_secs(15),
        || async {
            (1..=5).all(|id| has_generation(&redis, "lost", id))
                && applied("stream") >= group_before + 5
                && applied("stream_fanout") >= fanout_before + 5
                && pending(&redis) == 0
        },
    )
    .await;
    consumer.stop().await;
}

/// Redis killed and restarted empty (no persistence),
/// entries appended at once, before the consumers could reconnect and
/// re-create their group. Every entry is applied within the reconnect cap
/// (1 s, jittered) plus a round trip, by both paths, and acked
/// (docs/invalidation.md#what-the-consumer-does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_appended_right_after_a_redis_restart_are_applied_within_a_bound() {
    const BOUND: Duration = Duration::from_millis(2500);
    let redis = RedisServer::start();
    let consumer = running_consumer(&redis).await;
    let applied = |source: &str| applied(&consumer, source);
    let (group_before, fanout_before) = (applied("stream"), applied("stream_fanout"));

    redis.restart();
    for id in 1..=5 {
        add_event(&redis, "restart", id);
    }
    let appended = Instant::now();
    loop {
        if (1..=5).all(|id| has_generation(&redis, "restart", id)) {
            break;
        }
        assert!(
            appended.elapsed() < BOUND,
            "entries appended after the restart not applied within {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    println!(
        "redis restart: append -> all 5 applied {:.1} ms",
        appended.elapsed().as_secs_f64() * 1e3
    );
    eventually(
        "both paths applied every entry; all acked",
        Duration::from_secs(10),
        || async {
            applied("stream") >= group_before + 5
                && applied("stream_fanout") >= fanout_before + 5
                && pending(&redis) == 0
        },
    )
    .await;
    consumer.stop().await;
}

//! Witnesses
//! (docs/invalidation.md#witnesses-k-instances-fan-out-not-all-of-them): only
//! `invalidation.witnesses` instances (default 2) run a feed's fan-out, so one
//! event costs its consumer's application plus k covered checks whatever the
//! number of instances, and the other instances do nothing per event. With one
//! witness stopped, the other applies every event within the bound of
//! docs/invalidation.md#no-feed-waits-for-one-instance, and an instance that
//! was not a witness takes the stopped one's slot when it expires. On the
//! real binary, with real Redis and Postgres.

use crate::paused_instance::{
    applied_within, conn, consumer_of, consumers, instance, just_blocked, report, xadd, GROUP,
    STREAM,
};
use crate::support::postgres::PostgresServer;
use crate::support::redis::RedisServer;
use crate::support::{eventually, Origin, Sidecache};
use std::time::{Duration, Instant};

/// A slot outlives its stopped holder by its TTL (3 s), then the next beat
/// (every 1 s) takes it; the rest is a loaded machine's margin.
const HANDOVER: Duration = Duration::from_secs(8);

fn stream_feed() -> String {
    format!(
        "invalidation:\n  redis_stream:\n    stream: \"{STREAM}\"\n    group: {GROUP}\n    claim_idle: 30s\n"
    )
}

fn outbox_feed(pg: &PostgresServer) -> String {
    format!(
        "invalidation:\n  outbox:\n    url: \"{}\"\n    poll_interval: 1s\n",
        pg.url()
    )
}

async fn is_witness(sc: &Sidecache, feed: &str) -> bool {
    sc.metric_sum("sidecache_feed_witness", &[("feed", feed)])
        .await
        >= 1.0
}

/// Waits until exactly two of `fleet` are witnesses of `feed`; their
/// indexes.
async fn two_witnesses(fleet: &[Sidecache], feed: &str) -> Vec<usize> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut found = Vec::new();
        for (i, sc) in fleet.iter().enumerate() {
            if is_witness(sc, feed).await {
                found.push(i);
            }
        }
        if found.len() == 2 {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "not two witnesses of {feed} within 15 s: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every invalidation this instance counted, any source.
async fn all(sc: &Sidecache) -> f64 {
    sc.metric_sum("sidecache_invalidations_total", &[]).await
}

/// The witnesses of `feed` with the holder of slot 0 (the key's value is
/// the holder's `host-pid-random`) first: the gauge leader, and a witness
/// a sabotage can single out.
fn slot0_first(
    redis: &RedisServer,
    fleet: &[Sidecache],
    feed: &str,
    mut witnesses: Vec<usize>,
) -> Vec<usize> {
    let key = format!("sc:w:{{{feed}}}:0");
    let owner = match redis.cli(&["GET", &key]) {
        Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
        other => panic!("{key}: {other:?}"),
    };
    witnesses.sort_by_key(|&i| !owner.contains(&format!("-{}-", fleet[i].pid())));
    assert!(
        owner.contains(&format!("-{}-", fleet[witnesses[0]].pid())),
        "slot 0 ({owner}) is held by a witness"
    );
    witnesses
}

async fn applied(sc: &Sidecache, source: &str) -> f64 {
    sc.metric_sum(
        "sidecache_invalidations_total",
        &[("source", source), ("outcome", "applied")],
    )
    .await
}

/// Stream: W, the witness holding slot 0, is stopped right after it blocked in
/// `XREADGROUP`, so the group hands it the next entry and W holds it. The
/// other witness applies that entry and the nine after it within `BOUND`
/// (with `witnesses: 1` the held entry waits for W: checked by hand). The
/// instance that was not a witness takes W's slot; W, resumed, finds every
/// slot held and stops fanning out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_a_stopped_witness_is_covered_and_its_slot_taken_over() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let feed = stream_feed();
    let fleet = vec![
        instance(&origin, &redis, "300ms", &feed).start().await,
        instance(&origin, &redis, "300ms", &feed).start().await,
        instance(&origin, &redis, "300ms", &feed).start().await,
    ];
    eventually(
        "three consumers in the group",
        Duration::from_secs(10),
        || async { consumers(&redis).len() == 3 },
    )
    .await;
    let witnesses = two_witnesses(&fleet, "stream").await;
    let witnesses = slot0_first(&redis, &fleet, &format!("stream.{STREAM}"), witnesses);
    let w = &fleet[witnesses[0]];
    let other = &fleet[witnesses[1]];
    let spare = fleet
        .iter()
        .enumerate()
        .find(|(i, _)| !witnesses.contains(i))
        .map(|(_, sc)| sc)
        .expect("a third instance");
    just_blocked(&redis, w).await;
    w.signal("STOP");
    let stopped = Instant::now();

    let mut conn = conn(&redis).await;
    let mut latencies = Vec::new();
    let (mut id, mut after_w) = (0, 0);
    while after_w < 10 {
        id += 1;
        assert!(id <= 20, "no entry reached the stopped witness");
        xadd(&redis, id);
        let at = Instant::now();
        latencies.push(applied_within(&mut conn, id, at).await);
        if consumer_of(&redis, w).is_some_and(|c| c.1 >= 1) {
            after_w += 1;
        }
    }
    report("stream, one witness stopped: commit -> applied", &latencies);
    assert_eq!(
        consumer_of(&redis, w).map(|c| c.1),
        Some(1),
        "the stopped witness holds one entry"
    );
    assert!(
        applied(other, "stream_fanout").await >= id as f64,
        "the other witness applied every entry"
    );

    eventually("the spare takes W's slot", HANDOVER, || async {
        is_witness(spare, "stream").await
    })
    .await;
    println!(
        "slot taken over {:.1} s after the witness stopped",
        stopped.elapsed().as_secs_f64()
    );
    w.signal("CONT");
    eventually(
        "W, resumed, acks and is no witness",
        Duration::from_secs(10),
        || async {
            consumer_of(&redis, w).is_some_and(|c| c.1 == 0) && !is_witness(w, "stream").await
        },
    )
    .await;
    assert!(is_witness(other, "stream").await && is_witness(spare, "stream").await);
}

/// Stream, four instances: per entry, one application by the group's
/// consumer and one by each of the two witnesses (3 × 20 in all, whatever
/// the fleet's size: with every instance fanning out it is 5 × 20); the
/// two that are not witnesses never apply from the fan-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_only_witnesses_fan_out() {
    const EVENTS: u64 = 20;
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let feed = stream_feed();
    let mut fleet = Vec::new();
    for _ in 0..4 {
        fleet.push(instance(&origin, &redis, "300ms", &feed).start().await);
    }
    eventually(
        "four consumers in the group",
        Duration::from_secs(10),
        || async { consumers(&redis).len() == 4 },
    )
    .await;
    let witnesses = two_witnesses(&fleet, "stream").await;
    // A witness's cursor starts when it becomes one: wait until both read.
    let mut conn = conn(&redis).await;
    let mut warm = 1000;
    eventually("both witnesses read", Duration::from_secs(10), || {
        warm += 1;
        xadd(&redis, warm);
        let fleet = &fleet;
        let witnesses = &witnesses;
        async move {
            let mut reading = true;
            for &i in witnesses {
                reading &= applied(&fleet[i], "stream_fanout").await >= 1.0;
            }
            reading
        }
    })
    .await;
    let total = |source: &'static str| {
        let fleet = &fleet;
        async move {
            let mut each = Vec::new();
            for sc in fleet {
                each.push(applied(sc, source).await);
            }
            each
        }
    };
    // Every warm-up entry applied by the group and both witnesses.
    let warmed = (warm - 1000) as f64;
    eventually("the warm-up settled", Duration::from_secs(10), || async {
        total("stream").await.iter().sum::<f64>() >= warmed
            && total("stream_fanout").await.iter().sum::<f64>() >= 2.0 * warmed
    })
    .await;
    let (group_before, fanout_before) = (total("stream").await, total("stream_fanout").await);

    for id in 1..=EVENTS {
        xadd(&redis, id);
        applied_within(&mut conn, id, Instant::now()).await;
    }
    eventually(
        "the group and both witnesses applied every entry",
        Duration::from_secs(10),
        || async {
            let group: f64 =
                total("stream").await.iter().sum::<f64>() - group_before.iter().sum::<f64>();
            let fanout: f64 = total("stream_fanout").await.iter().sum::<f64>()
                - fanout_before.iter().sum::<f64>();
            group >= EVENTS as f64 && fanout >= 2.0 * EVENTS as f64
        },
    )
    .await;
    // Late extra applications would show here.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (group_after, fanout_after) = (total("stream").await, total("stream_fanout").await);
    let delta = |after: &[f64], before: &[f64], i: usize| after[i] - before[i];
    for i in 0..fleet.len() {
        let fanned = delta(&fanout_after, &fanout_before, i);
        match witnesses.contains(&i) {
            true => assert_eq!(
                fanned, EVENTS as f64,
                "witness {i} applies every entry once"
            ),
            false => assert_eq!(fanned, 0.0, "instance {i} is no witness but fanned out"),
        }
    }
    let group: f64 = (0..fleet.len())
        .map(|i| delta(&group_after, &group_before, i))
        .sum();
    assert_eq!(group, EVENTS as f64, "the group applies each entry once");
}

async fn insert(db: &tokio_postgres::Client, id: u64) {
    db.execute(
        "INSERT INTO sidecache_outbox (route, params) VALUES ('app', jsonb_build_object('tenant', 'acme', 'id', $1::bigint))",
        &[&(id as i64)],
    )
    .await
    .expect("insert outbox row");
}

/// Outbox, four instances: the two that are not witnesses do nothing per
/// event (no fan-out read, no claim: they do not LISTEN and poll only
/// every `idle_poll_interval`), the witnesses apply every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_non_witnesses_do_nothing_per_event() {
    const EVENTS: u64 = 20;
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    pg.execute(&crate::invalidation_binary::ddl()).await;
    let feed = outbox_feed(&pg);
    let mut fleet = Vec::new();
    for _ in 0..4 {
        fleet.push(instance(&origin, &redis, "300ms", &feed).start().await);
    }
    let witnesses = two_witnesses(&fleet, "outbox").await;
    let db = pg.client().await;
    let mut conn = conn(&redis).await;
    insert(&db, 1000).await;
    applied_within(&mut conn, 1000, Instant::now()).await;
    let mut before = Vec::new();
    for sc in &fleet {
        before.push((all(sc).await, applied(sc, "outbox_fanout").await));
    }
    for id in 1..=EVENTS {
        insert(&db, id).await;
        applied_within(&mut conn, id, Instant::now()).await;
    }
    eventually("every row deleted", Duration::from_secs(10), || async {
        let left: i64 = db
            .query_one("SELECT count(*) FROM sidecache_outbox", &[])
            .await
            .expect("count")
            .get(0);
        left == 0
    })
    .await;
    // A witness's claim may take a row its fan-out read had not seen yet
    // (inserted in between): the witnesses' applications from either path.
    let (mut fanned, mut by_witnesses) = (0.0, 0.0);
    for (i, sc) in fleet.iter().enumerate() {
        let (any, fanout) = (
            all(sc).await - before[i].0,
            applied(sc, "outbox_fanout").await - before[i].1,
        );
        match witnesses.contains(&i) {
            true => (fanned, by_witnesses) = (fanned + fanout, by_witnesses + any),
            false => assert_eq!(any, 0.0, "instance {i} is no witness but worked per event"),
        }
    }
    println!("outbox, 2 witnesses of 4: {fanned} fan-out applications for {EVENTS} rows");
    assert!(
        fanned >= 1.0 && by_witnesses >= EVENTS as f64,
        "the witnesses applied {by_witnesses} of {EVENTS} rows ({fanned} by their fan-out)"
    );
}

/// Outbox: W, the witness holding slot 0, is stopped; every row is applied by the other
/// witness within `BOUND` (only witnesses LISTEN: with `witnesses: 1` the
/// rows wait for a new witness, seconds later: checked by hand), and the
/// instance that was not a witness takes W's slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_a_stopped_witness_is_covered_and_its_slot_taken_over() {
    let origin = Origin::start().await;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    pg.execute(&crate::invalidation_binary::ddl()).await;
    let feed = outbox_feed(&pg);
    let fleet = vec![
        instance(&origin, &redis, "300ms", &feed).start().await,
        instance(&origin, &redis, "300ms", &feed).start().await,
        instance(&origin, &redis, "300ms", &feed).start().await,
    ];
    let witnesses = two_witnesses(&fleet, "outbox").await;
    let witnesses = slot0_first(&redis, &fleet, "outbox.sidecache_outbox", witnesses);
    let spare = (0..3).find(|i| !witnesses.contains(i)).expect("a spare");
    let db = pg.client().await;
    let mut conn = conn(&redis).await;
    insert(&db, 1000).await;
    applied_within(&mut conn, 1000, Instant::now()).await;

    let w = &fleet[witnesses[0]];
    w.signal("STOP");
    let stopped = Instant::now();
    let mut latencies = Vec::new();
    for id in 1..=10 {
        insert(&db, id).await;
        latencies.push(applied_within(&mut conn, id, Instant::now()).await);
    }
    report("outbox, one witness stopped: commit -> applied", &latencies);
    eventually("the spare takes W's slot", HANDOVER, || async {
        is_witness(&fleet[spare], "outbox").await
    })
    .await;
    println!(
        "slot taken over {:.1} s after the witness stopped",
        stopped.elapsed().as_secs_f64()
    );
    w.signal("CONT");
    eventually(
        "W, resumed, is no witness",
        Duration::from_secs(10),
        || async { !is_witness(w, "outbox").await },
    )
    .await;
}

//! Bloom filter operations of the store (docs/architecture.md#bloom-filter):
//! activation, signature and size checks, the build lock and its renewal, adds
//! that reach the active filter and a running build, a crashed build.

use super::eventually;
use sidecache::bloom::{positions, signature};
use sidecache::config::Sizing;
use sidecache::keys::BloomKeys;
use sidecache::store::{BloomAnswer, Store};
use std::time::Duration;

const BLOOM_SIZE: Sizing = Sizing { m: 1024, k: 4 };
const BLOOM_LOCK: Duration = Duration::from_secs(60);
const BLOOM_CANDIDATE: Duration = Duration::from_secs(600);

fn bloom_keys(scope: &str) -> BloomKeys {
    sidecache::keys::bloom_keys("sc:", "app", scope)
}

fn pos(scope: &str, id: &str) -> Vec<u64> {
    positions("app", scope, id, BLOOM_SIZE)
}

pub async fn check(s: &dyn Store, k: &BloomKeys, scope: &str, id: &str) -> BloomAnswer {
    s.bloom_check(k, &signature(BLOOM_SIZE), BLOOM_SIZE.m, &pos(scope, id))
        .await
        .unwrap()
}

/// Builds the filter of `scope` with `ids` the way the builder does.
pub async fn build_filter(s: &dyn Store, scope: &str, ids: &[&str]) {
    let k = bloom_keys(scope);
    assert!(s
        .bloom_begin(&k, "builder", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
        .await
        .unwrap());
    let bits: Vec<u64> = ids.iter().flat_map(|id| pos(scope, id)).collect();
    s.bloom_set_bits(&k.candidate("builder"), &bits)
        .await
        .unwrap();
    assert!(s
        .bloom_activate(&k, "builder", &signature(BLOOM_SIZE), BLOOM_SIZE.m)
        .await
        .unwrap());
    assert!(s.unlock(&k.lock, "builder").await.unwrap());
}

pub async fn bloom_is_unknown_until_activated_then_answers(s: &dyn Store) {
    let k = bloom_keys("b1");
    assert_eq!(check(s, &k, "b1", "1").await, BloomAnswer::Unknown);
    build_filter(s, "b1", &["1", "2", "3"]).await;
    for id in ["1", "2", "3"] {
        assert_eq!(check(s, &k, "b1", id).await, BloomAnswer::Maybe, "{id}");
    }
    let absent = (100..200)
        .filter(|i| {
            let p = pos("b1", &i.to_string());
            // Count only ids the 3-member filter can tell apart.
            !["1", "2", "3"].iter().any(|m| pos("b1", m) == p)
        })
        .count();
    let mut rejected = 0;
    for i in 100..200 {
        if check(s, &k, "b1", &i.to_string()).await == BloomAnswer::Absent {
            rejected += 1;
        }
    }
    assert!(rejected > absent * 9 / 10, "{rejected} of {absent}");
    // The active bitmap has no TTL and the candidate is gone.
    assert!(s.bloom_bitcount(&k.bits).await.unwrap() > 0);
    assert_eq!(s.bloom_bitcount(&k.candidate("builder")).await.unwrap(), 0);
}

pub async fn bloom_signature_mismatch_short_bitmap_and_disable_are_unknown(s: &dyn Store) {
    let k = bloom_keys("b2");
    build_filter(s, "b2", &["1"]).await;
    assert_eq!(check(s, &k, "b2", "1").await, BloomAnswer::Maybe);
    // Another size (capacity changed in the config): unknown, never absent.
    let other = Sizing { m: 2048, k: 4 };
    let answer = s
        .bloom_check(
            &k,
            &signature(other),
            other.m,
            &positions("app", "b2", "9", other),
        )
        .await
        .unwrap();
    assert_eq!(answer, BloomAnswer::Unknown);
    // Same signature but a caller that expects more bits than exist.
    let answer = s
        .bloom_check(
            &k,
            &signature(BLOOM_SIZE),
            BLOOM_SIZE.m * 2,
            &pos("b2", "9"),
        )
        .await
        .unwrap();
    assert_eq!(answer, BloomAnswer::Unknown);
    s.bloom_disable(&k, None).await.unwrap();
    assert_eq!(check(s, &k, "b2", "1").await, BloomAnswer::Unknown);
    assert_eq!(check(s, &k, "b2", "9").await, BloomAnswer::Unknown);
}

pub async fn bloom_build_lock_is_exclusive_and_activation_needs_the_owner(s: &dyn Store) {
    let k = bloom_keys("b3");
    let sig = signature(BLOOM_SIZE);
    assert!(s
        .bloom_begin(&k, "a", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
        .await
        .unwrap());
    assert!(!s
        .bloom_begin(&k, "b", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
        .await
        .unwrap());
    // b never got the lock: it cannot activate (nor has a candidate).
    assert!(!s.bloom_activate(&k, "b", &sig, BLOOM_SIZE.m).await.unwrap());
    assert_eq!(check(s, &k, "b3", "1").await, BloomAnswer::Unknown);
    // a's candidate is full-size before any bit is set.
    assert!(s.bloom_activate(&k, "a", &sig, BLOOM_SIZE.m).await.unwrap());
    assert_eq!(check(s, &k, "b3", "1").await, BloomAnswer::Absent);
    // Activation renamed the candidate away: a second activate fails.
    assert!(!s.bloom_activate(&k, "a", &sig, BLOOM_SIZE.m).await.unwrap());
    assert!(!s.unlock(&k.lock, "b").await.unwrap());
    assert!(s.unlock(&k.lock, "a").await.unwrap());
}

pub async fn bloom_renew_keeps_only_the_owners_build_alive(s: &dyn Store) {
    let k = bloom_keys("renew1");
    let sig = signature(BLOOM_SIZE);
    let short = Duration::from_millis(200);
    assert!(s
        .bloom_begin(&k, "a", short, BLOOM_SIZE.m, short)
        .await
        .unwrap());
    assert!(!s
        .bloom_renew(&k, "b", BLOOM_LOCK, BLOOM_CANDIDATE)
        .await
        .unwrap());
    assert!(s
        .bloom_renew(&k, "a", BLOOM_LOCK, BLOOM_CANDIDATE)
        .await
        .unwrap());
    // Time has to pass here: past the first 200 ms lease, the renewed lock
    // and candidate (60 s / 600 s now) are still there.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(s.bloom_activate(&k, "a", &sig, BLOOM_SIZE.m).await.unwrap());

    // Without renewal the lease runs out and renewing can no longer revive it.
    let k = bloom_keys("renew2");
    assert!(s
        .bloom_begin(&k, "c", short, BLOOM_SIZE.m, BLOOM_CANDIDATE)
        .await
        .unwrap());
    eventually(
        "the unrenewed build lock expires and d can build",
        || async {
            s.bloom_begin(&k, "d", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
                .await
                .unwrap()
        },
    )
    .await;
    assert!(!s
        .bloom_renew(&k, "c", BLOOM_LOCK, BLOOM_CANDIDATE)
        .await
        .unwrap());
    assert!(!s.bloom_activate(&k, "c", &sig, BLOOM_SIZE.m).await.unwrap());
}

pub async fn bloom_add_reaches_active_filter_and_running_build(s: &dyn Store) {
    let k = bloom_keys("b4");
    let sig = signature(BLOOM_SIZE);
    // No filter: add is harmless and creates nothing.
    s.bloom_add(&k, &pos("b4", "0")).await.unwrap();
    assert_eq!(check(s, &k, "b4", "0").await, BloomAnswer::Unknown);
    build_filter(s, "b4", &["1"]).await;
    // Created after the build: present at once.
    s.bloom_add(&k, &pos("b4", "2")).await.unwrap();
    assert_eq!(check(s, &k, "b4", "2").await, BloomAnswer::Maybe);
    // A rebuild whose snapshot misses "3" (created during the build).
    assert!(s
        .bloom_begin(&k, "r", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
        .await
        .unwrap());
    s.bloom_set_bits(
        &k.candidate("r"),
        &[pos("b4", "1"), pos("b4", "2")].concat(),
    )
    .await
    .unwrap();
    s.bloom_add(&k, &pos("b4", "3")).await.unwrap();
    assert_eq!(check(s, &k, "b4", "3").await, BloomAnswer::Maybe);
    assert!(s.bloom_activate(&k, "r", &sig, BLOOM_SIZE.m).await.unwrap());
    for id in ["1", "2", "3"] {
        assert_eq!(check(s, &k, "b4", id).await, BloomAnswer::Maybe, "{id}");
    }
    // Added after activation while the lock is still held: active bitmap.
    s.bloom_add(&k, &pos("b4", "4")).await.unwrap();
    assert_eq!(check(s, &k, "b4", "4").await, BloomAnswer::Maybe);
    assert!(s.unlock(&k.lock, "r").await.unwrap());
}

pub async fn bloom_crashed_build_leaves_the_old_filter_and_its_candidate_expires(s: &dyn Store) {
    let k = bloom_keys("b5");
    let sig = signature(BLOOM_SIZE);
    build_filter(s, "b5", &["1"]).await;
    // A build that dies after filling part of its candidate.
    assert!(s
        .bloom_begin(
            &k,
            "dead",
            Duration::from_millis(200),
            BLOOM_SIZE.m,
            Duration::from_millis(400)
        )
        .await
        .unwrap());
    s.bloom_set_bits(&k.candidate("dead"), &pos("b5", "2"))
        .await
        .unwrap();
    // The old filter keeps answering.
    assert_eq!(check(s, &k, "b5", "1").await, BloomAnswer::Maybe);
    eventually("dead build's lock and candidate expire", || async {
        s.bloom_bitcount(&k.candidate("dead")).await.unwrap() == 0
            && s.bloom_begin(&k, "next", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
                .await
                .unwrap()
    })
    .await;
    // Its owner can no longer activate; the next build can.
    assert!(!s
        .bloom_activate(&k, "dead", &sig, BLOOM_SIZE.m)
        .await
        .unwrap());
    s.bloom_set_bits(
        &k.candidate("next"),
        &[pos("b5", "1"), pos("b5", "3")].concat(),
    )
    .await
    .unwrap();
    assert!(s
        .bloom_activate(&k, "next", &sig, BLOOM_SIZE.m)
        .await
        .unwrap());
    assert_eq!(check(s, &k, "b5", "3").await, BloomAnswer::Maybe);
}
